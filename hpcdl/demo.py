"""``hpcdl demo``: train the climate and HEP models on the committed samples, baseline and compressed.

For each workload (the shipped CPU configs ``climate-deeplab`` and
``hep-jets``) and each method (no compression, and hpcdl's default policy,
:data:`hpcdl.runtime.policy.DEFAULT_POLICY_SPEC`) it runs the real trainer for a few epochs on the same seed, batch and
data order, then searches the largest batch whose measured step peak fits a
small memory budget (``hpcdl.memory.search_batch``). The table it prints
compares activation bytes, peak memory, the batch that fits, the validation
metric and throughput side by side, and says where each run directory is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpcdl.train.comparison import COMPARED_METHODS
from hpcdl.units import human_bytes

WORKLOADS = ("climate-deeplab", "hep-jets")
# The methods compared (hpcdl.train.comparison holds them, for the training benchmark too).
METHODS = COMPARED_METHODS


@dataclass
class DemoRow:
    workload: str
    model: str
    method: str
    metric_name: str
    val_metric: float
    activation_original_bytes: int
    activation_packed_bytes: int
    peak_memory_bytes: int
    budget_bytes: int
    max_batch: int
    step_peak_at_max_batch: int
    samples_per_s: float
    steps: int
    run_dir: str


def demo_overrides(epochs: int, steps_per_epoch: int | None) -> list[str]:
    overrides = [f"train.epochs={epochs}", "checkpoint.every_steps=0", "logging.progress=true"]
    if steps_per_epoch is not None:
        overrides.append(f"train.steps_per_epoch={steps_per_epoch}")
    return overrides


def run_demo(out_dir: str | Path = "runs/demo", epochs: int = 2, steps_per_epoch: int | None = 10,
             budget: str | int | None = None, workloads=WORKLOADS, progress: bool = True,
             search_options: dict | None = None) -> tuple[list[DemoRow], dict[str, str]]:
    """Train every (workload, method) pair and search its batch under the budget.

    Returns one row per run, and {workload: why it did not run} for a workload whose committed sample is
    missing from this checkout. ``budget`` defaults to each workload config's ``train.memory_budget``.
    ``search_options`` go to every batch search (:func:`hpcdl.memory.search_batch`): the stress test
    (tests/test_data_stress.py) caps the search at batch 1 (``limit=1``) and shares one measuring process
    (``process=``) to run the demo's sequence many times; the demo itself passes none.
    """
    from hpcdl.data import MissingFileError, load_dataset
    from hpcdl.train import load_config, run_training
    from hpcdl.train.trainer import measured_batch_search
    from hpcdl.units import parse_bytes

    rows, missing = [], {}
    for workload in workloads:
        dataset = load_config(workload)["data"]["dataset"]
        try:
            load_dataset(dataset)
        except MissingFileError as err:
            missing[workload] = str(err)
            continue
        for method, method_overrides in METHODS.items():
            overrides = [*demo_overrides(epochs, steps_per_epoch), *method_overrides]
            if not progress:
                overrides.append("logging.progress=false")
            config = load_config(workload, overrides=overrides)
            run_dir = Path(out_dir) / f"{workload}-{method.split()[0]}"
            result = run_training(config, run_dir=run_dir, progress=progress)
            budget_bytes = parse_bytes(budget or config["train"]["memory_budget"])
            search = measured_batch_search(config, result.model_options, budget_bytes, **(search_options or {}))
            rows.append(DemoRow(workload, f"{config['model']['name']} ({config['model']['scale']})", method,
                                result.metric_name, result.final_val_metric, result.activation_original_bytes,
                                result.activation_packed_bytes, result.peak_memory_bytes, budget_bytes,
                                search.batch_size, search.peak_bytes, result.samples_per_s, result.steps,
                                result.run_dir))
    return rows, missing


def elapsed_line(seconds: float) -> str:
    """The demo's last line: its wall time, from the command's start (torch's import included, the install not).

    CI's newcomer check (tools/check_newcomer.py) reads it and fails a demo slower than 3 minutes.
    """
    return f"demo time: {seconds:.0f} s (trainings and batch searches; the install is not counted)"


def format_table(rows: list[DemoRow], missing: dict[str, str]) -> str:
    """The demo's table: one line per (model, method), then where the runs are.

    "saved/step" is what autograd keeps for backward in one step: the original
    bytes for the baseline (measured by the compressed run of the same model,
    batch and data, since the baseline runs without hooks) and the packed bytes
    under compression.
    """
    original_per_step = {row.workload: row.activation_original_bytes / row.steps
                         for row in rows if row.activation_original_bytes}
    header = ("model", "activations", "val metric", "saved/step", "ratio", "train peak", "batch @ budget",
              "samples/s")
    lines = [header]
    for row in rows:
        original = original_per_step.get(row.workload)
        if row.activation_packed_bytes:
            saved, ratio = row.activation_packed_bytes / row.steps, \
                row.activation_original_bytes / row.activation_packed_bytes
        else:
            saved, ratio = original, 1.0
        lines.append((
            row.model, row.method, f"{row.metric_name} {row.val_metric:.3f}",
            human_bytes(saved) if saved else "-", f"{ratio:.1f}x", human_bytes(row.peak_memory_bytes),
            f"{row.max_batch} under {human_bytes(row.budget_bytes)}", f"{row.samples_per_s:.0f}",
        ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)) for line in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    text += ["", "train peak: peak RSS growth of the training process over its steps (CPU); batch @ budget: the "
                 "largest batch whose measured step peak fits the budget (hpcdl.memory, fresh process).",
             "run directories (config.resolved.yaml, metrics.jsonl, summary.json):"]
    text.extend(f"  {row.run_dir}" for row in rows)
    text.extend(f"NOT RUN: {workload}: {reason}" for workload, reason in missing.items())
    return "\n".join(text)
