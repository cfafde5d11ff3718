"""Recomputed blocks whose recomputation a session compresses (hpcdl.runtime.recompute)."""

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import hpcdl
from hpcdl.runtime import SavedTensorModifiedError
from hpcdl.runtime.methods import Codec, Recompute, train_step
from hpcdl.runtime.recompute import RecomputationError


def blocks_cnn(dropout: float = 0.0) -> nn.Sequential:
    """Two recomputable blocks of convolution, batch norm, ReLU (and dropout), then a head."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(dropout)),
        nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU()),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2),
    )


def batch(n: int = 6):
    generator = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, 16, 16, generator=generator), torch.randint(0, 2, (n,), generator=generator)


def gradients(model, method=None, n: int = 6):
    """The model's gradients after one step (lr 0, so the weights stay), from the same random-generator state."""
    x, y = batch(n)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(2)
    if method is None:
        nn.functional.cross_entropy(model(x), y).backward()
        stats = None
    else:
        stats = train_step(model, method, x, y, nn.functional.cross_entropy,
                           torch.optim.SGD(model.parameters(), lr=0.0)).stats
    return [p.grad.clone() for p in model.parameters()], stats


def recompute_both(model):
    return Recompute([model[0], model[1]])


def test_lossless_recomputation_gives_bit_identical_gradients_with_dropout():
    model = blocks_cnn(dropout=0.5)
    exact, _ = gradients(model)
    for policy in ("raw", "raw:entropy=zstd"):
        got, _ = gradients(model, recompute_both(model) + Codec(policy, threshold=0, chunk_bytes=0))
        assert all(torch.equal(g, want) for g, want in zip(got, exact)), policy  # same dropout mask: RNG restored


def test_recomputed_tensors_are_packed_and_counted_apart_from_what_forward_saved():
    model = blocks_cnn()
    opened = []
    original_recompute = hpcdl.runtime.session.Session.recompute

    def recording(session, *args, **kwargs):
        opened.append(session)
        return original_recompute(session, *args, **kwargs)

    hpcdl.runtime.session.Session.recompute = recording
    try:
        _, stats = gradients(model, recompute_both(model) + Codec("sz:rel=1e-2", threshold=0, arena_bytes=0))
    finally:
        hpcdl.runtime.session.Session.recompute = original_recompute
    session = opened[0]
    assert opened == [session, session]  # both blocks ran through the session
    forward_rows = stats.per_module()
    # what forward kept for the blocks is their inputs (saved where the block is called: in the model) and the head
    assert not any(name.startswith(("0.", "1.")) for name in forward_rows)
    recomputed = session.recompute_stats.per_module()
    assert {"0.1", "0.2", "1.1", "1.2"} <= set(recomputed)  # the batch norms' inputs, the ReLUs' outputs
    assert session.recompute_stats.ratio > 2  # compressed, not kept
    # each block's convolution saves only the block's input, which is shared with its packed copy, not packed again
    assert "0.0" not in recomputed and "1.0" not in recomputed


def test_lossy_recomputation_keeps_gradients_close():
    model = blocks_cnn()
    exact, _ = gradients(model)
    got, _ = gradients(model, recompute_both(model) + Codec("sz:rel=1e-4", threshold=0))
    for g, want in zip(got, exact):
        torch.testing.assert_close(g, want, rtol=1e-2, atol=1e-3)


class ConvolutionBatches(TorchDispatchMode):
    """The batch size of every convolution forward and backward call."""

    def __init__(self):
        super().__init__()
        self.forward, self.backward = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.convolution.default:
            self.forward.append(args[0].shape[0])
        if func is torch.ops.aten.convolution_backward.default:
            self.backward.append(args[1].shape[0])
        return func(*args, **(kwargs or {}))


def test_layers_inside_a_recomputed_block_run_in_chunks_in_forward_recomputation_and_backward():
    model = blocks_cnn()
    exact, _ = gradients(model, n=4)
    recorder = ConvolutionBatches()
    with recorder:
        got, _ = gradients(model, recompute_both(model) + Codec("raw", threshold=0, chunk_bytes=1), n=4)
    assert recorder.forward == [1] * 16  # two convolutions, in forward and again in the recomputation
    assert recorder.backward == [1] * 8
    for g, want in zip(got, exact):
        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-6)


def test_a_recomputed_decoded_input_only_its_layer_needs_takes_its_gradient(monkeypatch):
    """As in a forward's backward (tests/test_chunked.py): each batch norm's input, recomputed and packed, is
    decoded for it alone and takes its gradient; each block's convolution reads the block's input, which the
    block still holds for a later recomputation, so that one is not handed over."""
    from hpcdl.runtime import session as session_module

    model = blocks_cnn()
    exact, _ = gradients(model, n=4)
    claimed = []
    claim = session_module.Session._claim_decoded

    def recording_claim(self, tensor):
        claimed.append(claim(self, tensor))
        return claimed[-1]

    monkeypatch.setattr(session_module.Session, "_claim_decoded", recording_claim)
    got, _ = gradients(model, recompute_both(model) + Codec("raw", threshold=0, chunk_bytes=1), n=4)
    assert claimed == [True, False, True]  # block 1's batch norm, its convolution, block 0's batch norm
    for g, want in zip(got, exact):
        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-6)


def test_a_retained_graph_recomputes_for_its_second_backward():
    model = blocks_cnn()
    x, y = batch()
    with recompute_both(model).context(model), hpcdl.compressed(model, "raw", threshold=0, chunk_bytes=1):
        loss = nn.functional.cross_entropy(model(x), y)
    loss.backward(retain_graph=True)
    first = [p.grad.clone() for p in model.parameters()]
    loss.backward()
    for twice, once in zip(model.parameters(), first):
        torch.testing.assert_close(twice.grad, 2 * once)


def test_a_block_that_saves_something_else_when_recomputed_is_refused():
    class Fickle(nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):  # its recomputation saves one tensor more than its forward did
            self.calls += 1
            return x.sigmoid() if self.calls == 1 else x.sigmoid().sigmoid()

    block = Fickle()
    model = nn.Sequential(nn.Linear(4, 4), block, nn.Linear(4, 2))
    x = torch.randn(3, 4)
    with Recompute([block]).context(model), hpcdl.compressed(model, "raw", threshold=0):
        loss = model(x).sum()
    with pytest.raises(RecomputationError, match="did not save what its forward saved"):
        loss.backward()


def test_an_input_changed_in_place_after_the_block_ran_is_refused():
    block = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    model = nn.Sequential(nn.Linear(4, 4), block)
    x = torch.randn(3, 4)
    with Recompute([block]).context(model), hpcdl.compressed(model, "raw", threshold=1 << 20, arena_bytes=0):
        hidden = model[0](x)
        out = block(hidden)
    with torch.no_grad():
        hidden.add_(1.0)  # kept as it is (under the size threshold), so the change would go unnoticed
    with pytest.raises(SavedTensorModifiedError, match="modified in place"):
        out.sum().backward()


@pytest.mark.parametrize("codec", [None, "raw"], ids=["checkpoint", "session"])
def test_a_recomputation_updates_batch_norm_statistics_once(codec):
    """Running mean, variance and batch counter after a recomputed step are those of a plain step: the
    recomputation repeats the forward, and its second update is undone."""
    plain, recomputed = blocks_cnn(), blocks_cnn()
    gradients(plain)
    method = recompute_both(recomputed)
    gradients(recomputed, method if codec is None else method + Codec(codec, threshold=0))
    for (name, want), got in zip(plain.named_buffers(), recomputed.buffers()):
        assert torch.equal(got, want), name
