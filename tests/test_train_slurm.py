"""A 2-rank CPU training job through `hpcdl slurm submit` on the test Slurm cluster, checked by its metrics file."""

from __future__ import annotations

import json

import pytest

from conftest import require
from slurm_helpers import slurm_cluster_up, submit_cli_and_wait

pytestmark = [pytest.mark.slurm, pytest.mark.mpi]

SETS = ["data.dataset=synthetic", "data.synthetic_samples=64", "model.scale=tiny", "train.batch=16",
        "train.steps_per_epoch=2", "train.epochs=1", "logging.every_steps=1", "logging.progress=false"]


def test_two_rank_training_job_writes_its_metrics(tmp_path):
    require(slurm_cluster_up(), "a running Slurm cluster (bash tools/slurm_cluster.sh start)")
    run_dir = tmp_path / "run"
    args = [item for override in SETS for item in ("--set", override)]
    job = submit_cli_and_wait([*args, "hep-particles", "--", "--run-dir", str(run_dir)], workdir=tmp_path)
    assert job.succeeded, job.log
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if line["kind"] == "train"] == [1, 2]
    assert all(line["samples_per_s"] > 0 for line in lines if line["kind"] == "train")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["per_device_batch"] == 8 and summary["steps"] == 2
    assert job.log.count("run directory") == 1, "only rank 0 prints the summary"


@pytest.mark.slow  # two job starts with a requeue between them, and a reference run
def test_a_signalled_job_checkpoints_requeues_and_resumes_to_the_uninterrupted_weights(tmp_path):
    """`scancel --signal=USR1 --batch` is what `--signal=B:USR1@lead` sends before the time limit."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    import torch

    from hpcdl.train.checkpoint import latest_checkpoint, load_checkpoint

    from slurm_helpers import _finished

    require(slurm_cluster_up(), "a running Slurm cluster (bash tools/slurm_cluster.sh start)")
    sets = ["data.dataset=synthetic", "data.synthetic_samples=1024", "model.scale=tiny", "train.batch=16",
            "train.epochs=1", "logging.every_steps=1", "logging.progress=false"]  # 64 steps
    run_dir = (tmp_path / "run").resolve()
    log = tmp_path / "slurm-%j.out"
    args = [item for override in sets for item in ("--set", override)]
    submitted = subprocess.run(
        [sys.executable, "-m", "hpcdl", "slurm", "submit", "--system", "local", "--chdir", str(tmp_path),
         "--output", str(log), *args, "hep-particles", "--", "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[0]
    deadline = time.monotonic() + 300
    while not _steps_logged(run_dir / "metrics.jsonl") >= 3:
        assert time.monotonic() < deadline, f"job {job_id} logged no training step in time"
        time.sleep(0.2)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], check=True, timeout=30)
    job = _finished(job_id, Path(str(log).replace("%j", job_id)), timeout=600)
    assert job.succeeded, job.log
    assert f"requeueing job {job_id}" in job.log and "stopped on SIGUSR1 after step" in job.log
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 64 and 3 <= summary["resumed_from_step"] < 64
    train_steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                   if json.loads(line)["kind"] == "train"]
    assert train_steps == list(range(1, 65)), "each step logged once across the requeue"

    # The reference: the same 2 ranks under the same mpirun, uninterrupted.
    from mpi_helpers import run_mpi

    whole = tmp_path / "whole"
    reference = run_mpi(2, [sys.executable, "-m", "hpcdl", "train", "hep-particles", *args, "--run-dir", str(whole)])
    assert reference.returncode == 0, reference.stderr
    a = load_checkpoint(latest_checkpoint(run_dir / "checkpoints"))["model"]
    b = load_checkpoint(latest_checkpoint(whole / "checkpoints"))["model"]
    for key in b:
        torch.testing.assert_close(a[key], b[key], rtol=1e-6, atol=1e-7)


def _steps_logged(path) -> int:
    lines = path.read_text().splitlines() if path.exists() else []
    return max((json.loads(line)["step"] for line in lines[:-1]), default=0)
