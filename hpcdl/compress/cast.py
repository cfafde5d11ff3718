"""``cast``: store a float tensor in a narrower float type (bf16, fp16 or fp8 e4m3) and cast back on decode.

Not error-bounded: the error is the target type's rounding (relative 2**-8 for bf16, 2**-11 for fp16, 2**-4
for fp8 e4m3 on normal numbers) and nothing bounds it below the target's smallest subnormal, where small
values flush towards zero (so a tiny positive value may decode to 0). Overflow **saturates**: a finite
value beyond the target's largest finite number is stored as that number with its sign (fp16 keeps at most
65504, fp8 e4m3 at most 448), so a finite input never decodes to Inf. NaN comes back NaN. +-Inf come back
+-Inf for bf16 and fp16; fp8 e4m3 (the "fn" variant) has no Inf, so encoding a tensor with an infinity to
fp8 raises ValueError rather than silently storing a finite number (the runtime then keeps it raw).
"""

from __future__ import annotations

import torch

from hpcdl.compress.base import FLOAT_DTYPES, Codec, Packed, check_mode
from hpcdl.compress.checksum import payload_checksum, verified_payload
from hpcdl.compress.errors import CodecError
from hpcdl.compress.header import CODE_DTYPES, DTYPE_CODES, read_header, write_header
from hpcdl.compress.registry import register_codec

CAST_TARGETS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8_e4m3": torch.float8_e4m3fn}
_TARGET_NAMES = {dtype: name for name, dtype in CAST_TARGETS.items()}


@register_codec
class Cast(Codec):
    """Payload: the tensor in the target dtype, ``numel * target itemsize`` bytes. Header field: the target's code."""

    codec_id = "cast"
    modes = ("dtype",)
    dtypes = FLOAT_DTYPES

    def __init__(self, dtype: str = "bf16", mode: str = "dtype"):
        check_mode(self.codec_id, mode, self.modes)
        if dtype not in CAST_TARGETS:
            raise ValueError(f"cast has no target dtype {dtype!r}; use one of {list(CAST_TARGETS)}")
        self.dtype = dtype

    def get_config(self) -> dict:
        return {"id": self.codec_id, "dtype": self.dtype}

    def _encode(self, tensor: torch.Tensor) -> Packed:
        target = CAST_TARGETS[self.dtype]
        x = tensor.detach().reshape(-1)
        infinite = torch.isinf(x)
        if target == torch.float8_e4m3fn and bool(infinite.any()):
            raise ValueError(
                f"cast to fp8_e4m3 cannot store {int(infinite.sum())} infinite value(s): fp8 e4m3 has no Inf; "
                "use cast to bf16/fp16, sz, or raw for this tensor"
            )
        largest = torch.finfo(target).max
        if largest < torch.finfo(x.dtype).max:
            # clamp in a type that holds the target's largest value exactly (bf16 rounds 65504 up to 65536)
            wide = x if x.dtype == torch.float64 else x.float()
            x = torch.where(infinite, wide, wide.clamp(-largest, largest))
        narrow = x.to(target, copy=True).contiguous()
        data = narrow.view(torch.uint8) if narrow.numel() else torch.empty(0, dtype=torch.uint8, device=x.device)
        header = write_header(self.codec_id, tensor.dtype, tensor.shape, "B", DTYPE_CODES[target],
                              checksum=payload_checksum(data))
        return Packed(header, data)

    def _decode(self, packed: Packed) -> torch.Tensor:
        header = read_header(packed.header, self.codec_id, "B")
        (target_code,) = header.fields
        target = CODE_DTYPES.get(target_code)
        if target not in _TARGET_NAMES:
            raise CodecError(f"cast header names target dtype code {target_code}, which is not one of {list(CAST_TARGETS)}")
        if header.dtype not in self.dtypes:
            raise CodecError(f"cast header names original dtype {header.dtype}, which cast never encodes")
        expected = header.numel * target.itemsize
        if packed.data.numel() != expected:
            raise CodecError(
                f"cast payload has {packed.data.numel()} bytes, expected {expected} for {header.shape} as {_TARGET_NAMES[target]}"
            )
        data = verified_payload(packed.data, header)
        if expected == 0:
            return torch.empty(header.shape, dtype=header.dtype, device=packed.device)
        return data.view(target).to(header.dtype, copy=True).reshape(header.shape)
