"""The block stream shared by the ``sz`` and ``int`` codecs: layout, header, validation.

A stream is a header (hpcdl.compress.header: with the payload checksum of
hpcdl.compress.checksum and a CRC-32 over itself) and one uint8 payload tensor
laid out as (docs/format.md)::

    block headers   one byte per 32-element block: words (bits 0..5) | predictor (bits 6..7)
    words           u32 words of every block, at 8-byte-aligned offset
    outlier index   sorted flat indices (int32, or int64 for tensors of 2^31 elements or more)
    outlier values  the exact elements, in the tensor's dtype
    (zero padding after each section to a multiple of 8 bytes)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hpcdl.compress.errors import CodecError

BLOCK = 32
MAX_WORDS = 32  # words of one block


def block_count(numel: int) -> int:
    return (numel + BLOCK - 1) // BLOCK


def align8(nbytes: int) -> int:
    return (nbytes + 7) // 8 * 8


def index_dtype(numel: int) -> torch.dtype:
    """Outlier indices are int32 when every index fits, int64 otherwise."""
    return torch.int32 if numel < 2**31 else torch.int64


@dataclass(frozen=True)
class Layout:
    """Byte offsets of the payload sections of a stream."""

    numel: int
    n_words: int
    n_outliers: int
    value_size: int

    @property
    def n_blocks(self) -> int:
        return block_count(self.numel)

    @property
    def words_at(self) -> int:
        return align8(self.n_blocks)

    @property
    def indices_at(self) -> int:
        return align8(self.words_at + 4 * self.n_words)

    @property
    def values_at(self) -> int:
        return align8(self.indices_at + self.n_outliers * index_dtype(self.numel).itemsize)

    @property
    def total(self) -> int:
        return align8(self.values_at + self.n_outliers * self.value_size)

    def headers(self, data: torch.Tensor) -> torch.Tensor:
        return data[: self.n_blocks]

    def words(self, data: torch.Tensor) -> torch.Tensor:
        return data[self.words_at : self.words_at + 4 * self.n_words].view(torch.int32)

    def indices(self, data: torch.Tensor) -> torch.Tensor:
        dtype = index_dtype(self.numel)
        return data[self.indices_at : self.indices_at + self.n_outliers * dtype.itemsize].view(dtype)

    def values(self, data: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return data[self.values_at : self.values_at + self.n_outliers * self.value_size].view(dtype)


def raw_payload_size(numel: int, dtype: torch.dtype) -> int:
    """Payload bytes of the raw fallback: the tensor's bytes, padded to 8."""
    return align8(numel * dtype.itemsize)


def raw_payload(flat: torch.Tensor) -> torch.Tensor:
    """The raw fallback payload of a contiguous 1-D tensor: its bytes, zero-padded to 8."""
    data = torch.zeros(raw_payload_size(flat.numel(), flat.dtype), dtype=torch.uint8, device=flat.device)
    data[: flat.numel() * flat.element_size()] = flat.view(torch.uint8)
    return data


def word_offsets(headers: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Exclusive prefix sum of the blocks' word counts (int64, on the headers' device) and the total."""
    widths = (headers & 63).to(torch.int64)
    ends = torch.cumsum(widths, 0)
    total = int(ends[-1]) if ends.numel() else 0
    return ends - widths, total


def validate_block_headers(headers: torch.Tensor, n_words: int, codec_id: str) -> None:
    """Every block has at most 32 words, and the blocks' words add up to the stream's word count."""
    widths = headers & 63
    if headers.numel() and bool((widths > MAX_WORDS).any()):
        raise CodecError(f"{codec_id} stream has a block header of more than {MAX_WORDS} words: corrupted")
    total = int(widths.sum(dtype=torch.int64)) if headers.numel() else 0
    if total != n_words:
        raise CodecError(f"{codec_id} block headers add up to {total} words, the header says {n_words}: corrupted")


def validate_outlier_indices(indices: torch.Tensor, numel: int, codec_id: str) -> None:
    """Outlier indices must be strictly increasing and inside the tensor."""
    if indices.numel() == 0:
        return
    inside = bool(indices[0] >= 0) and bool(indices[-1] < numel)
    increasing = indices.numel() == 1 or bool((indices[1:] > indices[:-1]).all())
    if not (inside and increasing):
        raise CodecError(f"{codec_id} outlier indices are out of range or not strictly increasing: corrupted")


def check_payload_length(data: torch.Tensor, expected: int, codec_id: str) -> None:
    if data.numel() != expected:
        raise CodecError(f"{codec_id} payload has {data.numel()} bytes, the header implies {expected}: truncated or corrupted")
