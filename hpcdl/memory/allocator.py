"""glibc allocator tuning, so that resident memory follows live tensors and a peak-RSS delta is a step's own.

glibc serves allocations of at least :data:`MMAP_THRESHOLD` bytes with their own mapping and
unmaps them on free; with the default (dynamic) threshold it keeps freed blocks and reuses them
without the resident size growing, so a later step's peak reads near zero. Two ways to set it, one
setting: :func:`child_env` for a fresh process (environment variables read at its start; a standalone
measuring script re-executes itself with them: :func:`run_with_child_env`), and
:func:`return_freed_memory_to_os` for this process (``mallopt`` and ``malloc_trim``), which the
study calls between the runs it trains one after another.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

#: Allocations at least this large get their own mapping, given back to the system on free.
MMAP_THRESHOLD = 64 * 1024
_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter number


def child_env() -> dict[str, str]:
    """Environment variables that give a new process :data:`MMAP_THRESHOLD` (and trim above twice it)."""
    return {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(2 * MMAP_THRESHOLD)}


def run_with_child_env() -> None:
    """Re-execute this Python script once with :func:`child_env` set, unless it already is: a standalone
    measurement (docs/results/scale/*.py) then runs as ``hpcdl bench memory``'s measuring processes do. Call it
    before the script allocates what it measures (imports may come first: the new process starts afresh)."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:
        os.environ.update(child_env())
        os.execv(sys.executable, [sys.executable, *sys.argv])


def return_freed_memory_to_os() -> bool:
    """Set :data:`MMAP_THRESHOLD` in this process and give freed memory back; False where this is not glibc.

    A caller that measures CPU peaks after this returned False should say so: its peaks may read low.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and libc.malloc_trim(0) >= 0
    except (OSError, AttributeError):
        return False
