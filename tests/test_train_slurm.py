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


@pytest.mark.slow  # two or more job starts with requeues between them, and a reference run
def test_a_job_past_its_time_limit_is_signalled_checkpoints_requeues_and_resumes_to_the_uninterrupted_weights(
        tmp_path):
    """Slurm itself sends the warning: ``--time 00:02:00 --signal-lead 30`` (``--signal=B:USR1@30``).

    slurmctld looks at time limits on a 30-s tick (PERIODIC_TIMEOUT, compiled in; no slurm.conf setting) and
    sends the warning up to 60 s before ``limit - lead`` (sbatch(1)); on this cluster it came 3 s early to
    8 s late with 1- and 2-minute limits, and 30 s early once. With ``limit - lead`` = 90 s it comes when the
    ranks are past their start-up (up to 30 s on a loaded machine; a rank still starting holds the signal,
    tests/test_train_signals.py) and with time to finish a step and checkpoint before the limit. The training
    is throttled to about 5 s a step, 28 steps (the test codec ``negate`` sleeping ``delay_s`` in each of its
    ~70 encodes a step; exact, so the weights are those of an unthrottled run), so the first attempt is still
    training when the signal comes, even on an idle machine (at 3.5 s a step an idle one once trained all 28
    steps before it: a stop at the last step, which is also correct). A requeued attempt gets the limit afresh
    and may be signalled and requeued again, which must work too; each requeue waits cred_expire + 1 s, 21 s
    on the test cluster (tools/slurm_cluster.sh).
    """
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    import torch
    from codec_plugin import install_testcodec

    from hpcdl.train.checkpoint import latest_checkpoint, load_checkpoint

    from mpi_helpers import run_mpi
    from slurm_helpers import _finished

    require(slurm_cluster_up(), "a running Slurm cluster (bash tools/slurm_cluster.sh start)")
    sets = ["data.dataset=synthetic", "data.synthetic_samples=448", "model.scale=tiny", "train.batch=16",
            "train.epochs=1", "logging.every_steps=1", "logging.progress=false", "compression.method=codec",
            "compression.min_bytes=0"]  # 28 steps; about 70 saved tensors a step and rank go through the codec
    throttled = [*sets, "compression.codec={id: negate, delay_s: 0.07}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [*install_testcodec(tmp_path / "site"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    run_dir = (tmp_path / "run").resolve()
    log = tmp_path / "slurm-%j.out"
    began = time.monotonic()
    submitted = subprocess.run(
        [sys.executable, "-m", "hpcdl", "slurm", "submit", "--system", "local", "--chdir", str(tmp_path),
         "--output", str(log), "--time", "00:02:00", "--signal-lead", "30",
         *[item for override in throttled for item in ("--set", override)], "hep-particles", "--",
         "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=120, env=env)  # sbatch exports this environment to the job
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[0]
    job = _finished(job_id, Path(str(log).replace("%j", job_id)), timeout=600)
    assert job.succeeded, job.log
    requeues = job.log.count(f"requeueing job {job_id}")
    assert requeues >= 1 and job.log.count("stopped on SIGUSR1 after step") >= requeues, job.log  # each rank logs it
    assert time.monotonic() - began > 30, "the warning cannot have come from the time limit this early"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 28 and 1 <= summary["resumed_from_step"] <= 28
    train_steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                   if json.loads(line)["kind"] == "train"]
    assert train_steps == list(range(1, 29)), "each step logged once across the requeues"

    # The reference: the same 2 ranks under the same mpirun, uninterrupted and not throttled.
    whole = tmp_path / "whole"
    reference = run_mpi(2, [sys.executable, "-m", "hpcdl", "train", "hep-particles",
                            *[item for override in [*sets, "compression.codec={id: negate}"]
                              for item in ("--set", override)], "--run-dir", str(whole)], env=env)
    assert reference.returncode == 0, reference.stderr
    a = load_checkpoint(latest_checkpoint(run_dir / "checkpoints"))["model"]
    b = load_checkpoint(latest_checkpoint(whole / "checkpoints"))["model"]
    for key in b:
        torch.testing.assert_close(a[key], b[key], rtol=1e-6, atol=1e-7)
