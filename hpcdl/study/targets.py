"""Issue 13's targets for the adaptive policy, judged per model from a study's run records.

The targets: the adaptive policy reaches at least ``RATIO_TARGET`` (15x) activation compression (all saved
bytes) with its validation metric inside the baseline's seed spread, and at least ``RELATIVE_TARGET`` (1.5x)
the ratio of the best static ``sz`` setting whose metric stays inside that spread.

Definitions (one each, used by the report and its tests):

* **inside the spread**: the method's final validation metric, averaged over its seeds, is at least the
  lowest final metric of the baseline's seeds (inside the baseline's min..max, or above it). A method
  judged on fewer seeds than the baseline is still judged by its mean.
* **adaptive's ratio**: the activation ratio of the steps after its first decision
  (``activation_ratio_after_first_decision``, :mod:`hpcdl.study.decisions`): the adaptive policy trains its
  first step under the default policy (``sz:rel=1e-3``) while it measures, which in a short run weighs on the
  run's total. The run's
  total (every step) is reported beside it; a static codec has no such step, so its run ratio is used.
* **a static sz setting**: a method whose codec config has ``id: sz`` (``sz:rel=1e-2``, ``sz:abs=1e-2``).
* **the matched ActNN baseline**: methods whose codec id is ``actnn`` (per-layer bits from sensitivity at
  the adaptive policy's average bits), shown beside adaptive for comparison; no target applies to them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpcdl.errors import HpcdlError
from hpcdl.study.summary import Spread, final_metric

RATIO_TARGET = 15.0
RELATIVE_TARGET = 1.5
ADAPTIVE_ID = "adaptive"
ACTNN_ID = "actnn"
STATIC_SZ_ID = "sz"


def codec_id(run: dict) -> str | None:
    """The codec (or controller) id of a run's method, e.g. ``sz``, ``adaptive``; None for non-codec methods."""
    codec = run.get("codec")
    return codec.get("id") if isinstance(codec, dict) and run.get("method_kind") == "codec" else None


def adaptive_ratio(run: dict) -> float | None:
    """The ratio a controller-driven run is judged by: after its first decision when known, else the run's."""
    after = run.get("activation_ratio_after_first_decision")
    return after if after is not None else run.get("activation_ratio")


@dataclass
class MethodResult:
    """One method's numbers on one model, as the targets need them (means over its seeds)."""

    method: str
    seeds: list[int]
    ratio: Spread | None
    run_ratio: Spread | None
    metric: Spread | None
    inside: bool | None  # None: no baseline or no metric to judge by

    @property
    def mean_ratio(self) -> float | None:
        return None if self.ratio is None else self.ratio.mean

    @property
    def mean_metric(self) -> float | None:
        return None if self.metric is None else self.metric.mean


@dataclass
class ModelTargets:
    """Issue 13's targets on one (model, scale), for each adaptive method that ran on it."""

    model: str
    scale: str
    metric_name: str
    baseline: Spread | None
    random_data: bool
    adaptive: list[MethodResult] = field(default_factory=list)
    best_static: MethodResult | None = None  # the static sz setting of highest ratio inside the spread
    static_sz: list[MethodResult] = field(default_factory=list)
    matched: list[MethodResult] = field(default_factory=list)  # the ActNN-style baseline(s)

    def below_by(self, result: MethodResult) -> float | None:
        """How far ``result``'s mean metric is below the baseline's lowest seed (a positive number), if it is."""
        metric = result.mean_metric
        if metric is None or self.baseline is None or metric >= self.baseline.low:
            return None
        return self.baseline.low - metric

    @property
    def best_static_ratio(self) -> float | None:
        return None if self.best_static is None else self.best_static.mean_ratio

    def relative(self, result: MethodResult) -> float | None:
        """``result``'s ratio over the best static sz setting's inside the spread."""
        ratio, best = result.mean_ratio, self.best_static_ratio
        return None if ratio is None or best is None else ratio / best


def _result(method: str, runs: list[dict], baseline: Spread | None, ratio_of) -> MethodResult:
    latest = {run["seed"]: run for run in runs}  # one run per seed, the last in the file (as summary.py)
    done = [latest[seed] for seed in sorted(latest)]
    metric = Spread.of([final_metric(run) for run in done])
    inside = None if metric is None or baseline is None else metric.mean >= baseline.low
    return MethodResult(method=method, seeds=sorted(latest), ratio=Spread.of([ratio_of(run) for run in done]),
                        run_ratio=Spread.of([run.get("activation_ratio") for run in done]), metric=metric,
                        inside=inside)


def model_targets(runs: list[dict], metric_name: str, random_data: bool) -> ModelTargets | None:
    """The targets of one (model, scale)'s run records (any status); None when no adaptive method ran on it."""
    ok = [run for run in runs if run["status"] == "ok"]
    by_method: dict[str, list[dict]] = {}
    for run in ok:
        by_method.setdefault(run["method"], []).append(run)
    if not any(codec_id(mine[0]) == ADAPTIVE_ID for mine in by_method.values()):
        return None
    baseline_runs = {run["seed"]: run for run in ok if run["method_kind"] == "baseline"}
    baseline = Spread.of([final_metric(run) for run in baseline_runs.values()])
    targets = ModelTargets(model=runs[0]["model"], scale=runs[0]["scale"], metric_name=metric_name,
                           baseline=baseline, random_data=random_data)
    for method, mine in by_method.items():
        kind = codec_id(mine[0])
        if kind == ADAPTIVE_ID:
            targets.adaptive.append(_result(method, mine, baseline, adaptive_ratio))
        elif kind == ACTNN_ID:
            targets.matched.append(_result(method, mine, baseline, adaptive_ratio))
        elif kind == STATIC_SZ_ID:
            targets.static_sz.append(_result(method, mine, baseline, lambda run: run.get("activation_ratio")))
    inside = [result for result in targets.static_sz if result.inside and result.mean_ratio is not None]
    targets.best_static = max(inside, key=lambda result: result.mean_ratio or 0.0, default=None)
    return targets


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def ratio_verdict(ratio: Spread | None) -> str:
    """Against RATIO_TARGET: ``met`` or ``not met by X (Y of the target)``."""
    if ratio is None:
        return "no ratio measured"
    if ratio.mean >= RATIO_TARGET:
        return f"met ({ratio.mean:.1f}x >= {RATIO_TARGET:g}x)"
    return (f"not met by {RATIO_TARGET - ratio.mean:.1f}x ({ratio.mean:.1f}x, "
            f"{ratio.mean / RATIO_TARGET:.0%} of {RATIO_TARGET:g}x)")


def metric_verdict(targets: ModelTargets, result: MethodResult) -> str:
    """Inside the baseline's seed spread, or ``below by X``; flagged when the data are random."""
    metric, baseline = result.mean_metric, targets.baseline
    if baseline is None:
        text = "not judged (no baseline metric)"
    elif metric is None:
        text = "no metric"
    elif metric >= baseline.low:
        text = f"inside ({metric:.4f} >= {baseline.low:.4f})"
    else:
        text = f"**below by {baseline.low - metric:.4f}** ({metric:.4f} < {baseline.low:.4f})"
    return text + (" (random data: meaningless)" if targets.random_data else "")


def relative_verdict(targets: ModelTargets, result: MethodResult) -> str:
    """Against RELATIVE_TARGET times the best static sz setting inside the spread."""
    if not targets.static_sz:
        return "no static sz setting ran"
    best, best_ratio, ratio = targets.best_static, targets.best_static_ratio, result.mean_ratio
    if best is None or best_ratio is None:
        return "n/a: no static sz setting stays inside the spread"
    if ratio is None:
        return "no ratio measured"
    relative = ratio / best_ratio
    if relative >= RELATIVE_TARGET:
        return f"met ({relative:.2f}x of {best.method}'s {_x(best_ratio)})"
    needed = RELATIVE_TARGET * best_ratio
    return (f"not met by {needed - ratio:.1f}x ({relative:.2f}x of {best.method}'s "
            f"{_x(best_ratio)}; {RELATIVE_TARGET:g}x of it is {needed:.1f}x)")


def targets_section(all_targets: list[ModelTargets]) -> list[str]:
    """The report's "Targets" section: one table row per (model, adaptive method), then the matched baselines."""
    lines = [
        "## Targets (issue 13)",
        "",
        f"Adaptive should reach >= {RATIO_TARGET:g}x activation compression (all saved bytes) with its final "
        f"validation metric inside the baseline's seed spread, and >= {RELATIVE_TARGET:g}x the ratio of the best "
        "static sz setting that stays inside that spread. *Inside the spread*: the method's mean final metric over "
        "its seeds is at least the lowest final metric of the baseline's seeds (within min..max, or above). "
        "*Adaptive ratio*: all saved bytes / bytes held over the steps after its first decision (its first step "
        "trains under the default policy, sz:rel=1e-3, while the controller measures); the run's total over every step is beside it. "
        "Static settings have no such step: their run ratio is used.",
        "",
        f"| model | method | seeds | adaptive ratio | run ratio | vs {RATIO_TARGET:g}x | metric vs baseline spread | "
        f"best static sz inside the spread | vs {RELATIVE_TARGET:g}x of it |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for targets in all_targets:
        best = targets.best_static
        best_text = f"{best.method} ({_x(targets.best_static_ratio)})" if best is not None else "none"
        for result in targets.adaptive:
            lines.append(
                f"| {targets.model} | {result.method} | {','.join(map(str, result.seeds))} | "
                f"{_x(result.mean_ratio)} | "
                f"{_x(result.run_ratio.mean if result.run_ratio else None)} | {ratio_verdict(result.ratio)} | "
                f"{metric_verdict(targets, result)} | {best_text} | {relative_verdict(targets, result)} |")
    matched = [(targets, result) for targets in all_targets for result in targets.matched]
    if matched:
        lines += ["", "The ActNN-style baseline (per-layer bits from sensitivity) at adaptive's average bits:", "",
                  "| model | method | seeds | ratio | run ratio | metric vs baseline spread |", "|---|---|---|---|---|---|"]
        for targets, result in matched:
            lines.append(f"| {targets.model} | {result.method} | {','.join(map(str, result.seeds))} | "
                         f"{_x(result.mean_ratio)} | "
                         f"{_x(result.run_ratio.mean if result.run_ratio else None)} | "
                         f"{metric_verdict(targets, result)} |")
    return lines


class MatchedBitsError(HpcdlError, ValueError):
    """No (or more than one) adaptive method's ratio to match for a model in a study's results."""


def matched_bits(runs: list[dict], model: str, method: str | None = None, activation_bits: int = 32) -> float:
    """The average bits per saved element at which an ActNN-style baseline holds what adaptive held on ``model``.

    ``activation_bits / ratio``, with ratio the mean over seeds of :func:`adaptive_ratio` (the steps after the
    first decision); ``method`` picks one adaptive method spec when several ran on the model. Rounded to 3
    significant digits, as a method spec carries it (``actnn:bits=2.13``).
    """
    adaptive = [run for run in runs if run["model"] == model and run["status"] == "ok"
                and codec_id(run) == ADAPTIVE_ID and (method is None or run["method"] == method)]
    specs = sorted({run["method"] for run in adaptive})
    if not specs:
        raise MatchedBitsError(f"no finished adaptive run of model {model!r}" + (f" with method {method!r}" if method
                               else "") + " in these results; run the adaptive method on it first")
    if len(specs) > 1:
        raise MatchedBitsError(f"model {model!r} ran several adaptive methods {specs}; name one with --method")
    latest = {run["seed"]: run for run in adaptive}
    ratio = Spread.of([adaptive_ratio(run) for run in latest.values()])
    if ratio is None or ratio.mean <= 0:
        raise MatchedBitsError(f"the adaptive runs of model {model!r} recorded no activation ratio")
    return float(f"{activation_bits / ratio.mean:.3g}")
