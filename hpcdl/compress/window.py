"""``window``: max-pool indices, exactly, at 1-8 bits each: the position of each maximum inside its window.

A max-pool's backward needs, for every output element, which input element of its window was the largest.
PyTorch saves that as an int64 index into the flattened spatial input (``h * W + w`` in 2-D): 64 bits that
hold about log2(k_h * k_w) bits of information, the tap of a k_h x k_w window. The generic ``int`` codec
sees only the integers (its deltas jump by +-W wherever the maximum moves between window rows) and gets
about 6.6x on them. This codec uses the pooling geometry: output element (i, j) has its window at
(i * s_h - p_h, j * s_w - p_w) with taps d apart, so its index becomes the tap number
``((h - i s_h + p_h) / d_h) * k_w + (w - j s_w + p_w) / d_w`` in [0, k_h k_w), packed at 1, 2, 4 or 8 bits
(hpcdl.compress.bitpack). Decoding inverts it exactly. A 2x2 window costs 2 bits (32x against int64), 3x3
costs 4 (16x).

The geometry (1 to 3 spatial dims: input size, kernel, stride, padding, dilation) is the codec's config, and
it is written into the header, so a stream decodes on its own. The runtime builds the config from the running
``nn.MaxPool1d/2d/3d`` and its input (:func:`hpcdl.runtime.classify.pool_window`). Encoding a tensor that
holds anything else (an index outside its element's window or the input) raises ValueError, so nothing is
stored wrongly; decoding checks every tap and every restored index (CodecError), so a forged stream cannot
hand backward an index outside the input.

Payload: ``ceil(numel * bits / 8)`` bytes. Header fields: spatial dims (u8), bits (u8), then for each of 3
dims input size (u64), kernel, stride, padding, dilation (u16 each), zeros for the dims past the first ones.
"""

from __future__ import annotations

import math

import torch

from hpcdl.compress.base import Codec, Packed
from hpcdl.compress.bitpack import PACKABLE_BITS, pack_bits, packed_length, unpack_bits
from hpcdl.compress.checksum import payload_checksum, verified_payload
from hpcdl.compress.errors import CodecError
from hpcdl.compress.header import read_header, write_header
from hpcdl.compress.registry import register_codec

MAX_DIMS = 3
MAX_TAPS = 2 ** max(PACKABLE_BITS)  # taps of the largest window a tap number of 8 bits indexes
_FIELDS = "BB" + "QHHHH" * MAX_DIMS  # dims, bits, then per dim: input size, kernel, stride, padding, dilation
_U16 = 2**16
CHUNK = 1 << 20  # indices converted at a time: the integer temporaries stay a few MiB whatever the tensor


def tap_bits(taps: int) -> int:
    """The fewest packable bits per element that number ``taps`` taps."""
    return next(bits for bits in PACKABLE_BITS if taps <= 2**bits)


@register_codec
class Window(Codec):
    """Max-pool indices of one pooling geometry: ``get_codec({"id": "window", "input": [H, W], "kernel": [2, 2],
    "stride": [2, 2], "padding": [0, 0], "dilation": [1, 1]})`` (one entry per spatial dim, 1 to 3 of them)."""

    codec_id = "window"
    modes = ("lossless",)
    dtypes = frozenset({torch.int64})
    lossless = True

    def __init__(self, input, kernel, stride, padding, dilation):
        given = {"input": input, "kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation}
        lists = {}
        for name, value in given.items():
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                                for v in value):
                raise ValueError(f"window's {name} must be a list of integers, one per spatial dim, got {value!r}")
            lists[name] = tuple(value)
        dims = len(lists["input"])
        if not 1 <= dims <= MAX_DIMS or any(len(v) != dims for v in lists.values()):
            raise ValueError(f"window's input, kernel, stride, padding and dilation must each list the same 1 to "
                             f"{MAX_DIMS} spatial dims, got {given}")
        problem = _geometry_problem(lists["input"], lists["kernel"], lists["stride"], lists["padding"],
                                    lists["dilation"])
        if problem:
            raise ValueError(f"window geometry {given}: {problem}")
        self.input, self.kernel, self.stride = lists["input"], lists["kernel"], lists["stride"]
        self.padding, self.dilation = lists["padding"], lists["dilation"]

    def get_config(self) -> dict:
        return {"id": self.codec_id, "input": list(self.input), "kernel": list(self.kernel),
                "stride": list(self.stride), "padding": list(self.padding), "dilation": list(self.dilation)}

    def _encode(self, tensor: torch.Tensor) -> Packed:
        geometry = _Geometry(self.input, self.kernel, self.stride, self.padding, self.dilation)
        if tensor.dim() < geometry.dims:
            raise ValueError(f"window encodes max-pool indices with {geometry.dims} spatial dims, got a tensor of "
                             f"shape {tuple(tensor.shape)}")
        output = tuple(tensor.shape[tensor.dim() - geometry.dims:])
        flat = tensor.detach().contiguous().reshape(-1)
        taps = torch.empty(flat.numel(), dtype=torch.uint8, device=tensor.device)
        for start, origins in geometry.chunks(output, flat.numel(), tensor.device):
            count = origins[0].numel()
            taps[start:start + count] = geometry.taps_of(flat[start:start + count], origins, output)
        data = pack_bits(taps, geometry.bits)
        header = write_header(self.codec_id, tensor.dtype, tensor.shape, _FIELDS, *geometry.fields(),
                              checksum=payload_checksum(data))
        return Packed(header, data)

    def _decode(self, packed: Packed) -> torch.Tensor:
        header = read_header(packed.header, self.codec_id, _FIELDS)
        geometry = _Geometry.from_fields(header.fields)
        if geometry is None or header.dtype != torch.int64 or len(header.shape) < geometry.dims:
            raise CodecError(f"window header has impossible fields {header.fields} for a {header.dtype} tensor of "
                             f"shape {header.shape}: corrupted")
        expected = packed_length(header.numel, geometry.bits)
        if packed.data.numel() != expected:
            raise CodecError(f"window payload has {packed.data.numel()} bytes, expected {expected} for shape "
                             f"{header.shape}")
        data = verified_payload(packed.data, header)
        taps = unpack_bits(data, geometry.bits, header.numel)
        output = tuple(header.shape[len(header.shape) - geometry.dims:])
        restored = torch.empty(header.numel, dtype=torch.int64, device=packed.device)
        for start, origins in geometry.chunks(output, header.numel, packed.device):
            count = origins[0].numel()
            restored[start:start + count] = geometry.index_of(taps[start:start + count], origins)
        return restored.reshape(header.shape)


def _geometry_problem(input, kernel, stride, padding, dilation) -> str | None:
    """What is wrong with a pooling geometry (None when nothing is)."""
    if any(size < 1 for size in input):
        return "every input size must be >= 1"
    if any(not 1 <= v < _U16 for v in (*kernel, *stride, *dilation)):
        return f"kernel, stride and dilation must be between 1 and {_U16 - 1}"
    if any(not 0 <= p < _U16 for p in padding):
        return f"padding must be between 0 and {_U16 - 1}"
    if math.prod(kernel) > MAX_TAPS:
        return f"a window of {math.prod(kernel)} taps is more than the {MAX_TAPS} this codec numbers; use 'int'"
    if math.prod(input) >= 2**62:
        return "the input has too many elements for int64 indices"
    return None


class _Geometry:
    """The arithmetic between indices and tap numbers for one pooling geometry."""

    def __init__(self, input, kernel, stride, padding, dilation):
        self.input, self.kernel, self.stride, self.padding, self.dilation = input, kernel, stride, padding, dilation
        self.dims = len(input)
        self.bits = tap_bits(math.prod(kernel))
        # element strides of the flattened input and of the tap number, per dim (row-major)
        self.input_strides = [math.prod(input[d + 1:]) for d in range(self.dims)]
        self.tap_strides = [math.prod(kernel[d + 1:]) for d in range(self.dims)]

    def fields(self) -> tuple:
        per_dim = []
        for d in range(MAX_DIMS):
            per_dim += ([self.input[d], self.kernel[d], self.stride[d], self.padding[d], self.dilation[d]]
                        if d < self.dims else [0, 0, 0, 0, 0])
        return (self.dims, self.bits, *per_dim)

    @classmethod
    def from_fields(cls, fields: tuple) -> _Geometry | None:
        """The geometry a header names, or None when its fields are impossible."""
        dims, bits, rest = fields[0], fields[1], fields[2:]
        if not 1 <= dims <= MAX_DIMS or any(rest[5 * dims:]):
            return None
        input, kernel, stride, padding, dilation = (tuple(rest[5 * d + i] for d in range(dims)) for i in range(5))
        if _geometry_problem(input, kernel, stride, padding, dilation) or bits != tap_bits(math.prod(kernel)):
            return None
        return cls(input, kernel, stride, padding, dilation)

    def chunks(self, output: tuple[int, ...], numel: int, device: torch.device):
        """(first element, per-dim window origins) of consecutive whole output planes, about CHUNK elements at a
        time: the origin of each element's window in each spatial dim, as tensors of the chunk's length."""
        plane = math.prod(output)
        if plane == 0:
            return
        planes = max(1, min(CHUNK // plane, numel // plane))
        dtype = self.compute_dtype
        grids = torch.meshgrid(*(torch.arange(o, device=device, dtype=dtype) for o in output), indexing="ij")
        origins = [(g.reshape(-1) * self.stride[d] - self.padding[d]).repeat(planes) for d, g in enumerate(grids)]
        for first in range(0, numel, planes * plane):
            count = min(planes * plane, numel - first)
            yield first, [o[:count] for o in origins]

    @property
    def compute_dtype(self) -> torch.dtype:
        """int32 arithmetic when every index and coordinate fits (twice as fast as int64), else int64."""
        extent = max(math.prod(self.input), *(s + 2 * p + k * d for s, p, k, d in
                                               zip(self.input, self.padding, self.kernel, self.dilation)))
        return torch.int32 if extent < 2**30 else torch.int64

    def taps_of(self, index: torch.Tensor, origins: list[torch.Tensor], output: tuple[int, ...]) -> torch.Tensor:
        """Tap numbers (uint8) of a chunk of indices; ValueError if one is outside the input or its window."""
        low, high = torch.aminmax(index)
        if int(low) < 0 or int(high) >= math.prod(self.input):
            raise ValueError(f"an index is outside the pooled input of size {list(self.input)}: these are not "
                             "max-pool indices of this geometry")
        taps = torch.zeros_like(index, dtype=self.compute_dtype)
        outside = torch.zeros_like(index, dtype=torch.bool)
        for d, coordinate in _digits(index.to(self.compute_dtype, copy=True), self.input):
            offset = coordinate.sub_(origins[d])
            if self.dilation[d] != 1:
                outside |= offset % self.dilation[d] != 0
                offset = offset.div_(self.dilation[d], rounding_mode="floor")
            outside |= offset < 0
            outside |= offset >= self.kernel[d]
            taps += offset.mul_(self.tap_strides[d]) if self.tap_strides[d] != 1 else offset
        if bool(outside.any()):
            raise ValueError(f"an index lies outside its element's {list(self.kernel)} window (stride "
                             f"{list(self.stride)}, padding {list(self.padding)}, dilation {list(self.dilation)}) of "
                             f"an output of spatial size {list(output)}: these are not max-pool indices of this "
                             "geometry")
        return taps.to(torch.uint8)

    def index_of(self, taps: torch.Tensor, origins: list[torch.Tensor]) -> torch.Tensor:
        """The int64 indices of a chunk of tap numbers; CodecError if one names a tap past the window or the input."""
        if taps.numel() and int(taps.max()) >= math.prod(self.kernel):
            raise CodecError(f"window payload names a tap past its {list(self.kernel)} window: corrupted")
        index = torch.zeros_like(taps, dtype=self.compute_dtype)
        outside = torch.zeros_like(taps, dtype=torch.bool)
        for d, tap in _digits(taps.to(self.compute_dtype, copy=True), self.kernel):
            coordinate = tap.mul_(self.dilation[d]).add_(origins[d])
            outside |= coordinate < 0
            outside |= coordinate >= self.input[d]
            index += coordinate.mul_(self.input_strides[d]) if self.input_strides[d] != 1 else coordinate
        if bool(outside.any()):
            raise CodecError("window payload names a tap outside the pooled input (in its padding): corrupted")
        return index.to(torch.int64)


def _digits(values: torch.Tensor, radices: tuple[int, ...]):
    """(dim, digit) of ``values`` written in the mixed radix ``radices`` (row-major: the last dim varies fastest),
    last dim first; the first dim's digit is what is left, unbounded. Consumes ``values`` (divided in place)."""
    for d in reversed(range(len(radices))):
        if d:
            digit = values % radices[d]
            values = values.div_(radices[d], rounding_mode="floor")
            yield d, digit
        else:
            yield d, values
