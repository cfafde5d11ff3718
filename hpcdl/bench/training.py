"""``hpcdl bench training``: what compressed activations buy in training, at one memory budget.

For each workload (the climate DeepLabv3+ and the HEP jet-image CNN at their
CPU-demo scales) and each method (baseline; the default policy, hpcdl.train.comparison):

1. the per-device batch reached: the largest batch whose measured step peak
   fits the budget (:func:`hpcdl.train.trainer.measured_batch_search`, a fresh
   measuring process, doubling then bisection);
2. samples/s at that per-device batch, training with ``hpcdl train`` on 1 rank
   and under ``mpirun -np 2`` (weak scaling: the global batch doubles), one
   thread per rank so that 2 ranks use 2 cores against 1 rank's one;
3. the scaling efficiency: samples/s on 2 ranks over twice that on 1.

The batch search and the timed steps use the model's random example batches
(``data.dataset=synthetic``), since the committed samples hold fewer samples
than the larger batches need; random inputs give less compressible
activations than real fields, so sz's numbers here are conservative.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from hpcdl.train.comparison import COMPARED_METHODS
from hpcdl.units import human_bytes

WORKLOADS = ("climate-deeplab", "hep-jets")
DEFAULT_BUDGETS = {"climate-deeplab": "24MiB", "hep-jets": "16MiB"}


@dataclass
class TrainingBenchRow:
    workload: str
    model: str
    method: str
    budget_bytes: int
    per_device_batch: int
    step_peak_bytes: int
    samples_per_s: dict  # {ranks: samples/s}
    median_step_time_s: dict  # {ranks: seconds}
    activation_ratio: float
    scaling_efficiency: float | None  # samples/s on the most ranks / (ranks x samples/s on 1)


def _mpirun() -> str:
    local = Path(sys.executable).parent / "mpirun"
    return str(local) if local.exists() else "mpirun"


def _train(workload: str, overrides: list[str], ranks: int, run_dir: Path, timeout: float) -> dict:
    """Run ``hpcdl train`` on ``ranks`` ranks (one thread each) and return its summary.json."""
    sets = [item for override in overrides for item in ("--set", override)]
    command = [sys.executable, "-m", "hpcdl", "train", workload, *sets, "--run-dir", str(run_dir)]
    if ranks > 1:
        command = [_mpirun(), "-np", str(ranks), "--oversubscribe", *command]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def run_training_benchmark(out_dir: str | Path = "runs/bench-training", budgets: dict | None = None,
                           steps: int = 5, ranks: tuple[int, ...] = (1, 2), workloads=WORKLOADS,
                           timeout: float = 1800) -> list[TrainingBenchRow]:
    """Measure every (workload, method); see the module docstring."""
    from hpcdl.train import load_config
    from hpcdl.train.trainer import measured_batch_search
    from hpcdl.units import parse_bytes

    budgets = {**DEFAULT_BUDGETS, **(budgets or {})}
    rows = []
    for workload in workloads:
        for method, method_overrides in COMPARED_METHODS.items():
            base = ["data.dataset=synthetic", *method_overrides]
            config = load_config(workload, overrides=base)
            budget = parse_bytes(budgets[workload])
            search = measured_batch_search(config, {}, budget)
            batch = search.batch_size
            speed, step_time, ratio = {}, {}, 1.0
            for n in ranks:
                overrides = [*base, f"train.batch={batch * n}", "train.epochs=1", f"train.steps_per_epoch={steps}",
                             f"data.synthetic_samples={batch * n * steps}", "train.val_steps=1",
                             "logging.progress=false", "checkpoint.every_steps=0"]
                run_dir = Path(out_dir) / f"{workload}-{method.split()[0]}-{n}rank"
                summary = _train(workload, overrides, n, run_dir, timeout)
                speed[n], step_time[n] = summary["samples_per_s"], summary["median_step_time_s"]
                ratio = summary["activation_ratio"]
            largest = max(ranks)
            efficiency = speed[largest] / (largest * speed[1]) if 1 in speed and largest > 1 else None
            rows.append(TrainingBenchRow(workload, f"{config['model']['name']} ({config['model']['scale']})", method,
                                         budget, batch, search.peak_bytes, speed, step_time, ratio, efficiency))
    return rows


def format_rows(rows: list[TrainingBenchRow]) -> str:
    ranks = sorted({n for row in rows for n in row.samples_per_s})
    header = ("model", "activations", "budget", "batch/device", "step peak", "act. ratio",
              *(f"samples/s {n}r" for n in ranks), "2r/1r eff.")
    lines = [header]
    for row in rows:
        lines.append((row.model, row.method, human_bytes(row.budget_bytes), str(row.per_device_batch),
                      human_bytes(row.step_peak_bytes), f"{row.activation_ratio:.1f}x",
                      *(f"{row.samples_per_s[n]:.1f}" for n in ranks),
                      f"{row.scaling_efficiency:.0%}" if row.scaling_efficiency is not None else "-"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)) for line in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)


def write_rows(rows: list[TrainingBenchRow], path: str | Path) -> None:
    Path(path).write_text(json.dumps([asdict(row) for row in rows], indent=2) + "\n")
