"""The run directory and what rank 0 writes into it.

``<out_dir>/<name>-<YYYYmmdd-HHMMSS>/`` holds ``config.resolved.yaml``,
``metrics.jsonl`` (one JSON object per line: ``"kind": "train"`` lines every
``logging.every_steps`` steps, ``"kind": "val"`` lines once per epoch; every
line has ``"time"``, unix wall-clock seconds), ``summary.json``,
``checkpoints/`` and, when asked for, ``tensorboard/`` (scalars, the config as
text, hparams with the final metrics) and ``mlruns/`` (an offline MLflow file
store, unless ``logging.mlflow_uri`` names another tracking server).
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
from urllib.parse import urlparse

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

    def __init__(self, run_dir: Path, writes: bool, tensorboard: bool, mlflow: bool = False,
                 mlflow_uri: str | None = None):
        self.run_dir, self.writes = run_dir, writes
        self._metrics = None
        self._tensorboard = None
        self._mlflow = None
        for wanted, package in ((tensorboard, "tensorboard"), (mlflow, "mlflow")):
            if wanted and importlib.util.find_spec(package) is None:
                raise ValueError(f"logging.{package} is true but the {package} package is not installed; "
                                 f"`pip install {package}`, or set logging.{package}=false")
        if writes:
            make_dir(run_dir, "run directory")
            if tensorboard:
                from torch.utils.tensorboard import SummaryWriter

                self._tensorboard = SummaryWriter(str(run_dir / "tensorboard"))
            if mlflow:
                self._mlflow = _MlflowRun(run_dir, mlflow_uri)

    def write_config(self, config: dict) -> None:
        if not self.writes:
            return
        text = dump_config(config)
        (self.run_dir / "config.resolved.yaml").write_text(text)
        if self._tensorboard is not None:
            # Markdown: indented four spaces, the YAML shows as a code block in TensorBoard's text tab.
            self._tensorboard.add_text("config", "".join("    " + line for line in text.splitlines(True)))
        if self._mlflow is not None:
            self._mlflow.log_config(config, text)

    def write_hparams(self, config: dict, final_metrics: dict) -> None:
        """The flattened config against the final metrics (TensorBoard's hparams tab), at the end of a run."""
        if not self.writes or self._tensorboard is None:
            return
        hparams = {key: value if isinstance(value, (int, float, str, bool)) else json.dumps(value)
                   for key, value in flat_config(config).items()}
        metrics = {key: value for key, value in final_metrics.items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool)}
        self._tensorboard.add_hparams(hparams, metrics, run_name=".")

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
        """Append ``record`` (with ``"time"``, unix seconds, added) to metrics.jsonl and the loggers."""
        if not self.writes:
            return
        record = {**record, "time": time.time()}
        self._metrics.write(json.dumps(record) + "\n")
        scalars = {f"{record['kind']}/{key}": value for key, value in record.items()
                   if key not in ("kind", "step", "epoch", "time") and isinstance(value, (int, float))
                   and not isinstance(value, bool)}
        if self._tensorboard is not None:
            for key, value in scalars.items():
                self._tensorboard.add_scalar(key, value, record["step"], walltime=record["time"])
        if self._mlflow is not None:
            self._mlflow.log_metrics(scalars, record["step"], record["time"])

    def write_summary(self, summary: dict) -> None:
        if not self.writes:
            return
        path = self.run_dir / "summary.json"
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(summary, indent=2) + "\n")
        os.replace(temporary, path)

    def close(self, status: str = "FINISHED") -> None:
        """Close every writer; ``status`` ends the MLflow run: FINISHED, FAILED (an error) or KILLED (a signal)."""
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._mlflow is not None:
            self._mlflow.close(status)
            self._mlflow = None


def flat_config(config: dict, prefix: str = "") -> dict:
    """``{"train.batch": 8, ...}``: nested dict keys joined by dots (lists and other values as they are)."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(flat_config(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class _MlflowRun:
    """One MLflow run for one training run: params from the config, metrics per logged step.

    Uses an ``MlflowClient`` rather than mlflow's global active run, so nothing leaks between runs in one process.
    """

    def __init__(self, run_dir: Path, uri: str | None):
        from mlflow.tracking import MlflowClient

        if uri is None or urlparse(uri).scheme in ("", "file"):
            # Recent MLflow (3.x) refuses file stores unless this opt-out is set; the offline store under the
            # run directory is the point of the default. Process-wide, because MLflow may rebuild the store
            # (an LRU cache of stores) at any later call. A user's own setting is left as it is.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri or (Path(run_dir).resolve() / "mlruns").as_uri())
        name = "hpcdl"
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment_id, run_name=Path(run_dir).name).info.run_id

    def log_config(self, config: dict, text: str) -> None:
        for key, value in flat_config(config).items():
            self.client.log_param(self.run_id, key, json.dumps(value) if not isinstance(value, str) else value)
        self.client.log_text(self.run_id, text, "config.resolved.yaml")

    def log_metrics(self, scalars: dict, step: int, timestamp: float) -> None:
        for key, value in scalars.items():
            self.client.log_metric(self.run_id, key, value, timestamp=int(timestamp * 1000), step=step)

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status)
