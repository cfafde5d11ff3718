"""Quantizer parameters of the ``sz`` codec, derived from the error bound and the tensor.

abs and rel quantize x by an absolute bound eb (rel: eb = bound * (max - min) over
the finite elements, the same float64 arithmetic as hpcdl.compress.ErrorBound):
code q = sign(x) * ceil(|x| / (2 eb)), decoded (2|q| - 1) * eb with sign.

pw_rel quantizes the IEEE bits of |x| instead, a piecewise-linear log2: dropping
the low ``shift`` bits and decoding to the middle of the dropped range changes |x|
by at most 2^(shift - 1) units in the last place of its binade, i.e. by at most
bound * |x| for shift = floor(mantissa + 1 + log2(bound)). Unlike a log2/exp2
transform it needs only integer operations, so host and GPU decode bit-identically.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hpcdl.compress.base import value_range

MODE_CODES = {"abs": 0, "rel": 1, "pw_rel": 2}
CODE_MODES = {code: mode for mode, code in MODE_CODES.items()}
KERNEL_MODE_ABS = 0  # abs and rel
KERNEL_MODE_PW_REL = 2
MANTISSA_BITS = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7, torch.float64: 52}
MAX_Q = 2**29  # |q| <= 2^29 keeps Lorenzo differences in int32 (kernels/sz_block.cuh)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 input, float32 for the rest (float16 and bfloat16 convert exactly)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def pw_rel_shift(dtype: torch.dtype, bound: float) -> int:
    """Low bits of the compute type's |x| that pw_rel drops for ``bound`` (0 keeps every bit)."""
    compute_bits = MANTISSA_BITS[compute_dtype(dtype)]
    input_bits = MANTISSA_BITS[dtype]
    kept = math.floor(input_bits + 1 + math.log2(bound))
    return (compute_bits - input_bits) + min(max(kept, 0), input_bits)


@dataclass(frozen=True)
class SzParams:
    """What the quantizer kernels need: the mode, the bound, the absolute bound ``eb`` and the pw_rel ``shift``."""

    mode: str
    bound: float
    eb: float
    shift: int

    @property
    def kernel_mode(self) -> int:
        return KERNEL_MODE_PW_REL if self.mode == "pw_rel" else KERNEL_MODE_ABS

    @property
    def inv(self) -> float:
        """1 / (2 eb) in float64 (inf when eb is 0 or so small that it overflows): every nonzero becomes an outlier."""
        return 1.0 / (2.0 * self.eb) if self.eb > 0 else math.inf

    @classmethod
    def for_tensor(cls, mode: str, bound: float, tensor: torch.Tensor, measure_range: bool = True) -> SzParams:
        """Parameters for ``tensor`` (rel: from :func:`hpcdl.compress.value_range`, on any device; with
        ``measure_range`` False, eb is left NaN for a backend that measures the range itself)."""
        if mode == "pw_rel":
            return cls(mode, bound, 0.0, pw_rel_shift(tensor.dtype, bound))
        if mode == "rel" and not measure_range:
            return cls(mode, bound, math.nan, 0)
        return cls(mode, bound, bound if mode == "abs" else bound * value_range(tensor), 0)
