"""Real jobs on the one-node test Slurm cluster (tools/slurm_cluster.sh): the local template under mpirun,
ranks started by srun, and `hpcdl slurm submit --wait` / `hpcdl slurm status` end to end."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from hpcdl.slurm import JobRequest, render_script

from conftest import require
from distributed_worker import WORKER, check_ranks
from slurm_helpers import slurm_cluster_up, submit_and_wait, submit_cli_and_wait

pytestmark = pytest.mark.slurm


def require_cluster() -> None:
    require(slurm_cluster_up(), "a running Slurm cluster (bash tools/slurm_cluster.sh start)")


def worker_command(backend: str, out_dir) -> str:
    return shlex.join([sys.executable, WORKER, backend, str(out_dir)])


def test_local_template_runs_two_mpi_ranks_of_the_torch_backend(tmp_path):
    require_cluster()
    log = tmp_path / "job-%j.out"
    request = JobRequest(system="local", config="hep-jets", job_name="hpcdl-test-mpirun", time="00:10:00",
                         output=str(log), chdir=str(tmp_path))
    job = submit_and_wait(render_script(request, worker_command("torch", tmp_path)), log)
    assert job.succeeded, job.log
    check_ranks(tmp_path, "torch")


def test_srun_ranks_get_their_rendezvous_from_slurm(tmp_path):
    require_cluster()
    log = tmp_path / "job-%j.out"
    script = "\n".join([
        "#!/bin/bash",
        "#SBATCH --job-name=hpcdl-test-srun",
        "#SBATCH --ntasks=2",
        "#SBATCH --time=00:10:00",
        f"#SBATCH --output={log}",
        "set -euo pipefail",
        "export OMP_NUM_THREADS=1",
        # No MPI and no MASTER_ADDR/PORT: "auto" picks torch (Horovod could not see the ranks), which derives
        # its rendezvous from the step's SLURM_* variables.
        f"srun --mpi=none {worker_command('auto', tmp_path)}",
        "",
    ])
    job = submit_and_wait(script, log)
    assert job.succeeded, job.log
    check_ranks(tmp_path, "torch")


def test_cli_submit_waits_and_status_reports_the_finished_job(tmp_path):
    require_cluster()
    # `--print-config` keeps the job short: 2 ranks start `hpcdl train`, load the config and print it.
    job = submit_cli_and_wait(["--set", "train.epochs=1", "hep-jets", "--", "--print-config"], workdir=tmp_path)
    assert job.succeeded, job.log
    assert job.log.count("name: hep-jets") == 2  # once per rank
    assert "epochs: 1" in job.log
    status = subprocess.run([sys.executable, "-m", "hpcdl", "slurm", "status", job.job_id],
                            capture_output=True, text=True, timeout=120, check=True)
    assert status.stdout.splitlines()[1].split()[:3] == [job.job_id, "hpcdl-hep-jets", "COMPLETED"]


def test_cli_submit_reports_a_failing_job(tmp_path):
    require_cluster()
    command = [sys.executable, "-m", "hpcdl", "slurm", "submit", "--system", "local", "--chdir", str(tmp_path),
               "--output", str(tmp_path / "slurm-%j.out"), "--wait", "hep-jets", "--", "--resume",
               str(tmp_path / "no-such-run")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED" in result.stdout
