"""What a session saved and what it cost: counts and bytes per module and kind, codec time, fallbacks.

``original`` counts the bytes autograd would have held: each distinct storage
span once, however many times it was saved (repeats are counted as
``shared``). ``packed`` counts what the session holds instead: packed bytes
(for small tensors compressed together in an arena, counted in ``arena``,
their share of the arena's packed bytes), or the original bytes of tensors kept as they are (under the size threshold,
or after a codec failure). Parameters and buffers are only counted (kind
``parameter``): they are alive anyway and never part of the ratio.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from dataclasses import dataclass, fields

from hpcdl.units import human_bytes


@dataclass
class Row:
    """Totals for one (module, kind)."""

    count: int = 0
    shared: int = 0
    kept: int = 0
    arena: int = 0
    fallbacks: int = 0
    original: int = 0
    packed: int = 0
    encode_s: float = 0.0
    decode_s: float = 0.0

    @property
    def ratio(self) -> float:
        return self.original / self.packed if self.packed else 1.0

    def add(self, other: Row) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "ratio": self.ratio}


class Stats:
    """Per-(module, kind) :class:`Row` s, filled by a session's hooks, and the sizes of what backward decoded.

    ``largest_packed_original`` is the largest span a codec packed, in bytes before packing (alive
    uncompressed until the forward code drops it); ``decoded_live_bytes`` the bytes of decoded spans
    still alive (an unpacked tensor autograd still holds), ``decoded_peak_bytes`` the most of them alive
    at once during backward. ``held_originals_peak_bytes`` is the most bytes of storages whose tensors
    were already packed and that something other than autograd still held when a later tensor was
    packed: the caller's batch, a residual's input until the addition, a skip connection or any
    Python reference. Packing does not free those, so they bound what compression can take off the
    forward's peak; a model that holds references longer than it needs shows up here.
    """

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], Row] = defaultdict(Row)
        self.verified = 0  # decoded spans checked against their originals (verify mode)
        self.largest_packed_original = 0
        self.decoded_live_bytes = 0
        self.decoded_peak_bytes = 0
        self.held_originals_peak_bytes = 0
        self._held_originals: list[tuple[weakref.ref, int]] = []  # packed tensors' storages, maybe still alive

    def decoded(self, nbytes: int) -> None:
        """A span of ``nbytes`` was decoded; call :meth:`decoded_freed` with the same size when it is freed."""
        self.decoded_live_bytes += nbytes
        self.decoded_peak_bytes = max(self.decoded_peak_bytes, self.decoded_live_bytes)

    def decoded_freed(self, nbytes: int) -> None:
        self.decoded_live_bytes -= nbytes

    def packing(self, storage) -> None:
        """A tensor of ``storage`` (an ``UntypedStorage``) is being packed: note which earlier originals are alive.

        Weak references without callbacks, checked here: a finalizer per storage would pile up on a tensor
        that outlives many sessions (a benchmark's fixed batch) and keep every session's Stats alive.
        """
        self._held_originals = [(ref, size) for ref, size in self._held_originals if ref() is not None]
        self.held_originals_peak_bytes = max(self.held_originals_peak_bytes,
                                             sum(size for _, size in self._held_originals))
        if not any(ref() is storage for ref, _ in self._held_originals):
            self._held_originals.append((weakref.ref(storage), storage.nbytes()))

    def row(self, module: str, kind: str) -> Row:
        return self.rows[(module, kind)]

    def total(self) -> Row:
        total = Row()
        for row in self.rows.values():
            total.add(row)
        return total

    @property
    def original_bytes(self) -> int:
        return self.total().original

    @property
    def packed_bytes(self) -> int:
        return self.total().packed

    @property
    def ratio(self) -> float:
        """Original over packed bytes of everything saved (1.0 when nothing was)."""
        return self.total().ratio

    @property
    def fallbacks(self) -> int:
        return self.total().fallbacks

    def per_module(self) -> dict[str, dict]:
        """``{module: {"original": int, "packed": int, "ratio": float, "count": ..., ...}}`` over all kinds."""
        modules: dict[str, Row] = defaultdict(Row)
        for (module, _kind), row in self.rows.items():
            modules[module].add(row)
        return {module: row.as_dict() for module, row in modules.items()}

    def table(self) -> str:
        """A text table: one line per module and kind, then the total."""
        header = ("module", "kind", "count", "shared", "kept", "arena", "fallbk", "original", "packed", "ratio", "enc s", "dec s")
        lines = [(module, kind, row) for (module, kind), row in sorted(self.rows.items())]
        lines.append(("total", "", self.total()))
        cells = [header] + [
            (module, kind, str(row.count), str(row.shared), str(row.kept), str(row.arena), str(row.fallbacks),
             human_bytes(row.original), human_bytes(row.packed), f"{row.ratio:.2f}", f"{row.encode_s:.4f}", f"{row.decode_s:.4f}")
            for module, kind, row in lines
        ]
        widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
        return "\n".join(
            "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths)))
            for line in cells
        )
