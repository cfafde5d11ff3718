"""``hpcdl bench codecs``: every codec on the activations real models save, side by side with memcpy.

For each codec configuration (``sz``, ``sz3`` and ``zfp`` at each ``rel`` bound, ``sz`` again with the zstd
entropy stage; ``quant`` at 2, 4 and 8 bits;
``cast`` to bf16) it encodes and decodes every float tensor of :func:`benchmark_activations` and reports:
the compression ratio (original bytes / ``Packed.nbytes``, all tensors together), the largest error over the
bound and over the tensor's value range (judged by :func:`check_bound`, the one definition of the guarantee),
the rule violations it found, and compress and decompress throughput in GB/s of original bytes (the best of
``repeats`` passes over all tensors). The same run measures the machine's memcpy GB/s on the same tensors,
the ceiling any codec's throughput is to be read against.

Throughput is measured twice: per wall-clock second (what the issue's targets are about), and per CPU-second
this process used, summed over its threads (``*_cpu_gbps``; CPU tensors only). On a machine shared with other
work the wall-clock figure measures the load as much as the codec; the CPU figure does not, and for a
single-threaded codec it is what an idle machine's wall clock would show.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hpcdl.bench.activations import benchmark_activations, describe
from hpcdl.bench.load import background_load
from hpcdl.bench.machine import describe_machine
from hpcdl.compress import Codec, check_bound, get_codec, value_range

DEFAULT_BOUNDS = (1e-1, 1e-2, 1e-3)
QUANT_BITS = (2, 4, 8)
BOUNDED_IDS = ("sz", "sz3", "zfp")
# the issue's targets for sz against sz3 at rel 1e-2 on the same tensors
TARGET_BOUND = 1e-2
TARGET_SPEEDUP = 4.0
TARGET_RATIO_FRACTION = 0.75


@dataclass(frozen=True)
class Entry:
    """One row of the benchmark: a label and a codec config."""

    label: str
    config: dict


def codec_suite(bounds: tuple[float, ...] = DEFAULT_BOUNDS, only: tuple[str, ...] = ()) -> list[Entry]:
    """The configurations the benchmark runs, error-bounded ones at each ``rel`` bound first; ``only`` keeps
    the entries of those codec ids (all when empty)."""
    known = (*BOUNDED_IDS, "quant", "cast")
    unknown = sorted(set(only) - set(known))
    if unknown:
        raise ValueError(f"the codec benchmark has no codec {', '.join(unknown)}; choose from {', '.join(known)}")
    entries = [
        Entry(f"{codec_id} rel {bound:g}", {"id": codec_id, "mode": "rel", "bound": bound})
        for bound in bounds
        for codec_id in BOUNDED_IDS
    ]
    # sz with the lossless zstd stage over its stream (hpcdl.compress.entropy): the same errors, fewer bytes
    entries += [Entry(f"sz+zstd rel {bound:g}", {"id": "sz", "mode": "rel", "bound": bound, "entropy": "zstd"})
                for bound in bounds]
    entries += [Entry(f"quant {bits}-bit", {"id": "quant", "bits": bits, "group_size": 256, "seed": 0}) for bits in QUANT_BITS]
    entries.append(Entry("cast bf16", {"id": "cast", "dtype": "bf16"}))
    return [entry for entry in entries if not only or entry.config["id"] in only]


def run_codec_benchmark(bounds: tuple[float, ...] = DEFAULT_BOUNDS, quick: bool = False, repeats: int | None = None,
                        device: str = "cpu", seed: int = 0, threads: int | None = None, progress=None,
                        only: tuple[str, ...] = (), load: int = 0) -> dict:
    """Capture the activations, run the entries of :func:`codec_suite` on them, and return the JSON-safe report.

    ``threads`` sets torch's intra-op threads for the run (the sz host kernels use as many as torch does);
    None keeps the current setting. ``only`` limits the codecs (ids); ``load`` busy processes run beside the
    measurements (:func:`hpcdl.bench.load.background_load`), as a training job's other threads would.
    """
    if not bounds:
        raise ValueError("give at least one error bound, e.g. --bounds 1e-1,1e-2,1e-3")
    repeats = repeats if repeats is not None else (1 if quick else 3)
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads or previous_threads)
    suite = codec_suite(tuple(bounds), tuple(only))
    try:
        with background_load(load):
            report = _run(suite, tuple(bounds), quick, repeats, device, seed, progress)
        report["machine"]["background_load_processes"] = load
        return report
    finally:
        torch.set_num_threads(previous_threads)


def _run(suite: list[Entry], bounds: tuple[float, ...], quick: bool, repeats: int, device: str, seed: int,
         progress) -> dict:
    workloads = benchmark_activations(quick=quick, seed=seed, device=device)
    floats = [(w.model, t) for w in workloads for t in w.tensors if t.dtype.is_floating_point]
    report = {
        "command": "hpcdl bench codecs",
        "quick": quick,
        "device": device,
        "repeats": repeats,
        "bounds": list(bounds),
        "machine": _machine(device),
        "workloads": [describe(w) for w in workloads],
        "memcpy_gbps": memcpy_gbps([t for _, t in floats], repeats),
        "throughput_note": "GB/s of original bytes, best of repeats; *_cpu_gbps per CPU-second of this process",
        "results": [],
    }
    for entry in suite:
        if progress:
            progress(entry.label)
        report["results"].append(measure(entry, floats, repeats))
    report["targets"] = sz_targets(report["results"])
    return report


def measure(entry: Entry, tensors: list[tuple[str, torch.Tensor]], repeats: int) -> dict:
    """One result row: ratio, errors and throughput of ``entry`` over ``tensors`` ((model, tensor) pairs)."""
    row = {"label": entry.label, "codec": entry.config["id"], "config": entry.config, "status": "ok", "reason": None}
    try:
        codec = get_codec(entry.config)
    except ImportError as err:
        return _not_run(row, "skipped", str(err))
    device = tensors[0][1].device if tensors else torch.device("cpu")
    if entry.config["id"] in ("sz3", "zfp") and device.type != "cpu":
        return _not_run(row, "skipped", f"{entry.config['id']} runs on CPU tensors only")
    try:
        packed, compress = _best_time(lambda: [codec.encode(t) for _, t in tensors], repeats, device)
        restored, decompress = _best_time(lambda: [codec.decode(p) for p in packed], repeats, device)
    except ValueError as err:
        return _not_run(row, "failed", f"the codec refused a tensor: {err}")
    original = sum(t.numel() * t.element_size() for _, t in tensors)
    packed_bytes = sum(p.nbytes for p in packed)
    row.update(
        tensors=len(tensors),
        original_bytes=original,
        packed_bytes=packed_bytes,
        ratio=original / packed_bytes if packed_bytes else None,
        ratio_per_model=_ratio_per_model(tensors, packed),
        compress_gbps=_gbps(original, compress.wall_s),
        decompress_gbps=_gbps(original, decompress.wall_s),
        compress_cpu_gbps=_gbps(original, compress.cpu_s),
        decompress_cpu_gbps=_gbps(original, decompress.cpu_s),
        **_errors(codec, [t for _, t in tensors], restored),
    )
    return row


def memcpy_gbps(tensors: list[torch.Tensor], repeats: int) -> float | None:
    """GB/s of copying ``tensors`` into preallocated buffers: the ceiling for a codec's throughput."""
    if not tensors:
        return None
    targets = [torch.empty_like(t) for t in tensors]
    _, timing = _best_time(lambda: [d.copy_(s) for d, s in zip(targets, tensors)], repeats, tensors[0].device)
    return _gbps(sum(t.numel() * t.element_size() for t in tensors), timing.wall_s)


def sz_targets(results: list[dict]) -> dict:
    """The issue's targets for ``sz`` against ``sz3`` at ``rel`` 1e-2, from the measured rows (None where unmeasured)."""
    rows = {row["label"]: row for row in results if row["status"] == "ok"}
    sz, sz3 = rows.get(f"sz rel {TARGET_BOUND:g}"), rows.get(f"sz3 rel {TARGET_BOUND:g}")

    def target(numerator: str, denominator: str, of: dict | None, over: dict | None, goal: float) -> dict:
        measured = _quotient(of and of[numerator], over and over[denominator])
        # per CPU-second: the same comparison with the load of other processes taken out
        cpu = _quotient(of and of.get(numerator.replace("_gbps", "_cpu_gbps")),
                        over and over.get(denominator.replace("_gbps", "_cpu_gbps"))) if "_gbps" in numerator else None
        return {"measured": measured, "measured_per_cpu_second": cpu, "target": goal,
                "met": None if measured is None else measured >= goal}

    return {
        "bound": TARGET_BOUND,
        "sz_over_sz3_compress_speed": target("compress_gbps", "compress_gbps", sz, sz3, TARGET_SPEEDUP),
        "sz_over_sz3_ratio": target("ratio", "ratio", sz, sz3, TARGET_RATIO_FRACTION),
        "sz_decompress_over_compress_speed": target("decompress_gbps", "compress_gbps", sz, sz, 1.0),
    }


def format_report(report: dict) -> str:
    """The report as a Markdown table plus the workloads, memcpy ceiling and sz targets."""
    lines = [
        f"activations ({'--quick' if report['quick'] else 'full'}, device {report['device']}, "
        f"best of {report['repeats']}, {report['machine']['torch_threads']} torch threads, "
        f"OMP_WAIT_POLICY {report['machine']['openmp_wait_policy']}, "
        f"{report['machine'].get('background_load_processes', 0)} busy background processes, "
        f"sz backend {_sz_backend(report['machine'])}):"
    ]
    for workload in report["workloads"]:
        lines.append(f"  {workload['model']} {workload['scale']} batch {workload['batch_size']}: "
                     f"{workload['tensors']} saved tensors, {workload['bytes'] / 1e6:.1f} MB")
    memcpy = report["memcpy_gbps"]
    lines.append(f"memcpy: {memcpy:.2f} GB/s" if memcpy else "memcpy: not measured")
    lines += [
        "",
        "| codec | ratio | max err / bound | max err / range | bound violations | zero/sign/NaN mismatches "
        "| compress GB/s | decompress GB/s | compress GB/CPU-s | decompress GB/CPU-s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["results"]:
        if row["status"] != "ok":
            lines.append(f"| {row['label']} | {row['status']}: {row['reason']} | | | | | | | | |")
            continue
        bounded = row["max_error_over_bound"] is not None
        mismatches = row["zero_mismatches"] + row["sign_flips"] + row["nonfinite_mismatches"]
        lines.append(
            f"| {row['label']} | {_fmt(row['ratio'], '.2f')} | {_fmt(row['max_error_over_bound'], '.3f')} | "
            f"{_fmt(row['max_error_over_range'], '.2e')} | {row['bound_violations'] if bounded else '-'} | "
            f"{mismatches} | {_fmt(row['compress_gbps'], '.3f')} | {_fmt(row['decompress_gbps'], '.3f')} | "
            f"{_fmt(row['compress_cpu_gbps'], '.3f')} | {_fmt(row['decompress_cpu_gbps'], '.3f')} |"
        )
    lines.append("")
    for name, target in report["targets"].items():
        if name == "bound":
            continue
        verdict = "not measured" if target["met"] is None else "met" if target["met"] else "MISSED"
        per_cpu = target["measured_per_cpu_second"]
        lines.append(f"target {name} at rel {report['targets']['bound']:g}: {_fmt(target['measured'], '.2f')}"
                     f"{'' if per_cpu is None else f' ({per_cpu:.2f} per CPU-second)'} "
                     f"(need >= {target['target']}) {verdict}")
    return "\n".join(lines)


def write_report(report: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def _errors(codec: Codec, originals: list[torch.Tensor], restored: list[torch.Tensor]) -> dict:
    """Worst error over the bound (error-bounded codecs) and over the value range, and rule violations, summed.

    The error over the range skips constant tensors, whose range is 0 (any error there is infinite relative to it).
    """
    bounded = codec.error_bounded
    config = codec.get_config()  # an error-bounded codec's config names its mode and bound (as the session reads it)
    mode, bound = (config["mode"], config["bound"]) if bounded else ("rel", 1.0)
    totals = {"max_error_over_bound": 0.0 if bounded else None, "max_error_over_range": 0.0, "bound_violations": 0,
              "nonfinite_mismatches": 0, "zero_mismatches": 0, "sign_flips": 0}
    for original, decoded in zip(originals, restored):
        report = check_bound(original, decoded, mode, bound)
        if value_range(original) > 0:
            over_range = report.max_error_over_bound * bound if mode == "rel" else \
                check_bound(original, decoded, "rel", 1.0).max_error_over_bound
            totals["max_error_over_range"] = max(totals["max_error_over_range"], over_range)
        if bounded:
            totals["max_error_over_bound"] = max(totals["max_error_over_bound"], report.max_error_over_bound)
            totals["bound_violations"] += report.bound_violations
        totals["nonfinite_mismatches"] += report.nonfinite_mismatches
        totals["zero_mismatches"] += report.zero_mismatches
        totals["sign_flips"] += report.sign_flips
    return totals


@dataclass(frozen=True)
class Timing:
    """Shortest wall-clock and shortest process CPU time of several runs (CPU time None on a GPU)."""

    wall_s: float
    cpu_s: float | None


def _best_time(work, repeats: int, device: torch.device):
    """(result of the last run, :class:`Timing`) of ``repeats`` runs of ``work``."""
    best_wall = best_cpu = float("inf")
    result = None
    for _ in range(repeats):
        _synchronize(device)
        wall, cpu = time.perf_counter(), time.process_time()
        result = work()
        _synchronize(device)
        best_wall = min(best_wall, time.perf_counter() - wall)
        best_cpu = min(best_cpu, time.process_time() - cpu)
    return result, Timing(best_wall, best_cpu if device.type == "cpu" else None)


def _gbps(nbytes: int, seconds: float | None) -> float | None:
    return nbytes / seconds / 1e9 if seconds else None


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _ratio_per_model(tensors: list[tuple[str, torch.Tensor]], packed: list) -> dict:
    original: dict[str, int] = {}
    compressed: dict[str, int] = {}
    for (model, tensor), item in zip(tensors, packed):
        original[model] = original.get(model, 0) + tensor.numel() * tensor.element_size()
        compressed[model] = compressed.get(model, 0) + item.nbytes
    return {model: original[model] / compressed[model] for model in original}


def _not_run(row: dict, status: str, reason: str) -> dict:
    """``row`` for an entry that did not run (``status`` "skipped" or "failed"), with every field present."""
    row.update(status=status, reason=reason, tensors=0, original_bytes=0, packed_bytes=0, ratio=None,
               ratio_per_model={}, compress_gbps=None, decompress_gbps=None, compress_cpu_gbps=None,
               decompress_cpu_gbps=None, max_error_over_bound=None,
               max_error_over_range=None, bound_violations=0, nonfinite_mismatches=0, zero_mismatches=0, sign_flips=0)
    return row


def _machine(device: str) -> dict:
    from hpcdl.compress.blocks import backend_module, host

    backend = backend_module("auto", torch.device(device)).__name__.rsplit(".", 1)[-1]
    return {
        **describe_machine(),
        "sz_backend": backend,
        "sz_host_isa": host.active_isa() if backend == "host" else None,
        "gpu": torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else None,
    }


def _sz_backend(machine: dict) -> str:
    """The sz kernels that ran: "host (avx512)", "cuda", "reference"."""
    isa = machine.get("sz_host_isa")
    return f"{machine['sz_backend']} ({isa})" if isa else machine["sz_backend"]


def _quotient(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator and denominator else None


def _fmt(value: float | None, style: str) -> str:
    return "-" if value is None else format(value, style)
