"""``raw``: the tensor's bytes, unchanged. The fallback every other path can rely on."""

from __future__ import annotations

import torch

from hpcdl.compress.base import Codec, Packed
from hpcdl.compress.checksum import payload_checksum, verified_payload
from hpcdl.compress.errors import CodecError
from hpcdl.compress.header import DTYPE_CODES, read_header, write_header
from hpcdl.compress.registry import register_codec


@register_codec
class Raw(Codec):
    codec_id = "raw"
    modes = ("lossless",)
    dtypes = frozenset(DTYPE_CODES)
    lossless = True

    def get_config(self) -> dict:
        return {"id": self.codec_id}

    def _encode(self, tensor: torch.Tensor) -> Packed:
        flat = tensor.detach().contiguous().reshape(-1)
        data = (flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8, device=tensor.device)).clone()
        return Packed(write_header(self.codec_id, tensor.dtype, tensor.shape, checksum=payload_checksum(data)), data)

    def _decode(self, packed: Packed) -> torch.Tensor:
        header = read_header(packed.header, self.codec_id)
        expected = header.numel * header.dtype.itemsize
        if packed.data.numel() != expected:
            raise CodecError(f"raw payload has {packed.data.numel()} bytes, expected {expected} for {header.shape} {header.dtype}")
        data = verified_payload(packed.data, header)
        if expected == 0:
            return torch.empty(header.shape, dtype=header.dtype, device=packed.device)
        return (data.clone() if data is packed.data else data).view(header.dtype).reshape(header.shape)
