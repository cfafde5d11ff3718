"""The run directory and what rank 0 writes into it.

``<out_dir>/<name>-<YYYYmmdd-HHMMSS>/`` holds ``config.resolved.yaml``,
``metrics.jsonl`` (one JSON object per line: ``"kind": "train"`` lines every
``logging.every_steps`` steps, ``"kind": "val"`` lines once per epoch),
``summary.json``, ``checkpoints/`` and, when asked for, ``tensorboard/``.
Non-root ranks get a :class:`RunLog` that writes nothing.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import re
import time
from pathlib import Path

from hpcdl.train.config import check_run_name, dump_config


def run_dir_name(name: str, timestamp: float) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(timestamp))}"


def new_run_dir(out_dir: str | Path, name: str, timestamp: float) -> Path:
    """``<out_dir>/<name>-<timestamp>``, checked to lie directly inside ``out_dir`` whatever ``name`` holds."""
    out_dir = Path(out_dir)
    run_dir = out_dir / run_dir_name(check_run_name(name), timestamp)
    if run_dir.resolve().parent != out_dir.resolve():
        raise ValueError(f"run directory {str(run_dir)!r} would lie outside logging.out_dir {str(out_dir)!r}")
    return run_dir


def make_dir(directory: Path, what: str) -> None:
    """Create ``directory`` (and its parents); a file in the way is a ValueError naming it, not an OSError."""
    blocker = next((p for p in (directory, *directory.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise ValueError(f"cannot create the {what} {str(directory)!r}: {str(blocker)!r} is a file, not a "
                         "directory; choose another logging.out_dir or --run-dir")
    directory.mkdir(parents=True, exist_ok=True)


def latest_run_dir(out_dir: str | Path, name: str) -> Path:
    """The newest ``<out_dir>/<name>-<timestamp>`` directory, for ``--resume`` without a path."""
    check_run_name(name)
    # Exactly <name>-<stamp>: the run "hep-jets" must not pick up a newer "hep-jets-gpu" run.
    stamped = re.compile(re.escape(name) + r"-\d{8}-\d{6}")
    candidates = sorted(p for p in Path(out_dir).glob(f"{glob.escape(name)}-*")
                        if stamped.fullmatch(p.name) and (p / "checkpoints").is_dir())
    if not candidates:
        raise FileNotFoundError(f"no run of {name!r} with checkpoints under {str(out_dir)!r} to resume; "
                                "pass the run directory or a checkpoint file to --resume")
    return candidates[-1]


class RunLog:
    """Writes the run directory's files on rank 0; a silent no-op on other ranks."""

    def __init__(self, run_dir: Path, writes: bool, tensorboard: bool):
        self.run_dir, self.writes = run_dir, writes
        self._metrics = None
        self._tensorboard = None
        if tensorboard and importlib.util.find_spec("tensorboard") is None:
            raise ValueError("logging.tensorboard is true but the tensorboard package is not installed; "
                             "`pip install tensorboard`, or set logging.tensorboard=false")
        if writes:
            make_dir(run_dir, "run directory")
            if tensorboard:
                from torch.utils.tensorboard import SummaryWriter

                self._tensorboard = SummaryWriter(str(run_dir / "tensorboard"))

    def write_config(self, config: dict) -> None:
        if self.writes:
            (self.run_dir / "config.resolved.yaml").write_text(dump_config(config))

    def open_metrics(self, keep_through_step: int | None) -> None:
        """Open metrics.jsonl for appending; when resuming, first drop lines past the restored step."""
        if not self.writes:
            return
        path = self.run_dir / "metrics.jsonl"
        if keep_through_step is not None and path.exists():
            kept = []
            for line in path.read_text().splitlines():
                try:
                    if json.loads(line)["step"] <= keep_through_step:
                        kept.append(line)
                except (json.JSONDecodeError, KeyError, TypeError):
                    break  # a line cut by the kill, and anything after it, is not a record
            path.write_text("".join(line + "\n" for line in kept))
        self._metrics = open(path, "a", buffering=1)

    def log(self, record: dict) -> None:
        if not self.writes:
            return
        self._metrics.write(json.dumps(record) + "\n")
        if self._tensorboard is not None:
            prefix = record["kind"]
            for key, value in record.items():
                if key not in ("kind", "step", "epoch") and isinstance(value, (int, float)):
                    self._tensorboard.add_scalar(f"{prefix}/{key}", value, record["step"])

    def write_summary(self, summary: dict) -> None:
        if not self.writes:
            return
        path = self.run_dir / "summary.json"
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(summary, indent=2) + "\n")
        os.replace(temporary, path)

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
