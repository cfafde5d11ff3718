"""``hpcdl bench memory``: the measured step peak of each activation method, per batch and under budgets.

For one model (an ``hpcdl.models`` name at a scale, optionally at another input shape), every method
(a method spec of :mod:`hpcdl.train.method_spec`: ``baseline``, ``sz:rel=1e-2``, ``quant:bits=2``,
``cast:bf16``, ``recompute``, ``recompute+sz:rel=1e-2``, ...) is measured with
:mod:`hpcdl.memory`, every probe in a new measuring process on the CPU
(:class:`hpcdl.memory.FreshProcesses`) or on the GPU in this process:

1. the step peak at each batch of a list, with its breakdown (:func:`hpcdl.memory.breakdown`);
2. the per-sample step peak ``(peak(b2) - peak(b1)) / (b2 - b1)`` between the two largest batches
   (the marginal cost of a sample where a budget search ends up), and its ratio to the baseline's;
3. the largest batch whose step peak fits each budget (:func:`hpcdl.memory.search_batch`), starting
   from the batch the measured peaks' linear fit puts at the budget (:func:`search_start`), so that a
   search at a large batch, where every probe is a long step, costs a few probes near the answer;
4. a *projection* of the largest per-GPU batch on 40 and 80 GB A100s and a 141 GB H200 from the
   measured bytes: what a device holds at batch ``b`` is the step's footprint (resident weights,
   buffers, optimizer state and batch, plus the step peak), taken as linear in ``b`` through the two
   largest measured batches. Measured on the CPU, it assumes the GPU needs the same bytes; it ignores the CUDA
   context, the caching allocator's slack, cuDNN workspaces and mixed precision.

A method is named by its spec only, so a policy spec the runtime learns (an adaptive policy's, say)
is measured here by name with no change to this module: see :mod:`hpcdl.train.method_spec`.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from hpcdl.errors import HpcdlError
from hpcdl.units import human_bytes, parse_bytes

if TYPE_CHECKING:
    from hpcdl.train.method_spec import Method

#: The methods measured when none are named: the baseline, sz at two bounds, 2-bit quantization, a bf16
#: cast, recomputation, and recomputation with sz.
DEFAULT_METHODS = "baseline,sz:rel=1e-2,sz:rel=1e-1,quant:bits=2,cast:bf16,recompute,recompute+sz:rel=1e-2"

#: Devices of the projection and their memory: nominal sizes (the A100s' 40 and 80 GiB of HBM2/HBM2e,
#: the H200's 141 GB of HBM3e, which nvidia-smi reports as about 140 GiB). What PyTorch can allocate is
#: somewhat less (the CUDA context and what the driver reserves).
PROJECTED_GPUS: tuple[tuple[str, int], ...] = (
    ("A100 40GB", 40 * 2**30),
    ("A100 80GB", 80 * 2**30),
    ("H200 141GB", 140 * 2**30),
)

#: What MLPerf HPC DeepCAM submissions ran per GPU, for the projection's comparison.
MLPERF_DEEPCAM = {
    "local_batch_per_gpu": [1, 2],
    "source": "MLPerf HPC v1.0 results, NVIDIA DeepCAM on DGX A100 (github.com/mlcommons/hpc_results_v1.0, "
              "NVIDIA/benchmarks/deepcam/implementations/pytorch/configs: config_DGXA100_64x8x2.sh "
              "LOCAL_BATCH_SIZE=2, config_DGXA100_256x8x1.sh LOCAL_BATCH_SIZE=1)",
    "caveats": "those runs used mixed precision (PRECISION_MODE=amp) and the LAMB optimizer, and chose the local "
               "batch for time to train at scale, not as the most that fits; v0.7 submissions are not checked here",
}


class MemoryBenchError(HpcdlError, ValueError):
    """Input ``hpcdl bench memory`` cannot run: no batches, a bad budget or batch, an input shape it cannot use."""


@dataclass
class MethodResult:
    """What was measured for one method: peaks per batch (with breakdowns), budget searches, the projection."""

    method: str
    kind: str
    runtime: str
    peaks: list[dict] = field(default_factory=list)
    per_sample_bytes: float | None = None
    per_sample_ratio_to_baseline: float | None = None
    fixed_bytes: float | None = None
    footprint_per_sample_bytes: float | None = None
    footprint_fixed_bytes: float | None = None
    searches: list[dict] = field(default_factory=list)
    projection: list[dict] = field(default_factory=list)


@dataclass
class MemoryBenchReport:
    model: str
    scale: str
    input_shape: list[int] | None
    device: str
    measurement: str
    batches: list[int]
    budgets: list[dict]
    methods: list[MethodResult]
    projection_note: str
    mlperf_deepcam: dict
    warmup_steps: int = 1
    #: False while probes are still to come (a report written as the run goes, :func:`run_memory_benchmark`'s
    #: ``partial``): what it holds was measured, but the per-sample figures and searches may be missing.
    complete: bool = True


def parse_batches(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> (1, 2, 4): distinct positive batch sizes, in increasing order."""
    pieces = [piece.strip() for piece in str(text).split(",") if piece.strip()]
    if not pieces:
        raise MemoryBenchError(f"--batches is a comma-separated list of batch sizes like 1,2,4; got {text!r}")
    try:
        batches = sorted({int(piece) for piece in pieces})
    except ValueError:
        raise MemoryBenchError(f"--batches holds whole numbers like 1,2,4; got {text!r}") from None
    if batches[0] < 1:
        raise MemoryBenchError(f"batch sizes must be >= 1, got {text!r}")
    return tuple(batches)


def parse_budgets(text: str) -> tuple[tuple[str, int], ...]:
    """``"512MiB,2GiB"`` -> (("512MiB", 536870912), ("2GiB", 2147483648)); none (an empty string) is allowed."""
    budgets = []
    for piece in (piece.strip() for piece in str(text).split(",")):
        if not piece:
            continue
        try:
            budgets.append((piece, parse_bytes(piece)))
        except (ValueError, TypeError) as err:
            raise MemoryBenchError(f"--budgets holds memory sizes like 512MiB,2GiB; {piece!r}: {err}") from None
    return tuple(budgets)


def parse_input_shape(text: str | None) -> tuple[int, ...] | None:
    """``"16x768x1152"`` -> (16, 768, 1152); None stays None (the scale's own shape)."""
    if text is None:
        return None
    try:
        shape = tuple(int(piece) for piece in str(text).lower().split("x"))
    except ValueError:
        raise MemoryBenchError(f"--input-shape is sizes joined by x, like 16x768x1152; got {text!r}") from None
    if not all(size > 0 for size in shape):
        raise MemoryBenchError(f"--input-shape sizes must be > 0, got {text!r}")
    return shape


def _per_sample(peaks: list[dict], key: Callable[[dict], float]) -> tuple[float, float] | None:
    """(per-sample bytes, fixed bytes) of ``key`` through the two largest batches; None for one batch.

    The two largest, not the smallest and the largest: what a budget search and a device projection
    extrapolate is the cost of one more sample at a large batch. At the smallest batches some scratch
    still grows with the batch up to the thread count and then stops (oneDNN's backward of a dilated
    convolution holds one im2col buffer per thread that has a sample: 243 MiB each in DeepCAM's ASPP,
    docs/results/scale), which a slope from batch 1 would count as a per-sample cost.
    """
    if len(peaks) < 2:
        return None
    first, last = peaks[-2], peaks[-1]
    slope = (key(last) - key(first)) / (last["batch"] - first["batch"])
    return slope, key(last) - last["batch"] * slope


def search_start(fit: tuple[float, float] | None, budget: int, limit: int) -> int:
    """Where a budget search starts: the largest batch whose step peak the linear fit (per-sample bytes,
    fixed bytes) of the measured peaks keeps within ``budget``, between 1 and ``limit``; 1 without a fit or
    where the peak does not grow with the batch."""
    if fit is None or fit[0] <= 0:
        return 1
    per_sample, fixed = fit
    return min(max(math.floor((budget - fixed) / per_sample), 1), limit)


def project(per_sample: float, fixed: float, learning: tuple[float, float] | None = None) -> list[dict]:
    """The largest batch with ``fixed + batch * per_sample`` within each device of :data:`PROJECTED_GPUS`, and
    with ``learning``'s (per-sample, fixed) too where given (the learning steps' line: a run meets them as well);
    ``limited_by`` says which line set the batch."""
    rows = []
    for gpu, capacity in PROJECTED_GPUS:
        batch, limited_by = _largest(capacity, per_sample, fixed), "step"
        if learning is not None:
            probes = _largest(capacity, *learning)
            if probes is not None and (batch is None or probes < batch):
                batch, limited_by = probes, "learning steps"
        rows.append({"gpu": gpu, "capacity_bytes": capacity, "projected_batch": batch, "limited_by": limited_by})
    return rows


def _largest(capacity: int, per_sample: float, fixed: float) -> int | None:
    """The largest batch with ``fixed + batch * per_sample`` within ``capacity``; None where the bytes do not grow
    with the batch (no linear bound to project)."""
    return max(math.floor((capacity - fixed) / per_sample), 0) if per_sample > 0 else None


def _learning_footprint(row: dict) -> float:
    """What a device holds at a measured batch's learning steps (an adaptive policy's probes): the footprint
    with their peak in place of the usual step's."""
    return row["breakdown"]["footprint"] - row["peak_bytes"] + row["learning_peak_bytes"]


def run_memory_benchmark(
    model: str,
    scale: str,
    *,
    methods: str | list[str | Method] = DEFAULT_METHODS,
    batches: tuple[int, ...] = (1, 2),
    budgets: tuple[tuple[str, int], ...] = (),
    input_shape: tuple[int, ...] | None = None,
    options: dict | None = None,
    device: str = "cpu",
    threads: int | None = None,
    limit: int = 1 << 16,
    warmup_steps: int = 1,
    progress: Callable[[str], None] = lambda line: None,
    partial: Callable[[MemoryBenchReport], object] | None = None,
) -> MemoryBenchReport:
    """Measure every method (see the module docstring); ``progress`` gets a line per probe, and an indented
    line per step a probe runs (its time); ``partial`` (if given) the report so far after every probe and
    search, marked incomplete, so that a run stopped after hours keeps what it measured.

    Every probe runs ``warmup_steps`` steps before the measured one (see :class:`hpcdl.memory.TrainStep`).
    """
    import torch

    from hpcdl import memory
    from hpcdl.train.method_spec import parse_methods  # imported here: it loads torch, and `hpcdl --help` reads
                                                       # DEFAULT_METHODS from this module

    parsed: list[Method] = parse_methods(methods)
    if not batches:
        raise MemoryBenchError("give at least one batch size (--batches 1,2,4)")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 1:
        raise MemoryBenchError(f"--warmup-steps is a whole number of steps >= 1, got {warmup_steps!r}")
    target = torch.device(device)
    if target.type not in ("cpu", "cuda"):
        raise MemoryBenchError(f"--device is cpu or cuda[:N], got {device!r}")
    if target.type == "cuda" and not torch.cuda.is_available():
        raise MemoryBenchError("--device cuda needs a GPU that torch can see; this machine has none")
    for method in parsed:
        if method.needs_gpu and target.type != "cuda":
            raise MemoryBenchError(f"method {method.spec!r} offloads to host memory and needs --device cuda")
    workload = memory.Workload.of(model, scale=scale, options=dict(options or {}), input_shape=input_shape)
    _check_forward(workload)  # an unknown model, scale, option or input shape fails here, before any probe

    def step_line(line: str) -> None:
        progress(f"    {line}")

    process = memory.FreshProcesses(threads, progress=step_line) if target.type == "cpu" else None
    started = time.perf_counter()
    count = 0

    def measured(label: str, batch: int, peak) -> None:
        nonlocal count
        count += 1
        progress(f"[{count}] {label}: batch {batch} peak {human_bytes(peak.peak_bytes)} "
                 f"({time.perf_counter() - started:.1f} s elapsed)")

    results: list[MethodResult] = []
    kind = "cuda_max_allocated" if target.type == "cuda" else "cpu_peak_rss"

    def report(complete: bool) -> MemoryBenchReport:
        return _report(results, complete, model=model, scale=scale, input_shape=input_shape, device=device,
                       measurement=kind, batches=batches, budgets=budgets, warmup_steps=warmup_steps)

    def save_partial() -> None:
        if partial is not None:
            partial(report(complete=False))

    for method in parsed:
        runtime = method.activation_method()
        result = MethodResult(method.spec, method.kind, runtime.describe())
        results.append(result)
        for batch in batches:
            progress(f"measuring {method.spec} at batch {batch} ...")
            setup = memory.TrainStep(workload, batch, device=device, method=runtime, warmup_steps=warmup_steps)
            with memory.step_progress(step_line):  # on CUDA the steps run here
                peak = memory.peak(setup, device=device, process=process)
            measured(method.spec, batch, peak)
            kind = peak.method
            result.peaks.append({"batch": batch, "peak_bytes": peak.peak_bytes,
                                 "activation_original_bytes": peak.info["activation_original_bytes"],
                                 "activation_packed_bytes": peak.info["activation_packed_bytes"],
                                 "breakdown": memory.breakdown(peak),
                                 "learning_steps": peak.info.get("learning_steps", 0),
                                 "learning_peak_bytes": peak.info.get("learning_peak_bytes")})
            save_partial()
        step = _per_sample(result.peaks, lambda row: row["peak_bytes"])
        for text, budget in budgets:
            progress(f"searching the largest batch of {method.spec} within {text} ...")
            start = search_start(step, budget, limit)
            with memory.step_progress(step_line):
                search = memory.search_batch(
                    workload, None, budget, device=device, method=runtime, start=start, limit=limit,
                    process=process, warmup_steps=warmup_steps,
                    on_probe=functools.partial(measured, f"{method.spec} within {text}"))
            # every peak as the search held it to the budget: the step's, or its learning steps' where higher
            result.searches.append({"budget": text, "budget_bytes": budget, "start": start, "batch": search.batch_size,
                                    "peak_bytes": search.report.worst_bytes, "hit_limit": search.hit_limit,
                                    "probes": [[batch, probe.worst_bytes] for batch, probe in search.probes]})
            save_partial()
    return report(complete=True)


def _report(results: list[MethodResult], complete: bool, *, model: str, scale: str,
            input_shape: tuple[int, ...] | None, device: str, measurement: str, batches: tuple[int, ...],
            budgets: tuple[tuple[str, int], ...], warmup_steps: int) -> MemoryBenchReport:
    """The report of what ``results`` hold so far: each method's per-sample figures and projection from its
    measured peaks, and their ratios to the baseline's."""
    for result in results:
        step = _per_sample(result.peaks, lambda row: row["peak_bytes"])
        footprint = _per_sample(result.peaks, lambda row: row["breakdown"]["footprint"])
        learned = all(row.get("learning_peak_bytes") for row in result.peaks)
        learning = _per_sample(result.peaks, _learning_footprint) if learned else None
        if step is not None and footprint is not None:
            result.per_sample_bytes, result.fixed_bytes = step
            result.footprint_per_sample_bytes, result.footprint_fixed_bytes = footprint
            result.projection = project(*footprint, learning)
    baseline = next((r for r in results if r.kind == "baseline" and r.per_sample_bytes), None)
    for result in results:
        if baseline is not None and result.per_sample_bytes is not None:
            assert baseline.per_sample_bytes is not None
            result.per_sample_ratio_to_baseline = result.per_sample_bytes / baseline.per_sample_bytes
    return MemoryBenchReport(
        model=model, scale=scale, input_shape=list(input_shape) if input_shape else None, device=device,
        measurement=measurement, batches=list(batches),
        budgets=[{"budget": text, "budget_bytes": budget} for text, budget in budgets],
        methods=[replace(result, peaks=list(result.peaks), searches=list(result.searches)) for result in results],
        projection_note=(
            "PROJECTION, not a measurement: the largest batch b with resident(b) + step_peak(b) <= the device's "
            "memory, both taken as linear in b through the two largest measured batches, and the same with the "
            "learning steps' peak where every batch measured some (an adaptive policy's probes: marked where they "
            "set the batch). Bytes measured "
            f"on {device} ({measurement}); on a GPU this assumes the same bytes, and ignores the CUDA context, the "
            "caching allocator's slack, cuDNN workspaces and mixed precision."),
        mlperf_deepcam=MLPERF_DEEPCAM, warmup_steps=warmup_steps, complete=complete,
    )


def _check_forward(workload) -> None:
    """Runs the model's forward on one sample of its batch, without gradients, so that a model that cannot take
    the input (a fixed-size head given another ``--input-shape``) fails here with what it said, not as a
    traceback from the first measuring process."""
    import torch

    model, x, _, _ = workload.build(1, 0)
    try:
        with torch.no_grad():
            model.eval()(x[:1])
    except (RuntimeError, ValueError, TypeError, IndexError) as err:
        raise MemoryBenchError(f"{workload.describe()} cannot run on its batch of shape {tuple(x.shape)}: "
                               f"{type(err).__name__}: {err}; give an --input-shape the model takes (or none: "
                               f"the scale's own)") from err


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths)))
             for line in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _size(value) -> str:
    return "-" if value is None else human_bytes(value)


def format_report(report: MemoryBenchReport) -> str:
    """The report as text tables: peaks per batch, per-sample bytes, searches, breakdowns, the projection."""
    shape = f", input {'x'.join(map(str, report.input_shape))}" if report.input_shape else ""
    out = [f"model {report.model} ({report.scale}{shape}), device {report.device}, peaks: {report.measurement}", ""]
    header = ("method", *(f"peak @{b}" for b in report.batches), "per sample", "vs baseline",
              *(f"max batch <= {b['budget']}" for b in report.budgets))
    rows = []
    for result in report.methods:
        ratio = result.per_sample_ratio_to_baseline
        searches = [f"{s['batch']}{'+' if s['hit_limit'] else ''}" for s in result.searches]
        rows.append((result.method, *(human_bytes(p["peak_bytes"]) for p in result.peaks),
                     _size(result.per_sample_bytes), "-" if ratio is None else f"{ratio:.2f}x", *searches))
    warmup = f" after {report.warmup_steps} warm-up steps" if report.warmup_steps > 1 else ""
    out += [f"Step peak (above the state resident before the step){warmup} per batch:", *_table(header, rows), ""]
    learning: list[tuple[str, ...]] = [
        (f"{result.method} @{peak['batch']}", str(peak["learning_steps"]), human_bytes(peak["learning_peak_bytes"]))
        for result in report.methods for peak in result.peaks if peak.get("learning_steps")]
    if learning:
        out += ["Learning steps passed over before the measured step (an adaptive policy's probes, whose replays "
                "run beside the step; a run meets this peak at every probe, and the budget searches fit it too):",
                *_table(("method", "steps", "their peak"), learning), ""]
    parts = ("resident", "gradients", "saved_activations", "packed_activations", "decoded_peak",
             "largest_packed_original", "held_originals_peak", "remainder")
    rows = [(f"{result.method} @{peak['batch']}", human_bytes(peak["peak_bytes"]), peak["breakdown"]["peak_in"],
             *(_size(peak["breakdown"][part]) for part in parts))
            for result in report.methods for peak in result.peaks[-1:]]
    out += ["Breakdown of the step peak at the largest batch (peak = gradients + saved activations + decoded "
            "peak + remainder; resident held before the step; largest packed tensor and originals still held "
            "after packing not summed):",
            *_table(("method", "peak", "peak in", "resident", "gradients", "saved act.", "packed", "decoded",
                     "largest raw", "held raw", "remainder"), rows), ""]
    projected = [r for r in report.methods if r.projection]
    if projected:
        gpus = [row["gpu"] for row in projected[0].projection]
        rows = [(r.method, _size(r.footprint_per_sample_bytes), _size(r.footprint_fixed_bytes),
                 *(_projected(row) for row in r.projection))
                for r in projected]
        mlperf = report.mlperf_deepcam
        out += ["PROJECTED largest per-GPU batch (not measured on a GPU; " + report.projection_note.split(": ", 1)[1],
                *_table(("method", "per sample", "fixed", *gpus), rows),
                f"For comparison, MLPerf HPC DeepCAM ran {'-'.join(map(str, mlperf['local_batch_per_gpu']))} samples "
                f"per GPU: {mlperf['source']}; {mlperf['caveats']}."]
    return "\n".join(out)


def _projected(row: dict) -> str:
    """A projection cell: the batch, marked where the learning steps set it."""
    if row["projected_batch"] is None:
        return "-"
    return f"{row['projected_batch']}{' (probes)' if row.get('limited_by') == 'learning steps' else ''}"


def write_json(report: MemoryBenchReport, out_dir: str | Path) -> Path:
    """Write ``bench-memory.json`` (a partial report too: its ``complete`` says so), whole or not at all."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    json_path, staged = folder / "bench-memory.json", folder / "bench-memory.json.part"
    staged.write_text(json.dumps(asdict(report), indent=2) + "\n")
    staged.replace(json_path)  # a run stopped while writing leaves the previous version, not half of this one
    return json_path


def write_report(report: MemoryBenchReport, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``bench-memory.json`` and ``bench-memory.png`` (peak vs batch, one line per method, budgets dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    json_path, png_path = write_json(report, out_dir), Path(out_dir) / "bench-memory.png"
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for result in report.methods:
        axes.plot([p["batch"] for p in result.peaks], [p["peak_bytes"] / 2**20 for p in result.peaks],
                  marker="o", label=result.method)
    for budget in report.budgets:
        axes.axhline(budget["budget_bytes"] / 2**20, linestyle="--", color="gray", linewidth=1)
        axes.annotate(f"budget {budget['budget']}", (report.batches[0], budget["budget_bytes"] / 2**20),
                      textcoords="offset points", xytext=(2, 3), fontsize=8, color="gray")
    shape = f", input {'x'.join(map(str, report.input_shape))}" if report.input_shape else ""
    axes.set(xlabel="batch size", ylabel=f"step peak (MiB, {report.measurement})",
             title=f"{report.model} ({report.scale}{shape}) on {report.device}")
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(png_path, dpi=120)
    plt.close(figure)
    return json_path, png_path
