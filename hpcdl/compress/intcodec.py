"""``int``: exact compression of integer tensors (max-pool indices, token ids, labels).

The same block machinery as ``sz`` (hpcdl.compress.blocks: kernels/sz_block.cuh on
host and GPU): values become int32 codes, each 32-element block takes the
narrowest of zigzag, unsigned or 1-D Lorenzo (delta) prediction, and is
bit-packed at its own width. Deltas wrap modulo 2^32, so every int32 sequence
round-trips. int64 is split into two int32 code sequences, the low words then
the high words: indices and small values leave the high half all-zero blocks
that cost one byte per 32 elements. Stream format: docs/format.md.
"""

from __future__ import annotations

from itertools import accumulate

import torch

from hpcdl.compress.blocks.codec import BlockCodec, StreamCounts
from hpcdl.compress.blocks.protocol import BlockKernels, BlockPayload
from hpcdl.compress.blocks.stream import BLOCK, Layout, validate_block_headers, word_offsets
from hpcdl.compress.checksum import payload_checksum, verified_payload
from hpcdl.compress.header import Header
from hpcdl.compress.registry import register_codec

INT_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
FIELDS = "BBQ"  # flags, block size, words
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


def unpack_into(kernels: BlockKernels, headers: torch.Tensor, words: torch.Tensor, out: torch.Tensor) -> None:
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
class IntCodec(BlockCodec[None]):
    """Lossless block codec for integer tensors: ``get_codec({"id": "int"})``."""

    codec_id = "int"
    modes = ("lossless",)
    dtypes = INT_DTYPES
    lossless = True
    fields = FIELDS

    def get_config(self) -> dict:
        return {"id": self.codec_id}

    def _prepare(self, flat: torch.Tensor, kernels: BlockKernels) -> None:
        return None

    def _encode_blocks(self, kernels: BlockKernels, flat: torch.Tensor, state: None,
                       raw_size: int) -> tuple[None, BlockPayload | None]:
        codes = to_codes(flat)
        headers = kernels.block_headers(codes)
        offsets, n_words = word_offsets(headers)
        layout = Layout(codes.numel(), n_words, 0, 0)
        if layout.total > raw_size:
            return None, None
        data = torch.zeros(layout.total, dtype=torch.uint8, device=flat.device)
        layout.headers(data).copy_(headers)
        kernels.pack(codes, headers, offsets, layout.words(data))
        return None, BlockPayload(data, n_words, 0, payload_checksum(data, kernels))

    def _header_fields(self, state: None, flags: int, n_words: int, n_outliers: int) -> tuple:
        return flags, BLOCK, n_words

    @classmethod
    def _read_fields(cls, header: Header) -> tuple[StreamCounts, None]:
        flags, block, n_words = header.fields
        return StreamCounts(flags, block, n_words, 0), None

    @classmethod
    def _code_count(cls, numel: int, dtype: torch.dtype) -> int:
        return code_count(numel, dtype)

    @classmethod
    def _decode_blocks(cls, kernels: BlockKernels, header: Header, state: None, layout: Layout,
                       data: torch.Tensor) -> torch.Tensor:
        data = verified_payload(data, header, kernels)
        headers = layout.headers(data)
        validate_block_headers(headers, layout.n_words, cls.codec_id)
        out = torch.empty(header.numel, dtype=header.dtype, device=data.device)
        unpack_into(kernels, headers, layout.words(data), out)
        return out
