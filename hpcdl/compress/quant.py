"""``quant``: per-group k-bit quantization with stochastic rounding (the ActNN / GACT activation scheme).

The flattened tensor is cut into groups of ``group_size`` values (the last group may be shorter). Each group
keeps its minimum ``lo`` and its step ``(max - lo) / (2**bits - 1)``, stored as fp32 or fp16 (``scale_dtype``),
and every value becomes an integer ``q = floor((x - lo) / step + u)``, ``u ~ U[0, 1)``, of ``bits`` bits
(1, 2, 4 or 8), packed densely. Decoding returns ``lo + q * step``.

What holds: rounding is stochastic, so the decoded value is an unbiased estimate of ``x`` (E[x'] = x, computed
in float32, or float64 for float64 tensors, before the cast back to the tensor's dtype), and each error is
below one step of its group. That step depends on the data, so no user-given bound holds: the codec is not
error-bounded, and zero and sign are not preserved (a value near a group's minimum may decode to it).
Stored minima are rounded down and steps up to the storage type, so the grid always covers the group.

Non-finite values (NaN, +-Inf) have no place on the grid, so encoding a tensor with any raises ValueError
(the runtime then keeps that tensor raw); so does a group whose range overflows the storage type.

Randomness: with ``seed=None`` the noise comes from torch's global generator for the tensor's device; with an
integer ``seed`` the codec owns one generator per device, seeded once, so a sequence of encodes is reproducible;
:meth:`~hpcdl.compress.base.Codec.restart_random` seeds it again from ``(seed, stream)`` (the runtime does this
every training step).
"""

from __future__ import annotations

import math

import torch

from hpcdl.compress.base import FLOAT_DTYPES, Codec, Packed, check_mode
from hpcdl.compress.bitpack import PACKABLE_BITS, pack_bits, packed_length, unpack_bits
from hpcdl.compress.checksum import payload_checksum, verified_payload
from hpcdl.compress.errors import CodecError
from hpcdl.compress.header import CODE_DTYPES, DTYPE_CODES, read_header, write_header
from hpcdl.compress.registry import register_codec

SCALE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
_HEADER_FIELDS = "BQB"  # bits, group_size, dtype code of the stored minima and steps


@register_codec
class Quant(Codec):
    """Payload: ``groups`` minima, then ``groups`` steps (in ``scale_dtype``), then the packed ``bits``-bit codes."""

    codec_id = "quant"
    modes = ("bits",)
    dtypes = FLOAT_DTYPES

    def __init__(self, bits: int = 2, group_size: int = 256, scale_dtype: str = "fp32", seed: int | None = None,
                 mode: str = "bits"):
        check_mode(self.codec_id, mode, self.modes)
        if isinstance(bits, bool) or bits not in PACKABLE_BITS:
            raise ValueError(f"quant bits must be one of {list(PACKABLE_BITS)}, got {bits!r}")
        if isinstance(group_size, bool) or not isinstance(group_size, int) or not 1 <= group_size < 2**32:
            raise ValueError(f"quant group_size must be an integer in [1, 2**32), got {group_size!r}")
        if scale_dtype not in SCALE_DTYPES:
            raise ValueError(f"quant scale_dtype must be one of {list(SCALE_DTYPES)}, got {scale_dtype!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
            raise ValueError(f"quant seed must be None or an integer in [0, 2**63), got {seed!r}")
        self.bits = bits
        self.group_size = group_size
        self.scale_dtype = scale_dtype
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}
        self._stream: int | None = None  # set by restart_random: the generators start from (seed, stream)

    def get_config(self) -> dict:
        config = {"id": self.codec_id, "bits": self.bits, "group_size": self.group_size, "scale_dtype": self.scale_dtype}
        if self.seed is not None:
            config["seed"] = self.seed
        return config

    def _encode(self, tensor: torch.Tensor) -> Packed:
        stat_dtype = SCALE_DTYPES[self.scale_dtype]
        x = tensor.detach().reshape(-1)
        count = x.numel()
        if count == 0:
            return self._packed(tensor, stat_dtype, torch.empty(0, dtype=torch.uint8, device=x.device))
        if not bool(torch.isfinite(x).all()):
            nonfinite = int((~torch.isfinite(x)).sum())
            raise ValueError(f"quant cannot encode NaN or Inf ({nonfinite} of {count} values); use sz or raw for this tensor")
        compute = _compute_dtype(tensor.dtype)
        groups = _grouped(x.to(compute), self.group_size)
        levels = 2**self.bits - 1
        lo = _round_toward(groups.amin(dim=1), stat_dtype, -math.inf)
        step = _round_toward((groups.amax(dim=1) - lo.to(compute)) / levels, stat_dtype, math.inf)
        if not (bool(torch.isfinite(lo).all()) and bool(torch.isfinite(step).all())):
            raise ValueError(
                f"quant with scale_dtype={self.scale_dtype!r} cannot store this tensor's group minima or ranges "
                f"(largest |x| is {float(x.abs().max()):.3g}); use scale_dtype='fp32', sz, or raw"
            )
        lo_c, step_c = lo.to(compute).unsqueeze(1), step.to(compute).unsqueeze(1)
        inverse = torch.where(step_c > 0, 1 / step_c, torch.zeros_like(step_c))
        noise = torch.rand(groups.shape, dtype=compute, device=x.device, generator=self._generator(x.device))
        codes = torch.floor((groups - lo_c) * inverse + noise).clamp_(0, levels).to(torch.uint8)
        payload = torch.cat([_bytes_of(lo), _bytes_of(step), pack_bits(codes.reshape(-1)[:count], self.bits)])
        return self._packed(tensor, stat_dtype, payload)

    def _packed(self, tensor: torch.Tensor, stat_dtype: torch.dtype, payload: torch.Tensor) -> Packed:
        header = write_header(self.codec_id, tensor.dtype, tensor.shape, _HEADER_FIELDS, self.bits, self.group_size,
                              DTYPE_CODES[stat_dtype], checksum=payload_checksum(payload))
        return Packed(header, payload)

    def _decode(self, packed: Packed) -> torch.Tensor:
        header = read_header(packed.header, self.codec_id, _HEADER_FIELDS)
        bits, group_size, stat_code = header.fields
        stat_dtype = CODE_DTYPES.get(stat_code)
        if bits not in PACKABLE_BITS or group_size < 1 or stat_dtype not in SCALE_DTYPES.values():
            raise CodecError(f"quant header has bits={bits}, group_size={group_size}, scale dtype code {stat_code}: corrupted")
        if header.dtype not in self.dtypes:
            raise CodecError(f"quant header names dtype {header.dtype}, which quant never encodes")
        count = header.numel
        group_count = math.ceil(count / group_size) if count else 0
        stat_bytes = group_count * stat_dtype.itemsize
        expected = 2 * stat_bytes + packed_length(count, bits)
        if packed.data.numel() != expected:
            raise CodecError(f"quant payload has {packed.data.numel()} bytes, expected {expected} for {header.shape}")
        data = verified_payload(packed.data, header)
        if count == 0:
            return torch.empty(header.shape, dtype=header.dtype, device=packed.device)
        compute = _compute_dtype(header.dtype)
        lo = data[:stat_bytes].view(stat_dtype).to(compute).unsqueeze(1)
        step = data[stat_bytes : 2 * stat_bytes].view(stat_dtype).to(compute).unsqueeze(1)
        codes = _grouped(unpack_bits(data[2 * stat_bytes :], bits, count).to(compute), group_size)
        values = lo + codes * step
        return values.reshape(-1)[:count].to(header.dtype).reshape(header.shape)

    def restart_random(self, stream: int) -> None:
        self._stream = stream
        self._generators.clear()

    def _generator(self, device: torch.device) -> torch.Generator | None:
        if self.seed is None:
            return None
        if device not in self._generators:
            seed = self.seed if self._stream is None else hash((self.seed, self._stream)) % 2**63
            self._generators[device] = torch.Generator(device=device).manual_seed(seed)
        return self._generators[device]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _grouped(flat: torch.Tensor, group_size: int) -> torch.Tensor:
    """``flat`` as rows of ``group_size`` (one shorter row when it has fewer values), padded with its last value."""
    width = min(group_size, flat.numel())
    padding = -flat.numel() % width
    if padding:
        flat = torch.cat([flat, flat[-1:].expand(padding)])
    return flat.reshape(-1, width)


def _round_toward(values: torch.Tensor, dtype: torch.dtype, direction: float) -> torch.Tensor:
    """``values`` in ``dtype``, rounded toward ``direction`` (-inf or +inf) where the cast is inexact."""
    stored = values.to(dtype)
    back = stored.to(values.dtype)
    wrong_side = back > values if direction < 0 else back < values
    toward = torch.full_like(stored, direction)
    return torch.where(wrong_side, torch.nextafter(stored, toward), stored)


def _bytes_of(values: torch.Tensor) -> torch.Tensor:
    return values.contiguous().view(torch.uint8)
