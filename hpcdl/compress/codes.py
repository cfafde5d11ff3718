"""A block stream's codes laid out for zstd: the ``codes`` layouts of the entropy stage (hpcdl.compress.entropy).

``sz`` (like ``int``) packs each block of 32 codes as bit planes at the block's width (docs/format.md section 4).
zstd over those words sees bytes that hold one bit of each of 8 lanes, so its Huffman stage cannot see how
skewed the codes are: on the zoo's activations at coarse bounds, an order-0 entropy coder over the codes would
need 1.1-1.25x fewer bytes than zstd over the stream (docs/results/headroom.txt). Here an sz stream's block headers
and words are replaced by the codes themselves, zigzagged and packed ``k`` bits each (``k`` = 2, 4 or 8: four,
two or one code per byte), so that every byte zstd codes is whole codes: its Huffman stage then codes pairs or
quadruples of codes (less than a bit per code where most are zero) and its match finder sees runs of codes (a
padded particle's rows).

Body, for a stream of ``C`` codes (``Layout.numel``) and ``p = 8 / k`` codes a byte:

* ``ceil(C / p)`` bytes: code ``i``'s value ``v_i`` in bits ``k (i mod p) ..`` of byte ``i // p``, where ``v_i`` is
  ``zigzag(q_i)`` if that is below ``2^k - 1`` and the escape ``2^k - 1`` otherwise; unused bits of the last byte
  are zero;
* one u32 per escape, in code order: ``zigzag(q_i) - (2^k - 1)`` (below ``2^30``: sz's codes are at most
  ``MAX_Q = 2^29`` in magnitude);
* the stream's outlier sections as they are (its payload from ``Layout.indices_at`` on).

``k`` is the fewest bits whose escapes are at most :data:`ESCAPE_SHARE` of a sample of the codes; where even
8 bits escape more (fine bounds, wide codes) the stage keeps zstd over the stream. Block headers and words are a
function of the codes (the encoder picks each block's predictor from its codes alone), so decoding rebuilds
them with the block kernels: the inner stream comes back byte for byte, and its own checksum and checks run
on it. Both directions go :data:`CHUNK_BLOCKS` blocks at a time, so their temporaries stay a few MiB whatever
the tensor's size.
"""

from __future__ import annotations

from typing import Protocol

import torch

from hpcdl.compress.blocks.params import MAX_Q
from hpcdl.compress.blocks.stream import BLOCK, Layout, word_offsets
from hpcdl.compress.errors import CodecError

#: The code widths a body may use, fewest first.
CODE_BITS = (2, 4, 8)
#: The most escapes, as a share of the sampled codes, that a width may take.
ESCAPE_SHARE = 0.05
#: Blocks encoded at once (1 Mi codes), which bounds the escapes' scratch to 4 MiB.
CHUNK_BLOCKS = 1 << 15
#: The sample the width is chosen on: this many runs of SAMPLE_BLOCKS blocks, evenly spaced (all the blocks of a
#: stream that has no more).
SAMPLE_RUNS, SAMPLE_BLOCKS = 8, 1024
#: The largest zigzag value of a code (sz's codes are at most MAX_Q in magnitude).
MAX_ZIGZAG = 2 * MAX_Q
_DECODE_ERRORS = {
    -1: "an escape is missing, out of range or left over",
    -2: "bits are set past its last code",
    -3: "its codes pack into another number of words than its header says",
}


class CodesKernels(Protocol):
    """The functions of a CPU block backend (hpcdl/compress/blocks/host.py, reference.py) this layout uses."""

    def codes_encode(self, headers: torch.Tensor, offsets: torch.Tensor, words: torch.Tensor, numel: int,
                     bits: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def codes_escapes(self, headers: torch.Tensor, offsets: torch.Tensor, words: torch.Tensor,
                      numel: int) -> torch.Tensor: ...

    def codes_decode(self, packed: torch.Tensor, numel: int, bits: int, escapes: torch.Tensor, max_zigzag: int,
                     headers: torch.Tensor, words: torch.Tensor) -> int: ...


def codes_kernels() -> CodesKernels:
    """The host library's functions where the CPU block backend is the host library, else the reference's."""
    from hpcdl.compress.blocks import CPU_AUTO_BACKEND, host, reference

    return host if CPU_AUTO_BACKEND == "host" and host.AVAILABLE else reference


def code_bits(data: torch.Tensor, layout: Layout) -> int | None:
    """The width of CODE_BITS for the non-raw block payload ``data``: the fewest bits whose escapes are at most
    ESCAPE_SHARE of a sample of its codes; None when 8 bits escape more."""
    if layout.numel == 0:
        return CODE_BITS[0]
    headers, words = layout.headers(data), layout.words(data)
    offsets, _ = word_offsets(headers)
    kernels = codes_kernels()
    if layout.n_blocks <= SAMPLE_RUNS * SAMPLE_BLOCKS:
        sampled, escapes = layout.numel, kernels.codes_escapes(headers, offsets, words, layout.numel)
    else:
        starts = torch.linspace(0, layout.n_blocks - SAMPLE_BLOCKS, SAMPLE_RUNS).round().long().tolist()
        sampled = SAMPLE_RUNS * SAMPLE_BLOCKS * BLOCK
        escapes = torch.stack([kernels.codes_escapes(headers[start:start + SAMPLE_BLOCKS],
                                                     offsets[start:start + SAMPLE_BLOCKS], words, SAMPLE_BLOCKS * BLOCK)
                               for start in starts]).sum(dim=0)
    for bits, count in zip(CODE_BITS, escapes.tolist(), strict=True):  # codes_escapes counts at 2, 4 and 8 bits
        if count <= ESCAPE_SHARE * sampled:
            return bits
    return None


def encode_body(data: torch.Tensor, layout: Layout, bits: int) -> list[torch.Tensor]:
    """The body of the non-raw block payload ``data`` (codes of magnitude at most MAX_Q) at ``bits`` bits a code,
    as uint8 pieces in order."""
    headers, words = layout.headers(data), layout.words(data)
    offsets, _ = word_offsets(headers)
    kernels = codes_kernels()
    packed, escapes = [], []
    for first in range(0, layout.n_blocks, CHUNK_BLOCKS):
        last = first + CHUNK_BLOCKS
        count = min(layout.numel, last * BLOCK) - first * BLOCK
        chunk, extra = kernels.codes_encode(headers[first:last], offsets[first:last], words, count, bits)
        packed.append(chunk)
        escapes.append(extra)
    extra = torch.cat(escapes) if escapes else torch.empty(0, dtype=torch.int32)
    return [*packed, extra.view(torch.uint8), data[layout.indices_at:layout.total]]


def decode_body(body: torch.Tensor, layout: Layout, bits: int, codec_id: str) -> torch.Tensor:
    """The block payload (``layout.total`` bytes) whose body at ``bits`` bits a code is ``body`` (uint8, on the
    CPU); CodecError where ``body`` cannot be the body of a payload of ``layout`` with codes of magnitude at most
    MAX_Q. The payload's own checksum is the codec's to check."""
    if bits not in CODE_BITS:
        raise CodecError(f"entropy stream's codes are {bits} bits wide, not one of {list(CODE_BITS)}: corrupted")
    if layout.total > layout.numel * layout.value_size + 7:  # the encoder stores such a stream raw, without codes
        raise CodecError(f"entropy stream's {codec_id} header declares a payload of {layout.total} bytes for "
                         f"{layout.numel} codes, more than their raw bytes: corrupted")
    packed_bytes = -(-layout.numel // (8 // bits))
    tail = layout.total - layout.indices_at
    escape_bytes = body.numel() - packed_bytes - tail
    if escape_bytes < 0 or escape_bytes % 4:
        raise CodecError(f"entropy stream's {codec_id} codes body holds {body.numel()} bytes: {layout.numel} codes "
                         f"at {bits} bits take {packed_bytes}, its outliers {tail}, and the rest is not whole "
                         "4-byte escapes: corrupted")
    escapes = body[packed_bytes:packed_bytes + escape_bytes].clone().view(torch.int32)
    payload = torch.empty(layout.total, dtype=torch.uint8)
    payload[:layout.indices_at] = 0
    status = codes_kernels().codes_decode(body[:packed_bytes], layout.numel, bits, escapes, MAX_ZIGZAG,
                                          layout.headers(payload), layout.words(payload))
    if status != 0:
        raise CodecError(f"entropy stream's {codec_id} codes body is not one of a stream: "
                         f"{_DECODE_ERRORS.get(status, f'status {status}')}: corrupted")
    payload[layout.indices_at:] = body[packed_bytes + escape_bytes:]
    return payload
