"""Byte counts: parse a size a user writes (``"4GiB"``) and write one for people (``"1.5 MiB"``).

At the bottom of hpcdl (it imports nothing of hpcdl), so the config, the measurement package and
the runtime's statistics share one definition.
"""

from __future__ import annotations

import math
import re

#: Sizes at or beyond this are typos (``1e400``), and would overflow the C longs they end up in.
MAX_BYTES = 2**63
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def _parse_size(text: str) -> int:
    """``"4GiB"``, ``"512 MB"``, ``"1e9"`` -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMGT]i?B|B)?\s*", text)
    if not match:
        raise ValueError(f"{text!r} is not a size; write e.g. 4GiB, 512MiB, 2GB or a number of bytes")
    return _finite_bytes(float(match.group(1)) * _UNITS[match.group(2) or "B"], text)


def _finite_bytes(number: float, given) -> int:
    """``number`` as whole bytes; inf, NaN or 2**63 and beyond (``1e400``) is a ValueError, not an OverflowError."""
    if not math.isfinite(number) or abs(number) >= MAX_BYTES:
        raise ValueError(f"a memory size must be a finite number of bytes below 2**63, got {given!r}")
    return int(number)


def parse_bytes(value: int | float | str) -> int:
    """A memory size given as a number of bytes or a string with a unit (``"4GiB"``) -> bytes (> 0).

    >>> parse_bytes("4GiB"), parse_bytes("1.5MB"), parse_bytes(1024)
    (4294967296, 1500000, 1024)
    """
    if isinstance(value, bool):
        raise TypeError(f"a memory size is a number of bytes or a string like '4GiB', got {value!r}")
    size = _parse_size(value) if isinstance(value, str) else _finite_bytes(value, value)
    if size <= 0:
        raise ValueError(f"a memory size must be > 0 bytes, got {value!r}")
    return size


def human_bytes(nbytes: float) -> str:
    """A byte count in binary units: ``"512 B"``, ``"1.5 MiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(nbytes) < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")
