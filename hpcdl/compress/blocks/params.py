"""Quantizer parameters of the ``sz`` codec, derived from the error bound and the tensor.

abs and rel quantize x by an absolute bound eb (rel: eb = bound * (max - min) over
the finite elements, the same float64 arithmetic as hpcdl.compress.ErrorBound):
level 1 holds 0 < |x| <= eb, level k >= 2 the bin (eb + (k - 2) step, eb + (k - 1) step]
with step = 2 eb (1 - slack) <= 2 eb, and the code is sign(x) * level. The decoded
values are chosen from the tensor so that the errors are unbiased (docs/format.md,
section 5): level 1 decodes to the mean |x| of its elements (any value in (0, eb]
is within the bound of every one of them), level k >= 2 to (k - 2) step + base,
with base the bin centre plus the mean offset of the elements from their bin
centres, which the slack lets move by up to eb - step / 2 without breaking the
bound. Each sign has its own sub and base. The means come from integer sums
(:data:`STAT_BITS`), so every backend computes the same stream.

pw_rel quantizes the IEEE bits of |x| instead, a piecewise-linear log2: dropping
the low ``shift`` bits and decoding to the middle of the dropped range changes |x|
by at most 2^(shift - 1) units in the last place of its binade, i.e. by at most
bound * |x| for shift = floor(mantissa + 1 + log2(bound)). Unlike a log2/exp2
transform it needs only integer operations, so host and GPU decode bit-identically.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from hpcdl.compress.base import value_range

MODE_CODES = {"abs": 0, "rel": 1, "pw_rel": 2}
CODE_MODES = {code: mode for mode, code in MODE_CODES.items()}
KERNEL_MODE_ABS = 0  # abs and rel
KERNEL_MODE_PW_REL = 2
MANTISSA_BITS = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7, torch.float64: 52}
MAX_Q = 2**29  # |q| <= 2^29 keeps Lorenzo differences in int32 (kernels/sz_block.cuh)
STAT_BITS = 20  # HPCDL_STAT_BITS: the stats sums count eb / 2^20 (abs), the top 20 dropped bits (pw_rel)
# Slacks the encoder tries, smallest first (step = 2 eb (1 - slack)); it takes the first whose largest mean offset
# on a sample of the tensor is within SLACK_MARGIN of what the slack allows. A bigger slack costs bits.
SLACKS = (1 / 32, 1 / 16, 1 / 8, 3 / 16, 1 / 4, 3 / 8, 1 / 2)
SLACK_MARGIN = 0.75
SAMPLE_BLOCKS = 2048  # blocks of 32 the slack is chosen on (evenly spaced; the whole tensor when smaller)

Stats = Callable[[torch.Tensor, "SzParams"], Sequence[int]]  # BlockKernels.sz_stats: the 8 sums of a flat tensor


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
    """What the quantizer kernels need: the mode, the bound, the absolute bound ``eb``, the pw_rel ``shift``,
    and the reconstruction (abs: the bin width ``step``; ``sub`` and ``base`` per sign, x > 0 then x < 0;
    pw_rel: ``base`` holds the value of the dropped bits)."""

    mode: str
    bound: float
    eb: float
    shift: int
    step: float = 0.0
    sub: tuple[float, float] = (0.0, 0.0)
    base: tuple[float, float] = (0.0, 0.0)

    @property
    def kernel_mode(self) -> int:
        return KERNEL_MODE_PW_REL if self.mode == "pw_rel" else KERNEL_MODE_ABS

    @property
    def inv(self) -> float:
        """1 / step in float64 (inf when eb is 0 or so small that it overflows): every nonzero becomes an outlier."""
        return 1.0 / self.step if self.step > 0 else math.inf

    @property
    def reconstruction(self) -> tuple[float, float, float, float, float]:
        """step, sub (x > 0, x < 0), base (x > 0, x < 0): the order of the kernels' arguments."""
        return (self.step, *self.sub, *self.base)

    @classmethod
    def unresolved(cls, mode: str, bound: float, dtype: torch.dtype) -> SzParams:
        """What a backend that resolves the parameters on the device starts from: the mode, the bound, abs's eb,
        pw_rel's shift; rel's eb is NaN and the reconstruction is left for the backend to compute from the data
        exactly as :meth:`for_tensor` would."""
        if mode == "pw_rel":
            return cls(mode, bound, 0.0, pw_rel_shift(dtype, bound))
        return cls(mode, bound, bound if mode == "abs" else math.nan, 0)

    @classmethod
    def for_tensor(cls, mode: str, bound: float, tensor: torch.Tensor, stats: Stats) -> SzParams:
        """Parameters for the flat ``tensor`` (rel: from :func:`hpcdl.compress.value_range`, on any device), with
        the unbiased reconstruction from ``stats`` (a backend's sz_stats)."""
        if mode == "pw_rel":
            shift = pw_rel_shift(tensor.dtype, bound)
            half = (1 << shift) >> 1
            trial = cls(mode, bound, 0.0, shift, base=(half, half))
            return cls(mode, bound, 0.0, shift, base=_pw_rel_bases(trial, stats(tensor, trial), tensor.dtype))
        eb = usable_eb(bound if mode == "abs" else bound * value_range(tensor))
        if not eb > 0:
            return cls(mode, bound, eb, 0)
        sample = _sample(tensor)
        for slack in SLACKS:
            trial = cls(mode, bound, eb, 0, step=2.0 * eb * (1.0 - slack))
            sums = stats(sample, trial)
            if max(map(abs, _mean_offsets(sums, eb))) <= SLACK_MARGIN * slack * eb:
                break
        # a sample that is the whole tensor already measured the chosen slack's sums: no second full pass
        return trial.with_means(sums if sample is tensor else stats(tensor, trial))

    def with_means(self, sums: Sequence[int]) -> SzParams:
        """abs/rel parameters whose sub and base decode to the means the 8 sz_stats ``sums`` measured."""
        eb, step, unit = self.eb, self.step, self.eb / 2**STAT_BITS
        centre = eb + 0.5 * step
        sub = tuple(min(max(s / n * unit, unit), eb) if n else 0.5 * eb for n, s in (sums[0:2], sums[2:4]))
        offsets = _mean_offsets(sums, eb)
        base = tuple(min(max(centre + offset, step), 2.0 * eb) for offset in offsets)
        return SzParams(self.mode, self.bound, eb, 0, step, (sub[0], sub[1]), (base[0], base[1]))


def usable_eb(eb: float) -> float:
    """``eb``, or 0 when its bin width 2 eb overflows float64 (rel over float64 values whose range does): no
    quantization then, every nonzero element an outlier kept exactly. hp_sz_eb of kernels/sz_warp.cuh is the
    same rule."""
    return eb if 2.0 * eb < math.inf else 0.0


def _mean_offsets(sums: Sequence[int], eb: float) -> tuple[float, float]:
    """Mean offset of the levels >= 2 from their bin centres, x > 0 and x < 0 (0 without such elements)."""
    unit = eb / 2**STAT_BITS
    return (sums[5] / sums[4] * unit if sums[4] else 0.0, sums[7] / sums[6] * unit if sums[6] else 0.0)


def _pw_rel_bases(params: SzParams, sums: Sequence[int], dtype: torch.dtype) -> tuple[float, float]:
    """The dropped bits' decoded value per sign: their mean, rounded, inside the range that keeps the bound."""
    shift = params.shift
    if shift == 0:
        return (0.0, 0.0)
    drop = max(shift - STAT_BITS, 0)
    largest = min(math.floor(params.bound * 2 ** MANTISSA_BITS[compute_dtype(dtype)]), (1 << shift) - 1)
    smallest = (1 << shift) - 1 - largest
    half = (1 << shift) >> 1
    bases = []
    for n, s in (sums[4:6], sums[6:8]):
        if not n or smallest > largest:
            bases.append(float(half))
            continue
        mean = math.floor((s / n + 0.5) * 2**drop) if drop else math.floor(s / n + 0.5)
        bases.append(float(min(max(mean, smallest), largest)))
    return (bases[0], bases[1])


def sample_layout(numel: int) -> tuple[int, int]:
    """Where the slack's sample of a flat tensor of ``numel`` elements lies: (stride, length), element e of the
    sample being element (e // 32) * stride * 32 + e % 32 of the tensor; the whole tensor (stride 1) when it has at
    most 2 * SAMPLE_BLOCKS whole blocks, else every stride-th whole block, about SAMPLE_BLOCKS of them."""
    blocks = numel // 32
    if blocks <= 2 * SAMPLE_BLOCKS:
        return 1, numel
    stride = blocks // SAMPLE_BLOCKS
    return stride, -(-blocks // stride) * 32


def _sample(tensor: torch.Tensor) -> torch.Tensor:
    """The elements of :func:`sample_layout` of the flat tensor."""
    stride, length = sample_layout(tensor.numel())
    if stride == 1:
        return tensor
    blocks = tensor.numel() // 32
    return tensor[: blocks * 32].view(blocks, 32)[::stride].reshape(-1)
