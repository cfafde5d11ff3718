"""The compressed-activation session: exact gradients when lossless, sharing, views, fallbacks, errors, no leaks."""

from __future__ import annotations

import gc
import warnings
import weakref
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hpcdl
from hpcdl.compress import UnknownCodecError
from hpcdl.runtime import (
    CompressionFallbackWarning,
    Controller,
    Policy,
    ReleasedError,
    SavedTensorModifiedError,
    VerificationError,
    compressed,
    config_from_spec,
    policy_from_spec,
    spec_from_config,
)

from runtime_models import ExplodingCodec, LyingCodec, Recurrent, ResidualCNN, TransformerBlock

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.one_thread


ALL_RAW = Policy.static({"id": "raw"}, masks={"id": "raw"}, indices={"id": "raw"})
POLICIES = {
    "all-raw": lambda: ALL_RAW,
    "raw+bitmask+int": lambda: Policy.static({"id": "raw"}),  # floats raw, the default exact routing for the rest
}


def _lm_loss(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def _case(name):
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    if name == "cnn":
        return ResidualCNN(), torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 5, (4,), generator=g), F.cross_entropy
    if name == "transformer":
        tokens = torch.randint(0, 50, (3, 13), generator=g)
        return TransformerBlock(), tokens[:, :-1], tokens[:, 1:], _lm_loss
    return Recurrent(), torch.randn(4, 7, 6, generator=g), torch.randint(0, 3, (4,), generator=g), F.cross_entropy


def _grads(model, x, y, loss_fn, policy=None, **session_kw):
    """Parameter gradients of one seeded step; with a policy, also the session."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # the same dropout masks with and without the session
    session = None
    if policy is None:
        loss = loss_fn(model(x), y)
    else:
        with compressed(model, policy, **session_kw) as session:
            loss = loss_fn(model(x), y)
    loss.backward()  # outside the block
    return {name: p.grad.clone() for name, p in model.named_parameters()}, session


def _assert_identical(expected, got):
    assert expected.keys() == got.keys()
    different = [name for name in expected if not torch.equal(expected[name], got[name])]
    assert not different, f"gradients differ for {different}"


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("name", ["cnn", "transformer", "lstm"])
def test_lossless_policy_gives_bit_identical_gradients(name, policy):
    model, x, y, loss_fn = _case(name)
    expected, _ = _grads(model, x, y, loss_fn)
    got, session = _grads(model, x, y, loss_fn, POLICIES[policy](), threshold=0)
    _assert_identical(expected, got)
    stats = session.stats
    kinds = {kind for (_, kind), row in stats.rows.items() if row.count}
    assert stats.original_bytes > 0 and "activation" in kinds and "parameter" in kinds
    assert "index" in kinds  # max-pool indices, embedding ids, the LSTM's workspace
    if name == "transformer":
        assert "mask" in kinds  # the causal mask of masked_fill
    assert session.live_entries == 0 and session.held_bytes == 0  # all freed by backward


def test_default_threshold_keeps_small_tensors_and_stays_exact():
    model, x, y, loss_fn = _case("cnn")
    x = torch.randn(8, 3, 32, 32)
    y = torch.randint(0, 5, (8,))
    expected, _ = _grads(model, x, y, loss_fn)
    got, session = _grads(model, x, y, loss_fn, Policy.static({"id": "raw"}))
    _assert_identical(expected, got)
    total = session.stats.total()
    assert total.kept > 0 and total.count > total.kept  # small ones kept, big ones packed


class SavesOneStorageManyWays(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x):
        r = torch.relu(self.lin(x))  # relu saves its output r
        s = r.sin()  # saves r again
        t = r.t() @ r  # saves a transposed view of r, and r
        u = r[:, 8:40].cos()  # saves a slice (a view with an offset)
        return s.sum() + t.sum() + u.sum()


def test_one_storage_saved_many_ways_is_packed_once_and_counted_once():
    model = SavesOneStorageManyWays()
    x = torch.randn(256, 64)
    expected, _ = _grads(model, x, None, lambda out, y: out)
    model.zero_grad(set_to_none=True)
    with compressed(model, ALL_RAW, threshold=0) as session:
        loss = model(x)
    r_bytes = 256 * 64 * 4
    assert session.live_entries == 2  # x (saved by Linear) and r; every other save shares r's entry
    row = session.stats.row("(model)", "activation")
    assert row.count == 5 and row.shared == 4 and row.original == r_bytes
    loss.backward()
    got = {name: p.grad.clone() for name, p in model.named_parameters()}
    _assert_identical(expected, got)


def test_unpacked_views_have_the_saved_size_strides_and_offset():
    base = torch.randn(40, 30, requires_grad=True)
    wide, other = base * 2, base * 3
    with compressed(nn.Identity(), Policy.static({"id": "raw"}), threshold=0) as session:
        dense = wide.t()  # a transposed view of the whole storage: packed in storage order
        inside = wide[5:25, 3:13].t()  # offset, transposed, with gaps, inside that span: shared
        alone = other[::2, 1::3]  # with gaps, and nothing else saved from its storage: packed alone, compactly
        outs = [view.sin() for view in (dense, inside, alone)]
    assert session.stats.total().shared == 1 and session.live_entries == 2
    assert session.stats.total().original == (40 * 30 + 20 * 10) * 4  # the span of `wide`; the 200 values of `alone`
    restored = [out.grad_fn._saved_self for out in outs]  # runs the unpack hook
    for got, view in zip(restored, (dense, inside)):
        assert (got.size(), got.stride()) == (view.size(), view.stride()) and torch.equal(got, view)
    # the view with gaps comes back without its gaps: same size and values, strides in the same order
    assert restored[2].size() == alone.size() and restored[2].stride() == (10, 1) and torch.equal(restored[2], alone)
    # while the first is alive, the second view comes from the same decompressed tensor, at the same relative offset
    assert restored[1].untyped_storage().data_ptr() == restored[0].untyped_storage().data_ptr()
    assert restored[1].storage_offset() - restored[0].storage_offset() == inside.storage_offset()


class _HoldsASkip(nn.Module):
    """Three layers whose first activation is kept in a local until the end (a skip connection)."""

    def __init__(self, width: int = 256):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = torch.relu(self.a(x))
        return self.c(torch.tanh(self.b(skip))) + skip


def test_stats_count_the_packed_originals_something_else_still_holds():
    """Packing frees nothing that a Python reference still holds: the caller's input and the skip connection
    are both alive when the later tensors are packed, a chain's intermediate tensors are not."""
    x = torch.randn(512, 256)
    tensor_bytes = x.numel() * 4
    with hpcdl.compressed(_HoldsASkip(), "sz:rel=1e-2") as session:
        loss = session.model(x).sum()
    loss.backward()
    assert session.stats.held_originals_peak_bytes == 2 * tensor_bytes  # x and the skip
    chain = nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 256))
    with hpcdl.compressed(chain, "sz:rel=1e-2") as session:
        loss = chain(x).sum()
    loss.backward()
    assert session.stats.held_originals_peak_bytes == tensor_bytes  # x only
    finalizers = len(weakref.finalize._registry)
    for _ in range(20):  # the same input in every session leaves nothing behind per session
        with hpcdl.compressed(chain, "sz:rel=1e-2") as session:
            loss = chain(x).sum()
        loss.backward()
    assert len(weakref.finalize._registry) <= finalizers


def test_in_place_change_between_saves_does_not_reuse_the_stale_copy():
    h = torch.randn(300, 100, requires_grad=True)
    with compressed(nn.Identity(), ALL_RAW, threshold=0) as session:
        a = h * 1.0
        first = a.sin()  # saves a at version 0
        a.add_(1.0)  # a is now h + 1
        second = a.cos()  # saves a at version 1: must not share the packed version 0
    assert session.stats.total().shared == 0 and session.live_entries == 2
    (first.sum() + second.sum()).backward()
    expected = torch.cos(h.detach()) - torch.sin(h.detach() + 1.0)
    assert torch.allclose(h.grad, expected, atol=1e-6)


def test_parameters_and_views_of_them_are_never_packed():
    seen = []

    class Spy(Controller):
        def choose(self, info):
            seen.append(info)
            return {"id": "raw"}

    model = nn.Sequential(nn.Linear(128, 256), nn.Tanh(), nn.Linear(256, 8))
    with compressed(model, Policy(Spy()), threshold=0) as session:
        model(torch.randn(64, 128)).sum().backward()
    weight_shapes = {tuple(p.shape) for p in model.parameters()} | {tuple(p.t().shape) for p in model.parameters()}
    assert seen and not any(info.shape in weight_shapes for info in seen)
    assert session.stats.row("2", "parameter").count >= 1  # the second Linear saves its weight for grad_input
    assert {info.module for info in seen} == {"0", "1"}  # "2" saves Tanh's output, which "1" already packed
    assert session.stats.row("2", "activation").shared == 1
    assert all(info.kind == "activation" and info.step == 0 for info in seen)


def test_per_module_policy_routes_by_glob_and_module_names_are_qualified():
    model, x, y, loss_fn = _case("cnn")
    policy = Policy.per_module({"stem.*": {"id": "raw"}, "conv?": {"id": "raw"}}, default=None)
    expected, _ = _grads(model, x, y, loss_fn)
    got, session = _grads(model, x, y, loss_fn, policy, threshold=0)
    _assert_identical(expected, got)
    per_module = session.stats.per_module()
    assert {"stem.0", "stem.1", "conv1", "bn1", "pool", "head"} <= set(per_module)
    rows = session.stats.rows
    assert rows[("stem.0", "activation")].kept == 0 and rows[("conv1", "activation")].kept == 0
    assert rows[("bn1", "activation")].kept == rows[("bn1", "activation")].count  # default None: kept as is
    table = session.stats.table()
    assert "stem.0" in table and "total" in table


def test_adaptive_controller_sees_step_and_last_gradients():
    class Adaptive(Controller):
        def __init__(self):
            self.observed = []
            self.steps = set()

        def choose(self, info):
            self.steps.add(info.step)
            return {"id": "raw"} if not info.grad_stats else {"id": "cast", "dtype": "bf16"}

        def observe(self, step, grad_stats):
            self.observed.append((step, dict(grad_stats)))

    controller = Adaptive()
    policy = Policy(controller)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    for _ in range(2):
        with compressed(model, policy, threshold=0) as session:
            loss = model(torch.randn(16, 32)).pow(2).mean()
        loss.backward()
        policy.record_gradients(model)
        model.zero_grad()
    assert controller.steps == {0, 1} and policy.step == 2
    step, stats = controller.observed[-1]
    assert step == 2 and set(stats) == {"0", "2"} and stats["0"].norm > 0 and stats["0"].numel == 32 * 64 + 64
    assert any(key[1] == "activation" for key in session.stats.rows) and session.stats.ratio > 1.5  # bf16 at step 1


def test_failing_codec_keeps_tensors_raw_warns_once_per_module_and_counts():
    model, x, y, loss_fn = _case("cnn")
    expected, _ = _grads(model, x, y, loss_fn)
    policy = Policy.static({"id": ExplodingCodec.codec_id}, indices={"id": "raw"})
    with pytest.warns(CompressionFallbackWarning, match="boom") as record:
        got, session = _grads(model, x, y, loss_fn, policy, threshold=0)
    _assert_identical(expected, got)
    modules = [str(w.message).split("module ")[1].split()[0] for w in record]
    assert len(modules) == len(set(modules)) >= 5  # once per module
    assert session.stats.fallbacks >= len(modules)
    got_again, _ = _grads(model, x, y, loss_fn, policy, threshold=0)  # same policy: already warned, silent
    _assert_identical(expected, got_again)


def test_verify_mode_catches_a_codec_that_breaks_its_bound():
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh())
    with compressed(model, Policy.static({"id": LyingCodec.codec_id}), threshold=0, verify=True) as session:
        loss = model(torch.randn(32, 64)).sum()
    with pytest.raises(VerificationError, match="broke its bound"):
        loss.backward()
    assert session.stats.verified == 0


def test_verify_mode_passes_an_exact_codec_and_counts_checks():
    model, x, y, loss_fn = _case("cnn")
    _, session = _grads(model, x, y, loss_fn, ALL_RAW, threshold=0, verify=True)
    assert session.stats.verified > 0


def test_backward_after_release_says_what_happened():
    model, x, y, loss_fn = _case("cnn")
    with compressed(model, ALL_RAW, threshold=0) as session:
        loss = loss_fn(model(x), y)
    assert session.held_bytes > 0
    session.release()
    assert session.held_bytes == 0
    with pytest.raises(ReleasedError, match="released"):
        loss.backward()


def test_bad_input_is_refused_clearly():
    model = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        compressed(lambda x: x, ALL_RAW)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 warns that torch.jit.script is deprecated
        scripted = torch.jit.script(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="TorchScript module \\(the model is one"):
        compressed(scripted, ALL_RAW)
    with pytest.raises(TypeError, match="TorchScript module \\(1 is one"):
        compressed(nn.Sequential(nn.ReLU(), scripted), ALL_RAW)
    with pytest.raises(UnknownCodecError, match="unknown codec id 'nope'"):
        Policy.static({"id": "nope"})
    with pytest.raises(UnknownCodecError):
        compressed(model, "nope:rel=1e-2")
    with pytest.raises(UnknownCodecError):
        Policy.per_module({"a.*": {"id": "nope"}})
    with pytest.raises(ValueError, match="cannot encode floating"):
        Policy.static({"id": "bitmask"})
    with pytest.raises(TypeError, match="policy must be"):
        compressed(model, 3)
    with pytest.raises(ValueError, match="threshold"):
        compressed(model, ALL_RAW, threshold=-1)
    with compressed(model, ALL_RAW):
        with pytest.raises(RuntimeError, match="cannot be nested"):
            with compressed(nn.Linear(2, 2), ALL_RAW):
                pass
    session = compressed(model, ALL_RAW)
    with session:
        pass
    with pytest.raises(RuntimeError, match="one forward"):
        with session:
            pass


def test_module_hooks_are_removed_on_exit():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with compressed(model, ALL_RAW):
        assert model[0]._forward_pre_hooks
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise OSError("no VmRSS")


def test_500_steps_hold_nothing_between_steps_and_do_not_grow():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    policy = Policy.static({"id": "raw"})
    x, y = torch.randn(64, 64), torch.randint(0, 4, (64,))
    rss = []
    for step in range(500):
        with compressed(model, policy, threshold=0) as session:
            loss = F.cross_entropy(model(x), y)
        assert session.live_entries > 0
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        assert session.live_entries == 0 and session.held_bytes == 0
        if step in (50, 499):
            gc.collect()
            rss.append(_rss())
    assert policy.step == 500
    assert rss[1] - rss[0] < 16 * 2**20



@pytest.mark.parametrize("policy,threshold", [(None, 0), ("sz:rel=1e-2", 1 << 30), ("sz:rel=1e-2", 0)],
                         ids=["no-policy", "all-small-kept", "compressed"])
@pytest.mark.parametrize("ending", ["no-backward", "retain-graph"])
def test_a_graph_dropped_without_a_freeing_backward_frees_its_saved_tensors(policy, threshold, ending):
    """A ReLU or sigmoid saves its own output; an entry that kept that very tensor would close a cycle through
    autograd's graph (output -> its op -> the saved entry -> the output) that Python's collector cannot see: a
    graph dropped without a backward (an evaluation forward, an exception, a probe's kept replay) leaked."""
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.Sigmoid(), nn.Softmax(-1))
    x = torch.randn(64, 32)
    with compressed(model, policy, threshold=threshold, arena_bytes=0):
        output = model(x)
    if ending == "retain-graph":
        output.sum().backward(retain_graph=True)
    alive = weakref.ref(output)
    del output
    gc.collect()
    assert alive() is None


class Checkpointed(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.2))
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        x = self.pre(x)
        x = torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)
        return self.head(x.mean(dim=(2, 3)))


def test_composes_with_non_reentrant_checkpoint():
    torch.manual_seed(0)
    model = Checkpointed()
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 3, (4,))
    expected, _ = _grads(model, x, y, F.cross_entropy)
    got, session = _grads(model, x, y, F.cross_entropy, ALL_RAW, threshold=0)
    _assert_identical(expected, got)
    assert session.stats.row("pre.0", "activation").count == 1  # outside the checkpoint: ours
    assert session.stats.row("block.0", "activation").count == 0  # inside: the checkpoint's


def test_composes_with_bf16_autocast_on_cpu():
    model, x, y, loss_fn = _case("transformer")

    def step(policy=None):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return _grads(model, x, y, loss_fn, policy, threshold=0)

    expected, _ = step()
    got, session = step(Policy.static({"id": "raw"}))
    _assert_identical(expected, got)
    assert any(session.stats.row(module, "activation").count for module in ("qkv", "mlp.0"))


@pytest.mark.parametrize(
    ("spec", "config"),
    [
        ("sz:rel=1e-2", {"id": "sz", "mode": "rel", "bound": 0.01}),
        ("sz:abs=0.001", {"id": "sz", "mode": "abs", "bound": 0.001}),
        ("quant:bits=2,group_size=256", {"id": "quant", "bits": 2, "group_size": 256}),
        ("cast:bf16", {"id": "cast", "dtype": "bf16"}),
        ("raw", {"id": "raw"}),
        ("none", None),
    ],
)
def test_method_specs_parse_and_print_back(spec, config):
    assert config_from_spec(spec) == config
    assert config_from_spec(spec_from_config(config)) == config
    policy = policy_from_spec(spec)
    assert (policy is None) if config is None else (policy.controller.config == config)


@pytest.mark.parametrize("spec", ["", "sz:rel", "nope", "quant:2", "sz:rel=abc"])
def test_bad_method_specs_are_refused(spec):
    with pytest.raises(ValueError):
        config_from_spec(spec)


def test_a_used_policy_pickles_for_a_measuring_process():
    import pickle

    policy = Policy.per_module({"conv*": {"id": "sz", "mode": "rel", "bound": 1e-2}}, default={"id": "raw"})
    model, x, y, loss_fn = _case("cnn")
    _grads(model, x, y, loss_fn, policy)
    policy.record_gradients(model)
    copy = pickle.loads(pickle.dumps(policy))
    assert copy.step == 1 and copy.grad_stats == policy.grad_stats and copy.describe() == "PerModuleController"
    assert copy.codec({"id": "raw"}) == policy.codec({"id": "raw"})


def test_top_level_names_and_retain_graph():
    assert hpcdl.compressed is compressed and hpcdl.Policy is Policy and hpcdl.memory.max_batch
    model, x, y, loss_fn = _case("cnn")
    expected, _ = _grads(model, x, y, loss_fn)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    with hpcdl.compressed(model, ALL_RAW, threshold=0) as session:
        loss = loss_fn(model(x), y)
    loss.backward(retain_graph=True)  # packed data must survive for the second backward
    assert session.live_entries > 0
    loss.backward()
    assert session.live_entries == 0
    _assert_identical({k: 2 * v for k, v in expected.items()}, {n: p.grad for n, p in model.named_parameters()})


@pytest.mark.parametrize("threshold,policy", [(1 << 20, "raw"), (0, Policy.static(None))],
                         ids=["small-kept", "large-kept-by-the-policy"])
def test_a_kept_tensor_modified_in_place_before_backward_is_refused(threshold, policy):
    """PyTorch refuses a tensor it saved that changed in place before backward; a session that keeps the tensor
    uncompressed must refuse it too, or backward silently computes gradients from the changed values."""
    layer = nn.Linear(4, 4)
    hidden = torch.randn(3, 4, requires_grad=True) * 2.0
    with hpcdl.compressed(layer, policy, threshold=threshold, arena_bytes=0):
        out = layer(hidden)
    with torch.no_grad():
        hidden.add_(1.0)
    with pytest.raises(SavedTensorModifiedError, match="modified in place"):
        out.sum().backward()
