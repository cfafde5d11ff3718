"""A probe's perturbed replays are backward passes through the exact replay's graph (``Replayer.run(keep=True)``,
``Session.substituted``): they must give the gradients that replaying the whole step gives, with a saved tensor
compressed as training would compress it, and leave the graph exact again afterwards.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hpcdl
from hpcdl.compress import get_codec
from hpcdl.runtime import policy_from_spec
from hpcdl.runtime.probe import (
    Capture,
    RecordingPolicy,
    Replayer,
    SlotInfo,
    slot_codec,
    squared_difference,
    sz_abs,
)
from hpcdl.runtime.session import active_session

sys.path.insert(0, str(Path(__file__).parent))
from runtime_models import TransformerBlock, WideCNN, wide_cnn_batch  # noqa: E402


def _cnn():
    torch.manual_seed(0)
    x, y = wide_cnn_batch(8, torch.Generator().manual_seed(0), size=32)
    return WideCNN(channels=8, depth=4), x, lambda out: F.cross_entropy(out, y)


def _transformer():
    torch.manual_seed(0)
    tokens = torch.randint(0, 50, (8, 65), generator=torch.Generator().manual_seed(0))
    targets = tokens[:, 1:]
    return TransformerBlock(), tokens[:, :-1], lambda out: F.cross_entropy(out.flatten(0, 1), targets.flatten())


def _captured(model, x, loss_fn, threshold: int) -> Capture:
    """A training step's capture, as the adaptive controller's watch takes it."""
    capture = Capture(model, threshold)
    with capture:
        out = model(x)
    loss_fn(out).backward()
    assert capture.complete
    return capture


def _replays(replayer: Replayer, perturbations: list[dict[str, dict]], keep: bool):
    """The exact replay (its graph kept if ``keep``) and one replay per perturbation, with their Linear/Conv
    calls."""
    with replayer.restored():
        exact = replayer.run(RecordingPolicy({}), layer_calls=True, keep=keep)
        return exact, [replayer.run(RecordingPolicy(perturb=perturb), layer_calls=True) for perturb in perturbations]


def _same(got, want) -> bool:
    return all((g is None and w is None) or torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("case", [_cnn, _transformer], ids=["cnn", "transformer"])
def test_a_backward_through_the_kept_graph_gives_the_gradients_of_a_whole_replay(case):
    model, x, loss_fn = case()
    capture = _captured(model, x, loss_fn, threshold=0)
    forwards: list[int] = []
    model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    with Replayer(capture, rows=4).restored():
        records = Replayer(capture, rows=4).run(RecordingPolicy({})).slots

    def compressed_at(keys, rel):
        return {key: slot_codec(sz_abs(rel * records[key].value_range), records[key]) for key in keys}

    keys = sorted(key for key, record in records.items() if record.value_range > 0)
    perturbations = [compressed_at([key], 0.05) for key in keys] + [compressed_at(keys, 0.02)]
    forwards.clear()
    whole = _replays(Replayer(capture, rows=4), perturbations, keep=False)
    assert len(forwards) == 1 + len(perturbations)
    forwards.clear()
    with_kept = _replays(Replayer(capture, rows=4), perturbations, keep=True)
    assert len(forwards) == 1
    for want, got in zip([whole[0], *whole[1]], [with_kept[0], *with_kept[1]]):
        assert _same(got.grads, want.grads)
        assert [c.delta_sq for c in got.layer_calls] == [c.delta_sq for c in want.layer_calls]
    # the passes compared are compressed ones (a ReLU output that only its own backward reads bends nothing)
    bent = [not _same(replay.grads, whole[0].grads) for replay in with_kept[1]]
    assert bent[-1] and sum(bent) > len(bent) / 2


@pytest.mark.parametrize("keep", [True, False], ids=["kept graph", "whole replays"])
@pytest.mark.parametrize("case", [_cnn, _transformer], ids=["cnn", "transformer"])
def test_a_replay_against_the_reference_gives_each_modules_squared_deviation_and_keeps_no_gradients(case, keep):
    """A probe's perturbed replays compare each parameter's gradient with the reference's as backward produces
    it (so that a probe never holds a third set of gradients): the deviations are those of the whole gradients."""
    model, x, loss_fn = case()
    capture = _captured(model, x, loss_fn, threshold=0)
    replayer = Replayer(capture, rows=4)
    with replayer.restored():
        reference = replayer.run(RecordingPolicy({}), keep=keep)
        perturb = {key: slot_codec(sz_abs(0.05 * record.value_range), record)
                   for key, record in sorted(reference.slots.items()) if record.value_range > 0}
        whole = replayer.run(RecordingPolicy(perturb=perturb))
        compared = replayer.run(RecordingPolicy(perturb=perturb), against=reference)
    want: dict[str, float] = {}
    for owner, got, exact in zip(replayer.owners, whole.grads, reference.grads):
        if got is not None and exact is not None and (value := squared_difference(got, exact) * whole.scale) > 0:
            want[owner] = want.get(owner, 0.0) + value
    assert whole.scale == 2.0 and len(want) > 1
    assert compared.grads == [] and compared.deviation == want


def _session(threshold: int):
    """A forward that saves tanh outputs of 128 KiB, kept as they are, named as a probe's replay names them."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    x = torch.randn(512, 64)
    with hpcdl.compressed(model, RecordingPolicy({}), threshold=threshold) as session:
        loss = model(x).square().mean()
    return model, x, session, loss


def _grads(model, loss):
    return torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)


@pytest.mark.parametrize("bound", [0.01, 0.2])
def test_substituted_compresses_what_the_session_kept_as_packing_would_and_restores_it_after(bound):
    model, x, session, loss = _session(threshold=0)
    exact = _grads(model, loss)
    spec = f"sz:abs={bound}"
    codec = get_codec({"id": "sz", "mode": "abs", "bound": bound})
    with session.substituted(lambda info: codec if isinstance(info, SlotInfo) else None):
        substituted = _grads(model, loss)
    with hpcdl.compressed(model, policy_from_spec(spec), threshold=0):
        packed = _grads(model, model(x).square().mean())
    assert _same(substituted, packed) and not _same(substituted, exact)
    assert _same(_grads(model, loss), exact)  # the entries restore their own tensors again


def test_substituted_gives_small_tensors_their_arenas_member_codec_and_keeps_those_no_arena_takes():
    model, x, session, loss = _session(threshold=1 << 30)  # every tensor small: arena candidates
    exact = _grads(model, loss)
    quant = get_codec({"id": "quant", "bits": 4})  # no pointwise form: training keeps a small tensor as it is
    with session.substituted(lambda info: quant):
        assert _same(_grads(model, loss), exact)
    sz = get_codec({"id": "sz", "mode": "abs", "bound": 0.05})  # pointwise: its own member codec
    with session.substituted(lambda info: sz):
        assert not _same(_grads(model, loss), exact)
    assert _same(_grads(model, loss), exact)


class _Recomputed(nn.Module):
    """A block recomputed in backward (Session.recompute) between two layers."""

    def __init__(self):
        super().__init__()
        self.first, self.block, self.last = nn.Linear(64, 64), nn.Sequential(nn.Linear(64, 64), nn.Tanh()), nn.Linear(64, 1)

    def forward(self, x):
        session = active_session()
        hidden = torch.tanh(self.first(x))
        hidden = session.recompute(self.block, hidden) if session is not None else self.block(hidden)
        return self.last(hidden)


def test_a_forward_with_a_recomputed_block_is_not_kept_and_each_replay_runs_whole():
    torch.manual_seed(0)
    model, x = _Recomputed(), torch.randn(512, 64)
    capture = _captured(model, x, lambda out: out.square().mean(), threshold=0)
    forwards: list[int] = []
    model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    with Replayer(capture).restored():
        records = Replayer(capture).run(RecordingPolicy({})).slots
    perturbations = [{key: sz_abs(0.05 * record.value_range)} for key, record in sorted(records.items())]
    forwards.clear()
    exact, replays = _replays(Replayer(capture), perturbations, keep=True)
    assert len(forwards) == 1 + len(perturbations)
    assert all(not _same(replay.grads, exact.grads) for replay in replays)


def test_a_kept_graphs_slots_keep_their_samples_by_reference_and_measure_the_same_bytes():
    """Where the exact replay's graph is kept it holds the slots' tensors, so their samples (for sz's bytes at the
    decided bound) are not copied but taken again from those tensors, the same chunks: the same bytes as copies.
    A batch norm's input is sampled in channel units, a scaled copy: it keeps its sample."""
    torch.manual_seed(0)
    x, y = wide_cnn_batch(8, torch.Generator().manual_seed(0), size=96)  # 8 x 8 x 96 x 96: past one sample
    capture = _captured(WideCNN(channels=8, depth=4), x, lambda out: F.cross_entropy(out, y), threshold=0)
    codec = get_codec(sz_abs(1e-2))
    measured = {}
    for keep in (True, False):
        replayer = Replayer(capture)
        with replayer.restored():
            records = replayer.run(RecordingPolicy({}, keep_samples=True), keep=keep).slots
        samples = {key: record.sample for key, record in records.items() if record.sample is not None}
        by_reference = {key for key, kept in samples.items() if kept.part is None}
        channel_units = {key for key, record in records.items() if record.channels is not None}
        if keep:
            assert by_reference and not by_reference & channel_units
        else:
            assert not by_reference
        measured[keep] = {key: kept.packed_bytes(codec) for key, kept in samples.items()}  # after the probe ended
    assert measured[True] == measured[False]


def _live_tensor_bytes() -> int:
    """The bytes of the storages every plain tensor the collector tracks holds (each storage once)."""
    gc.collect()
    storages = {obj.untyped_storage().data_ptr(): obj.untyped_storage().nbytes() for obj in gc.get_objects()
                if type(obj) is torch.Tensor and obj.device.type == "cpu"}  # type(): no attribute lookups
    return sum(storages.values())


@pytest.mark.parametrize("case", [_cnn, _transformer], ids=["cnn", "transformer"])
def test_the_kept_graph_is_freed_when_the_probe_ends(case):
    """The exact replay's graph, kept through the perturbed replays' backward passes, goes when the probe ends:
    it held ReLU and softmax outputs as they were, and a graph that holds its ops' own outputs once never went
    (a run's memory grew by one uncompressed replay per probe)."""
    model, x, loss_fn = case()
    capture = _captured(model, x, loss_fn, threshold=0)
    exact, _ = _replays(Replayer(capture), [], keep=True)  # a warm-up: lazily built state stays
    del exact
    before = _live_tensor_bytes()
    exact, replays = _replays(Replayer(capture), [{}] * 2, keep=True)
    held_by_results = sum(g.untyped_storage().nbytes() for r in (exact, *replays) for g in r.grads if g is not None)
    assert _live_tensor_bytes() - before <= held_by_results
