"""TensorBoard and MLflow logging, read back with the tools' own readers: the loss per step, the config (as text,
hparams and params), the MLflow run's end status, and two runs in one process kept apart."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from hpcdl.train import load_config, run_training
from hpcdl.train.config import dump_config
from hpcdl.train.runlog import RunLog, flat_config
from hpcdl.train.signals import TrainingInterrupted

TINY = ["data.dataset=synthetic", "data.synthetic_samples=64", "model.scale=tiny", "train.batch=16",
        "train.steps_per_epoch=3", "train.epochs=1", "logging.every_steps=1", "logging.progress=false",
        "compression.method=none", "distributed.backend=none"]


def _train_losses(run_dir: Path) -> dict[int, float]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {line["step"]: line["loss"] for line in lines if line["kind"] == "train"}


@pytest.fixture
def no_file_store_opt_out(monkeypatch):
    """Start without MLFLOW_ALLOW_FILE_STORE, as a fresh shell does, and remove whatever the run sets after."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "unset-below")  # recorded as absent-before, so undone after
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")


def test_tensorboard_holds_the_loss_per_step_the_config_text_and_hparams(tmp_path, one_thread):
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    run_dir = tmp_path / "run"
    result = run_training(load_config("hep-particles", overrides=[*TINY, "logging.tensorboard=true"]),
                          run_dir=run_dir)
    events = event_accumulator.EventAccumulator(
        str(run_dir / "tensorboard"), size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    events.Reload()

    losses = _train_losses(run_dir)
    assert sorted(losses) == [1, 2, 3]
    logged = {event.step: event.value for event in events.Scalars("train/loss")}
    assert logged == pytest.approx(losses, rel=1e-6)  # stored as float32
    final = result.epochs[-1]
    assert [event.value for event in events.Scalars("val/val_loss")] == pytest.approx([final["val_loss"]])

    (text,) = events.Tensors("config/text_summary")
    config_text = (run_dir / "config.resolved.yaml").read_text()
    assert text.tensor_proto.string_val[0].decode() == "".join("    " + line for line in config_text.splitlines(True))

    plugin = {tag: plugin_data_pb2.HParamsPluginData.FromString(content)
              for tag, content in events.PluginTagToContent("hparams").items()}
    hparams = plugin["_hparams_/session_start_info"].session_start_info.hparams
    assert set(hparams) == set(flat_config(result.config))
    assert hparams["train.batch"].number_value == 16
    assert hparams["model.name"].string_value == "particle-transformer"
    assert hparams["optimizer.betas"].string_value == json.dumps(result.config["optimizer"]["betas"])
    metric_tags = {info.name.tag for info in plugin["_hparams_/experiment"].experiment.metric_infos}
    assert {"final/val_loss", "final/train_loss", "final/step"} <= metric_tags
    assert [event.value for event in events.Scalars("final/val_loss")] == pytest.approx([final["val_loss"]])


def _only_run(store: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    experiment = client.get_experiment_by_name("hpcdl")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1, [run.info.run_name for run in runs]
    return client, runs[0]


def test_mlflow_runs_hold_their_own_params_metrics_and_status(tmp_path, one_thread, no_file_store_opt_out):
    """Two runs in one process, each with its own offline store: params, per-step metrics, FINISHED, no mixing."""
    results = {}
    for lr in ("0.001", "0.003"):
        config = load_config("hep-particles", overrides=[*TINY, "logging.mlflow=true", f"optimizer.lr={lr}"])
        results[lr] = run_training(config, run_dir=tmp_path / f"lr{lr}")
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"  # the default store's opt-out, set by the run

    for lr, result in results.items():
        run_dir = tmp_path / f"lr{lr}"
        client, run = _only_run(run_dir / "mlruns")
        assert run.info.status == "FINISHED" and run.info.run_name == run_dir.name
        expected = {key: value if isinstance(value, str) else json.dumps(value)
                    for key, value in flat_config(result.config).items()}
        assert run.data.params == expected and run.data.params["optimizer.lr"] == lr
        history = client.get_metric_history(run.info.run_id, "train/loss")
        assert {metric.step: metric.value for metric in history} == pytest.approx(_train_losses(run_dir))
        (val_loss,) = client.get_metric_history(run.info.run_id, "val/val_loss")
        assert (val_loss.step, val_loss.value) == (3, pytest.approx(result.epochs[-1]["val_loss"]))
        artifact = Path(client.download_artifacts(run.info.run_id, "config.resolved.yaml", str(tmp_path)))
        assert artifact.read_text() == dump_config(result.config)
    assert _train_losses(tmp_path / "lr0.001") != _train_losses(tmp_path / "lr0.003")


def test_two_runs_into_one_mlflow_uri_are_two_mlflow_runs(tmp_path, one_thread, no_file_store_opt_out):
    store = tmp_path / "shared-mlruns"
    for name in ("first", "second"):
        overrides = [*TINY, "logging.mlflow=true", f"logging.mlflow_uri={store.as_uri()}", f"name={name}"]
        run_training(load_config("hep-particles", overrides=overrides), run_dir=tmp_path / name)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store.as_uri())
    runs = client.search_runs([client.get_experiment_by_name("hpcdl").experiment_id])
    assert sorted(run.info.run_name for run in runs) == ["first", "second"]
    for run in runs:
        assert run.data.params["name"] == run.info.run_name and run.info.status == "FINISHED"
        history = client.get_metric_history(run.info.run_id, "train/loss")
        assert [metric.step for metric in history] == [1, 2, 3]  # its own three steps, not six
    assert not (tmp_path / "first" / "mlruns").exists()


class _Broken(RuntimeError):
    pass


@pytest.mark.parametrize(("ending", "status"), [("error", "FAILED"), ("signal", "KILLED")])
def test_a_failed_or_signalled_run_is_not_marked_finished(tmp_path, one_thread, no_file_store_opt_out, monkeypatch,
                                                          ending, status):
    log = RunLog.log

    def log_then_end(self, record):
        log(self, record)
        if record["kind"] == "train" and record["step"] == 2:
            if ending == "error":
                raise _Broken("a step failed")
            os.kill(os.getpid(), signal.SIGUSR1)  # the trainer checkpoints at this step boundary and stops

    monkeypatch.setattr(RunLog, "log", log_then_end)
    with pytest.raises(_Broken if ending == "error" else TrainingInterrupted):
        run_training(load_config("hep-particles", overrides=[*TINY, "logging.mlflow=true"]), run_dir=tmp_path / "run")
    client, run = _only_run(tmp_path / "run" / "mlruns")
    assert run.info.status == status
    assert [metric.step for metric in client.get_metric_history(run.info.run_id, "train/loss")] == [1, 2]


@pytest.mark.parametrize("package", ["tensorboard", "mlflow"])
def test_a_logger_without_its_package_is_a_one_line_config_error(tmp_path, monkeypatch, package):
    """Both packages are installed here, so their absence is simulated where RunLog looks for them."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else find_spec(name, *a))
    with pytest.raises(ValueError, match=f"logging.{package} is true but the {package} package is not installed"):
        RunLog(tmp_path / "run", writes=True, tensorboard=package == "tensorboard", mlflow=package == "mlflow")
    assert not (tmp_path / "run").exists()
