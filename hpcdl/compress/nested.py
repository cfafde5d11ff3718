"""An inner codec's whole stream carried inside another stream's payload (the codec stages' common layout).

A stage (:mod:`hpcdl.compress.entropy`, :mod:`hpcdl.compress.channels`) wraps another codec and stores that
codec's finished stream in its own payload as ``u32 header length | header | zeros | payload``: the zeros make
the inner payload start on an 8-byte boundary of the outer one, so the block kernels read it in place. The inner
stream keeps its own header, checksum and checks; decoding it is the inner codec's decode.
"""

from __future__ import annotations

import struct

import torch

from hpcdl.compress.base import Packed
from hpcdl.compress.errors import CodecError
from hpcdl.compress.header import peek_codec_id


def header_prefix(header: bytes) -> torch.Tensor:
    """``u32 length | header | zeros``, as a uint8 tensor of a multiple of 8 bytes, so that the inner payload
    after it starts 8-byte aligned (the block kernels read it in place; an unaligned one would be copied)."""
    prefix = struct.pack("<I", len(header)) + header
    return torch.frombuffer(bytearray(prefix + bytes(-len(prefix) % 8)), dtype=torch.uint8)


def inner_packed(stream: torch.Tensor, limit: int, stage: str) -> Packed:
    """The inner codec's Packed from its serialised form (:func:`header_prefix`, then the payload: a view);
    :class:`CodecError` naming ``stage`` when the serialised form cannot be one of at most ``limit`` bytes."""
    if stream.numel() < 4 or stream.numel() > limit:
        raise CodecError(f"{stage} stream holds {stream.numel()} bytes: corrupted")
    (length,) = struct.unpack("<I", bytes(stream[:4].cpu().tolist()))
    payload_at = 4 + length + (-(4 + length) % 8)
    if payload_at > stream.numel():
        raise CodecError(f"{stage} stream's inner header of {length} bytes runs past its {stream.numel()} bytes: "
                         "corrupted")
    header = bytes(stream[4:4 + length].cpu().numpy().tobytes())
    try:
        peek_codec_id(header)
    except CodecError as err:
        raise CodecError(f"{stage} stream's inner header is unreadable ({err}): corrupted") from None
    return Packed(header, stream[payload_at:])
