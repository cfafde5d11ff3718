"""Saved views of any geometry: expanded, overlapping, sliced with steps, permuted, views of views.

Whatever autograd saves must come back with its size, dtype and values, without the
session ever writing into overlapping memory, and packing no more than the view's
distinct elements (or its storage span, when that is no larger).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import hpcdl
from hpcdl.runtime import Policy, compressed
from hpcdl.runtime.classify import Footprint, Layout

from runtime_models import SaveForBackward

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.one_thread

ALL_RAW = Policy.static({"id": "raw"}, masks={"id": "raw"}, indices={"id": "raw"})
# lossless through a codec other than raw: masks through bitmask, indices through int, bf16/fp16 cast to themselves
EXACT_CODECS = {
    torch.float32: Policy.static({"id": "raw"}),
    torch.float64: Policy.static({"id": "raw"}),
    torch.bfloat16: Policy.static({"id": "cast", "dtype": "bf16"}),
    torch.float16: Policy.static({"id": "cast", "dtype": "fp16"}),
    torch.int64: Policy.static({"id": "raw"}),  # indices: the default int codec
    torch.int32: Policy.static({"id": "raw"}),
    torch.bool: Policy.static({"id": "raw"}),  # masks: the default bitmask codec
}
DTYPES = list(EXACT_CODECS)


@st.composite
def geometries(draw):
    """(size, stride, offset) of a view: any strides including 0, overlaps and gaps; never empty."""
    dims = draw(st.integers(0, 4))
    size = tuple(draw(st.lists(st.integers(1, 5), min_size=dims, max_size=dims)))
    stride = tuple(draw(st.lists(st.integers(0, 12), min_size=dims, max_size=dims)))
    return size, stride, draw(st.integers(0, 9))


def _storage(dtype: torch.dtype, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    if dtype == torch.bool:
        return torch.rand(n, generator=g) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(-1000, 1000, (n,), generator=g, dtype=dtype)
    return torch.randn(n, generator=g).to(dtype)


def _save_and_restore(view: torch.Tensor, policy: Policy):
    """Save ``view`` in a session (threshold 0: always packed) and unpack it; (restored, session)."""
    x = torch.zeros(1, requires_grad=True)
    with compressed(nn.Identity(), policy, threshold=0) as session:
        out = SaveForBackward.apply(x, view)
    (restored,) = out.grad_fn.saved_tensors  # runs the unpack hook
    return restored, session


@given(geometry=geometries(), dtype=st.sampled_from(DTYPES), exact=st.booleans())
def test_any_view_restores_exactly_and_packs_at_most_its_distinct_elements(geometry, dtype, exact):
    size, stride, offset = geometry
    footprint = Footprint(size, stride, offset)
    storage = _storage(dtype, footprint.hi + 3)
    view = storage.as_strided(size, stride, offset)
    restored, session = _save_and_restore(view, EXACT_CODECS[dtype] if exact else ALL_RAW)
    assert restored.size() == view.size() and restored.dtype == view.dtype
    assert torch.equal(restored, view)
    layout = Layout.of(footprint)
    if layout.span:  # the span was packed: the exact strides and the offset relative to it come back
        assert restored.stride() == view.stride()
    packed_elements = session.stats.total().original // view.element_size()
    assert packed_elements == layout.numel <= min(footprint.hi - footprint.lo, math.prod(footprint.distinct_size))


@given(geometry=geometries(), ops=st.lists(st.sampled_from(["t", "step", "expand", "unfold", "flip_dims"]), max_size=3))
def test_views_of_views_give_bit_identical_gradients(geometry, ops):
    size, stride, offset = geometry
    footprint = Footprint(size, stride, offset)
    leaf = torch.randn(footprint.hi + 2, generator=torch.Generator().manual_seed(7), requires_grad=True)

    def make_view(base):
        view = base.as_strided(size, stride, offset)
        for op in ops:
            if op == "t" and view.dim() >= 2:
                view = view.transpose(0, -1)
            elif op == "step" and view.dim() >= 1:
                view = view[::2]
            elif op == "expand":
                view = view.unsqueeze(0).expand(3, *view.shape)
            elif op == "unfold" and view.dim() >= 1 and view.size(-1) >= 2:
                view = view.unfold(-1, 2, 1)  # overlapping windows: stride 1 < size 2
            elif op == "flip_dims" and view.dim() >= 2:
                view = view.permute(*reversed(range(view.dim())))
        return view

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(make_view(leaf.detach()).shape, generator=torch.Generator().manual_seed(3)))

        def forward(self, base):
            view = make_view(base * 1.5)  # a view of an activation, not of a parameter
            return ((self.w * view).sin() * view.exp()).sum()

    model = Model()

    def grads(policy):
        model.zero_grad(set_to_none=True)
        leaf.grad = None
        if policy is None:
            loss = model(leaf)
        else:
            with compressed(model, policy, threshold=0):
                loss = model(leaf)
        loss.backward()
        return model.w.grad.clone(), leaf.grad.clone()

    expected = grads(None)
    for policy in (ALL_RAW, Policy.static({"id": "raw"})):
        got = grads(policy)
        assert all(torch.equal(e, g) for e, g in zip(expected, got))


def test_expanded_row_packs_its_64_values_and_backward_runs():
    """The Hugging Face BERT case: a buffer row expanded over the batch (no token_type_ids passed)."""

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(64))

        def forward(self, b):
            return (self.w * b).sum()

    m = M()
    b = torch.randn(1, 64).expand(1024, 64)
    expected = b.sum(0)
    with hpcdl.compressed(m, hpcdl.Policy.static({"id": "raw"})):  # the default threshold: kept as it is
        loss = m(b)
    loss.backward()
    assert torch.equal(m.w.grad, expected)
    m.w.grad = None
    with hpcdl.compressed(m, hpcdl.Policy.static({"id": "raw"}), threshold=0) as session:
        loss = m(b)
    assert session.stats.total().original == 64 * 4  # not 1024 * 64 elements
    loss.backward()
    assert torch.equal(m.w.grad, expected)


@pytest.mark.parametrize(
    "name, make, packed",
    [
        ("expanded buffer of a model", None, 0),  # a parameter/buffer view is never packed
        ("unfold with stride < size", lambda s: s[:100].unfold(0, 10, 3), 100),  # the span: 100 < 31 * 10
        ("column of a wide matrix", lambda s: s.view(50, 20)[:, 3:4], 50),  # distinct elements, not the span
        ("slice with a step, transposed", lambda s: s.view(25, 40)[::3, 1::4].t(), 9 * 10),
        ("scalar expanded to a matrix", lambda s: s[7].expand(30, 40), 1),
        ("overlapping expand of a slice", lambda s: s.view(10, 100)[:, :5].unsqueeze(1).expand(10, 8, 5), 50),
    ],
)
def test_named_geometries(name, make, packed):
    storage = torch.randn(1000)
    if make is None:
        model = nn.Linear(4, 4)
        model.register_buffer("ids", torch.arange(512))
        view = model.ids[None].expand(64, 512)
        x = torch.zeros(1, requires_grad=True)
        with compressed(model, ALL_RAW, threshold=0) as session:
            out = SaveForBackward.apply(x, view)
        assert session.stats.total().original == 0 and session.live_entries == 0
        assert torch.equal(out.grad_fn.saved_tensors[0], view)
        return
    view = make(storage)
    restored, session = _save_and_restore(view, ALL_RAW)
    assert restored.size() == view.size() and torch.equal(restored, view), name
    assert session.stats.total().original == packed * 4, name


def test_a_relu_output_saved_twice_and_transposed_shares_one_entry():
    h = torch.randn(128, 64, requires_grad=True)
    with compressed(nn.Identity(), ALL_RAW, threshold=0) as session:
        r = torch.relu(h)  # saves r
        outs = [r.sin(), r.t().cos(), r[:, ::2].sin(), r.unsqueeze(0).expand(2, 128, 64).cos()]  # each saves its input
    total = session.stats.total()
    assert session.live_entries == 1 and total.shared == 4 and total.original == 128 * 64 * 4
    loss = sum(out.sum() for out in outs)
    loss.backward()
    expected_h = h.detach().clone().requires_grad_()
    r = torch.relu(expected_h)
    (r.sin().sum() + r.t().cos().sum() + r[:, ::2].sin().sum() + r.unsqueeze(0).expand(2, 128, 64).cos().sum()).backward()
    assert torch.equal(h.grad, expected_h.grad)
