"""``hpcdl bench gradients``: how far each policy moves the parameter gradients, on every zoo model.

Issue 13: a default policy must keep the gradient cosine >= 0.99 (:data:`COSINE_FLOOR`) on any model a user
brings. For each model of the zoo (``hpcdl models``) at a scale (``full``: the published configuration and its
real input shape), with random weights (seeded) and a random batch of its input
(:meth:`hpcdl.models.ModelFamily.example_batch`), this runs one forward and backward exactly and then under
each policy, with the same weights, input and dropout masks (:mod:`hpcdl.runtime.fidelity`), and reports the
cosine of the concatenated parameter gradients to the exact ones, the worst cosine of one module's gradients,
and the activation compression ratio of the step (``session.stats.ratio``, as the trainer reports it).

A policy that probes (``adaptive``: its first step is an uncompressed probe) runs on the same batch until a
step does not probe; that step is the one measured, so the numbers are those of a compressed step under the
bounds the probes chose. The issue's two reproductions (:data:`REPRODUCTIONS`) run too (``--cases``).

Random weights and inputs are not a trained model on real data: the gradients of a trained model, and of
real inputs, have other spreads. The cosine here is that of one step, not of a training run's result.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from hpcdl.bench.machine import describe_machine
from hpcdl.errors import HpcdlError
from hpcdl.runtime.fidelity import gradient_cosine, module_cosines, step_gradients
from hpcdl.runtime.policy import DEFAULT_POLICY_SPEC, policy_from_spec

#: The issue's line: a default policy keeps the gradient cosine at least this on every model.
COSINE_FLOOR = 0.99

#: The policies measured when none are named: the old default, a ten times tighter bound, the adaptive policy.
DEFAULT_POLICIES = ("sz:rel=1e-2", "sz:rel=1e-3", "adaptive")

#: Steps on the same batch a probing policy may take before one is compressed; more is an error.
MAX_PROBE_STEPS = 4


class GradientBenchError(HpcdlError, ValueError):
    """Input ``hpcdl bench gradients`` cannot use: an unknown model or case, no policies, a bad batch."""


def batchnorm_reproduction():
    """Issue 13's batch-norm case: channel spreads from 1e-2 to 10 behind a 1x1 conv, ``BatchNorm2d(64)``,
    x ``(2, 64, 32, 32)``. (model, input, loss function)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(64, 64, 1, bias=False)
    with torch.no_grad():
        conv.weight.copy_(torch.eye(64).view(64, 64, 1, 1) * torch.logspace(-2, 1, 64).view(-1, 1, 1, 1)
                          + 0.01 * torch.randn(64, 64, 1, 1))
    model = nn.Sequential(conv, nn.BatchNorm2d(64))
    x = torch.randn(2, 64, 32, 32)
    target = torch.randn(2, 64, 32, 32)
    return model, x, lambda out: (out * target).sum()


class SharpAttention(nn.Module):
    """``(q(x) @ k(x)^T).softmax(-1) @ v(x)``, unscaled, so the softmax is sharp (probabilities 1e-9 to 0.85)."""

    def __init__(self, dim: int = 32):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x):
        return (self.q(x) @ self.k(x).transpose(-1, -2)).softmax(-1) @ self.v(x)


def attention_reproduction():
    """Issue 13's attention case: :class:`SharpAttention` with d = 32 on 196 tokens, batch 4."""
    torch.manual_seed(0)
    model = SharpAttention()
    x = torch.randn(4, 196, 32)
    target = torch.randn(4, 196, 32)
    return model, x, lambda out: (out * target).sum()


#: The issue's reproductions by name: each a function giving (model, input, loss function).
REPRODUCTIONS: dict[str, Callable] = {"batchnorm": batchnorm_reproduction, "attention": attention_reproduction}


@dataclass
class PolicyResult:
    """One policy on one model: the cosines, the compression ratio, the probe steps before the measured one.

    ``worst_module_norm_share`` is the norm of the worst module's exact gradient over the whole exact gradient's:
    a module whose gradient is a tiny share (one whose gradient sums terms that cancel) can have a poor cosine
    that moves the whole gradient very little."""

    policy: str
    cosine: float | None = None
    worst_module: str | None = None
    worst_module_cosine: float | None = None
    worst_module_norm_share: float | None = None
    ratio: float | None = None
    original_bytes: int = 0
    packed_bytes: int = 0
    probe_steps: int = 0
    seconds: float = 0.0
    error: str | None = None


@dataclass
class ModelResult:
    """Every policy on one model (or reproduction) at one scale and batch."""

    model: str
    scale: str
    input_shape: list[int]
    batch: int
    parameters: int
    exact_seconds: float
    policies: list[PolicyResult] = field(default_factory=list)
    error: str | None = None


def measure_policies(model: nn.Module, inputs, loss_fn: Callable, policies: list[str], *, seed: int = 0,
                     progress: Callable[[str], None] = lambda line: None) -> tuple[float, list[PolicyResult]]:
    """The exact step's seconds and each policy's :class:`PolicyResult` on one model and batch."""
    start = time.perf_counter()
    exact = step_gradients(model, inputs, loss_fn, seed=seed).gradients
    exact_seconds = time.perf_counter() - start
    results = []
    for spec in policies:
        progress(f"    {spec}")
        policy = policy_from_spec(spec)
        result = PolicyResult(spec)
        start = time.perf_counter()
        try:
            step = step_gradients(model, inputs, loss_fn, policy, seed=seed)
            while step.probed:
                result.probe_steps += 1
                if result.probe_steps > MAX_PROBE_STEPS:
                    raise GradientBenchError(f"{spec} still probed after {MAX_PROBE_STEPS} steps on the same batch")
                step = step_gradients(model, inputs, loss_fn, policy, seed=seed)
        except (RuntimeError, MemoryError, GradientBenchError) as err:
            result.error = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            results.append(result)
            continue
        result.seconds = time.perf_counter() - start
        result.cosine = gradient_cosine(step.gradients, exact)
        per_module = module_cosines(step.gradients, exact)
        if per_module:
            result.worst_module = min(per_module, key=per_module.__getitem__)
            result.worst_module_cosine = per_module[result.worst_module]
            result.worst_module_norm_share = _norm_share(exact, result.worst_module)
        if step.stats is not None:
            result.ratio = step.stats.ratio
            result.original_bytes, result.packed_bytes = step.stats.original_bytes, step.stats.packed_bytes
        results.append(result)
    return exact_seconds, results


def _norm_share(exact: dict[str, torch.Tensor], module: str) -> float:
    """The norm of ``module``'s own parameters' gradients over the norm of all of them (module names as
    :func:`hpcdl.runtime.fidelity.module_cosines` gives them)."""
    own = sum(float(g.double().square().sum()) for name, g in exact.items()
              if (name.rpartition(".")[0] or "(model)") == module)
    total = sum(float(g.double().square().sum()) for g in exact.values())
    return math.sqrt(own / total) if total > 0 else math.nan


def measure_model(name: str, scale: str, batch: int, policies: list[str], *, seed: int = 0,
                  progress: Callable[[str], None] = lambda line: None) -> ModelResult:
    """Every policy on zoo model ``name`` at ``scale``: random weights (seed ``seed``), a random batch."""
    from hpcdl.models import family

    model_family = family(name)
    shape = list(model_family.input_shape(scale))
    try:
        torch.manual_seed(seed)
        model = model_family.build(scale)
        x, y = model_family.example_batch(scale, batch, torch.Generator().manual_seed(seed))
        exact_seconds, results = measure_policies(
            model, x, lambda out: model_family.loss(out, y), policies, seed=seed, progress=progress)
    except (RuntimeError, MemoryError) as err:  # the exact step did not fit this machine
        return ModelResult(name, scale, shape, batch, 0, 0.0,
                           error=f"{type(err).__name__}: {str(err).splitlines()[0][:300]}")
    parameters = sum(p.numel() for p in model.parameters())
    return ModelResult(name, scale, shape, batch, parameters, exact_seconds, results)


def measure_reproduction(name: str, policies: list[str], *, seed: int = 0,
                         progress: Callable[[str], None] = lambda line: None) -> ModelResult:
    """Every policy on one of the issue's :data:`REPRODUCTIONS`."""
    if name not in REPRODUCTIONS:
        raise GradientBenchError(f"unknown case {name!r}; the reproductions are {', '.join(REPRODUCTIONS)}")
    model, x, loss_fn = REPRODUCTIONS[name]()
    exact_seconds, results = measure_policies(model, x, loss_fn, policies, seed=seed, progress=progress)
    return ModelResult(f"reproduction: {name}", "-", list(x.shape[1:]), x.shape[0],
                       sum(p.numel() for p in model.parameters()), exact_seconds, results)


def parse_policies(text: str) -> list[str]:
    """``"sz:rel=1e-2,adaptive"`` -> ["sz:rel=1e-2", "adaptive"]; ``default`` names :data:`DEFAULT_POLICY_SPEC`.

    Specs are separated by ``;`` when one has options with commas (``"adaptive:alpha=1e-2,reruns=1;sz:rel=1e-3"``).
    """
    separator = ";" if ";" in text else ","
    specs = [DEFAULT_POLICY_SPEC if spec.strip() == "default" else spec.strip() for spec in text.split(separator)]
    specs = [spec for spec in specs if spec]
    if not specs:
        raise GradientBenchError(f"--policies names at least one method spec, e.g. sz:rel=1e-3,adaptive; got {text!r}")
    for spec in specs:
        if policy_from_spec(spec) is None:
            raise GradientBenchError(f"--policies: {spec!r} compresses nothing; its cosine is 1 by definition")
    return specs


def run_gradient_benchmark(models: list[str], scale: str, batch: int, policies: list[str], *,
                           cases: Sequence[str] = (), seed: int = 0, threads: int | None = None,
                           progress: Callable[[str], None] = lambda line: None,
                           on_result: Callable[[dict], object] = lambda report: None) -> dict:
    """Every policy on each zoo model in ``models`` and each reproduction in ``cases``; the report as a dict.

    ``on_result`` gets the report so far after each model (to write it as the run goes: a full zoo at full
    scale takes hours on a CPU).
    """
    from hpcdl.models import family

    if batch < 1:
        raise GradientBenchError(f"--batch is a positive number of samples, got {batch}")
    for name in models:
        family(name)  # refuse an unknown name before anything runs
    for name in cases:
        if name not in REPRODUCTIONS:
            raise GradientBenchError(f"unknown case {name!r}; the reproductions are {', '.join(REPRODUCTIONS)}")
    if threads is not None:
        torch.set_num_threads(threads)
    results: list[dict] = []
    report = {"scale": scale, "batch": batch, "seed": seed, "policies": list(policies), "cosine_floor": COSINE_FLOOR,
              "default_policy": DEFAULT_POLICY_SPEC, "machine": describe_machine(), "results": results}
    for name in cases:
        progress(f"reproduction {name}")
        results.append(asdict(measure_reproduction(name, list(policies), seed=seed, progress=progress)))
        on_result(report)
    for name in models:
        progress(f"{name} ({scale}, batch {batch})")
        results.append(asdict(measure_model(name, scale, batch, list(policies), seed=seed, progress=progress)))
        on_result(report)
    report["summary"] = summarize(report)
    return report


def summarize(report: dict) -> list[dict]:
    """Per policy: the least cosine over the measured models, whether it holds :data:`COSINE_FLOOR` on all of
    them, and the geometric mean of the compression ratios."""
    summary = []
    for spec in report["policies"]:
        rows = [p for r in report["results"] if not r["error"] for p in r["policies"] if p["policy"] == spec]
        measured = [p for p in rows if p["error"] is None]
        cosines = [p["cosine"] for p in measured]
        ratios = [p["ratio"] for p in measured if p["ratio"]]
        summary.append({
            "policy": spec, "measured": len(measured), "failed": len(rows) - len(measured),
            "least_cosine": min(cosines) if cosines else None,
            "least_module_cosine": min((p["worst_module_cosine"] for p in measured
                                        if p["worst_module_cosine"] is not None), default=None),
            "holds_floor": bool(cosines) and min(cosines) >= report["cosine_floor"],
            "geomean_ratio": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None,
        })
    return summary


def _fmt(value: float | None, style: str) -> str:
    return "-" if value is None else format(value, style)


def format_report(report: dict) -> str:
    """The report as text: one line per model and policy, then the summary per policy."""
    header = ("model", "input", "batch", "policy", "cosine", "worst module", "its cosine", "its norm share", "ratio",
              "probes", "s")
    rows = [header]
    for result in report["results"]:
        shape = "x".join(map(str, result["input_shape"]))
        if result["error"]:
            rows.append((result["model"], shape, str(result["batch"]), "-", "not run: " + result["error"],
                         "", "", "", "", "", ""))
            continue
        for p in result["policies"]:
            if p["error"]:
                rows.append((result["model"], shape, str(result["batch"]), p["policy"], "failed: " + p["error"],
                             "", "", "", "", "", ""))
                continue
            rows.append((result["model"], shape, str(result["batch"]), p["policy"], _fmt(p["cosine"], ".5f"),
                         p["worst_module"] or "-", _fmt(p["worst_module_cosine"], ".4f"),
                         _fmt(p.get("worst_module_norm_share"), ".1e"), _fmt(p["ratio"], ".2f") + "x",
                         str(p["probe_steps"]), f"{p['seconds']:.1f}"))
    widths = [max(len(row[i]) for row in rows if len(row[i]) < 60) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.append("")
    lines.append(f"per policy, over the models measured (floor {report['cosine_floor']}):")
    for s in report.get("summary") or summarize(report):
        lines.append(f"  {s['policy']:<16} least cosine {_fmt(s['least_cosine'], '.5f')}  least module cosine "
                     f"{_fmt(s['least_module_cosine'], '.4f')}  {'holds' if s['holds_floor'] else 'FAILS'} the floor  "
                     f"geomean ratio {_fmt(s['geomean_ratio'], '.2f')}x  ({s['measured']} measured, {s['failed']} failed)")
    return "\n".join(lines)


def write_report(report: dict, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``bench-gradients.json`` and ``bench-gradients.txt`` into ``out_dir``; their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, text_path = out / "bench-gradients.json", out / "bench-gradients.txt"
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    text_path.write_text(format_report(report) + "\n")
    return json_path, text_path
