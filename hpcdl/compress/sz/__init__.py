"""``sz``: error-bounded lossy compression of float tensors in independent 32-element blocks.

>>> codec = get_codec({"id": "sz", "mode": "rel", "bound": 1e-2})
>>> restored = codec.decode(codec.encode(activation))

Quantize by the bound (hpcdl/compress/blocks/params.py), predict inside each block (none, unsigned or
1-D Lorenzo, whichever packs narrower), bit-pack each block at its own width, keep the elements the
quantizer cannot hold exactly as outliers. The format is in docs/format.md. The block engine (stream
layout, reference, host and CUDA backends, the raw fallback and header checks) is hpcdl.compress.blocks,
shared with the ``int`` codec; this module says only what an sz stream's header holds and how its
blocks and outliers are encoded.

``hpcdl.compress.sz.{host,reference,cuda,stream,params}`` and ``backend_module``/``BACKENDS`` here are the
old names of hpcdl.compress.blocks' modules, kept for one release.
"""

from __future__ import annotations

import math

import torch

from hpcdl.compress.base import ERROR_BOUND_MODES, FLOAT_DTYPES, ErrorBound, Packed, check_mode
from hpcdl.compress.blocks import BACKENDS, backend_module, host, reference
from hpcdl.compress.blocks.codec import BlockCodec, StreamCounts
from hpcdl.compress.blocks.params import CODE_MODES, MANTISSA_BITS, MODE_CODES, SzParams, compute_dtype
from hpcdl.compress.blocks.protocol import BlockKernels, BlockPayload
from hpcdl.compress.blocks.stream import BLOCK, Layout
from hpcdl.compress.header import Header
from hpcdl.compress.registry import register_codec

__all__ = ["BACKENDS", "FIELDS", "Sz", "backend_module", "decode_with", "encode_with", "host", "reference"]

# mode code, flags, block size, pw_rel shift, bound, eb, step, sub (x > 0, x < 0), base (x > 0, x < 0), words,
# outliers (docs/format.md)
FIELDS = "BBBBdddddddQQ"
# Format 1 (fields BBBBddQQ) decoded level k to (2k - 1) eb, errors biased away from zero: its streams are refused
# rather than decoded, since sz streams hold saved activations, which live for one training step.
RETIRED_FIELDS = {36: "sz format 1 (before the unbiased reconstruction, docs/format.md section 5); re-encode the "
                      "tensor with this hpcdl"}


def encode_with(backend: str, tensor: torch.Tensor, mode: str, bound: float) -> Packed:
    """Encode with a chosen implementation ("reference", "host", "cuda" or "auto"): tests compare their bytes."""
    return Sz(mode, bound).encode_with(tensor, backend)


def decode_with(backend: str, packed: Packed) -> torch.Tensor:
    """Decode with a chosen implementation."""
    return Sz.decode_with(packed, backend)


def _reconstruction_valid(mode: str, shift: int, step: float, sub: tuple[float, float],
                          base: tuple[float, float]) -> bool:
    """Whether a header's reconstruction fields can be what an encoder wrote: pw_rel's bases are integers below
    2^shift (the kernels convert them to integers), abs and rel's values are finite and >= 0."""
    if mode == "pw_rel":
        return step == 0 and sub == (0.0, 0.0) and all(math.isfinite(b) and b == int(b) and 0 <= b < 1 << shift for b in base)
    return all(math.isfinite(value) and value >= 0 for value in (step, *sub, *base))


@register_codec
class Sz(BlockCodec[SzParams]):
    """Error-bounded block codec: ``Sz(mode="rel", bound=1e-2)``; modes abs, rel, pw_rel."""

    codec_id = "sz"
    modes = ERROR_BOUND_MODES
    dtypes = FLOAT_DTYPES
    error_bounded = True
    fields = FIELDS
    retired_fields = RETIRED_FIELDS
    bounded_codes = True

    def __init__(self, mode: str = "rel", bound: float = 1e-2):
        check_mode(self.codec_id, mode, self.modes)
        self.error_bound = ErrorBound(mode, bound)

    def get_config(self) -> dict:
        return {"id": self.codec_id, "mode": self.error_bound.mode, "bound": self.error_bound.bound}

    def _prepare(self, flat: torch.Tensor, kernels: BlockKernels) -> SzParams:
        mode, bound = self.error_bound.mode, self.error_bound.bound
        if kernels.RESOLVES_PARAMS:
            return SzParams.unresolved(mode, bound, flat.dtype)
        return SzParams.for_tensor(mode, bound, flat, kernels.sz_stats)

    def _encode_blocks(self, kernels: BlockKernels, flat: torch.Tensor, state: SzParams,
                       raw_size: int) -> tuple[SzParams, BlockPayload | None]:
        return kernels.sz_encode(flat, state, raw_size)

    def _header_fields(self, state: SzParams, flags: int, n_words: int, n_outliers: int) -> tuple:
        return (MODE_CODES[state.mode], flags, BLOCK, state.shift, state.bound, state.eb, *state.reconstruction,
                n_words, n_outliers)

    @classmethod
    def _read_fields(cls, header: Header) -> tuple[StreamCounts, SzParams] | None:
        mode_code, flags, block, shift, bound, eb, step, *rest = header.fields
        sub, base, (n_words, n_outliers) = (rest[0], rest[1]), (rest[2], rest[3]), rest[4:]
        if (mode_code not in CODE_MODES or shift > MANTISSA_BITS[compute_dtype(header.dtype)] or not eb >= 0
                or n_outliers > header.numel or not _reconstruction_valid(CODE_MODES[mode_code], shift, step, sub, base)):
            return None
        params = SzParams(CODE_MODES[mode_code], bound, eb, shift, step, sub, base)
        return StreamCounts(flags, block, n_words, n_outliers), params

    @classmethod
    def _decode_blocks(cls, kernels: BlockKernels, header: Header, state: SzParams, layout: Layout,
                       data: torch.Tensor) -> torch.Tensor:
        return kernels.sz_decode(data, layout, header.checksum, header.dtype, state)
