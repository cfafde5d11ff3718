"""Submit a rendered script with ``sbatch``, read job states from ``squeue``/``sacct``, wait for a job to end.

Finished jobs leave ``squeue``; ``sacct`` then knows them where accounting is enabled, and where it is not
(a small cluster without slurmdbd, like the test cluster) ``scontrol show job`` still does for MinJobAge.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass

from hpcdl.slurm.errors import SlurmError

# States after which a job will not run again (Slurm's job state codes, long form).
FINAL_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
    "TIMEOUT", "REVOKED", "SPECIAL_EXIT",
})
SQUEUE_FORMAT = "%i|%j|%T|%M|%l|%D|%R"
SACCT_FIELDS = "JobID,JobName,State,Elapsed,Timelimit,NNodes,ExitCode"


@dataclass(frozen=True)
class JobInfo:
    """One job (or array task) as Slurm reports it."""

    job_id: str
    name: str
    state: str  # e.g. PENDING, RUNNING, COMPLETED, FAILED
    elapsed: str
    time_limit: str
    nodes: str
    detail: str  # the reason while queued, the node list while running, the exit code when done

    @property
    def finished(self) -> bool:
        return self._state_code in FINAL_STATES

    @property
    def succeeded(self) -> bool:
        return self._state_code == "COMPLETED"

    @property
    def _state_code(self) -> str:
        """The state without sacct's detail ("CANCELLED by 1000" -> "CANCELLED")."""
        return (self.state.split() or [""])[0]


def _slurm_command(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise FileNotFoundError(
            f"`{name}` is not on PATH: run this on a Slurm login node (for a local test cluster: "
            "bash tools/slurm_cluster.sh start)"
        )
    return path


def _run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60)


def submit_script(script: str, extra_args: tuple[str, ...] = ()) -> str:
    """Submit ``script`` (its text) with sbatch and return the job id."""
    result = _run([_slurm_command("sbatch"), "--parsable", *extra_args], stdin=script)
    if result.returncode != 0:
        raise SlurmError(f"sbatch refused the job: {result.stderr.strip() or result.stdout.strip()}")
    job_id = result.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch answered {result.stdout.strip()!r}, which holds no job id")
    return job_id


def job_status(job_id: str | None = None, user: str | None = None) -> list[JobInfo]:
    """Queued and running jobs (all of ``user``'s, or all when None), or the one ``job_id`` wherever it is."""
    if job_id is not None and not str(job_id).split("_")[0].isdigit():
        raise SlurmError(f"a job id is a number (or NUMBER_TASK for an array task), got {job_id!r}")
    argv = [_slurm_command("squeue"), "--noheader", f"--format={SQUEUE_FORMAT}"]
    if job_id is not None:
        argv.append(f"--jobs={job_id}")
    elif user is not None:
        argv.append(f"--user={user}")
    result = _run(argv)
    # squeue errors on a job id it no longer knows ("Invalid job id specified"); look further then.
    queued = [_from_squeue(line) for line in result.stdout.splitlines() if line.strip()] if result.returncode == 0 else []
    if queued or job_id is None:
        if result.returncode != 0 and job_id is None:
            raise SlurmError(f"squeue failed: {result.stderr.strip()}")
        return queued
    return _from_sacct(str(job_id)) or _from_scontrol(str(job_id))


def wait_for_job(job_id: str, timeout: float = 600, poll: float = 1.0) -> list[JobInfo]:
    """Poll until the job (every task of an array job) has ended; returns its final entries.

    TimeoutError if it has not ended within ``timeout`` seconds (the job is left alone).
    """
    deadline = time.monotonic() + timeout
    jobs: list[JobInfo] = []
    while time.monotonic() < deadline:
        jobs = job_status(job_id)
        if jobs and all(job.finished for job in jobs):
            return jobs
        time.sleep(poll)
    raise TimeoutError(f"Slurm job {job_id} did not finish within {timeout:.0f} s (last seen: {jobs})")


def _split_around_name(line: str, fields_after: int) -> tuple[str, str, list[str]]:
    """(job id, name, the fields after the name) of a '|'-separated line whose second field is the job name.

    A job name may itself hold '|' (any user can submit one), so the name is whatever lies between the
    first field and the last ``fields_after`` ones, none of which can hold '|'.
    """
    parts = line.split("|")
    if len(parts) < fields_after + 2:
        raise SlurmError(f"Slurm printed {line!r}, which has fewer than {fields_after + 2} '|'-separated fields")
    return parts[0], "|".join(parts[1:-fields_after]), parts[-fields_after:]


def _from_squeue(line: str) -> JobInfo:
    job_id, name, (state, elapsed, limit, nodes, detail) = _split_around_name(line, 5)
    return JobInfo(job_id, name, state, elapsed, limit, nodes, detail)


def _from_sacct_line(line: str) -> JobInfo:
    job_id, name, (state, elapsed, limit, nodes, exit_code) = _split_around_name(line, 5)
    return JobInfo(job_id, name, state, elapsed, limit, nodes, f"exit {exit_code}")


def _from_scontrol_line(line: str) -> JobInfo | None:
    """One ``scontrol --oneliner show job`` line, or None if it describes no job.

    ``JobName=`` may hold spaces and text like ``JobState=COMPLETED``; Slurm prints it right before
    ``UserId=``, so the name is cut out first and the other fields are read from the rest.
    """
    match = re.match(r"(?P<head>.*?)\bJobName=(?P<name>.*?) (?P<tail>UserId=.*)$", line)
    if match is None:
        head, name, tail = line, "", ""
    else:
        head, name, tail = match["head"], match["name"], match["tail"]
    fields: dict[str, str] = {}
    for item in f"{head} {tail}".split():
        key, equals, value = item.partition("=")
        if equals:
            fields.setdefault(key, value)  # the first is Slurm's own; a later one could come from a comment
    if "JobId" not in fields:
        return None
    task = fields.get("ArrayTaskId")
    job_id = f"{fields.get('ArrayJobId')}_{task}" if task and task != "N/A" else fields["JobId"]
    return JobInfo(job_id, name, fields.get("JobState", "UNKNOWN"), fields.get("RunTime", ""),
                   fields.get("TimeLimit", ""), fields.get("NumNodes", ""), f"exit {fields.get('ExitCode', '?')}")


def _from_sacct(job_id: str) -> list[JobInfo]:
    sacct = shutil.which("sacct")
    if sacct is None:
        return []
    result = _run([sacct, "--noheader", "--parsable2", "--allocations", f"--jobs={job_id}", f"--format={SACCT_FIELDS}"])
    if result.returncode != 0:  # e.g. "Slurm accounting storage is disabled"
        return []
    return [_from_sacct_line(line) for line in result.stdout.splitlines() if line.strip()]


def _from_scontrol(job_id: str) -> list[JobInfo]:
    result = _run([_slurm_command("scontrol"), "--oneliner", "show", "job", job_id])
    if result.returncode != 0:
        raise SlurmError(f"Slurm knows no job {job_id}: {result.stderr.strip() or result.stdout.strip()}")
    return [job for line in result.stdout.splitlines() if (job := _from_scontrol_line(line)) is not None]


def format_jobs(jobs: list[JobInfo]) -> str:
    """A table of jobs for the terminal."""
    header = ("JOBID", "NAME", "STATE", "ELAPSED", "LIMIT", "NODES", "REASON/NODES/EXIT")
    rows = [header] + [(j.job_id, j.name, j.state, j.elapsed, j.time_limit, j.nodes, j.detail) for j in jobs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)
