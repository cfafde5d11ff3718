"""Arenas: small saved activations compressed together (hpcdl/runtime/arena.py).

A recurrent model's many small saves must compress like a convolutional model's few large ones, every member
must keep its own codec's guarantee, lossless policies must stay bit-identical, and an arena must hold nothing
longer than its members need it.
"""

from __future__ import annotations

import gc
import warnings
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hpcdl.compress import get_codec
from hpcdl.runtime import CompressionFallbackWarning, Policy, VerificationError, compressed
from hpcdl.runtime.arena import STEPS_PER_OCTAVE, member_codec

from runtime_models import ExplodingCodec, LSTMCellTagger, LyingCodec, RecurrentTagger, ResidualCNN, tagger_batch

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.one_thread

SZ = "sz:rel=1e-2"
SZ_ABS = Policy.static({"id": "sz", "mode": "abs", "bound": 1e-2})  # pointwise: equal members share one arena
ALL_RAW = Policy.static({"id": "raw"}, masks={"id": "raw"}, indices={"id": "raw"})


def _step(model, x, y, loss_fn=F.cross_entropy, policy=None, **session_kw):
    """Flat parameter gradients of one step, and the session (None without a policy)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    session = None
    if policy is None:
        loss = loss_fn(model(x), y)
    else:
        with compressed(model, policy, **session_kw) as session:
            loss = loss_fn(model(x), y)
    loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]), session


def _tagger(name: str, batch: int = 32):
    torch.manual_seed(0)
    model = RecurrentTagger("gru", hidden=128) if name == "gru" else LSTMCellTagger(hidden=128)
    return (model, *tagger_batch(batch, torch.Generator().manual_seed(0)))


def _arenas(session) -> set:
    return {entry.slot.arena for entry in list(session._entries) if entry.slot is not None}


# -- the judged numbers --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gru", "lstm-cells"])
def test_recurrent_model_compresses_4x_at_sz_rel_1e2_with_close_gradients(name):
    model, x, y = _tagger(name)  # 2 layers, hidden 128, batch 32, 50 steps
    exact, _ = _step(model, x, y)
    _, old = _step(model, x, y, policy=SZ, arena_bytes=0)  # small tensors kept as they are
    got, session = _step(model, x, y, policy=SZ)
    one_by_one, _ = _step(model, x, y, policy=SZ, threshold=0, arena_bytes=0)  # sz on every tensor on its own
    assert old.stats.ratio < 1.2  # what arenas fix
    total = session.stats.total()
    assert total.arena >= 400 and session.stats.ratio >= 4.0
    assert F.cosine_similarity(got, exact, dim=0) >= 0.99
    error = (got - exact).norm() / exact.norm()
    assert error <= 1.1 * (one_by_one - exact).norm() / exact.norm()  # no worse than sz on each tensor alone
    assert session.live_entries == 0 and session.held_bytes == 0


@pytest.mark.parametrize("name", ["gru", "lstm-cells"])
@pytest.mark.parametrize("policy", [lambda: ALL_RAW, lambda: Policy.static({"id": "raw"})])
def test_lossless_policy_through_arenas_gives_bit_identical_gradients(name, policy):
    model, x, y = _tagger(name, batch=8)
    exact, _ = _step(model, x, y)
    got, session = _step(model, x, y, policy=policy())
    assert session.stats.total().arena >= 400
    assert torch.equal(exact, got)
    assert session.live_entries == 0 and session.held_bytes == 0


def test_every_member_keeps_its_own_rel_bound_verified_on_unpack():
    model, x, y = _tagger("gru", batch=8)
    _, session = _step(model, x, y, policy=SZ, verify=True)  # raises VerificationError on a broken bound
    assert session.stats.verified >= session.stats.total().arena >= 400


def test_a_conv_model_compresses_no_worse_with_arenas():
    torch.manual_seed(0)
    model = ResidualCNN()
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 5, (8,))
    exact, _ = _step(model, x, y)
    without, old = _step(model, x, y, policy=SZ, arena_bytes=0)
    got, session = _step(model, x, y, policy=SZ)
    assert session.stats.total().arena > 0  # batch-norm statistics
    assert session.stats.ratio >= old.stats.ratio
    assert F.cosine_similarity(got, exact, dim=0) >= F.cosine_similarity(without, exact, dim=0) - 1e-4


# -- which tensors join arenas, and the codec they get --------------------------------------------------------

def test_member_codec_keeps_each_guarantee():
    policy = Policy.static(None)
    raw, sz_abs, sz_pw = get_codec({"id": "raw"}), get_codec({"id": "sz", "mode": "abs", "bound": 1e-3}), \
        get_codec({"id": "sz", "mode": "pw_rel", "bound": 1e-2})
    x = torch.linspace(-3.0, 5.0, 100)
    assert member_codec(raw, x, policy.codec) is raw
    assert member_codec(sz_abs, x, policy.codec) is sz_abs and member_codec(sz_pw, x, policy.codec) is sz_pw
    assert member_codec(get_codec({"id": "quant", "bits": 8}), x, policy.codec) is None  # range-scaled, no bound
    rel = get_codec({"id": "sz", "mode": "rel", "bound": 1e-2})
    assert member_codec(rel, torch.full((10,), 2.0), policy.codec) is None  # no range: a rel bound of 0
    for spread in (8.0, 1e-3, 0.7, 2.0 ** 0.25, 2.0 ** 0.25 * (1 - 1e-15), 3e5):
        config = member_codec(rel, torch.tensor([0.0, spread], dtype=torch.float64), policy.codec).get_config()
        assert config["mode"] == "abs"
        assert 2.0 ** (-1 / STEPS_PER_OCTAVE) * 1e-2 * spread < config["bound"] <= 1e-2 * spread
    near = [member_codec(rel, torch.tensor([0.0, s]), policy.codec) for s in (1.0, 1.1, 1.18)]
    assert near[0] is near[1] is near[2]  # one quarter octave: one codec, so one arena


class _Saves(nn.Module):
    """Saves what ``build(x)`` returns through ``sin`` inside its forward."""

    def __init__(self, build):
        super().__init__()
        self.build = build

    def forward(self, x):
        return sum(t.sin().sum() for t in self.build(x))


def test_masks_indices_parameters_and_the_loss_stay_out_of_arenas():
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Dropout(0.5), nn.MaxPool1d(2))
    x = torch.randn(4, 2, 16, requires_grad=True)
    with compressed(model, SZ) as session:
        loss = F.cross_entropy(model(x).flatten(1), torch.tensor([0, 1, 2, 3]))
    arena = {key: row.arena for key, row in session.stats.rows.items()}
    assert arena[("0", "activation")] == 1 and arena[("3", "index")] == 0  # x; max-pool indices stay exact
    assert arena[("(outside)", "activation")] == 0 and session.stats.row("(outside)", "activation").kept > 0
    assert session.stats.row("0", "parameter").count > 0
    loss.backward()


def test_small_tensors_under_levels_stay_out_of_arenas_that_would_hold_too_many_distinct_values():
    """levels takes each of these tensors (200 distinct values) but not the two concatenated (400), so they do not
    share an arena: kept as they are, exact, and no fallback (a batch norm's saved mean and invstd at 256
    channels each, once the adaptive controller chose levels for them, fell back with a warning every step)."""
    levels = Policy.static({"id": "levels"})
    assert member_codec(levels.codec({"id": "levels"}), torch.zeros(3), levels.codec) is None
    assert member_codec(levels.codec({"id": "levels", "entropy": "zstd"}), torch.zeros(3), levels.codec) is None

    def build(x):
        return [x * 0 + torch.arange(200.0), x * 0 + torch.arange(200.0) + 0.5]

    x = torch.randn(200, requires_grad=True)
    model = _Saves(build)
    expected = torch.autograd.grad(model(x), x)[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with compressed(model, levels) as session:
            loss = model(x)
        assert torch.equal(torch.autograd.grad(loss, x)[0], expected)
    assert not [w for w in caught if issubclass(w.category, CompressionFallbackWarning)]
    assert not _arenas(session)


def test_dtypes_and_codecs_get_their_own_arenas_and_stay_exact_when_lossless():
    def build(x):
        return [x, x.double() * 2, x.to(torch.bfloat16) * 3, x * 4]

    x = torch.randn(64, 8, requires_grad=True)
    model = _Saves(build)
    expected = torch.autograd.grad(model(x), x)[0]
    with compressed(model, ALL_RAW) as session:
        loss = model(x)
    arenas = _arenas(session)
    assert sorted(str(a.dtype) for a in arenas) == ["torch.bfloat16", "torch.float32", "torch.float64"]
    assert torch.equal(torch.autograd.grad(loss, x)[0], expected)


def test_a_small_view_of_a_large_storage_is_copied_and_does_not_pin_it():
    big = torch.randn(4096, 64)
    storage = weakref.ref(big.untyped_storage())
    view = big[:, :2]
    leaf = torch.ones(4096, 2, requires_grad=True)
    model = _Saves(lambda pair: [pair[0] * pair[1]])  # saves `view` (strided, 8 KiB of a 1 MiB storage), x * view
    with compressed(model, ALL_RAW) as session:
        loss = model((leaf, view))
    expected = (view * view.cos()).clone()
    del big, view
    gc.collect()
    assert storage() is None and session.stats.total().arena == 2
    assert torch.equal(torch.autograd.grad(loss, leaf)[0], expected)


class _ChangesInPlace(nn.Module):
    def forward(self, x):
        a = x * 2
        y = a.sin()  # saves a
        a.add_(1)  # bumps a's version: the next save of a is packed afresh
        return y.sum() + a.sin().sum()


def test_an_in_place_change_after_the_save_does_not_reach_the_arena():
    x = torch.randn(32, 8, requires_grad=True)
    model = _ChangesInPlace()
    with compressed(model, ALL_RAW, threshold=0) as large:  # the large-tensor path: packed at save time
        expected = torch.autograd.grad(model(x), x)[0]
    with compressed(model, ALL_RAW) as session:
        got = torch.autograd.grad(model(x), x)[0]
    assert session.stats.total().arena == 2 and large.stats.total().arena == 0
    assert torch.equal(got, expected)
    a = x.detach() * 2
    assert torch.allclose(got, 2 * a.cos() + 2 * (a + 1).cos())


class _Penalised(nn.Module):
    def forward(self, x):
        y = (x * 1.5).tanh()  # saves y
        (g,) = torch.autograd.grad(y.sum(), x, retain_graph=True)  # inside the forward: the arena is still open
        return y, g


def test_backward_inside_the_forward_unpacks_from_an_open_arena():
    x = torch.randn(16, 8, requires_grad=True)
    model = _Penalised()
    _, expected = model(x)
    with compressed(model, ALL_RAW) as session:
        _, got = model(x)
    assert session.stats.total().arena == 1 and torch.equal(got, expected)


# -- lifetime -------------------------------------------------------------------------------------------------

def _three_members():
    xs = [torch.randn(32, 8, requires_grad=True) for _ in range(3)]
    model = _Saves(lambda _: [x * 1.0 for x in xs])
    return model, xs


def test_decoded_arena_lives_until_its_last_member_is_unpacked_then_all_is_freed():
    model, xs = _three_members()
    with compressed(model, SZ_ABS) as session:
        loss = model(None)
    (arena,) = _arenas(session)
    assert arena.packed is not None and arena.parts is None and arena.waiting == 3  # sealed at the forward's end
    held = arena.nbytes
    assert session.held_bytes == held and session.stats.packed_bytes >= held
    first = torch.autograd.grad(loss, xs[0], retain_graph=True)[0]
    assert arena.decoded is not None and arena.waiting == 2  # decoded once, kept for the two members to come
    rest = torch.autograd.grad(loss, xs[1:], retain_graph=True)
    assert arena.decoded is None and arena.waiting == 0  # every member unpacked: decoded values freed
    assert arena.packed is not None  # the graph is retained: a second backward can still decode
    again = torch.autograd.grad(loss, xs)
    assert torch.equal(again[0], first) and all(torch.equal(a, b) for a, b in zip(again[1:], rest))
    arena_ref = weakref.ref(arena)
    del arena, loss, again
    gc.collect()
    assert arena_ref() is None and session.live_entries == 0 and session.held_bytes == 0


def test_members_dropped_unused_release_the_decoded_arena():
    model, xs = _three_members()
    with compressed(model, SZ_ABS) as session:
        loss = model(None)
    (arena,) = _arenas(session)
    torch.autograd.grad(loss, xs[0], retain_graph=True)
    assert arena.decoded is not None
    del loss  # autograd drops the other handles without unpacking them
    gc.collect()
    assert arena.waiting == 0 and arena.decoded is None


def test_an_arena_is_sealed_when_full_and_when_the_forward_ends():
    xs = [torch.randn(16, 16, requires_grad=True) for _ in range(10)]  # 1 KiB each
    model = _Saves(lambda _: [x * 1.0 for x in xs])
    expected = torch.autograd.grad(model(None), xs)
    with compressed(model, ALL_RAW, arena_bytes=3 * 1024) as session:
        loss = model(None)
    arenas = _arenas(session)
    assert len(arenas) == 4 and all(a.numel * 4 <= 3 * 1024 and a.parts is None for a in arenas)
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(loss, xs), expected))


def test_an_arena_a_submodule_opened_is_sealed_when_the_session_closes():
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    x = torch.randn(4, 8)
    with compressed(model, SZ_ABS) as session:
        loss = model[1](model[0](x)).sum()  # the submodules' forwards only: the model's own never ends
        arenas = _arenas(session)  # one per module: the Linear's input, the Tanh's output
        assert len(arenas) == 2 and all(a.parts is not None for a in arenas)
    assert all(a.parts is None for a in arenas) and session.stats.total().arena == 2
    loss.backward()


def test_stats_rows_add_up_to_what_the_arenas_hold():
    xs = [torch.randn(64, 32, requires_grad=True) for _ in range(40)]
    model = _Saves(lambda _: [x * 1.0 for x in xs])
    with compressed(model, SZ) as session:
        loss = model(None)
    arenas = _arenas(session)
    row = session.stats.row("(model)", "activation")
    assert row.count == row.arena == 40 and row.original == 40 * 64 * 32 * 4
    assert row.packed == sum(a.nbytes for a in arenas) == session.held_bytes
    assert row.ratio > 3 and all(a.packed is not None for a in arenas)
    loss.backward()
    assert session.live_entries == 0 and session.held_bytes == 0


def test_a_recurrent_models_rows_and_ratio_include_its_arena_members():
    model, x, y = _tagger("gru", batch=8)
    _, session = _step(model, x, y, policy=SZ)
    row = session.stats.row("rnn", "activation")
    assert row.arena >= 400 and row.count == row.arena + row.shared + row.kept + 2  # 2: the layers' large saves
    assert session.stats.per_module()["rnn"]["ratio"] > 4


def test_arena_bytes_must_be_a_size():
    with pytest.raises(ValueError, match="arena_bytes"):
        compressed(nn.Identity(), SZ, arena_bytes=-1)
    with pytest.raises(ValueError, match="arena_bytes"):
        compressed(nn.Identity(), SZ, arena_bytes=1.5)


# -- failures ---------------------------------------------------------------------------------------------------

def test_a_failing_codec_keeps_the_arena_raw_warns_and_counts():
    model, xs = _three_members()
    expected = torch.autograd.grad(model(None), xs)
    with pytest.warns(CompressionFallbackWarning, match="boom"):
        with compressed(model, Policy.static({"id": ExplodingCodec.codec_id})) as session:
            loss = model(None)
    assert session.stats.fallbacks == 3
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(loss, xs), expected))


def test_verify_catches_a_member_outside_its_bound():
    model, xs = _three_members()
    with compressed(model, Policy.static({"id": LyingCodec.codec_id}), verify=True) as session:
        loss = model(None)
    assert session.stats.total().arena == 3
    with pytest.raises(VerificationError, match="broke its bound"):
        torch.autograd.grad(loss, xs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_rel_members_hold_their_own_bound_in_every_float_dtype(dtype):
    xs = [(torch.randn(64, 64) * scale).to(dtype).requires_grad_() for scale in (1e-3, 1.0, 50.0) for _ in range(4)]
    model = _Saves(lambda _: [x * 1 for x in xs])
    with compressed(model, SZ, verify=True) as session:
        loss = model(None)
    assert any(a.packed is not None for a in _arenas(session))
    torch.autograd.grad(loss, xs)  # verify: each member against its own range
    assert session.stats.verified == session.stats.total().arena == 12
    assert session.stats.ratio > 2
