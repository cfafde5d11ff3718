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
