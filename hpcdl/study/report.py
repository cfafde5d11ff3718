"""``hpcdl study report DIR``: DIR/report.md with PNG plots beside it, from DIR's results files.

Per model: the setup, a table (method, activation ratio, peak-memory reduction, final validation
metric with its spread across seeds, its change vs the baseline of the same seed, step-time
ratio), which methods hurt the metric, skipped and failed runs with their reasons, and four plots:
metric vs memory saved (Pareto front), training curves, per-module compression ratios, and the
distribution of activation values per module; for a controller-driven method (adaptive), a plot of its
decisions over the steps. When adaptive ran, a "Targets" section first judges it against issue 13's
targets (:mod:`hpcdl.study.targets`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from hpcdl.study.plots import (
    plot_activation_distribution,
    plot_curves,
    plot_decisions,
    plot_module_ratios,
    plot_pareto,
)
from hpcdl.study.results import read_results
from hpcdl.study.summary import ModelSummary, Spread, group_runs, summarise_model
from hpcdl.study.targets import RATIO_TARGET, model_targets, targets_section

REPORT_NAME = "report.md"


def _spread(value: Spread | None, digits: int = 3, signed: bool = False, suffix: str = "") -> str:
    if value is None:
        return "—"
    sign = "+" if signed else ""
    text = f"{value.mean:{sign}.{digits}f}{suffix}"
    if value.n > 1 and value.high > value.low:
        text += f" ± {value.std:.{digits}f} [{value.low:{sign}.{digits}f}, {value.high:{sign}.{digits}f}]"
    return text


def _table(summary: ModelSummary) -> list[str]:
    lines = [
        f"| method | activation ratio | peak-memory reduction (run) | peak-memory reduction (one step) | "
        f"final {summary.metric_name} | change vs baseline | step-time ratio | seeds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method in summary.methods:
        if not method.seeds:
            continue
        change = _spread(method.metric_change, signed=True) if method.kind != "baseline" else "(reference)"
        if method.hurts:
            change += " **hurts**"
        lines.append(
            f"| {method.method} | {_spread(method.activation_ratio, 2, suffix='x')} | "
            f"{_spread(method.peak_reduction, 2, suffix='x')} | "
            f"{_spread(method.step_peak_reduction, 2, suffix='x')} | "
            f"{_spread(method.val_metric)} | {change} | "
            f"{_spread(method.step_time_ratio, 2, suffix='x')} | {','.join(map(str, method.seeds))} |"
        )
    return lines


def _dataset(runs: list[dict]) -> str | None:
    """The data set a model's runs trained on, as the config names it; None when no run finished."""
    ok = [run for run in runs if run["status"] == "ok" and run.get("config")]
    return (ok[0]["config"]["data"].get("dataset") or "(the model's default)") if ok else None


def _random_data(dataset: str | None) -> bool:
    return dataset is not None and (dataset == "synthetic" or dataset.startswith("random-"))


def _setup(runs: list[dict]) -> list[str]:
    ok = [run for run in runs if run["status"] == "ok" and run.get("config")]
    if not ok:
        return []
    config = ok[0]["config"]
    dataset = _dataset(runs)
    lines = [
        f"Setup: dataset `{dataset}`"
        + (f" ({config['data']['features']})" if config["data"].get("features") else "")
        + f", {config['train']['epochs']} epochs, global batch {ok[0].get('batch_size', config['train']['batch'])}"
        + (f", at most {config['train']['steps_per_epoch']} steps per epoch" if config["train"].get("steps_per_epoch")
           else "")
        + f", optimizer {config['optimizer']['name']} lr {config['optimizer']['lr']:g}"
        + f", base config `{ok[0]['identity']['base_config']}`."
    ]
    if _random_data(dataset):
        lines.append("")
        lines.append("**The data here are random inputs with random labels: the validation metric measures nothing "
                     "learnable; read this model's rows for memory and speed only.**")
    return lines


def _same_start(summary: ModelSummary) -> str:
    if not summary.same_start:
        return "Same start: not checked (the trainer's metrics.jsonl had no first-step loss)."
    parts = [f"seed {seed}: {'identical' if same else 'DIFFERENT'}" for seed, same in summary.same_start.items()]
    verdict = "every method started" if all(summary.same_start.values()) else "NOT every method started"
    return (f"Same start: {verdict} from the same weights and first batch (first-step training loss, "
            f"which no activation method can change, per seed: {'; '.join(parts)}).")


def _model_section(summary: ModelSummary, runs: list[dict], stats: dict | None, out: Path) -> list[str]:
    """One model's section of the report (its setup, table, verdicts and plots); writes the plots into ``out``."""
    model, scale = summary.model, summary.scale
    stem = f"{model}-{scale}"
    lines = ["", f"## {model} ({scale})", ""]
    lines += _setup(runs)
    lines += ["", _same_start(summary), ""]
    lines += _table(summary)
    hurting = [m.method for m in summary.methods if m.hurts]
    lines += ["", "Where compression hurts: " + (", ".join(hurting) if hurting else
                                                 "no method hurt the final metric beyond the seed spread.")]
    for method in summary.methods:
        for reason in method.skipped:
            lines.append(f"- {method.method}: skipped — {reason}")
        for error in method.failed:
            lines.append(f"- {method.method}: FAILED — {error}")
    plot_pareto(summary, out / f"{stem}-pareto.png")
    plot_curves(runs, out / f"{stem}-curves.png", summary.metric_name)
    lines += ["", f"![{model}: metric vs memory saved]({stem}-pareto.png)",
              "", f"![{model}: training curves]({stem}-curves.png)"]
    if plot_module_ratios(runs, out / f"{stem}-modules.png"):
        lines += ["", f"![{model}: per-module compression ratio]({stem}-modules.png)"]
    if stats:
        plot_activation_distribution(model, stats, out / f"{stem}-activations.png")
        lines += ["", f"![{model}: activation values per module]({stem}-activations.png)"]
    return lines + _decision_plots(runs, out, stem)


def _decision_plots(runs: list[dict], out: Path, stem: str) -> list[str]:
    """One plot per controller-driven method (runs that carry ``decisions``) of what it decided over the steps."""
    lines = []
    methods = dict.fromkeys(run["method"] for run in runs if run["status"] == "ok" and run.get("decisions"))
    for method in methods:
        name = f"{stem}-decisions-{re.sub(r'[^A-Za-z0-9.=-]+', '_', method)}.png"
        plot_decisions([run for run in runs if run["method"] == method and run["status"] == "ok"], out / name,
                       RATIO_TARGET)
        lines += ["", f"![{runs[0]['model']}: {method}'s decisions over the steps]({name})"]
    if methods:
        lines += ["", "Decisions: per slot (`module#k`, the k-th tensor the module saves) the chosen bound relative "
                      "to the slot's value range and the codec, at each probe; the check of the decisions in effect "
                      "before each probe (predicted and measured squared gradient error, summed over modules); and "
                      "the activation ratio of the steps trained under each decision."]
    return lines


def write_report(out: str | os.PathLike) -> Path:
    """Write ``out/report.md`` and its PNGs from ``out/results.jsonl``; return the report's path."""
    out = Path(out)
    results = read_results(out)
    runs = results.runs()
    if not runs:
        raise ValueError(f"the results in {out} hold no run records yet; run `hpcdl study run --out {out}` first")
    activation_stats = results.activation_stats()
    step_peaks = results.step_peaks()
    statuses = [run["status"] for run in runs]
    env = next((run for run in runs if run["status"] == "ok"), runs[0])
    device = env["device"]
    lines = [
        "# hpcdl impact study",
        "",
        f"Written by `hpcdl study report` from {', '.join(f'`{p.name}`' for p in results.paths)}: {len(runs)} runs "
        f"({statuses.count('ok')} ok, {statuses.count('skipped')} skipped, {statuses.count('failed')} failed); "
        f"torch {env['torch']}, hpcdl {env['hpcdl']}, on {device['type']} "
        f"({device.get('name') or device.get('cpu')}, {device['threads']} threads).",
        "",
        "How to read the tables: *activation ratio* = bytes autograd saved for backward / bytes the method held "
        "for them (higher saves more); *peak-memory reduction (run)* = baseline peak / method peak, measured by "
        "the trainer over the whole run (higher saves more); *peak-memory reduction (one step)* = the same for "
        "one training step measured alone in a clean process by `hpcdl.memory.peak` (same model, per-device "
        "batch, data and method; the tighter number on a CPU); *change vs baseline* = final validation metric "
        "minus the baseline's, paired by seed (same initial weights and data order); *step-time ratio* = median "
        "step time / baseline's "
        "(higher is slower). Values are mean ± std [min, max] over seeds. A method **hurts** when its metric fell "
        "for every seed and by more on average than the baseline's own spread across seeds.",
    ]
    for path, text in results.truncated.items():
        lines += ["", f"Note: `{Path(path).name}` ends in an unfinished line (a run killed while writing); "
                      f"it is ignored: `{text[:80]}`"]
    all_targets = []
    sections: list[str] = []
    for (model, scale), model_runs in group_runs(runs).items():
        summary = summarise_model(model_runs, step_peaks.get((model, scale)))
        targets = model_targets(model_runs, summary.metric_name, _random_data(_dataset(model_runs)))
        if targets is not None:
            all_targets.append(targets)
        sections += _model_section(summary, model_runs, activation_stats.get((model, scale)), out)
    lines += (["", *targets_section(all_targets)] if all_targets else []) + sections
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
