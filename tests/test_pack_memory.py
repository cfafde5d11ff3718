"""The pack hook's own memory: value_range with NaN/Inf copies nothing big, and one pack stays near its output.

value_range is the one definition of ``max - min`` over the finite elements
(``rel`` bounds). It runs inside the pack hook, so with NaN or Inf (fp16
overflow, masks filled with -inf) it must not copy the tensor. The peaks are
measured as the measuring process of :mod:`hpcdl.memory` does: peak RSS of one
step above what existed before it, in a fresh process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from unittest import mock

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import hpcdl.compress.base as base
from hpcdl.compress import value_range
from hpcdl.memory import MeasuringProcess, peak

from runtime_models import SaveForBackward

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.one_thread

FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
SPECIALS = [math.nan, math.inf, -math.inf]


def _reference(tensor: torch.Tensor) -> float:
    finite = tensor[torch.isfinite(tensor)].to(torch.float64)
    return float(finite.max() - finite.min()) if finite.numel() else 0.0


@given(
    dtype=st.sampled_from(FLOATS),
    values=st.lists(st.one_of(st.floats(-1e4, 1e4), st.sampled_from(SPECIALS)), min_size=0, max_size=200),
    slice_limit=st.integers(1, 40),
    layout=st.sampled_from(["flat", "transposed", "stepped"]),
)
def test_value_range_is_max_minus_min_of_the_finite_elements(dtype, values, slice_limit, layout):
    x = torch.tensor(values, dtype=torch.float64).to(dtype)
    if layout == "transposed" and x.numel() >= 6:
        x = x[: x.numel() // 3 * 3].view(3, -1).t()
    elif layout == "stepped":
        x = x[::3]
    with mock.patch.object(base, "VALUE_RANGE_SLICE", slice_limit):  # small slices: many of them, odd boundaries
        assert value_range(x) == _reference(x)


@pytest.mark.parametrize("dtype", FLOATS)
def test_value_range_edge_cases(dtype):
    def t(*values):
        return torch.tensor(values, dtype=torch.float64).to(dtype)

    assert value_range(torch.empty(0, dtype=dtype)) == 0.0
    assert value_range(t(math.nan, math.inf, -math.inf)) == 0.0  # nothing finite
    assert value_range(t(math.nan, 2.5)) == 0.0  # one finite value
    assert value_range(t(-1.0, math.inf, 3.0)) == 4.0
    assert value_range(t(-2.0, math.nan, 6.0).expand(5, 3)) == 8.0  # stride 0
    big = torch.full((3_000_000,), 1.0, dtype=dtype)  # more than one VALUE_RANGE_SLICE
    big[2_999_999], big[1] = -3.0, -math.inf
    big[1_234_567] = math.nan
    assert value_range(big) == 4.0
    largest = torch.finfo(dtype).max
    assert value_range(t(-largest, math.nan, largest)) == 2 * largest  # float64 difference, no overflow in dtype


# -- measured memory ----------------------------------------------------------------------------------------
N = 1 << 23


def _with_nonfinite(dtype: str) -> torch.Tensor:
    x = torch.randn(N, generator=torch.Generator().manual_seed(0)).to(getattr(torch, dtype))
    x[::97], x[5::101], x[7::103] = math.nan, math.inf, -math.inf
    return x


@dataclass(frozen=True)
class ValueRangeStep:
    """Setup for hpcdl.memory.peak: the step computes value_range of a tensor with NaN and Inf."""

    dtype: str

    def __call__(self):
        x = _with_nonfinite(self.dtype)
        return lambda: {"input": x.numel() * x.element_size(), "packed": 0, "range": value_range(x)}


@dataclass(frozen=True)
class PackStep:
    """Setup for hpcdl.memory.peak: the step packs one tensor with NaN and Inf through a session."""

    dtype: str
    config: tuple

    def __call__(self):
        from hpcdl.runtime import Policy, compressed

        x = _with_nonfinite(self.dtype)
        one = torch.zeros(1, requires_grad=True)

        def step():
            with compressed(nn.Identity(), Policy.static(dict(self.config)), threshold=0) as session:
                out = SaveForBackward.apply(one, x)
            assert out.grad_fn is not None and session.stats.fallbacks == 0
            return {"input": x.numel() * x.element_size(), "packed": session.held_bytes}

        return step



@pytest.fixture(scope="module")
def measuring_process():
    with MeasuringProcess(threads=1) as process:
        yield process


def _extra(setup, process) -> tuple[float, dict]:
    """Peak bytes of the step beyond its packed output, as a fraction of the input's bytes."""
    report = peak(setup, process=process)
    return (report.peak_bytes - report.info["packed"]) / report.info["input"], report.info


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_value_range_with_nan_and_inf_copies_nothing_big(dtype, measuring_process):
    extra, info = _extra(ValueRangeStep(dtype), measuring_process)
    assert info["range"] == _reference(_with_nonfinite(dtype))
    assert extra <= 0.125, f"value_range used {extra:.2f}x its input's bytes"  # was 3.2x (float32), 5.3x (16-bit)


@pytest.mark.parametrize(
    "dtype, config, allowed",
    [
        ("float32", (("id", "raw"),), 0.125),
        ("float16", (("id", "raw"),), 0.125),
        # the fused host encoder writes the payload once into scratch, then assembles the stream: one payload more
        ("float32", (("id", "sz"), ("mode", "rel"), ("bound", 1e-2)), "payload"),
        ("bfloat16", (("id", "sz"), ("mode", "rel"), ("bound", 1e-2)), "payload"),
    ],
)
def test_one_pack_of_a_tensor_with_nan_and_inf_stays_near_its_output(dtype, config, allowed, measuring_process):
    extra, info = _extra(PackStep(dtype, config), measuring_process)
    if allowed == "payload":
        allowed = info["packed"] / info["input"] + 0.125
    assert extra <= allowed, f"one pack used {extra:.2f}x its input's bytes beyond its output (allowed {allowed:.2f})"
