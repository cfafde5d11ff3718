"""A compact record of what a controller-driven method decided during a run, for the study's results file.

The adaptive controller (and any controller that implements ``Controller.report``) writes a
``"kind": "compression"`` line to the run's ``metrics.jsonl`` after each probe (docs/adaptive.md). The
run directories are not committed with a study, so :func:`summarise_decisions` condenses those lines,
with the activation bytes of the ``"train"`` lines, into the run's results record; the committed
``results.jsonl`` alone then regenerates the decision plots and the targets table.

Per decision (one per report) the summary holds:

* ``step``, ``probe``;
* ``slots``: per slot (``module#k``) ``[codec, rel]``: the codec spec chosen (``"sz:abs=0.0123"``, ``"none"``
  for a slot kept as it is, or another codec's spec) and the bound relative to the slot's value range (None
  when the controller reports none);
* ``predicted_total``: the predicted squared gradient error of the new decisions, summed over modules;
* ``check_predicted_total`` / ``check_measured_total`` and ``check`` (per module ``[predicted, measured]``):
  the check of the decisions in effect before this one (absent at the first probe);
* ``ratio``: the activation ratio (all saved bytes / bytes held) of the steps trained under this decision,
  from this step (exclusive) to the next decision (inclusive), or to the end of the run.

Floats are rounded to 4 significant digits: the summary is for plots and tables, and a run has one per probe.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

DIGITS = 4
_LONG_FLOAT = re.compile(r"\d+\.\d{5,}(?:e[-+]?\d+)?")


def _round(value):
    return None if value is None else float(f"{value:.{DIGITS}g}")


def _short_codec(spec: str) -> str:
    """``"sz:abs=0.7071067811865476"`` -> ``"sz:abs=0.7071"``: the codec spec with its long floats shortened."""
    return _LONG_FLOAT.sub(lambda match: f"{float(match.group()):.{DIGITS}g}", spec)


def _decision(record: dict) -> dict:
    slots = {name: [_short_codec(str(slot.get("codec", "?"))), _round(slot.get("rel"))]
             for name, slot in (record.get("slots") or {}).items()}
    entry: dict = {"step": record["step"], "probe": record.get("probe"), "slots": slots}
    predicted = record.get("predicted_error")
    if predicted:
        entry["predicted_total"] = _round(sum(predicted.values()))
    if record.get("check"):
        entry["check"] = {module: [_round(row.get("predicted")), _round(row.get("measured"))]
                          for module, row in record["check"].items()}
        entry["check_predicted_total"] = _round(record.get("check_predicted_total"))
        entry["check_measured_total"] = _round(record.get("check_measured_total"))
    return entry


def _span_ratio(totals: list[tuple[int, int, int]], after: int, until: int | None) -> float | None:
    """Activation ratio of the steps in (after, until] from running (step, original, packed) totals."""
    before = max((t for t in totals if t[0] <= after), default=(after, 0, 0))
    inside = [t for t in totals if t[0] > after and (until is None or t[0] <= until)]
    if not inside:
        return None
    original, packed = inside[-1][1] - before[1], inside[-1][2] - before[2]
    return _round(original / packed) if packed > 0 else None


def summarise_decisions(metrics_path: str | Path) -> dict | None:
    """The run's decisions and its activation ratio after the first one, from its metrics.jsonl; None when the
    method's controller reported nothing (static codecs, baseline) or the file is missing.

    Returns ``{"decisions": [...], "activation_ratio_after_first_decision": float | None}``: the latter is the
    ratio of every step after the first decision, the steady compression without the first probe's step
    (the adaptive controller's first step trains under the default policy while it measures).
    """
    path = Path(metrics_path)
    if not path.exists():
        return None
    reports: list[dict] = []
    totals: list[tuple[int, int, int]] = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            if record.get("kind") == "compression":
                reports.append(record)
            elif record.get("kind") == "train" and record.get("activation_packed_bytes") is not None:
                totals.append((record["step"], record["activation_original_bytes"], record["activation_packed_bytes"]))
    if not reports:
        return None
    decisions = [_decision(record) for record in reports]
    steps = [entry["step"] for entry in decisions]
    for entry, until in zip(decisions, steps[1:] + [None]):
        entry["ratio"] = _span_ratio(totals, entry["step"], until)
    return {"decisions": decisions,
            "activation_ratio_after_first_decision": _span_ratio(totals, steps[0], None)}
