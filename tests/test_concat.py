"""A concatenation's incoming gradient is freed after its first consumer (hpcdl.runtime.concat), under a session."""

import gc

import torch
from torch import nn

import hpcdl
from hpcdl.runtime.concat import MIN_BYTES


class SkipNet(nn.Module):
    """A U-Net-like skip: early features wait for the end of backward while the deep path is consumed first.

    ``grads`` records, per concatenated input, whether the gradient it received is a view of another buffer."""

    def __init__(self, deep_channels: int = 16, skip_channels: int = 4, how: str = "cat"):
        super().__init__()
        torch.manual_seed(0)
        self.early = nn.Conv2d(3, skip_channels, 3, padding=1)
        self.deep = nn.Conv2d(3, deep_channels, 3, padding=1)
        self.head = nn.Conv2d(deep_channels + skip_channels if how == "cat" else deep_channels, 2, 1)
        self.how = how
        self.grads: dict[str, bool] = {}

    def forward(self, x):
        skip = torch.relu(self.early(x))
        deep = torch.sigmoid(self.deep(x))  # made after skip, so its backward runs first
        for name, tensor in (("deep", deep), ("skip", skip)):
            tensor.register_hook(lambda grad, name=name: self.grads.__setitem__(name, grad._base is not None))
        if self.how == "stack":  # same channel counts: the pieces are equal halves
            return self.head(torch.stack([deep, skip]).sum(0))
        return self.head(torch.cat([deep, skip], dim=1))


def batch(channels_bytes: int = MIN_BYTES) -> torch.Tensor:
    """A batch whose concatenated gradient is at least ``channels_bytes``."""
    side = 64
    n = max(1, -(-channels_bytes // (20 * side * side * 4)))
    return torch.randn(n, 3, side, side, generator=torch.Generator().manual_seed(1))


def step(model, x, policy="raw"):
    model.zero_grad(set_to_none=True)
    with hpcdl.compressed(model, policy, threshold=0):
        out = model(x)
    out.square().mean().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_the_late_piece_is_copied_out_and_the_first_consumed_stays_a_view():
    model = SkipNet()
    step(model, batch())
    assert model.grads == {"deep": True, "skip": False}


def test_without_a_session_both_pieces_are_views():
    model = SkipNet()
    model(batch()).square().mean().backward()
    assert model.grads == {"deep": True, "skip": True}


def test_values_are_unchanged_lossless_gradients_stay_bit_identical():
    model, x = SkipNet(), batch()
    model(x).square().mean().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    compressed = step(model, x)
    assert all(torch.equal(a, b) for a, b in zip(plain, compressed))


def test_pieces_over_half_the_buffer_are_not_copied():
    model = SkipNet(deep_channels=4, skip_channels=16)  # the late piece is 80 % of the buffer
    step(model, batch())
    assert model.grads == {"deep": True, "skip": True}


def test_small_buffers_are_left_alone():
    model = SkipNet()
    step(model, batch(1024)[:1, :, :8, :8])
    assert model.grads == {"deep": True, "skip": True}


def test_stack_is_handled_like_cat_and_half_is_copied():
    model = SkipNet(deep_channels=4, skip_channels=4, how="stack")
    step(model, batch(4 * MIN_BYTES))
    assert model.grads == {"deep": True, "skip": False}


def test_the_hooks_hold_no_node_so_a_dropped_graph_is_freed_at_once():
    model = SkipNet()
    gc.disable()
    try:
        with hpcdl.compressed(model, "raw", threshold=0) as session:
            out = model(batch())
        assert session.live_entries > 0
        del out  # reference counting alone must free the graph: a node held by its own hook would not be
        assert session.live_entries == 0
    finally:
        gc.enable()


def test_the_session_removes_its_forward_hook():
    model = SkipNet()
    step(model, batch())
    assert not model._forward_hooks
    model.grads.clear()
    model(batch()).square().mean().backward()
    assert model.grads == {"deep": True, "skip": True}
