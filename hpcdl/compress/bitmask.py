"""``bitmask``: bool tensors (ReLU and dropout masks) at 1 bit per element, exact, on any device."""

from __future__ import annotations

import torch

from hpcdl.compress.base import Codec, Packed
from hpcdl.compress.bitpack import pack_bits, packed_length, unpack_bits
from hpcdl.compress.checksum import payload_checksum, verified_payload
from hpcdl.compress.errors import CodecError
from hpcdl.compress.header import read_header, write_header
from hpcdl.compress.registry import register_codec


@register_codec
class Bitmask(Codec):
    """Eight bools per byte; the payload is ``ceil(numel / 8)`` bytes after the header."""

    codec_id = "bitmask"
    modes = ("lossless",)
    dtypes = frozenset({torch.bool})
    lossless = True

    def get_config(self) -> dict:
        return {"id": self.codec_id}

    def _encode(self, tensor: torch.Tensor) -> Packed:
        data = pack_bits(tensor.detach().reshape(-1).to(torch.uint8), 1)
        return Packed(write_header(self.codec_id, tensor.dtype, tensor.shape, checksum=payload_checksum(data)), data)

    def _decode(self, packed: Packed) -> torch.Tensor:
        header = read_header(packed.header, self.codec_id)
        if header.dtype != torch.bool:
            raise CodecError(f"bitmask header names dtype {header.dtype}, but bitmask only writes torch.bool")
        expected = packed_length(header.numel, 1)
        if packed.data.numel() != expected:
            raise CodecError(f"bitmask payload has {packed.data.numel()} bytes, expected {expected} for shape {header.shape}")
        data = verified_payload(packed.data, header)
        return unpack_bits(data, 1, header.numel).to(torch.bool).reshape(header.shape)
