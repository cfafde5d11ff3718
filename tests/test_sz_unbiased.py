"""sz's errors are unbiased (hpcdl issue 13): on ReLU, GELU and softmax outputs, in every error-bound mode, the mean
error over the nonzero elements, and over the nonzero elements smaller than the bound, is within 1% of the bound,
while zeros, signs and the element-wise bound still hold. docs/format.md, section 5, says how."""

from __future__ import annotations

import pytest
import torch

from hpcdl.compress import check_bound
from hpcdl.compress.base import ERROR_BOUND_MODES
from hpcdl.compress.errors import CodecError
from hpcdl.compress.header import write_header
from hpcdl.compress.sz import Sz

BIAS_LIMIT = 0.01  # |mean error| / bound


def activations() -> dict[str, torch.Tensor]:
    """Realistic activations of a few 100k elements."""
    generator = torch.Generator().manual_seed(13)
    pre = torch.randn(256, 1024, generator=generator) * 2
    logits = torch.randn(1280, 196, generator=generator) * 2
    return {"relu": torch.relu(pre), "gelu": torch.nn.functional.gelu(pre), "softmax": torch.softmax(logits, dim=1)}


CASES = [(kind, mode, bound) for kind in ("relu", "gelu", "softmax") for mode in ERROR_BOUND_MODES
         for bound in ((1e-1, 1e-2) if mode != "abs" else (None,))]


@pytest.fixture(scope="module")
def tensors() -> dict[str, torch.Tensor]:
    return activations()


@pytest.mark.parametrize("kind,mode,bound", CASES)
def test_sz_errors_are_unbiased_with_zeros_signs_and_bound_kept(tensors, kind, mode, bound):
    x = tensors[kind]
    if bound is None:  # abs: a bound of 5% of the range, a coarse setting where a bias shows most
        bound = 0.05 * float(x.max() - x.min())
    codec = Sz(mode, bound)
    y = codec.decode(codec.encode(x))
    report = check_bound(x, y, mode, bound)
    assert report.ok, report
    assert torch.equal(y == 0, x == 0)
    assert torch.equal(torch.sign(y), torch.sign(x))  # every element, the ones below the bound included
    error = (y - x).double()
    nonzero = x != 0
    if mode == "pw_rel":  # each element's own bound is bound * |x|: none is smaller than it
        scaled = error[nonzero] / (bound * x[nonzero].abs().double())
        assert abs(float(scaled.mean())) <= BIAS_LIMIT
        return
    eb = codec.error_bound.absolute(x)
    small = nonzero & (x.abs() < eb)
    assert int(small.sum()) > 1000  # the sub-bound population is a real one in every case
    assert abs(float(error[nonzero].mean()) / eb) <= BIAS_LIMIT
    assert abs(float(error[small].mean()) / eb) <= BIAS_LIMIT


def test_sub_bound_values_keep_their_sign_and_decode_to_their_mean_per_sign():
    """Values below the bound on both sides of zero: each side decodes to its own mean magnitude."""
    x = torch.cat([torch.linspace(1e-4, 0.3, 999), -torch.linspace(1e-4, 0.1, 999), torch.tensor([5.0])])
    codec = Sz("abs", 1.0)
    y = codec.decode(codec.encode(x))
    assert torch.equal(torch.sign(y), torch.sign(x))
    assert float(y[:999].mean()) == pytest.approx(float(x[:999].mean()), rel=1e-4)
    assert float(y[999:1998].mean()) == pytest.approx(float(x[999:1998].mean()), rel=1e-4)


def test_every_backend_writes_the_same_unbiased_stream(tensors):
    x = tensors["gelu"][:20_000]
    codec = Sz("rel", 1e-1)
    reference, host = codec.encode_with(x, "reference"), codec.encode_with(x, "host")
    assert reference.header == host.header and torch.equal(reference.data, host.data)


def test_a_format_1_stream_is_refused_with_a_clear_error():
    old = write_header("sz", torch.float32, (4,), "BBBBddQQ", 1, 0, 32, 0, 1e-2, 1e-2, 1, 0, checksum=0)
    packed = Sz().encode(torch.ones(4))
    with pytest.raises(CodecError, match="earlier format.*sz format 1.*re-encode"):
        Sz().decode(type(packed)(old, packed.data))
