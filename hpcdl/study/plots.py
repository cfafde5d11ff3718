"""The study's PNG plots, drawn with matplotlib's Agg backend (no display needed).

Each function draws one figure for one model and writes it to ``path``.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import matplotlib
import matplotlib.patches
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from hpcdl.study.summary import ModelSummary  # noqa: E402

# Modules shown in the per-module plots: the ones saving the most bytes, so that deep models stay readable.
TOP_MODULES = 16


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plain_ticks(ax) -> None:
    """Tick labels like 2 and 0.5 on a log x axis instead of 2x10^0; minor ones only within one decade."""
    formatter = matplotlib.ticker.FuncFormatter(lambda value, _position: f"{value:g}")
    ax.xaxis.set_major_formatter(formatter)
    low, high = ax.get_xlim()
    ax.xaxis.set_minor_formatter(formatter if high / low < 10 else matplotlib.ticker.NullFormatter())


def _pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points no other point beats on both axes (more saving and a higher metric), by increasing saving."""
    front = []
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return sorted(front)


def plot_pareto(summary: ModelSummary, path: Path) -> None:
    """Final validation metric against memory saved: activation ratio (left), peak-memory reduction (right).

    The right panel uses the single-step peaks where they were measured (the steadier number), else the runs'.
    """
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    baseline = next((m for m in summary.methods if m.kind == "baseline" and m.val_metric), None)
    if any(m.step_peak_reduction for m in summary.methods):
        peak = ("step_peak_reduction", "peak-memory reduction vs baseline, one step measured alone (x, log)")
    else:
        peak = ("peak_reduction", "peak-memory reduction vs baseline over the run (x, log)")
    for ax, attribute, label in ((axes[0], "activation_ratio", "activation compression ratio (x, log)"),
                                 (axes[1], *peak)):
        points = []
        for method in summary.methods:
            saving = getattr(method, attribute)
            if method.kind == "baseline" and saving is None:
                saving_mean = 1.0
            elif saving is None or method.val_metric is None:
                continue
            else:
                saving_mean = saving.mean
            metric = method.val_metric
            # max(0, ...): the mean of equal values can round a hair outside them, and matplotlib refuses that.
            ax.errorbar(saving_mean, metric.mean,
                        yerr=[[max(0.0, metric.mean - metric.low)], [max(0.0, metric.high - metric.mean)]],
                        fmt="o", capsize=3)
            ax.annotate(method.method, (saving_mean, metric.mean), textcoords="offset points", xytext=(4, 4),
                        fontsize=7)
            points.append((saving_mean, metric.mean))
        front = _pareto_front(points)
        if len(front) > 1:
            ax.plot(*zip(*front), "--", color="grey", linewidth=1, label="Pareto front")
            ax.legend(fontsize=7, loc="lower left")
        if baseline is not None:
            ax.axhline(baseline.val_metric.mean, color="black", linewidth=0.6, alpha=0.5)
        ax.set_xscale("log")
        _plain_ticks(ax)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"final {summary.metric_name} (mean, bars min-max over seeds)")
    fig.suptitle(f"{summary.model} ({summary.scale}): validation metric vs memory saved")
    _save(fig, path)


def plot_curves(runs: list[dict], path: Path, metric: str) -> None:
    """Training loss and validation metric per epoch, one line per method (mean over seeds, band min-max)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    methods = list(dict.fromkeys(run["method"] for run in runs if run["status"] == "ok"))
    for method in methods:
        mine = [run for run in runs if run["status"] == "ok" and run["method"] == method and run.get("epochs")]
        for ax, key in ((axes[0], "train_loss"), (axes[1], "val_metric")):
            per_epoch: dict[int, list[float]] = {}
            for run in mine:
                for entry in run["epochs"]:
                    if entry.get(key) is not None:
                        per_epoch.setdefault(entry["epoch"], []).append(entry[key])
            if not per_epoch:
                continue
            epochs = sorted(per_epoch)
            means = [statistics.fmean(per_epoch[e]) for e in epochs]
            (line,) = ax.plot(epochs, means, marker="o", markersize=3, label=method)
            ax.fill_between(epochs, [min(per_epoch[e]) for e in epochs], [max(per_epoch[e]) for e in epochs],
                            color=line.get_color(), alpha=0.15)
    axes[0].set_ylabel("training loss (epoch mean)")
    axes[1].set_ylabel(metric)
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle(f"{runs[0]['model']} ({runs[0]['scale']}): training curves")
    _save(fig, path)


def top_modules(byte_counts: dict[str, float], count: int = TOP_MODULES) -> list[str]:
    """The ``count`` modules with the most bytes, in their original (forward) order."""
    keep = set(sorted(byte_counts, key=byte_counts.get, reverse=True)[:count])
    return [name for name in byte_counts if name in keep]


def plot_module_ratios(runs: list[dict], path: Path) -> bool:
    """Per-module compression ratio (original / packed bytes) of each method that reports it; False if none does."""
    ratios: dict[str, dict[str, float]] = {}
    sizes: dict[str, float] = {}
    for run in runs:
        if run["status"] != "ok" or not run.get("per_module") or run["method_kind"] != "codec":
            continue
        method = ratios.setdefault(run["method"], {})
        steps = max(run.get("steps") or 1, 1)
        for name, entry in run["per_module"].items():
            if entry.get("packed"):
                method.setdefault(name, entry["original"] / entry["packed"])
                sizes[name] = max(sizes.get(name, 0), entry["original"] / steps)
    if not ratios:
        return False
    modules = top_modules(sizes, TOP_MODULES * 3 // 4)
    fig, ax = plt.subplots(figsize=(11, 0.1 * len(modules) * len(ratios) + 2))
    height = 0.8 / len(ratios)
    for index, (method, values) in enumerate(ratios.items()):
        positions = [row + index * height for row in range(len(modules))]
        ax.barh(positions, [values.get(name, 0) for name in modules], height=height, label=method)
    ax.set_yticks([row + 0.4 - height / 2 for row in range(len(modules))])
    ax.set_yticklabels([f"{name} ({sizes[name] / 2**20:.1f} MiB)" for name in modules], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    _plain_ticks(ax)
    ax.set_xlabel("compression ratio of the activations saved in the module (x, log)")
    ax.axvline(1, color="black", linewidth=0.6)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3, axis="x")
    ax.set_title(f"{runs[0]['model']} ({runs[0]['scale']}): per-module ratio, "
                 f"{len(modules)} largest modules (bytes per training step in brackets)")
    _save(fig, path)
    return True


def plot_activation_distribution(model: str, stats: dict[str, dict], path: Path) -> None:
    """Box plots of saved activation values per module (box 25-75 %, whiskers 1-99 %, dots 0.1/99.9 %)."""
    modules = top_modules({name: entry["bytes"] for name, entry in stats.items() if "quantiles" in entry})
    boxes = []
    for name in modules:
        q = stats[name]["quantiles"]
        boxes.append({"label": f"{name} ({100 * stats[name]['zero_fraction']:.0f}% zeros)", "med": q["0.5"],
                      "q1": q["0.25"], "q3": q["0.75"], "whislo": q["0.01"], "whishi": q["0.99"],
                      "fliers": [q["0.001"], q["0.999"]]})
    fig, ax = plt.subplots(figsize=(11, 0.35 * len(modules) + 2))
    ax.bxp(boxes, orientation="horizontal", showfliers=True)
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xscale("symlog", linthresh=1e-2)
    ax.set_xlabel("activation value saved for backward (symlog)")
    ax.grid(alpha=0.3, axis="x")
    ax.set_title(f"{model}: values saved for backward per module at initialisation, {len(modules)} largest")
    _save(fig, path)


def codec_label(spec: str) -> str:
    """A codec spec without its error bound's value (``sz:abs=0.0123`` -> ``sz:abs``), other options kept."""
    codec, _, options = spec.partition(":")
    kept = [option.split("=", 1)[0] if option.split("=", 1)[0] in ("abs", "rel", "pw_rel") else option
            for option in options.split(",") if option]
    return codec + (":" + ",".join(kept) if kept else "")


def plot_decisions(runs: list[dict], path: Path, ratio_target: float | None = None) -> None:
    """What one controller-driven method decided over the steps, from its runs' ``decisions`` summaries.

    Top: per slot (the slots of the largest modules), the bound relative to the slot's value range (log) and
    the codec chosen, for the lowest seed. Bottom: the predicted and measured gradient error of the decisions
    in effect (every seed), and the activation ratio of the steps under each decision (every seed).
    """
    runs = sorted((run for run in runs if run.get("decisions")), key=lambda run: run["seed"])
    first = runs[0]
    decisions = first["decisions"]
    slots = list(dict.fromkeys(name for entry in decisions for name in entry["slots"]))
    per_module = first.get("per_module") or {}
    sizes = {name: per_module.get(name.split("#", 1)[0], {}).get("original", 0) + 1e-9 * index
             for index, name in enumerate(slots)}
    slots = top_modules(sizes, TOP_MODULES)
    steps = [entry["step"] for entry in decisions]
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    ax = axes[0][0]
    for name in slots:
        points = [(entry["step"], entry["slots"][name][1]) for entry in decisions
                  if name in entry["slots"] and entry["slots"][name][1]]
        if points:
            ax.plot(*zip(*points), marker="o", markersize=3, linewidth=1, label=name)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("bound / value range of the slot (log)")
    ax.set_title(f"bounds per slot, seed {first['seed']} (kept slots not drawn)", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3)
    ax = axes[0][1]
    labels = list(dict.fromkeys(codec_label(entry["slots"][name][0]) for entry in decisions for name in slots
                                if name in entry["slots"]))
    grid = [[labels.index(codec_label(entry["slots"][name][0])) if name in entry["slots"] else float("nan")
             for entry in decisions] for name in slots]
    colours = plt.get_cmap("tab10", max(len(labels), 1))
    ax.imshow(grid, aspect="auto", interpolation="nearest", cmap=colours, vmin=-0.5, vmax=len(labels) - 0.5)
    ax.set_yticks(range(len(slots)))
    ax.set_yticklabels(slots, fontsize=6)
    ax.set_xticks(range(len(steps)))
    ax.set_xticklabels([str(step) for step in steps], fontsize=6, rotation=90)
    ax.set_xlabel("step of the decision")
    ax.set_title(f"codec per slot, seed {first['seed']} (bound values on the left)", fontsize=9)
    ax.legend(handles=[matplotlib.patches.Patch(color=colours(index), label=label)
                       for index, label in enumerate(labels)], fontsize=7, loc="upper right")
    ax = axes[1][0]
    for run in runs:
        checked = [entry for entry in run["decisions"] if entry.get("check_measured_total") is not None]
        if not checked:
            continue
        (line,) = ax.plot([e["step"] for e in checked], [e["check_measured_total"] for e in checked], marker="o",
                          markersize=3, label=f"measured, seed {run['seed']}")
        ax.plot([e["step"] for e in checked], [e["check_predicted_total"] for e in checked], "--", marker="x",
                markersize=4, color=line.get_color(), label=f"predicted, seed {run['seed']}")
    ax.set_yscale("log")
    ax.set_xlabel("step of the check (the decisions in effect before it)")
    ax.set_ylabel("squared gradient error, summed over modules (log)")
    ax.set_title("gradient error of the decisions in effect: predicted vs measured", fontsize=9)
    if ax.lines:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax = axes[1][1]
    for run in runs:
        points = [(entry["step"], entry["ratio"]) for entry in run["decisions"] if entry.get("ratio")]
        if points:
            ax.step(*zip(*points), where="post", marker="o", markersize=3, label=f"seed {run['seed']}")
    if ratio_target is not None:
        ax.axhline(ratio_target, color="black", linewidth=0.8, linestyle=":", label=f"target {ratio_target:g}x")
    ax.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda value, _position: f"{value:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.set_xlabel("step of the decision")
    ax.set_ylabel("activation ratio of the steps under it (x, log)")
    ax.set_title("activation compression under each decision (all saved bytes)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.suptitle(f"{first['model']} ({first['scale']}) {first['method']}: decisions over the steps")
    _save(fig, path)
