"""Packing small unsigned integers (1, 2, 4 or 8 bits each) densely into bytes, with torch ops on any device.

Value ``i`` of a byte's ``8 // bits`` values sits at bit offset ``i * bits`` (least significant first), so
``[1, 0, 1]`` at 1 bit packs to ``0b101``. Shared by the ``bitmask`` and ``quant`` codecs.
"""

from __future__ import annotations

import torch

PACKABLE_BITS = (1, 2, 4, 8)


def packed_length(count: int, bits: int) -> int:
    """Bytes that ``count`` values of ``bits`` bits occupy (the last byte zero-padded)."""
    return (count * bits + 7) // 8


def pack_bits(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack a 1-D uint8 tensor of values < 2**bits into ``packed_length(len(values), bits)`` bytes."""
    _check_bits(bits)
    if bits == 8:
        return values.clone()
    per_byte = 8 // bits
    padding = -values.numel() % per_byte
    if padding:
        values = torch.cat([values, values.new_zeros(padding)])
    lanes = values.reshape(-1, per_byte)
    packed = lanes[:, 0].clone()
    for lane in range(1, per_byte):
        packed |= lanes[:, lane] << (lane * bits)
    return packed


def unpack_bits(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """The first ``count`` values of ``bits`` bits from a tensor made by :func:`pack_bits`, as 1-D uint8."""
    _check_bits(bits)
    if bits == 8:
        return packed[:count].clone()
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)
    mask = (1 << bits) - 1
    values = (packed.unsqueeze(1) >> shifts) & mask
    return values.reshape(-1)[:count]


def _check_bits(bits: int) -> None:
    if bits not in PACKABLE_BITS:
        raise ValueError(f"can pack {PACKABLE_BITS} bits per value, not {bits!r}")
