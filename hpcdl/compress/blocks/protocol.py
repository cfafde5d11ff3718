"""What a block-kernel backend is: the coarse operations ``sz`` and ``int`` call, one typing.Protocol.

A backend is a module (reference.py, host.py, cuda.py) whose functions have these names and signatures;
mypy checks each module against :class:`BlockKernels` where :func:`hpcdl.compress.blocks.backend_module`
returns it, and tests/test_block_backends.py checks the names and parameters at run time. Every backend
produces the same bytes (tests/test_sz_fixtures.py holds the golden streams).

Callers pass contiguous flat tensors on the backend's device whose lengths were validated against the
stream header (hpcdl.compress.blocks.stream) and whose payloads are 8-byte aligned
(hpcdl.compress.checksum.aligned_payload).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from hpcdl.compress.blocks.params import SzParams
from hpcdl.compress.blocks.stream import Layout


class BlockPayload(NamedTuple):
    """An encoded payload: the bytes (docs/format.md's layout), its word and outlier counts, its checksum."""

    data: torch.Tensor
    n_words: int
    n_outliers: int
    checksum: int


class BlockKernels(Protocol):
    """The operations of one block-kernel backend."""

    RESOLVES_PARAMS: bool  # sz_encode computes the data-dependent SzParams itself (on the device, docs/gpu.md)

    def sz_encode(self, x: torch.Tensor, params: SzParams, raw_size: int) -> tuple[SzParams, BlockPayload | None]:
        """The parameters used and the sz payload of the flat float tensor ``x``, or None for the payload when it
        would be larger than ``raw_size`` bytes (the codec then stores the raw fallback). A backend that
        RESOLVES_PARAMS takes :meth:`SzParams.unresolved` and returns the params it computed from ``x`` (rel's eb,
        the unbiased reconstruction), the same as :meth:`SzParams.for_tensor` with its sz_stats; any other backend
        takes those and returns them."""
        ...

    def sz_stats(self, x: torch.Tensor, params: SzParams) -> tuple[int, ...]:
        """The 8 integer sums of the flat float tensor ``x`` that :meth:`SzParams.with_means` turns into the
        unbiased reconstruction (docs/format.md, section 5); the codec calls it when the backend does not
        RESOLVES_PARAMS."""
        ...

    def sz_decode(self, data: torch.Tensor, layout: Layout, expected_checksum: int, dtype: torch.dtype,
                  params: SzParams) -> torch.Tensor:
        """The decoded flat tensor of the 8-byte aligned payload ``data`` (length checked against ``layout``),
        outliers included, after checking the payload's checksum against ``expected_checksum``, that the block headers
        have at most 32 words each and ``layout.n_words`` in all, and that the outlier indices increase strictly
        inside the tensor (CodecError if any fails)."""
        ...

    def block_headers(self, q: torch.Tensor) -> torch.Tensor:
        """One header byte per block of the int32 codes ``q``: the narrowest predictor and its word count."""
        ...

    def pack(self, q: torch.Tensor, headers: torch.Tensor, offsets: torch.Tensor, words: torch.Tensor) -> None:
        """Write the words of each block of the codes ``q`` into ``words`` (int32) at its offset (int64)."""
        ...

    def unpack(self, headers: torch.Tensor, offsets: torch.Tensor, words: torch.Tensor,
               numel: int) -> torch.Tensor:
        """The int32 codes of ``numel`` elements from validated block headers, their word offsets and words."""
        ...

    def checksum(self, data: torch.Tensor) -> int:
        """The payload checksum (hpcdl.compress.checksum) of ``data``, a whole number of u64 words."""
        ...
