"""The study's run loop: plan the runs of a sweep, shard them, skip finished ones, run the rest.

Every run goes through the trainer (:func:`hpcdl.train.run_training`) with config overrides for
model, scale, method, seed, epochs and batch, so all methods are measured by the same code, and
appends one line to ``OUT/results.jsonl`` (see :mod:`hpcdl.study.results`). A run is identified by
its key, a hash of everything that defines it (model, scale, method overrides, seed, epochs,
batch, steps per epoch, base config, extra overrides, and the resolved trainer config, so an edited
base config makes new runs): a resumed sweep skips keys already in the file, and ``--shard i/n`` takes every n-th run starting at i, so n processes or Slurm array tasks
split a sweep without overlap.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from hpcdl.memory.allocator import return_freed_memory_to_os
from hpcdl.study.decisions import summarise_decisions
from hpcdl.study.results import append_record, read_results, result_files
from hpcdl.train.distributed import detect_world
from hpcdl.train.method_spec import Method, parse_methods, yaml_scalar

RECORD_VERSION = 1


@dataclass(frozen=True)
class PlannedRun:
    """One run of a sweep, planned (not yet run): a model at a scale, trained with one method from one seed."""

    model: str
    scale: str
    method: Method
    seed: int
    epochs: int
    batch: int | str | None  # None: the base config's batch
    base_config: str
    steps_per_epoch: int | None = None
    extra: tuple[str, ...] = ()
    config_digest: str = ""  # hash of the resolved trainer config: an edited base config makes new runs

    def overrides(self) -> list[str]:
        """Trainer config overrides for this run, the user's extra ones last (they win)."""
        items = [
            # The run's name titles the trainer's step progress bar.
            f"name={yaml_scalar(f'{self.model} {self.method.spec} seed={self.seed}')}",
            f"model.name={self.model}",
            f"model.scale={self.scale}",
            f"train.seed={self.seed}",
            f"train.epochs={self.epochs}",
            # Every step logged, so the first step's loss (the same-start check) is in metrics.jsonl.
            "logging.every_steps=1",
            *self.method.overrides(),
        ]
        if self.batch is not None:
            items.append(f"train.batch={self.batch}")
        if self.steps_per_epoch is not None:
            items.append(f"train.steps_per_epoch={self.steps_per_epoch}")
        return items + list(self.extra)

    def identity(self) -> dict:
        return {
            "model": self.model,
            "scale": self.scale,
            "method": self.method.overrides(),
            "seed": self.seed,
            "epochs": self.epochs,
            "batch": self.batch,
            "steps_per_epoch": self.steps_per_epoch,
            "base_config": self.base_config,
            "extra": list(self.extra),
            "config_digest": self.config_digest,
        }

    @property
    def key(self) -> str:
        """A stable hash of :meth:`identity`: same run, same key, in any process and on any machine."""
        blob = json.dumps(self.identity(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def label(self) -> str:
        return f"{self.model}/{self.scale} {self.method.spec} seed={self.seed}"


#: The old name of :class:`PlannedRun` (kept for one release).
RunSpec = PlannedRun


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` -> (i, n) with 0 <= i < n; i counts from 0, as Slurm array task ids 0..n-1 do."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard takes i/n with integers 0 <= i < n (e.g. 0/4), got {text!r}") from None
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"--shard {text!r}: need n >= 1 and 0 <= i < n (shards count from 0)")
    return index, count


def shard(runs: list[PlannedRun], index: int, count: int) -> list[PlannedRun]:
    """Every ``count``-th run from ``index``: the shards are disjoint, their union is ``runs``, sizes differ by <= 1."""
    return runs[index::count]


@dataclass
class SweepSummary:
    """What a call of :func:`run_sweep` did, by key."""

    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    already_done: list[str] = field(default_factory=list)
    truncated: dict[str, str] = field(default_factory=dict)  # results file -> its unfinished last line
    step_peaks: int = 0  # single-step peak measurements made


TRAINER_DEFAULTS = "trainer-defaults"  # base config name of a model without a shipped config


def base_config_for(model: str) -> str:
    """The trainer config a model's runs start from: its CPU-scale shipped config, else the trainer's defaults.

    A shipped config whose ``model.name`` is ``model`` carries the optimizer and data settings its
    author chose for that workload; of several (CPU, GPU, multi-node), the one with the shortest
    name is the CPU-demo one (``hep-jets`` before ``hep-jets-gpu``).
    """
    from hpcdl.train.config import load_config, shipped_configs

    matches = [name for name in shipped_configs() if load_config(name)["model"]["name"] == model]
    return min(matches, key=lambda name: (len(name), name)) if matches else TRAINER_DEFAULTS


def plan_sweep(models: list[str], methods: str | list[str | Method], seeds: list[int], epochs: int,
               batch: int | str | None = None, scale: str | None = None, steps_per_epoch: int | None = None,
               base_config: str | None = None, extra: list[str] = ()) -> list[PlannedRun]:
    """Every (model, seed, method) run, in that nesting order; ``scale=None`` takes each model's smallest scale."""
    import hpcdl.models

    if not models or not seeds:
        raise ValueError("a sweep needs at least one model and one seed (e.g. --models hep-cnn --seeds 0)")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds {seeds} repeat a seed; list each once")
    parsed = parse_methods(methods)
    runs = []
    for model in models:
        family = hpcdl.models.family(model)
        model_scale = scale or family.scales[0]
        if model_scale not in family.scales:
            raise ValueError(f"model {model!r} has no scale {model_scale!r}; its scales are {list(family.scales)}")
        base = base_config or base_config_for(model)
        for seed in seeds:
            for method in parsed:
                run = PlannedRun(model=model, scale=model_scale, method=method, seed=int(seed), epochs=epochs,
                              batch=batch, base_config=base, steps_per_epoch=steps_per_epoch, extra=tuple(extra))
                runs.append(dataclasses.replace(run, config_digest=config_digest(_resolve_config(run))))
    return runs


def config_digest(config: dict) -> str:
    """A stable hash of a resolved trainer config."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _resolve_config(run: PlannedRun) -> dict:
    from hpcdl.train import load_config

    base = {"model": {"name": run.model}} if run.base_config == TRAINER_DEFAULTS else run.base_config
    return load_config(base, overrides=run.overrides())


def environment() -> dict:
    """Versions and device a run was measured with."""
    import torch

    import hpcdl

    device = {"type": "cuda" if torch.cuda.is_available() else "cpu", "threads": torch.get_num_threads(),
              "cpu": _cpu_model()}
    if device["type"] == "cuda":
        device["name"] = torch.cuda.get_device_name(0)
    return {"torch": torch.__version__, "hpcdl": hpcdl.__version__, "python": platform.python_version(),
            "device": device}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _base_record(run: PlannedRun, status: str) -> dict:
    return {
        "kind": "run",
        "record_version": RECORD_VERSION,
        "key": run.key,
        "status": status,
        "model": run.model,
        "scale": run.scale,
        "method": run.method.spec,
        "method_kind": run.method.kind,
        "codec": run.method.codec_config,
        "seed": run.seed,
        "identity": run.identity(),
        "overrides": run.overrides(),
        **environment(),
    }


def _first_step_loss(run_dir: Path) -> float | None:
    """The loss of the first training step, from the trainer's metrics.jsonl: equal for every method of a seed."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return None
    with metrics.open() as handle:
        for line in handle:
            record = json.loads(line)
            if record.get("kind") == "train" and record.get("step") == 1:
                return record["loss"]
    return None


STATS_BATCH = 8


def activation_stats_record(run: PlannedRun) -> dict:
    """Per-module statistics of what the model saves for backward, at initialisation, on real training samples.

    The model and data are built as the trainer builds them for ``run`` (same seed, so the same initial
    weights), and one forward runs on the first ``STATS_BATCH`` training samples.
    """
    import torch

    import hpcdl.models
    from hpcdl.study.activations import capture_activation_stats
    from hpcdl.train.inputs import datasets, model_options

    record = {"kind": "activation_stats", "record_version": RECORD_VERSION, "model": run.model, "scale": run.scale,
              "seed": run.seed}
    try:
        config = _resolve_config(run)
        family = hpcdl.models.family(run.model)
        train_set, _ = datasets(config, family)
        torch.manual_seed(run.seed)
        model = family.build(run.scale, **model_options(config, family, train_set))
        count = min(len(train_set), STATS_BATCH)
        inputs = torch.stack([train_set[index][0] for index in range(count)])
        record.update(samples=count, dataset=config["data"]["dataset"] or family.default_dataset,
                      modules=capture_activation_stats(model, inputs))
    except Exception as err:  # the statistics are an extra: their failure is recorded, the sweep goes on
        record["error"] = f"{type(err).__name__}: {err}"
    return record


def step_peak_record(run: PlannedRun, record: dict, process) -> dict:
    """One step of ``run``'s model, per-device batch and method, measured alone (see :mod:`hpcdl.study.steppeak`)."""
    import torch

    import hpcdl.models
    from hpcdl import memory
    from hpcdl.study.steppeak import step_setup
    from hpcdl.train.inputs import datasets

    peak = {"kind": "step_peak", "record_version": RECORD_VERSION, "key": run.key, "model": run.model,
            "scale": run.scale, "method": run.method.spec, "method_kind": run.method.kind, "seed": run.seed,
            "per_device_batch": record["per_device_batch"]}
    try:
        config = record["config"]
        train_set, _ = datasets(config, hpcdl.models.family(run.model))
        samples = [train_set[index] for index in range(min(len(train_set), record["per_device_batch"]))]
        batch = (torch.stack([x for x, _ in samples]), torch.stack([y for _, y in samples]))
        device = "cuda" if record["device"]["type"] == "cuda" else "cpu"
        setup = step_setup(config, record["model_options"], batch, device, record["batch_size"])
        report = memory.peak(setup, process=process) if device == "cpu" else memory.peak(setup)
        peak.update(peak_bytes=report.peak_bytes, peak_kind=report.method, device=report.device,
                    activation_original_bytes=report.info.get("activation_original_bytes"),
                    activation_packed_bytes=report.info.get("activation_packed_bytes"))
    except Exception as err:  # an extra measurement: its failure is recorded, the sweep goes on
        peak["error"] = f"{type(err).__name__}: {err}"
    return peak


def measure_step_peaks(runs: list[PlannedRun], out: Path, shard: tuple[int, int], progress: bool) -> int:
    """Measure the single-step peak of every finished (ok) run not yet measured; return how many."""
    from tqdm import tqdm

    from hpcdl.memory import MeasuringProcess

    results = read_results(out)
    finished = {record["key"]: record for record in results.runs() if record["status"] == "ok"}
    measured = {record["key"] for record in results.records if record.get("kind") == "step_peak"}
    todo = [run for run in runs if run.key in finished and run.method.kind != "offload" and run.key not in measured]
    if not todo:
        return 0
    with MeasuringProcess() as process:
        for run in tqdm(todo, desc="step peaks", unit="step", disable=not progress):
            append_record(out, step_peak_record(run, finished[run.key], process), shard)
    return len(todo)


def execute(run: PlannedRun, out: Path, progress: bool = True) -> dict:
    """Run one sweep entry through the trainer and return its results record (status ok, skipped or failed)."""
    import torch

    if run.method.needs_gpu and not torch.cuda.is_available():
        record = _base_record(run, "skipped")
        record["reason"] = f"method {run.method.spec!r} needs a CUDA GPU and none is available on this machine"
        return record
    from hpcdl.train import run_training

    run_dir = out / "runs" / f"{run.model}-{run.key}"
    started = time.time()
    try:
        config = _resolve_config(run)
        result = run_training(config, run_dir=run_dir, progress=progress)
    except Exception as err:  # a failed run is a result too: recorded with its error, the sweep goes on
        record = _base_record(run, "failed")
        record.update(error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc(limit=8),
                      wall_time_s=time.time() - started)
        return record
    record = _base_record(run, "ok")
    record.update(
        config=config,
        run_dir=os.path.relpath(result.run_dir, out),
        epochs=result.epochs,
        first_step_loss=_first_step_loss(Path(result.run_dir)),
        median_step_time_s=result.median_step_time_s,
        samples_per_s=result.samples_per_s,
        activation_original_bytes=result.activation_original_bytes,
        activation_packed_bytes=result.activation_packed_bytes,
        activation_ratio=result.activation_ratio,
        per_module=result.per_module,
        metric_name=result.metric_name,
        peak_memory_bytes=result.peak_memory_bytes,
        peak_memory_kind=result.peak_memory_kind,
        wall_time_s=result.wall_time_s,
        steps=result.steps,
        batch_size=result.batch_size,
        per_device_batch=result.per_device_batch,
        world_size=result.world_size,
        model_options=result.model_options,
    )
    # A controller-driven method (adaptive): its decisions, condensed, since the run directory is not kept.
    record.update(summarise_decisions(Path(result.run_dir) / "metrics.jsonl") or {})
    return record


def run_sweep(runs: list[PlannedRun], out: str | os.PathLike, progress: bool = True, retry_failed: bool = False,
              shard: tuple[int, int] = (0, 1)) -> SweepSummary:
    """Run every run of ``runs`` not finished in ``out``'s results files, appending one line each.

    ``shard`` (i, n) names the file written (``results_path(out, shard)``); finished runs are looked
    up in every results file of ``out``, so a sweep resumed with another sharding skips them too.
    """
    from tqdm import tqdm

    out = Path(out)
    summary = SweepSummary()
    done: set[str] = set()
    stats_done: set[tuple[str, str]] = set()
    if result_files(out):
        existing = read_results(out)
        done = existing.finished_keys(retry_failed=retry_failed)
        stats_done = set(existing.activation_stats())
        summary.truncated = existing.truncated
    todo = [run for run in runs if run.key not in done]
    summary.already_done = [run.key for run in runs if run.key in done]
    # Under mpirun/srun every rank runs the same sweep (each run is data-parallel); rank 0 alone writes.
    root = detect_world().rank == 0
    bar = tqdm(todo, desc="study runs", unit="run", disable=not (progress and root), position=0, dynamic_ncols=True)
    for run in bar:
        bar.set_postfix_str(run.label)
        if root and (run.model, run.scale) not in stats_done and run.method.kind == "baseline":
            append_record(out, activation_stats_record(run), shard)
            stats_done.add((run.model, run.scale))
        freed_memory_returned = return_freed_memory_to_os()
        record = execute(run, out, progress=progress)
        record["freed_memory_returned"] = freed_memory_returned
        if root:
            append_record(out, record, shard)
        {"ok": summary.ran, "skipped": summary.skipped, "failed": summary.failed}[record["status"]].append(run.key)
        if progress and root:
            tqdm.write(summary_line(record))
    if root:
        summary.step_peaks = measure_step_peaks(runs, out, shard, progress)
    return summary


def summary_line(record: dict) -> str:
    """One line per finished run: what ran and what it measured (or why it did not)."""
    head = f"[{record['status']}] {record['model']}/{record['scale']} {record['method']} seed={record['seed']}"
    if record["status"] == "skipped":
        return f"{head}: {record['reason']}"
    if record["status"] == "failed":
        return f"{head}: {record['error']}"
    final = record["epochs"][-1] if record["epochs"] else {}
    peak = record.get("peak_memory_bytes")
    return (f"{head}: val_metric={_fmt(final.get('val_metric'))} train_loss={_fmt(final.get('train_loss'))} "
            f"ratio={_fmt(record.get('activation_ratio'))}x peak={'-' if peak is None else f'{peak / 2**20:.1f}MiB'} "
            f"step={_fmt(record.get('median_step_time_s'))}s wall={record['wall_time_s']:.1f}s")


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.4g}"
