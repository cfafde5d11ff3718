"""Ops whose backward compares saved tensors for equality keep what they save exact (hpcdl/runtime/exact_saves.py).

Without it a lossy copy of ``amax``'s input matches none of its maxima: the gradient is 0/0 = NaN (or, for a
whole-tensor ``max``, lost), whatever the bound.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hpcdl
from hpcdl.runtime.exact_saves import ExactSaves, compares_saved, saving_for_equality
from hpcdl.runtime.methods import Codec, Recompute, train_step

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.one_thread

LOSSY = hpcdl.Policy.static({"id": "sz", "mode": "rel", "bound": 1e-1})
INF = math.inf

EQUALITY_OPS = {
    "amax over dims": lambda h: h.amax((2, 3)),
    "torch.amin": lambda h: torch.amin(h, 1),
    "aminmax": lambda h: torch.stack(torch.aminmax(h, dim=1)),
    "whole max": lambda h: h.max(),
    "torch.min of a tensor": lambda h: torch.min(h),
    "whole median": lambda h: h.median(),
    "whole nanmedian": lambda h: h.nanmedian(),
    "Tensor.norm p=inf": lambda h: h.norm(p=INF, dim=1),
    "vector_norm inf": lambda h: torch.linalg.vector_norm(h, INF),
    "vector_norm -inf": lambda h: torch.linalg.vector_norm(h, -INF, dim=(2, 3)),
    "linalg.norm inf": lambda h: torch.linalg.norm(h.flatten(1), INF, dim=1),
    "matrix_norm inf": lambda h: torch.linalg.matrix_norm(h, INF),
    "matrix_norm 1": lambda h: torch.linalg.matrix_norm(h, 1),
    "matrix_norm 2": lambda h: torch.linalg.matrix_norm(h[:, :2, :8, :8], 2),
    "linalg.norm of a matrix, ord -2": lambda h: torch.linalg.norm(h[:, :2, :8, :8], -2, dim=(2, 3)),
    "F.normalize p=inf": lambda h: F.normalize(h, p=INF, dim=1),
    "torch.dist p=inf": lambda h: torch.dist(h, h.flip(1), p=INF),
    "cdist p=inf": lambda h: torch.cdist(h.flatten(2), h.flatten(2)[:, :2], p=INF),
    "pairwise_distance p=inf": lambda h: F.pairwise_distance(h.flatten(1), h.flip(0).flatten(1), p=INF),
    "triplet_margin_loss p=inf": lambda h: F.triplet_margin_loss(h.flatten(1), h.flip(0).flatten(1),
                                                                 h.roll(1, 0).flatten(1), p=INF),
}


class Head(nn.Module):
    """A convolution whose output goes through ``op`` (optionally after a ReLU, which saves that output too)."""

    def __init__(self, op, relu: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)
        self.relu = nn.ReLU() if relu else nn.Identity()
        self.op = op

    def forward(self, x):
        self.h = self.relu(self.conv(x))
        self.h.retain_grad()
        return self.op(self.h)


def _h_grad(model: Head, x: torch.Tensor, policy=None) -> torch.Tensor:
    """The gradient reaching the op's input, without a session or with ``policy``."""
    model.zero_grad(set_to_none=True)
    if policy is None:
        model(x).sum().backward()
    else:
        with hpcdl.compressed(model, policy, threshold=0):
            loss = model(x).sum()  # saves nothing itself: what reaches the op is exact
        loss.backward()
    return model.h.grad


# After a ReLU (whose minimum is a tie of zeros) the ops that pick a maximum.
AFTER_RELU = ["amax over dims", "whole max", "vector_norm inf", "matrix_norm 2"]


@pytest.mark.parametrize("name,relu", [(name, False) for name in EQUALITY_OPS] + [(name, True) for name in AFTER_RELU])
def test_a_lossy_policy_leaves_the_gradients_of_equality_ops_exact(name, relu):
    """The gradient an equality op sends back is bit-identical to the uncompressed one; after a ReLU, whose own
    saved copy of the same tensor is lossy, the op does not share that copy."""
    torch.manual_seed(0)
    model = Head(EQUALITY_OPS[name], relu)
    x = torch.randn(4, 4, 32, 32)
    exact = _h_grad(model, x)
    got = _h_grad(model, x, LOSSY)
    assert torch.isfinite(got).all() and got.abs().sum() > 0
    assert torch.equal(got, exact)


def test_what_other_ops_save_is_still_compressed():
    """A 2-norm, a max over a dim (indices) and the convolution's input are compressed as before: only the
    equality op's saves are kept as they are."""
    torch.manual_seed(0)
    x = torch.randn(4, 4, 32, 32)
    for op in (lambda h: torch.linalg.vector_norm(h, dim=1), lambda h: h.max(1).values):
        model = Head(op)
        with hpcdl.compressed(model, LOSSY, threshold=0) as session:
            model(x).sum().backward()
        assert session.stats.total().kept == 0
    model = Head(lambda h: h.amax((2, 3)))
    with hpcdl.compressed(model, LOSSY, threshold=0) as session:
        model(x).sum().backward()
    total = session.stats.total()
    assert total.kept == 2  # amax's input and its result; the convolution's input is compressed
    assert total.original - total.packed > x.numel() * 4 // 2


def test_a_recomputed_block_keeps_its_equality_ops_exact():
    """A block recomputed in backward saves its amax's input again, and keeps it exact there too."""
    torch.manual_seed(0)
    block = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU())

    class Pooled(nn.Module):
        def __init__(self):
            super().__init__()
            self.block, self.head = block, nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.block(x).amax((2, 3)))

    class AmaxBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Pooled()

        def forward(self, x):
            return self.inner(x)

    model = AmaxBlock()
    x, y = torch.randn(4, 4, 16, 16), torch.tensor([0, 1, 0, 1])

    def gradients(method=None):
        model.zero_grad(set_to_none=True)
        if method is None:
            nn.functional.cross_entropy(model(x), y).backward()
        else:
            train_step(model, method, x, y, nn.functional.cross_entropy, torch.optim.SGD(model.parameters(), lr=0.0))
        return [p.grad.clone() for p in model.parameters()]

    exact = gradients()
    got = gradients(Recompute([model.inner]) + Codec({"id": "sz", "mode": "rel", "bound": 1e-2}, threshold=0))
    assert all(torch.isfinite(g).all() for g in got)  # NaN where the recomputation's amax saved lossy copies
    cosine = torch.nn.functional.cosine_similarity(torch.cat([g.flatten() for g in got]),
                                                   torch.cat([g.flatten() for g in exact]), dim=0)
    assert cosine > 0.99


def test_which_calls_compare_their_saved_tensors():
    h, m = torch.randn(3, 4), torch.randn(2, 3, 4)
    assert compares_saved(torch.max, (h,), {}) and compares_saved(torch.Tensor.median, (h,), {})
    assert not compares_saved(torch.max, (h, 1), {}) and not compares_saved(torch.max, (h, h), {})
    assert not compares_saved(torch.Tensor.max, (h,), {"dim": 0})
    assert compares_saved(torch.linalg.vector_norm, (h,), {"ord": -INF})
    assert not compares_saved(torch.linalg.vector_norm, (h,), {}) and not compares_saved(torch.norm, (h,), {})
    assert not compares_saved(torch.linalg.matrix_norm, (m,), {}) and not compares_saved(torch.linalg.matrix_norm,
                                                                                         (m, "nuc"), {})
    assert compares_saved(torch.linalg.matrix_norm, (m, 2), {})
    assert compares_saved(torch.linalg.norm, (h, 1), {})  # a 2-D input without dims: a matrix norm
    assert not compares_saved(torch.linalg.norm, (m, 1), {})  # a vector 1-norm of the flattened tensor
    assert compares_saved(torch.linalg.norm, (m, 1), {"dim": (1, 2)})
    assert not compares_saved(F.normalize, (h,), {}) and compares_saved(F.normalize, (h,), {"p": INF})
    assert not compares_saved(torch.cdist, (m, m), {}) and compares_saved(torch.cdist, (m, m, INF), {})
    assert not compares_saved(torch.add, (h, h), {})


def test_the_mark_holds_only_while_such_an_op_runs():
    seen = []
    h = torch.randn(8, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(saving_for_equality()) or t, lambda t: t):
        with ExactSaves():
            h.exp().amax().backward()
    assert seen == [False, True, True]  # exp's result, then amax's input and result
    assert not saving_for_equality()
