"""The payload checksum every codec's stream carries in its header, and its check on decode.

Definition (docs/format.md): the payload, zero-padded to a multiple of 8 bytes, read as little-endian u64
words w_0 .. w_{m-1}; the checksum is ``sum((2 i + 1) * w_i) mod 2^64``. The odd weights make any change
of one word change the sum, the position weights catch swapped words, and it is one multiply-add per 8
bytes in parallel (the host library, or torch on any device, computes the whole words; the tail of a
payload whose length is not a multiple of 8 is added here).

The header that holds the checksum protects itself with a CRC-32 (hpcdl.compress.header), so a stream
whose header or payload changed in any byte is refused with :class:`CodecError` before a codec reads it.
"""

from __future__ import annotations

import torch

from hpcdl.compress.errors import CodecError
from hpcdl.compress.header import Header

_MASK64 = 2**64 - 1


def aligned_payload(data: torch.Tensor) -> torch.Tensor:
    """The payload, or an aligned contiguous copy when it does not start on an 8-byte boundary (a Packed over a
    foreign buffer may not): codecs read its sections as u16 .. u64 values, which need their alignment."""
    return data.clone() if data.storage_offset() % 8 or data.data_ptr() % 8 or not data.is_contiguous() else data


def payload_checksum(data: torch.Tensor, kernels=None) -> int:
    """The checksum of a 1-D uint8 payload on any device. ``kernels`` is a block-kernel module with a
    ``checksum`` of whole u64 words (a backend of hpcdl.compress.blocks); by default the host library
    for CPU payloads when it is built, else the torch reference."""
    if kernels is None:
        from hpcdl.compress.blocks import host, reference  # the kernels import the codec base: import late

        kernels = host if data.device.type == "cpu" and host.AVAILABLE else reference
    data = aligned_payload(data)
    whole = data.numel() // 8 * 8
    total = kernels.checksum(data[:whole]) if whole else 0
    if whole < data.numel():
        tail = int.from_bytes(bytes(data[whole:].cpu().tolist()), "little")  # zero-padded to 8 bytes
        total += (2 * (whole // 8) + 1) * tail
    return total & _MASK64


def verified_payload(data: torch.Tensor, header: Header, kernels=None) -> torch.Tensor:
    """``data``, aligned (:func:`aligned_payload`), after checking it against ``header.checksum``: a payload that
    changed in any byte raises :class:`CodecError`."""
    data = aligned_payload(data)
    if payload_checksum(data, kernels) != header.checksum:
        raise CodecError(f"{header.codec_id} payload fails its checksum: the packed data is corrupted")
    return data
