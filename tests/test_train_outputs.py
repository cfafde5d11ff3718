"""What a run leaves for people and other tools: export of plain weights, a time on every metrics line,
progress lines without a terminal, the CLI's --version and --debug, the MLflow switch."""

from __future__ import annotations

import io
import json
import logging

import pytest
import torch

from hpcdl.cli import main
from hpcdl.train import load_config, run_training
from hpcdl.train.progress import Progress

SMALL = ["data.dataset=synthetic", "data.synthetic_samples=64", "model.scale=tiny", "train.batch=16",
         "train.steps_per_epoch=2", "train.epochs=1", "logging.progress=false", "compression.method=none",
         "distributed.backend=none"]


def test_export_writes_a_plain_state_dict_and_metrics_lines_carry_a_time(tmp_path, capsys):
    result = run_training(load_config("hep-particles", overrides=SMALL), run_dir=tmp_path / "run")
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lines and all(isinstance(line["time"], float) and line["time"] > 1.6e9 for line in lines)
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "model.pt")]) == 0
    assert "(step 2)" in capsys.readouterr().out
    weights = torch.load(tmp_path / "model.pt", weights_only=True)
    from hpcdl import models

    spec = models.spec(result.config["model"]["name"])
    model = spec.build("tiny", **result.model_options)
    model.load_state_dict(weights)  # the plain state dict fits the model
    assert main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "m.pt")]) == 2
    assert "nothing' does not exist" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "no" / "m.pt")]) == 2
    assert "does not exist; create it first" in capsys.readouterr().err


def test_progress_without_a_terminal_logs_plain_lines(caplog):
    stream = io.StringIO()  # not a TTY, like a Slurm .out file
    with caplog.at_level(logging.INFO, logger="hpcdl"):
        progress = Progress("run", 40, 0, enabled=True, stream=stream)
        for step in range(1, 41):
            progress.update(step, 0, 0.5)
        progress.close()
    assert stream.getvalue() == ""
    assert len(caplog.records) == 20 and caplog.records[-1].getMessage() == "run: step 40/40 epoch 0 loss 0.5000"
    assert all("\r" not in record.getMessage() for record in caplog.records)


def test_version_and_debug_on_every_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("hpcdl 0.")
    assert main(["configs", "--debug"]) == 0 and main(["--debug", "configs"]) == 0
    with pytest.raises(FileNotFoundError):  # --debug: the traceback, not the one-line error
        main(["--debug", "export", "missing-run", "--out", "m.pt"])
    assert main(["export", "missing-run", "--out", "m.pt"]) == 2
    assert logging.getLogger("hpcdl").level == logging.INFO


def test_mlflow_logging_logs_offline_under_the_run_directory(tmp_path):
    # (Without the mlflow package it is a one-line config error: tests/test_train_loggers.py.)
    overrides = [*SMALL, "logging.mlflow=true"]
    run_training(load_config("hep-particles", overrides=overrides), run_dir=tmp_path / "run")
    assert any((tmp_path / "run" / "mlruns").rglob("meta.yaml"))
