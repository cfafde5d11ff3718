"""glibc allocator tuning, so that resident memory follows live tensors and a peak-RSS delta is a step's own.

glibc serves allocations of at least :data:`MMAP_THRESHOLD` bytes with their own mapping and
unmaps them on free; with the default (dynamic) threshold it keeps freed blocks and reuses them
without the resident size growing, so a later step's peak reads near zero. Two ways to set it, one
setting: :func:`child_env` for a fresh process (environment variables read at its start), and
:func:`return_freed_memory_to_os` for this process (``mallopt`` and ``malloc_trim``), which the
study calls between the runs it trains one after another.
"""

from __future__ import annotations

import ctypes
import ctypes.util

#: Allocations at least this large get their own mapping, given back to the system on free.
MMAP_THRESHOLD = 64 * 1024
_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter number


def child_env() -> dict[str, str]:
    """Environment variables that give a new process :data:`MMAP_THRESHOLD` (and trim above twice it)."""
    return {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(2 * MMAP_THRESHOLD)}


def return_freed_memory_to_os() -> bool:
    """Set :data:`MMAP_THRESHOLD` in this process and give freed memory back; False where this is not glibc.

    A caller that measures CPU peaks after this returned False should say so: its peaks may read low.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and libc.malloc_trim(0) >= 0
    except (OSError, AttributeError):
        return False
