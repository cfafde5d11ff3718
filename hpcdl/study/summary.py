"""Per-model numbers of a study: each method against the baseline of the same seed.

Comparisons are paired by seed (a method's run and the baseline run of the same seed start from the
same weights and see the same data), then summarised across seeds as mean, standard deviation, min
and max. Ratios follow one convention each:

* activation ratio = activation bytes saved for backward / bytes held by the method (higher saves more);
* peak-memory reduction = baseline peak / method peak (higher saves more);
* step-time ratio = method median step time / baseline median step time (higher is slower).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class Spread:
    """Mean, standard deviation (0 for one value), min and max of a few numbers; ``n`` how many."""

    mean: float
    std: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: list[float | None]) -> Spread | None:
        """The spread of the values that are not None; None when there are none."""
        known = [v for v in values if v is not None]
        if not known:
            return None
        std = statistics.stdev(known) if len(known) > 1 else 0.0
        return cls(statistics.fmean(known), std, min(known), max(known), len(known))


@dataclass
class MethodSummary:
    """One method's numbers on one model."""

    method: str
    kind: str
    seeds: list[int] = field(default_factory=list)
    activation_ratio: Spread | None = None
    peak_reduction: Spread | None = None
    val_metric: Spread | None = None
    metric_change: Spread | None = None
    step_time_ratio: Spread | None = None
    step_peak_reduction: Spread | None = None  # baseline's single-step peak / this method's (hpcdl.study.steppeak)
    hurts: bool = False
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


@dataclass
class ModelSummary:
    """Every method's numbers on one model, in the order the methods first appear in the results."""

    model: str
    scale: str
    metric_name: str
    methods: list[MethodSummary]
    baseline_spread: float | None
    same_start: dict[int, bool]


def final_metric(run: dict) -> float | None:
    epochs = run.get("epochs") or []
    return epochs[-1].get("val_metric") if epochs else None


def metric_name(run: dict) -> str:
    """The validation metric's name as the trainer reports it (auc, accuracy, miou)."""
    return f"val {run.get('metric_name') or 'metric'}"


def summarise_model(runs: list[dict], step_peaks: dict[str, dict] | None = None) -> ModelSummary:
    """Summarise the run records of one (model, scale); ``runs`` holds every status.

    ``step_peaks``: this model's single-step peak records by (method spec, seed), if measured.
    """
    step_peaks = step_peaks or {}
    step_peak = {key: record.get("peak_bytes") for key, record in step_peaks.items()}
    model, scale = runs[0]["model"], runs[0]["scale"]
    ok = [run for run in runs if run["status"] == "ok"]
    baseline = {run["seed"]: run for run in ok if run["method_kind"] == "baseline"}
    baseline_metrics = [final_metric(run) for run in baseline.values()]
    spread = Spread.of(baseline_metrics)
    order = list(dict.fromkeys(run["method"] for run in runs))
    methods = []
    for name in order:
        mine = [run for run in runs if run["method"] == name]
        summary = MethodSummary(method=name, kind=mine[0]["method_kind"])
        summary.skipped = sorted({run.get("reason", "") for run in mine if run["status"] == "skipped"})
        summary.failed = sorted({run.get("error", "") for run in mine if run["status"] == "failed"})
        # One run per seed, the last in the file (as for the baseline): an old and a new record of the
        # same method and seed (a renamed method, an edited base config) count once.
        latest = {run["seed"]: run for run in mine if run["status"] == "ok"}
        done = [latest[seed] for seed in sorted(latest)]
        summary.seeds = [run["seed"] for run in done]
        # Only a codec packs what autograd saves; the baseline holds it all (1x by definition), recompute and
        # offload save memory otherwise and are compared by their peak.
        if summary.kind == "codec":
            summary.activation_ratio = Spread.of([run.get("activation_ratio") for run in done])
        elif summary.kind == "baseline":
            summary.activation_ratio = Spread.of([1.0 for _ in done])
        summary.val_metric = Spread.of([final_metric(run) for run in done])
        paired = [(run, baseline[run["seed"]]) for run in done if run["seed"] in baseline]
        summary.peak_reduction = Spread.of([_ratio(base.get("peak_memory_bytes"), run.get("peak_memory_bytes"))
                                            for run, base in paired])
        summary.step_time_ratio = Spread.of([_ratio(run.get("median_step_time_s"), base.get("median_step_time_s"))
                                             for run, base in paired])
        changes = [_difference(final_metric(run), final_metric(base)) for run, base in paired]
        summary.metric_change = Spread.of(changes)
        summary.hurts = _hurts(changes, spread)
        summary.step_peak_reduction = Spread.of([_ratio(step_peak.get((base["method"], seed)),
                                                        step_peak.get((name, seed)))
                                                 for seed, base in baseline.items()])
        methods.append(summary)
    starts: dict[int, set] = {}
    for run in ok:
        if run.get("first_step_loss") is not None:
            starts.setdefault(run["seed"], set()).add(run["first_step_loss"])
    return ModelSummary(model=model, scale=scale, metric_name=metric_name(ok[0]) if ok else "val metric",
                        methods=methods, baseline_spread=None if spread is None else spread.high - spread.low,
                        same_start={seed: len(values) == 1 for seed, values in sorted(starts.items())})


def _hurts(changes: list[float | None], baseline: Spread | None) -> bool:
    """Hurts: the metric fell for every seed, by more on average than the baseline's own spread across seeds.

    Needs two seeds or more: one seed has no spread to judge a change against.
    """
    changes = [c for c in changes if c is not None]
    if len(changes) < 2 or baseline is None or baseline.n < 2:
        return False
    return all(c < 0 for c in changes) and -statistics.fmean(changes) > (baseline.high - baseline.low)


def _ratio(numerator, denominator) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def _difference(value, reference) -> float | None:
    return None if value is None or reference is None else value - reference


def group_runs(runs: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """Run records by (model, scale), models in the order they first appear."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for run in runs:
        groups.setdefault((run["model"], run["scale"]), []).append(run)
    return groups
