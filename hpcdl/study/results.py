"""The study's results file: append-only JSON lines, one per finished (or skipped, or failed) run.

Each line is written with a single ``os.write`` on an ``O_APPEND`` descriptor and fsync'd before the
next run starts, so a crash loses at most the run in progress. A process killed in the middle of a
write can leave one truncated last line; :func:`read_results` reports it (``Results.truncated``)
and :func:`append_record` starts the next record on a fresh line, so the finished lines stay intact.

Records written before a method was renamed (``checkpoint``, now ``recompute``) are read under the
current name, so a report groups them with the new runs; the file itself is never rewritten.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from hpcdl.train.config import METHOD_ALIASES

RESULTS_NAME = "results.jsonl"
FINISHED_STATUSES = ("ok", "skipped")


@dataclass
class Results:
    """The parsed records of a study's results files, in file order, and any truncated last lines by file."""

    paths: list[Path]
    records: list[dict] = field(default_factory=list)
    truncated: dict[str, str] = field(default_factory=dict)

    def runs(self) -> list[dict]:
        """Run records (``kind == "run"``), the last one per key (a retried failure replaces the failure)."""
        latest: dict[str, dict] = {}
        for record in self.records:
            if record.get("kind") == "run":
                latest[record["key"]] = record
        return list(latest.values())

    def finished_keys(self, retry_failed: bool = False) -> set[str]:
        """Keys that a resumed sweep skips: ok and skipped runs, and failed ones unless ``retry_failed``."""
        statuses = FINISHED_STATUSES if retry_failed else FINISHED_STATUSES + ("failed",)
        return {run["key"] for run in self.runs() if run.get("status") in statuses}

    def step_peaks(self) -> dict[tuple[str, str], dict[tuple[str, int], dict]]:
        """Single-step peak records by (model, scale), then by (method spec, seed); the last of each."""
        peaks: dict[tuple[str, str], dict[tuple[str, int], dict]] = {}
        for record in self.records:
            if record.get("kind") == "step_peak":
                peaks.setdefault((record["model"], record["scale"]), {})[(record["method"], record["seed"])] = record
        return peaks

    def activation_stats(self) -> dict[tuple[str, str], dict]:
        """Per-module activation value statistics by (model, scale)."""
        return {
            (record["model"], record["scale"]): record["modules"]
            for record in self.records
            if record.get("kind") == "activation_stats" and "modules" in record
        }


def results_path(out: str | os.PathLike, shard: tuple[int, int] = (0, 1)) -> Path:
    """The file a sweep (or shard ``(i, n)`` of one) appends to: ``results.jsonl``, or one file per shard.

    Shards write separate files so that array tasks on a parallel file system (Lustre, GPFS), where
    concurrent appends to one file may interleave, never share a file. A path ending in .jsonl is
    used as it is.
    """
    out = Path(out)
    if out.suffix == ".jsonl":
        return out
    index, count = shard
    return out / (RESULTS_NAME if count == 1 else f"results-shard{index}of{count}.jsonl")


def result_files(out: str | os.PathLike) -> list[Path]:
    """Every results file of a study directory (``results.jsonl`` and shard files), or the one file given."""
    out = Path(out)
    if out.suffix == ".jsonl":
        return [out] if out.exists() else []
    return sorted(out.glob("results*.jsonl"), key=lambda path: (path.name != RESULTS_NAME, path.name))


def read_results(out: str | os.PathLike) -> Results:
    """Parse a study's results files. A malformed line other than an unterminated last one is an error naming it."""
    paths = result_files(out)
    if not paths:
        raise FileNotFoundError(f"no results file in {out}; run `hpcdl study run --out {out}` first")
    parsed = Results(paths=paths)
    for path in paths:
        lines = path.read_text(encoding="utf-8").split("\n")
        # A file ending in "\n" splits into [..., ""]; anything else in the last slot is an unterminated line.
        for number, line in enumerate(lines[:-1], start=1):
            if not line.strip():
                continue
            try:
                parsed.records.append(_current_names(json.loads(line)))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}: line {number} is not valid JSON ({err}); the file was edited or "
                                 "corrupted") from err
        if lines[-1].strip():
            try:
                parsed.records.append(_current_names(json.loads(lines[-1])))
            except json.JSONDecodeError:
                parsed.truncated[str(path)] = lines[-1]
    return parsed


def _current_names(record):
    """``record`` with an old method name (``method``, ``method_kind``: ``checkpoint``) replaced by the current one."""
    if isinstance(record, dict):
        for key in ("method", "method_kind"):
            if isinstance(record.get(key), str):
                record[key] = METHOD_ALIASES.get(record[key], record[key])
    return record


def _finite_or_none(value):
    """The record with NaN/Inf floats replaced by None, so every line is strict JSON (a diverged loss reads null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite_or_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(item) for item in value]
    return value


def append_record(out: str | os.PathLike, record: dict, shard: tuple[int, int] = (0, 1)) -> None:
    """Append one record as a JSON line to ``results_path(out, shard)``, durably (fsync).

    After a truncated last line, the record starts on a fresh line.
    """
    path = results_path(out, shard)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(_finite_or_none(record), sort_keys=True, allow_nan=False) + "\n"
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = "\n" + line
        os.write(fd, line.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
