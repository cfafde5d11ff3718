"""The coarse sz operations from a backend's per-block kernels, for the backends that run them as separate
passes (reference.py, cuda.py); the host library fuses them (host.sz_encode, host.sz_decode)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from hpcdl.compress.blocks.params import SzParams
from hpcdl.compress.blocks.protocol import BlockPayload
from hpcdl.compress.blocks.stream import Layout, validate_block_headers, validate_outlier_indices, word_offsets
from hpcdl.compress.errors import CodecError

HeadersPass = Callable[[torch.Tensor, SzParams], tuple[torch.Tensor, torch.Tensor]]
PackPass = Callable[..., None]
BlocksDecoder = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.dtype, SzParams], torch.Tensor]


def sz_encode(sz_headers: HeadersPass, sz_pack: PackPass, checksum: Callable[[torch.Tensor], int], x: torch.Tensor,
              params: SzParams, raw_size: int) -> BlockPayload | None:
    """The payload of flat ``x``, or None when it would be larger than ``raw_size`` bytes: block headers and
    outlier counts (``sz_headers``), their prefix sums, then the words and outliers (``sz_pack``)."""
    headers, outlier_counts = sz_headers(x, params)
    offsets, n_words = word_offsets(headers)
    outlier_ends = torch.cumsum(outlier_counts, 0)
    n_outliers = int(outlier_ends[-1]) if x.numel() else 0
    layout = Layout(x.numel(), n_words, n_outliers, x.element_size())
    if layout.total > raw_size:
        return None
    data = torch.zeros(layout.total, dtype=torch.uint8, device=x.device)
    layout.headers(data).copy_(headers)
    sz_pack(x, params, headers, offsets, outlier_ends - outlier_counts, layout.words(data),
            layout.indices(data), layout.values(data, x.dtype))
    return BlockPayload(data, n_words, n_outliers, checksum(data))


def sz_decode(decode_blocks: BlocksDecoder, headers: torch.Tensor, n_words: int, words: torch.Tensor, numel: int,
              dtype: torch.dtype, params: SzParams) -> torch.Tensor:
    """Validate the block headers against ``n_words``, then ``decode_blocks`` at their word offsets."""
    validate_block_headers(headers, n_words, "sz")
    offsets, _ = word_offsets(headers)
    return decode_blocks(headers, offsets, words, numel, dtype, params)


BlocksDecode = Callable[[torch.Tensor, int, torch.Tensor, int, torch.dtype, SzParams], torch.Tensor]


def sz_decode_checked(checksum_of: Callable[[torch.Tensor], int], decode: BlocksDecode, data: torch.Tensor,
                      layout: Layout, checksum: int, dtype: torch.dtype, params: SzParams) -> torch.Tensor:
    """BlockKernels.sz_decode from a backend's ``checksum`` (an sz payload is whole u64 words) and block decoder
    ``decode`` (headers, words, numel, dtype, params; it validates the headers): the checksum and outlier index
    checks, the blocks, then the outliers scattered."""
    if checksum_of(data) != checksum:
        raise CodecError("sz payload fails its checksum: the packed data is corrupted")
    indices = layout.indices(data)
    validate_outlier_indices(indices, layout.numel, "sz")
    restored = decode(layout.headers(data), layout.n_words, layout.words(data), layout.numel, dtype, params)
    restored[indices.to(torch.int64)] = layout.values(data, dtype)
    return restored
