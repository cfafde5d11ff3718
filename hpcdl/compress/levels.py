"""``levels``: exact storage of a float tensor that takes few distinct values (a dropout scale {0, 1/(1-p)}).

The tensor's distinct bit patterns (at most ``MAX_LEVELS``) form a table, stored in the tensor's dtype, and each
element becomes its index into the table, packed at 1, 2, 4 or 8 bits (the fewest that index every level).
Decoding looks the indices up in the table, so the result is bit-identical to the input: values are compared as
bit patterns, so -0.0 and 0.0, and NaNs of different payloads, are distinct levels. A tensor with more than
``MAX_LEVELS`` distinct values raises ValueError (the runtime then keeps it raw).

Payload: ``levels * itemsize`` bytes of table, then ``ceil(numel * bits / 8)`` bytes of indices.
Header fields: ``bits`` (u8), ``levels`` (u16).
"""

from __future__ import annotations

import torch

from hpcdl.compress.base import FLOAT_DTYPES, Codec, Packed
from hpcdl.compress.bitpack import PACKABLE_BITS, pack_bits, packed_length, unpack_bits
from hpcdl.compress.checksum import payload_checksum, verified_payload
from hpcdl.compress.errors import CodecError
from hpcdl.compress.header import read_header, write_header
from hpcdl.compress.registry import register_codec

MAX_LEVELS = 2 ** max(PACKABLE_BITS)
_BITS_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # itemsize -> same-size integer type
_HEADER_FIELDS = "BH"  # bits, levels


def index_bits(levels: int) -> int:
    """The fewest packable bits per element that index ``levels`` table entries."""
    return next(bits for bits in PACKABLE_BITS if levels <= 2**bits)


@register_codec
class Levels(Codec):
    """Exact for tensors of at most ``MAX_LEVELS`` distinct values: ``get_codec({"id": "levels"})``."""

    codec_id = "levels"
    modes = ("lossless",)
    dtypes = FLOAT_DTYPES
    lossless = True
    whole_tensor_limit = True

    def get_config(self) -> dict:
        return {"id": self.codec_id}

    def _encode(self, tensor: torch.Tensor) -> Packed:
        flat = tensor.detach().contiguous().reshape(-1).view(_BITS_VIEW[tensor.element_size()])
        table, index = torch.unique(flat, return_inverse=True)
        if table.numel() > MAX_LEVELS:
            raise ValueError(f"levels stores tensors of at most {MAX_LEVELS} distinct values exactly; this one has "
                             f"{table.numel()} (of {flat.numel()}); use sz, quant or raw for it")
        bits = index_bits(max(table.numel(), 1))
        data = torch.cat([table.contiguous().view(torch.uint8), pack_bits(index.to(torch.uint8), bits)])
        header = write_header(self.codec_id, tensor.dtype, tensor.shape, _HEADER_FIELDS, bits, table.numel(),
                              checksum=payload_checksum(data))
        return Packed(header, data)

    def _decode(self, packed: Packed) -> torch.Tensor:
        header = read_header(packed.header, self.codec_id, _HEADER_FIELDS)
        bits, levels = header.fields
        if header.dtype not in self.dtypes:
            raise CodecError(f"levels header names dtype {header.dtype}, which levels never encodes")
        if bits not in PACKABLE_BITS or levels > MAX_LEVELS or levels > 2**bits or (levels == 0) != (header.numel == 0):
            raise CodecError(f"levels header has bits={bits}, levels={levels} for {header.numel} elements: corrupted")
        table_bytes = levels * header.dtype.itemsize
        expected = table_bytes + packed_length(header.numel, bits)
        if packed.data.numel() != expected:
            raise CodecError(f"levels payload has {packed.data.numel()} bytes, expected {expected} for {header.shape}")
        data = verified_payload(packed.data, header)
        if header.numel == 0:
            return torch.empty(header.shape, dtype=header.dtype, device=packed.device)
        table = data[:table_bytes].view(_BITS_VIEW[header.dtype.itemsize])
        index = unpack_bits(data[table_bytes:], bits, header.numel).long()
        if bool((index >= levels).any()):
            raise CodecError(f"levels payload indexes past its {levels} levels: corrupted")
        return table[index].view(header.dtype).reshape(header.shape)
