"""The training loop on CPU: run directory outputs, methods, resume after a kill, bad checkpoints.

Runs use the particle transformer at its tiny scale on synthetic jets (no
dropout, so runs are bit-for-bit repeatable) for a handful of steps.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hpcdl.train import load_config, run_training
from hpcdl.train.checkpoint import (
    CheckpointError,
    CheckpointWarning,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
)

SMALL = ["data.dataset=synthetic", "data.synthetic_samples=128", "model.scale=tiny", "train.batch=16",
         "train.steps_per_epoch=4", "train.epochs=2", "logging.progress=false", "compression.method=none"]
SZ = ["compression.method=codec", "compression.codec={id: sz, mode: rel, bound: 1.0e-2}"]


def _config(*overrides):
    return load_config("hep-particles", overrides=[*SMALL, *overrides])


def _final_parameters(run_dir: Path) -> dict:
    return load_checkpoint(latest_checkpoint(Path(run_dir) / "checkpoints"))["model"]


def test_a_short_run_writes_its_run_directory(tmp_path):
    result = run_training(_config("logging.every_steps=2"), run_dir=tmp_path / "run")
    run = Path(result.run_dir)
    assert load_config(run / "config.resolved.yaml")["train"]["batch"] == 16
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [line for line in lines if line["kind"] == "train"]
    assert [line["step"] for line in train] == [2, 4, 6, 8]
    assert all(line["samples_per_s"] > 0 and line["step_time_s"] > 0 and line["peak_memory_bytes"] >= 0
               for line in train)
    assert [line["epoch"] for line in lines if line["kind"] == "val"] == [0, 1]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 8 and summary["metric_name"] == "auc" and len(summary["epochs"]) == 2
    assert 0 <= result.final_val_metric <= 1 and result.batch_size == 16 and result.world_size == 1
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["ckpt-00000008.pt"]


def test_sz_compression_reports_ratio_and_starts_like_the_baseline(tmp_path):
    baseline = run_training(_config("train.epochs=1", "logging.every_steps=1"), run_dir=tmp_path / "base")
    compressed = run_training(_config("train.epochs=1", "logging.every_steps=1", *SZ), run_dir=tmp_path / "sz")
    assert baseline.activation_packed_bytes == 0 and baseline.method == "none"
    assert compressed.method == "codec:sz:rel=0.01"
    assert compressed.activation_ratio > 2 and compressed.per_module
    assert sum(m["original"] for m in compressed.per_module.values()) == compressed.activation_original_bytes

    def first_loss(result):
        return json.loads((Path(result.run_dir) / "metrics.jsonl").read_text().splitlines()[0])["loss"]

    assert first_loss(baseline) == first_loss(compressed)  # same weights and batch; forward is exact
    assert baseline.epochs[-1]["train_loss"] == pytest.approx(compressed.epochs[-1]["train_loss"], rel=0.05)


def test_recompute_method_gives_the_baseline_gradients(tmp_path):
    baseline = run_training(_config("train.epochs=1"), run_dir=tmp_path / "base")
    recomputed = run_training(_config("train.epochs=1", "compression.method=recompute"), run_dir=tmp_path / "ck")
    a, b = _final_parameters(baseline.run_dir), _final_parameters(recomputed.run_dir)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


def test_offload_without_cuda_is_a_clear_error(tmp_path):
    # (A missing tensorboard or mlflow package: tests/test_train_loggers.py.)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="offload .* needs CUDA"):
            run_training(_config("compression.method=offload"), run_dir=tmp_path / "off")


def _train_command(run_dir: Path, *extra: str) -> list[str]:
    sets = [item for override in [*SMALL, "checkpoint.every_steps=2",
                                  "checkpoint.keep=3", "logging.every_steps=1", *extra] for item in ("--set", override)]
    return [sys.executable, "-m", "hpcdl", "train", "hep-particles", *sets, "--run-dir", str(run_dir)]


def _kill_after_checkpoint(command: list[str], run_dir: Path, step: int, delay_s: float = 0.0) -> bool:
    """Start ``command``; SIGKILL it ``delay_s`` after its checkpoint of ``step`` (or a later one) appears.

    Returns True if it was killed, False if it finished first.
    """
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not any(int(p.stem.split("-")[1]) >= step for p in list_checkpoints(run_dir / "checkpoints")):
        if process.poll() is not None:
            assert process.returncode == 0, process.stderr.read().decode()
            process.stderr.close()
            return False
        assert time.monotonic() < deadline, "the training subprocess made no checkpoint in time"
        time.sleep(0.005)
    time.sleep(delay_s)
    process.send_signal(signal.SIGKILL)
    process.wait()
    process.stderr.close()
    return process.returncode == -signal.SIGKILL


def _assert_equal_weights(run_dir: Path, reference: Path) -> None:
    """Bit for bit: CPU torch on fixed threads, with data order and every RNG restored, is deterministic."""
    a, b = _final_parameters(run_dir), _final_parameters(reference)
    assert a.keys() == b.keys()
    differing = [key for key in a if not torch.equal(a[key], b[key])]
    assert not differing, f"after the resume {len(differing)} of {len(a)} tensors differ, e.g. {differing[:3]}"


def test_a_run_killed_in_epoch_two_resumes_to_the_uninterrupted_result(tmp_path):
    killed = tmp_path / "killed"
    # Step 6 is the second step of epoch 2 (4 steps per epoch); the run has 8.
    assert _kill_after_checkpoint(_train_command(killed, "distributed.backend=none"), killed, 6)
    assert not (killed / "summary.json").exists()
    resumed_from = load_checkpoint(latest_checkpoint(killed / "checkpoints"))["step"]
    assert 6 <= resumed_from < 8

    subprocess.run(_train_command(killed, "distributed.backend=none")[:-2] + ["--resume", str(killed)],
                   check=True, stdout=subprocess.DEVNULL)
    # The reference run is a process of its own too, so both see the same process state (threads, allocator).
    uninterrupted = tmp_path / "whole"
    subprocess.run(_train_command(uninterrupted, "distributed.backend=none"), check=True, stdout=subprocess.DEVNULL)

    _assert_equal_weights(killed, uninterrupted)
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["resumed_from_step"] == resumed_from and summary["steps"] == 8
    steps = [json.loads(line)["step"] for line in (killed / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "train"]
    assert steps == list(range(1, 9)), "metrics.jsonl must hold each step once after the resume"
    whole = json.loads((uninterrupted / "summary.json").read_text())
    assert [e["val_metric"] for e in summary["epochs"]] == pytest.approx([e["val_metric"] for e in whole["epochs"]])


def _flip_a_byte(path: Path) -> None:
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    path.write_bytes(bytes(blob))


def test_a_corrupted_latest_checkpoint_resumes_from_the_one_before(tmp_path):
    config = _config("checkpoint.every_steps=2")
    whole = run_training(config, run_dir=tmp_path / "run")
    latest = latest_checkpoint(tmp_path / "run" / "checkpoints")
    latest.write_bytes(latest.read_bytes()[:1000])  # truncated, as by a full disk
    (latest.parent / ".ckpt-00000009.pt.123.tmp").write_bytes(b"left by a killed write")
    with pytest.warns(CheckpointWarning, match=r"resuming from ckpt-00000006\.pt instead: checkpoint .*"
                                               r"ckpt-00000008\.pt is corrupted or truncated"):
        resumed = run_training(config, resume=tmp_path / "run")
    assert resumed.resumed_from_step == 6 and resumed.steps == 8
    assert not list(latest.parent.glob("*.tmp"))
    assert resumed.epochs[-1]["val_metric"] == pytest.approx(whole.epochs[-1]["val_metric"])


def test_corrupted_or_foreign_checkpoint_is_refused_and_left_alone(tmp_path):
    config = _config("checkpoint.every_steps=2")
    run_training(config, run_dir=tmp_path / "run")
    for path in list_checkpoints(tmp_path / "run" / "checkpoints"):
        _flip_a_byte(path)
    before = {p.name: p.read_bytes() for p in list_checkpoints(tmp_path / "run" / "checkpoints")}
    with pytest.raises(CheckpointError, match="no checkpoint in .* loads .*corrupted or truncated"):
        run_training(config, resume=tmp_path / "run")
    with pytest.raises(CheckpointError, match="corrupted or truncated"):  # a file named is that file, no fallback
        run_training(config, resume=latest_checkpoint(tmp_path / "run" / "checkpoints"))
    assert {p.name: p.read_bytes() for p in list_checkpoints(tmp_path / "run" / "checkpoints")} == before
    run_training(config, run_dir=tmp_path / "run")

    earlier = list_checkpoints(tmp_path / "run" / "checkpoints")[0]
    with pytest.raises(CheckpointError, match="global_batch: checkpoint has 16, this run has 32"):
        run_training(_config("checkpoint.every_steps=2", "train.batch=32"), resume=earlier)


def test_batch_auto_needs_a_budget_on_cpu(tmp_path):
    with pytest.raises(ValueError, match="train.memory_budget"):
        run_training(_config("train.batch=auto", "train.memory_budget=null"), run_dir=tmp_path / "auto")


@pytest.mark.slow
def test_batch_auto_uses_the_measured_search(tmp_path):
    budget = 2 * 2**20
    config = _config("train.batch=auto", f"train.memory_budget={budget}", "train.epochs=1",
                     "train.steps_per_epoch=1", "data.synthetic_samples=512")
    result = run_training(config, run_dir=tmp_path / "auto")
    search = result.batch_search
    chosen = result.per_device_batch
    assert result.batch_size == chosen == search["per_device_batch"] and search["budget_bytes"] == budget
    assert search["probes"][str(chosen)] <= budget, "the chosen batch's measured peak fits"
    assert search["probes"][str(chosen + 1)] > budget or str(chosen + 1) not in search["probes"]
    assert any(int(b) > chosen and peak > budget for b, peak in search["probes"].items()), \
        "the search must have measured a larger batch that does not fit"


def test_resume_restores_the_numpy_python_and_torch_random_generators(tmp_path):
    import random

    import numpy as np

    np.random.seed(7), random.seed(7)
    run_training(_config("train.epochs=1"), run_dir=tmp_path / "run")
    saved = load_checkpoint(latest_checkpoint(tmp_path / "run" / "checkpoints"))["rng"]
    np.random.seed(99), random.seed(99), torch.manual_seed(99)
    # Resuming the finished run trains nothing and saves again: what it saves is what it restored.
    run_training(_config("train.epochs=1"), resume=tmp_path / "run")
    restored = load_checkpoint(latest_checkpoint(tmp_path / "run" / "checkpoints"))["rng"]
    assert torch.equal(restored["torch"], saved["torch"])
    assert torch.equal(restored["numpy"][1], saved["numpy"][1]) and restored["numpy"][2] == saved["numpy"][2]
    assert restored["python"] == saved["python"]
    assert not torch.equal(saved["numpy"][1], torch.from_numpy(np.random.RandomState(99).get_state()[1].astype(np.int64)))


def test_out_dir_that_is_a_file_and_hostile_run_names_are_clear_errors(tmp_path, capsys):
    from hpcdl.cli import main
    from hpcdl.train.runlog import new_run_dir

    (tmp_path / "afile").write_text("")
    with pytest.raises(ValueError, match=r"'.*afile' is a file, not a directory; choose another logging\.out_dir"):
        run_training(_config(f"logging.out_dir={tmp_path / 'afile'}"))
    assert main(["train", "hep-particles", "--set", "name=../../x", "--set", f"logging.out_dir={tmp_path}"]) == 2
    assert capsys.readouterr().err.startswith("hpcdl train: error: config key 'name' must be a run name")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "run-19700101-000000").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="would lie outside logging.out_dir"):
        new_run_dir(tmp_path / "out", "run", 0)
    assert new_run_dir(tmp_path / "out", "run", 1).parent == tmp_path / "out"


def _kill_after_step_line(command: list[str], step: int, delay_s: float) -> int:
    """Start ``command`` (a training that logs every step on stderr), read its log until the line of ``step``,
    then SIGKILL it ``delay_s`` later; returns its exit status (-SIGKILL unless it finished first)."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = []
    for line in process.stderr:
        log.append(line)
        if f": step {step}/" in line:
            time.sleep(delay_s)
            process.send_signal(signal.SIGKILL)
            break
    process.wait(timeout=120)
    process.stderr.close()
    assert process.returncode == -signal.SIGKILL, f"exit {process.returncode} before step {step}: {''.join(log)}"
    return process.returncode


@pytest.mark.slow
def test_kill_campaign_sigkills_mid_run_then_resume_reach_exactly_the_uninterrupted_weights(tmp_path):
    """SIGKILL training subprocesses (checkpoints every step) at random step points, resume each, compare.

    Each kill is placed by the run's own log: right after the line of a random step among the first 8 of 12,
    plus a random delay of up to 50 ms (inside the next step or its checkpoint write), so at least 4 steps
    and 2 validations remain and every kill lands mid-run, even on a loaded machine. The resumed run must
    end with exactly the uninterrupted run's weights. Bounded: one reference run and 4 kills with their
    resumes, 45 s on the 2-core machine at load ~10.
    """
    import random

    extra = ("distributed.backend=none", "checkpoint.every_steps=1", "train.epochs=3", "logging.progress=true")
    reference = tmp_path / "whole"
    subprocess.run(_train_command(reference, *extra), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    rng = random.Random(0)
    for kill in range(4):
        run_dir = tmp_path / f"killed-{kill}"
        step, delay = rng.randint(1, 8), rng.uniform(0.0, 0.05)
        _kill_after_step_line(_train_command(run_dir, *extra), step, delay)
        assert not (run_dir / "summary.json").exists()
        # The step line is logged just before that step's checkpoint is written.
        assert step - 1 <= load_checkpoint(latest_checkpoint(run_dir / "checkpoints"))["step"] < 12
        subprocess.run(_train_command(run_dir, *extra)[:-2] + ["--resume", str(run_dir)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert not list((run_dir / "checkpoints").glob(".*.tmp"))
        assert json.loads((run_dir / "summary.json").read_text())["steps"] == 12
        _assert_equal_weights(run_dir, reference)
