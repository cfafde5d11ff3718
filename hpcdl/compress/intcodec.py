"""``int``: exact compression of integer tensors (max-pool indices, token ids, labels).

The same block machinery as ``sz`` (hpcdl/compress/sz: kernels/sz_block.cuh on
host and GPU): values become int32 codes, each 32-element block takes the
narrowest of zigzag, unsigned or 1-D Lorenzo (delta) prediction, and is
bit-packed at its own width. Deltas wrap modulo 2^32, so every int32 sequence
round-trips. int64 is split into two int32 code sequences, the low words then
the high words: indices and small values leave the high half all-zero blocks
that cost one byte per 32 elements. Stream format: docs/format.md.
"""

from __future__ import annotations

from itertools import accumulate
from types import ModuleType

import torch

from hpcdl.compress.base import Codec, Packed
from hpcdl.compress.checksum import payload_checksum, verified_payload
from hpcdl.compress.errors import CodecError
from hpcdl.compress.header import read_header, write_header
from hpcdl.compress.registry import register_codec
from hpcdl.compress.sz import backend_module
from hpcdl.compress.sz.stream import (
    BLOCK,
    Layout,
    check_payload_length,
    raw_payload,
    raw_payload_size,
    validate_block_headers,
    word_offsets,
)

INT_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
FIELDS = "BBQ"  # flags, block size, words
FLAG_RAW = 1
UNPACK_BLOCKS = 2**15  # blocks decoded at a time: 1M codes, 4 MiB of int32 scratch


def to_codes(flat: torch.Tensor) -> torch.Tensor:
    """int32 codes of a flat integer tensor: the values, or for int64 the low then the high 32-bit words."""
    if flat.dtype != torch.int64:
        return flat.to(torch.int32)
    low = ((flat & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000  # the low word as a signed int32 value
    return torch.cat([low, flat >> 32]).to(torch.int32)


def code_count(numel: int, dtype: torch.dtype) -> int:
    return 2 * numel if dtype == torch.int64 else numel


def code_targets(out: torch.Tensor) -> list[torch.Tensor]:
    """Where the code sequence goes in the flat output ``out``, as consecutive int32-or-narrower views: ``out``
    itself, or for int64 its low then its high 32-bit words (little-endian, like the rest of the stream)."""
    if out.dtype != torch.int64:
        return [out]
    words = out.view(torch.int32).view(-1, 2)
    return [words[:, 0], words[:, 1]]


def unpack_into(kernels: ModuleType, headers: torch.Tensor, words: torch.Tensor, out: torch.Tensor) -> None:
    """Decode validated block headers and words into the flat output ``out``, UNPACK_BLOCKS blocks at a time,
    so that the codes and word offsets never exist for the whole tensor: the transient stays a few MiB
    above the output, whatever its size (the whole-tensor int32 codes, their int64 copy and the shifted
    halves once made an int64 decode peak at 6x its output)."""
    targets = code_targets(out)
    bounds = list(accumulate((t.numel() for t in targets), initial=0))
    total, first_code, word_base = bounds[-1], 0, 0
    for block in range(0, headers.numel(), UNPACK_BLOCKS):
        chunk = headers[block : block + UNPACK_BLOCKS]
        offsets, chunk_words = word_offsets(chunk)
        count = min(total - first_code, chunk.numel() * BLOCK)
        codes = kernels.unpack(chunk, offsets + word_base, words, count)
        for target, start, end in zip(targets, bounds, bounds[1:]):
            low, high = max(start, first_code), min(end, first_code + count)
            if low < high:
                target[low - start : high - start].copy_(codes[low - first_code : high - first_code])
        first_code += count
        word_base += chunk_words


@register_codec
class IntCodec(Codec):
    """Lossless block codec for integer tensors: ``get_codec({"id": "int"})``."""

    codec_id = "int"
    modes = ("lossless",)
    dtypes = INT_DTYPES
    lossless = True

    def get_config(self) -> dict:
        return {"id": self.codec_id}

    def _encode(self, tensor: torch.Tensor) -> Packed:
        return self.encode_with(tensor, "auto")

    def _decode(self, packed: Packed) -> torch.Tensor:
        return self.decode_with(packed, "auto")

    def encode_with(self, tensor: torch.Tensor, backend: str) -> Packed:
        """Encode with a chosen implementation ("reference", "host", "cuda" or "auto")."""
        if not isinstance(tensor, torch.Tensor) or tensor.dtype not in self.dtypes:
            return self.encode(tensor)  # raises the contract's TypeError
        kernels = backend_module(backend, tensor.device)
        flat = tensor.detach().contiguous().reshape(-1)
        codes = to_codes(flat)
        headers = kernels.block_headers(codes)
        offsets, n_words = word_offsets(headers)
        layout = Layout(codes.numel(), n_words, 0, 0)
        if layout.total > raw_payload_size(flat.numel(), flat.dtype):
            flags, n_words = FLAG_RAW, 0
            data = raw_payload(flat)
        else:
            flags = 0
            data = torch.zeros(layout.total, dtype=torch.uint8, device=flat.device)
            layout.headers(data).copy_(headers)
            kernels.pack(codes, headers, offsets, layout.words(data))
        header = write_header(self.codec_id, tensor.dtype, tensor.shape, FIELDS, flags, BLOCK, n_words,
                              checksum=payload_checksum(data, kernels))
        return Packed(header, data)

    def decode_with(self, packed: Packed, backend: str) -> torch.Tensor:
        """Decode with a chosen implementation."""
        if not isinstance(packed, Packed):
            raise TypeError(f"int decodes a Packed, got {type(packed).__name__}")
        header = read_header(packed.header, self.codec_id, FIELDS)
        flags, block, n_words = header.fields
        dtype, numel = header.dtype, header.numel
        if dtype not in INT_DTYPES or flags not in (0, FLAG_RAW) or block != BLOCK:
            raise CodecError(f"int packed header has impossible fields {header.fields} for {dtype}: corrupted")
        layout = Layout(code_count(numel, dtype), n_words, 0, 0)
        check_payload_length(packed.data, raw_payload_size(numel, dtype) if flags == FLAG_RAW else layout.total,
                             self.codec_id)
        kernels = backend_module(backend, packed.device)
        data = verified_payload(packed.data, header, kernels)
        if flags == FLAG_RAW:
            return data[: numel * dtype.itemsize].clone().view(dtype).reshape(header.shape)
        headers = layout.headers(data)
        validate_block_headers(headers, n_words, self.codec_id)
        out = torch.empty(numel, dtype=dtype, device=data.device)
        unpack_into(kernels, headers, layout.words(data), out)
        return out.reshape(header.shape)
