"""Arenas: many small saved tensors of one module, compressed together.

A recurrent model saves hundreds of small tensors per forward (a 2-layer GRU over 50 steps: ~800 gates and
hidden states of a few KiB each). One by one they are not worth a codec call (a stream header and per-call
cost on a few KiB), so the session keeps such tensors as they are and the model escapes compression. An
:class:`Arena` gathers them instead: each small floating tensor saved inside the model's forward is copied
into the open arena of its (module, codec, dtype, device), and the arena is encoded as one flat tensor when it
is *sealed*: when the open arenas together pass a byte budget (the largest is sealed), when the model's forward
ends, or when the session closes.

Every member keeps the guarantee its codec gives a tensor on its own (:func:`member_codec`): lossless codecs
and pointwise bounds (``abs``, ``pw_rel``) hold per element whatever else is in the arena; a ``rel`` bound,
which is relative to one tensor's range, is turned into an ``abs`` bound of ``bound * 2**(k/4)`` for the
largest integer k with ``2**(k/4) <= range``: at most the member's own ``bound * range`` and at least 0.84 of
it. Members share an arena only with the same such bound (ranges within a factor of 2**(1/4)), so a gate in
(0, 1) never inherits the error allowed to a tensor ranging over hundreds. An abs bound per channel
(``"channels"``, :mod:`hpcdl.compress.channels`) becomes the bound of its tightest channel, for every element.

Lifetime. An open arena holds copies of its members (the originals are never referenced, so the forward code
frees them as without hooks, and an in-place change after the save does not reach the arena, as with a tensor
packed on its own). A sealed arena holds its packed bytes (or its raw bytes when encoding did not make them
smaller) as long as any member's entry is alive, i.e. until autograd has dropped every handle on its members.
Its decoded values are kept while some handle on a member has not yet been unpacked (:meth:`Arena.wait` /
:meth:`Arena.done`), so backward decodes each arena once; after the last one they are freed. Every unpacked
member is its own small copy, so nothing unpacked pins the arena.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from hpcdl.compress import Codec, Packed, value_range
from hpcdl.compress.channels import channel_exponents
from hpcdl.runtime.stats import Row

DEFAULT_ARENA_BYTES = 1 << 20  # the most bytes open (not yet encoded) arenas hold together

STEPS_PER_OCTAVE = 4  # rel members are grouped by range in steps of 2**(1/4)
POINTWISE_MODES = ("abs", "pw_rel")  # error bounds that hold per element whatever the rest of the tensor is


def member_codec(codec: Codec, source: torch.Tensor, codec_of: Callable[[dict], Codec]) -> Codec | None:
    """The codec ``source`` is encoded with inside an arena so that it keeps ``codec``'s guarantee, or None.

    None means the tensor cannot share an arena: a codec whose result depends on the whole tensor and has no
    pointwise form (``quant``, ``cast``, a plugin that is neither lossless nor error-bounded), a codec that may
    refuse members together that it takes one by one (``levels``: its 256 distinct values are per tensor), or a
    ``rel`` bound on a tensor without two distinct finite values (its bound is 0). ``codec_of`` builds a codec from a
    config (the policy's cache).
    """
    if codec.whole_tensor_limit:
        return None
    if codec.lossless:
        return codec
    if not codec.error_bounded:
        return None
    config = codec.get_config()
    mode = config.get("mode")
    if "channels" in config:  # bounds per channel have no pointwise form: the tightest channel's holds for all
        if mode != "abs":
            return None
        exponent = int(channel_exponents(source, config["channels"]).min())
        pointwise = {key: value for key, value in config.items() if key != "channels"}
        return codec_of({**pointwise, "bound": config["bound"] * 2.0 ** exponent})
    if mode in POINTWISE_MODES:
        return codec
    if mode != "rel" or "abs" not in codec.modes:
        return None
    spread = value_range(source)
    if not 0.0 < spread < math.inf:
        return None
    step = math.floor(math.log2(spread) * STEPS_PER_OCTAVE)  # log2 may round either way by an ulp: settle it
    while 2.0 ** (step / STEPS_PER_OCTAVE) > spread:
        step -= 1
    while 2.0 ** ((step + 1) / STEPS_PER_OCTAVE) <= spread:
        step += 1
    return codec_of({**config, "mode": "abs", "bound": config["bound"] * 2.0 ** (step / STEPS_PER_OCTAVE)})


class Arena:
    """Small saved tensors of one (module, codec, dtype, device), packed and encoded together.

    Open: ``parts`` holds a flat copy of each member. Sealed: ``packed`` holds the encoded arena, or ``raw``
    its flat values when encoding did not make them smaller (or the codec failed).
    """

    __slots__ = (
        "codec", "module", "dtype", "itemsize", "device", "parts", "members", "shares", "numel", "raw", "packed",
        "decoded", "waiting", "__weakref__",
    )

    def __init__(self, module: str, codec: Codec, dtype: torch.dtype, device: torch.device):
        self.module, self.codec, self.dtype, self.device = module, codec, dtype, device
        self.itemsize = torch.empty(0, dtype=dtype).element_size()
        self.parts: list[torch.Tensor] | None = []
        self.members: list[tuple[Row, int]] = []  # each member's stats row and elements, until the arena is sealed
        self.shares: list[int] = []  # once sealed, each member's share of the bytes the arena holds
        self.numel = 0
        self.raw: torch.Tensor | None = None
        self.packed: Packed | None = None
        self.decoded: torch.Tensor | None = None
        self.waiting = 0  # handles on members that have not been unpacked yet

    @property
    def nbytes(self) -> int:
        """Bytes this arena holds now: its members' copies while open, then its packed (or raw) bytes."""
        if self.packed is not None:
            return self.packed.nbytes
        return self.numel * self.itemsize if self.parts is not None or self.raw is not None else 0

    def add(self, source: torch.Tensor, row: Row) -> Slot:
        """Copy ``source`` (contiguous; what a member's layout packs) in as a new member of this open arena."""
        assert self.parts is not None, "members join open arenas only (Arenas.add seals and replaces full ones)"
        part = source.detach().reshape(-1).clone()
        slot = Slot(self, len(self.parts), self.numel, tuple(source.shape), row)
        self.parts.append(part)
        self.members.append((row, part.numel()))
        self.numel += part.numel()
        return slot

    def seal(self, on_failure: Callable[[str, Codec, torch.Tensor, Exception], None]) -> None:
        """Encode the members as one flat tensor and account each member's share of the packed bytes.

        ``on_failure(module, codec, values, error)`` is told when the codec raises; the values are then kept raw.
        """
        if self.parts is None:
            return
        start = time.perf_counter()
        values = torch.cat(self.parts) if len(self.parts) > 1 else self.parts[0]
        self.parts = None
        try:
            packed = self.codec.encode(values)
        except Exception as err:  # a codec bug or an input it cannot take must not break training
            on_failure(self.module, self.codec, values, err)
            for row, _ in self.members:
                row.fallbacks += 1
            packed = None
        elapsed = time.perf_counter() - start
        if packed is not None and packed.nbytes < self.numel * self.itemsize:
            self.packed = packed
        else:
            self.raw = values
        held = self.nbytes
        shares = [held * numel // self.numel for _, numel in self.members]
        shares[-1] += held - sum(shares)  # what rounding left goes to the last member, so the rows add up exactly
        for (row, numel), share in zip(self.members, shares):
            row.packed += share - numel * self.itemsize
            row.encode_s += elapsed * numel / self.numel
        self.members, self.shares = [], shares

    def share(self, slot: Slot) -> int:
        """The bytes held for one member: its copy while open, its share of the packed (or raw) arena once sealed."""
        if self.parts is not None:
            return (slot.stop - slot.start) * self.itemsize
        return self.shares[slot.index] if self.shares else 0

    def values(self, slot: Slot) -> torch.Tensor:
        """A fresh copy of one member's values, in the shape it was added with."""
        if self.parts is not None:
            flat = self.parts[slot.index]
        elif self.raw is not None:
            flat = self.raw[slot.start : slot.stop]
        else:
            flat = self._decoded(slot.row)[slot.start : slot.stop]
        return flat.clone().view(slot.shape)

    def _decoded(self, row: Row) -> torch.Tensor:
        decoded = self.decoded
        if decoded is None:
            assert self.packed is not None  # an arena is decoded only when it was encoded
            start = time.perf_counter()
            decoded = self.codec.decode(self.packed).reshape(-1)
            row.decode_s += time.perf_counter() - start
            if self.waiting > 0:  # more members will be unpacked: decode once for all of them
                self.decoded = decoded
        return decoded

    def wait(self) -> None:
        """A handle on a member was created: keep decoded values for it until :meth:`done`."""
        self.waiting += 1

    def done(self) -> None:
        """A handle on a member was unpacked (the first time) or dropped unused."""
        self.waiting -= 1
        if self.waiting <= 0:
            self.decoded = None

    def release(self) -> None:
        """Free everything the arena holds (the session's release)."""
        self.parts = self.raw = self.packed = self.decoded = None
        self.members, self.shares = [], []


class Slot:
    """One member's place in its arena: elements [start, stop) of the flat arena, added in ``shape``."""

    __slots__ = ("arena", "index", "start", "stop", "shape", "row")

    def __init__(self, arena: Arena, index: int, start: int, shape: tuple[int, ...], row: Row):
        self.arena, self.index, self.start, self.shape, self.row = arena, index, start, shape, row
        self.stop = start + math.prod(shape)

    @property
    def nbytes(self) -> int:
        """This member's share of what its arena holds now."""
        return self.arena.share(self)

    def values(self) -> torch.Tensor:
        return self.arena.values(self)


class Arenas:
    """A session's open arenas, one per (module, codec, dtype, device).

    ``budget`` bounds the bytes all open arenas hold together (uncompressed copies): before a member that
    would take them over it is added, the largest open arena is sealed, as often as needed. So the copies a
    session holds unsealed never exceed ``budget`` (or one member, if that is larger) however many kinds of
    arena are open, and no arena grows past it.
    :meth:`seal_all` seals the rest (the model's forward ended, or the session closes).
    """

    def __init__(self, budget: int, on_failure: Callable[[str, Codec, torch.Tensor, Exception], None]):
        self.budget = budget
        self.on_failure = on_failure
        self.open: dict[tuple, Arena] = {}
        self.open_bytes = 0

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def add(self, module: str, codec: Codec, source: torch.Tensor, row: Row) -> Slot:
        """Copy ``source`` into the open arena of its kind, first sealing the largest open arenas it would overfill."""
        nbytes = source.numel() * source.element_size()
        while self.open and self.open_bytes + nbytes > self.budget:
            full, largest = max(self.open.items(), key=lambda item: item[1].numel * item[1].itemsize)
            del self.open[full]
            self.open_bytes -= largest.numel * largest.itemsize
            largest.seal(self.on_failure)
        key = (module, id(codec), source.dtype, source.device)  # the arena holds the codec, so its id stays unique
        arena = self.open.get(key)
        if arena is None:
            arena = self.open[key] = Arena(module, codec, source.dtype, source.device)
        self.open_bytes += nbytes
        return arena.add(source, row)

    def seal_all(self) -> None:
        """Seal every open arena (the model's forward ended, or the session closes)."""
        arenas, self.open, self.open_bytes = self.open, {}, 0
        for arena in arenas.values():
            arena.seal(self.on_failure)

    def release(self) -> None:
        for arena in self.open.values():
            arena.release()
        self.open, self.open_bytes = {}, 0
