"""Submit jobs to the real test Slurm cluster and wait for them (test helper, shared by test modules).

CI starts a one-node cluster with ``tools/slurm_cluster.sh start``. Use::

    require(slurm_cluster_up(), "a running Slurm cluster (bash tools/slurm_cluster.sh start)")
    job = submit_cli_and_wait(["hep-jets", "--set", "train.epochs=1"], workdir=tmp_path)
    assert job.succeeded, job.log
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hpcdl.slurm import JobInfo, submit_script, wait_for_job

JOB_TIMEOUT_S = 600


def slurm_cluster_up() -> bool:
    """Whether sbatch exists and sinfo shows at least one node that can take work."""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return False
    result = subprocess.run(["sinfo", "--noheader", "--format=%T"], capture_output=True, text=True, timeout=30)
    states = result.stdout.split()
    return result.returncode == 0 and any(state.rstrip("*") in ("idle", "mixed", "allocated") for state in states)


@dataclass(frozen=True)
class FinishedJob:
    job_id: str
    jobs: list[JobInfo]
    log: str  # the job's output file (stdout and stderr of the batch script)

    @property
    def succeeded(self) -> bool:
        return all(job.succeeded for job in self.jobs)


def submit_and_wait(script: str, log_path: Path, timeout: float = JOB_TIMEOUT_S) -> FinishedJob:
    """sbatch ``script`` (whose --output is ``log_path``), wait for it to end, return its states and log."""
    job_id = submit_script(script)
    return _finished(job_id, Path(str(log_path).replace("%j", job_id)), timeout)


def submit_cli_and_wait(args: list[str], workdir: Path, timeout: float = JOB_TIMEOUT_S) -> FinishedJob:
    """``hpcdl slurm submit --system local`` with ``args`` (options, CONFIG, ``--`` job args), run in ``workdir``."""
    workdir = Path(workdir).resolve()
    log_pattern = workdir / "slurm-%j.out"
    command = [sys.executable, "-m", "hpcdl", "slurm", "submit", "--system", "local", "--chdir", str(workdir),
               "--output", str(log_pattern), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr}")
    job_id = result.stdout.split()[0]
    return _finished(job_id, Path(str(log_pattern).replace("%j", job_id)), timeout)


def _finished(job_id: str, log_path: Path, timeout: float) -> FinishedJob:
    jobs = wait_for_job(job_id, timeout=timeout, poll=0.5)
    log = log_path.read_text() if log_path.exists() else f"(no job output at {log_path})"
    return FinishedJob(job_id, jobs, log)
