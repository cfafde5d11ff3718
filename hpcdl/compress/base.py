"""The codec contract: :class:`Codec`, :class:`Packed` and :class:`ErrorBound`.

A codec turns a tensor into a :class:`Packed` (device buffers plus a small host
header) and back. ``decode(encode(t))`` has ``t``'s shape, dtype and device.
Error-bounded codecs hold their bound on every finite element; NaN, Inf, zero
and sign survive. ``Packed.nbytes`` counts every byte the packed object keeps
alive: header (shape, dtype, codec fields) and payload.
"""

from __future__ import annotations

import json
import math
import struct
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from hpcdl.compress.errors import CodecError
from hpcdl.compress.header import peek_codec_id

ERROR_BOUND_MODES = ("abs", "rel", "pw_rel")
FLOAT_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.float64})


@dataclass(frozen=True, eq=False)
class Packed:
    """A compressed tensor: a host ``header`` and a 1-D uint8 ``data`` tensor on the original device."""

    header: bytes
    data: torch.Tensor

    def __post_init__(self):
        if not isinstance(self.header, bytes):
            raise TypeError(f"Packed.header must be bytes, got {type(self.header).__name__}")
        if not isinstance(self.data, torch.Tensor) or self.data.dtype != torch.uint8 or self.data.dim() != 1:
            raise TypeError("Packed.data must be a 1-D torch.uint8 tensor")

    @property
    def codec_id(self) -> str:
        return peek_codec_id(self.header)

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        """Every byte this object keeps alive: header plus payload."""
        return len(self.header) + self.data.numel()

    def to_bytes(self) -> bytes:
        """Serialise to ``u32 header length | header | payload`` (for files and golden fixtures)."""
        return struct.pack("<I", len(self.header)) + self.header + self.data.cpu().numpy().tobytes()

    @classmethod
    def from_bytes(cls, blob: bytes, device: str | torch.device = "cpu") -> Packed:
        if len(blob) < 4:
            raise CodecError(f"packed bytes are truncated: {len(blob)} bytes, need at least 4")
        (header_len,) = struct.unpack("<I", blob[:4])
        if 4 + header_len > len(blob):
            raise CodecError(f"packed bytes are truncated: header of {header_len} bytes, only {len(blob) - 4} follow")
        payload = torch.frombuffer(bytearray(blob[4 + header_len :]), dtype=torch.uint8) if len(blob) > 4 + header_len \
            else torch.empty(0, dtype=torch.uint8)
        return cls(header=bytes(blob[4 : 4 + header_len]), data=payload.to(device))


@dataclass(frozen=True)
class ErrorBound:
    """An error-bound mode and its bound.

    ``abs``: |x - x'| <= bound. ``rel``: |x - x'| <= bound * (max - min) over the
    tensor's finite elements. ``pw_rel``: |x - x'| <= bound * |x|.
    """

    mode: str
    bound: float

    def __post_init__(self):
        if self.mode not in ERROR_BOUND_MODES:
            raise ValueError(f"unknown error-bound mode {self.mode!r}; use one of {list(ERROR_BOUND_MODES)}")
        if isinstance(self.bound, bool) or not isinstance(self.bound, (int, float)):
            raise TypeError(f"error bound must be a number, got {self.bound!r}")
        if not math.isfinite(self.bound) or self.bound <= 0:
            raise ValueError(f"error bound must be a finite number > 0, got {self.bound!r}")
        if self.mode == "pw_rel" and self.bound >= 1:
            raise ValueError(f"a pw_rel bound must be < 1 so that signs survive, got {self.bound!r}")
        object.__setattr__(self, "bound", float(self.bound))

    def absolute(self, tensor: torch.Tensor) -> float:
        """The absolute bound that ``abs`` or ``rel`` mode gives for ``tensor`` (float64 arithmetic)."""
        if self.mode == "abs":
            return self.bound
        if self.mode == "rel":
            return self.bound * value_range(tensor)
        raise ValueError("pw_rel has no single absolute bound; it scales with each |x|")

    def tolerance(self, original: torch.Tensor) -> torch.Tensor:
        """Per-element allowed error, as float64, for ``original``."""
        if self.mode == "pw_rel":
            return self.bound * original.to(torch.float64).abs()
        return torch.full_like(original, self.absolute(original), dtype=torch.float64)


VALUE_RANGE_SLICE = 1 << 18  # most elements value_range scans at once when it must skip NaN/Inf


def value_range(tensor: torch.Tensor) -> float:
    """max - min over the finite elements, in float64; 0.0 for a tensor with none.

    The one definition, for every device and backend. All finite (the usual case):
    one ``aminmax`` pass and no copy. With NaN or Inf (fp16 overflow, masks filled
    with -inf) it scans slices of at most 1/16 of the tensor (and at most
    ``VALUE_RANGE_SLICE`` elements), replacing the non-finite values of one slice at
    a time, so its scratch stays under 1/8 of the tensor's bytes: it runs inside the
    pack hook, when memory is tightest. min and max are exact in the tensor's own
    dtype; only their difference is taken in float64.
    """
    if tensor.numel() == 0:
        return 0.0
    x = tensor.detach()
    low, high = torch.aminmax(x)
    low, high = float(low), float(high)
    if math.isfinite(low) and math.isfinite(high):  # NaN would have propagated, so every element is finite
        return high - low
    lows, highs = [], []
    for piece in _slices(x, max(1, min(VALUE_RANGE_SLICE, x.numel() // 16))):
        finite = torch.isfinite(piece)
        lows.append(torch.where(finite, piece, math.inf).amin())
        highs.append(torch.where(finite, piece, -math.inf).amax())
    low, high = float(torch.stack(lows).amin()), float(torch.stack(highs).amax())
    return high - low if low <= high else 0.0


def _slices(x: torch.Tensor, limit: int):
    """Views of ``x`` (no copies, any strides) that together hold each of its elements once, <= ``limit`` each."""
    if x.numel() <= limit or x.dim() == 0:
        yield x
    elif x.is_contiguous():
        flat = x.view(-1)
        for start in range(0, flat.numel(), limit):
            yield flat[start : start + limit]
    elif x[0].numel() <= limit:
        rows = limit // x[0].numel()
        for start in range(0, x.size(0), rows):
            yield x[start : start + rows]
    else:
        for row in x:
            yield from _slices(row, limit)


class Codec(ABC):
    """Base of every codec. Subclasses set the class attributes and implement the underscored methods."""

    codec_id: ClassVar[str]
    modes: ClassVar[tuple[str, ...]]
    dtypes: ClassVar[frozenset[torch.dtype]]
    error_bounded: ClassVar[bool] = False
    lossless: ClassVar[bool] = False
    #: Whether the codec can refuse a tensor for what its elements hold together (levels: at most 256 distinct
    #: values), so that tensors it takes one by one may fail concatenated (an arena cannot share it).
    whole_tensor_limit: ClassVar[bool] = False

    def encode(self, tensor: torch.Tensor) -> Packed:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{self.codec_id} encodes torch.Tensor, got {type(tensor).__name__}")
        if tensor.dtype not in self.dtypes:
            raise TypeError(
                f"codec {self.codec_id!r} cannot encode dtype {tensor.dtype}; "
                f"it takes {sorted(str(d) for d in self.dtypes)}"
            )
        return self._encode(tensor)

    def decode(self, packed: Packed) -> torch.Tensor:
        if not isinstance(packed, Packed):
            raise TypeError(f"{self.codec_id} decodes a Packed, got {type(packed).__name__}")
        return self._decode(packed)

    @property
    def stream_ids(self) -> tuple[str, ...]:
        """The codec ids of the streams :meth:`decode` takes: its own; a stage that can leave its inner codec's
        stream as it is (entropy on a CUDA tensor) adds that codec's."""
        return (self.codec_id,)

    def restart_random(self, stream: int) -> None:  # noqa: B027  (optional hook; most codecs draw no noise)
        """Restart the codec's own random generator, if it has one, at ``stream`` (the runtime passes the
        training step before every forward): the noise of an encode then depends on the step and the encodes
        before it in that step, not on everything this process encoded before, so a run resumed from a
        checkpoint encodes as the uninterrupted one. Codecs that draw no noise ignore it."""

    @abstractmethod
    def _encode(self, tensor: torch.Tensor) -> Packed: ...

    @abstractmethod
    def _decode(self, packed: Packed) -> torch.Tensor: ...

    @abstractmethod
    def get_config(self) -> dict:
        """A JSON-safe dict with ``"id"`` that :func:`hpcdl.compress.get_codec` turns back into an equal codec."""

    @classmethod
    def from_config(cls, config: dict) -> Codec:
        options = {key: value for key, value in config.items() if key != "id"}
        try:
            return cls(**options)
        except TypeError as err:
            raise ValueError(f"bad options for codec {cls.codec_id!r}: {options} ({err})") from err

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self) -> int:
        return hash(json.dumps(self.get_config(), sort_keys=True))

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "id")
        return f"{type(self).__name__}({options})"


def check_mode(codec_id: str, mode: str, modes: tuple[str, ...]) -> None:
    """Refuse a mode a codec does not have, naming the ones it does."""
    if mode not in modes:
        raise ValueError(f"codec {codec_id!r} has no mode {mode!r}; its modes are {list(modes)}")
