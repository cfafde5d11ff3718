"""Best-fit codec per saved tensor (``Policy.adaptive()``'s codec choice) and the ActNN baseline (``actnn:bits=2``).

A slot of two distinct values is stored exactly; quant wins where it meets the error target in fewer bytes and sz
where sz does; budget mode with codec choice keeps its byte budget; the ActNN baseline packs within its bits
and uses only quant at 1, 2, 4 or 8 bits; its method spec runs a training step. (The gradient-error prediction
with codec choice on is tests/test_adaptive.py's test_predicted_gradient_error_matches_the_measured_one: codec
choice is the default.)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hpcdl
from hpcdl.compress import CodecError, get_codec
from hpcdl.compress.entropy import with_stage
from hpcdl.compress.quant import Quant
from hpcdl.runtime import Policy
from hpcdl.runtime.adaptive import ActnnController, AdaptiveController, AdaptiveOptions, Slot
from hpcdl.runtime.policy import GradStat, spec_from_config
from hpcdl.runtime.probe import RecordingPolicy
from hpcdl.runtime.trials import CHUNK, FAMILIES, QUANT_BITS, trial, trials
from hpcdl.train.method_spec import parse_method

sys.path.insert(0, str(Path(__file__).parent))
from runtime_models import WideCNN, wide_cnn_step  # noqa: E402


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                     b.reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_levels_decodes_bit_identically(dtype):
    codec = get_codec({"id": "levels"})
    scale = ((torch.rand(4, 1000) > 0.1) / 0.9).to(dtype)
    packed = codec.encode(scale)
    assert _same_bits(codec.decode(packed), scale)
    assert packed.nbytes < scale.numel() / 8 + 100  # one bit per element
    odd = torch.tensor([0.0, -0.0, float("nan"), float("-inf"), 3.0], dtype=dtype)  # -0.0 and NaN are levels too
    assert _same_bits(codec.decode(codec.encode(odd)), odd)
    with pytest.raises(ValueError, match="at most 256 distinct values"):
        codec.encode(torch.arange(300, dtype=dtype))
    broken = codec.encode(scale)
    with pytest.raises(CodecError):
        codec.decode(type(broken)(broken.header, broken.data[:-1]))


class ScaleDropout(nn.Module):
    """Dropout written as ``x * scale`` with a float scale tensor of two values (0 and 1 / (1 - p)): the
    multiplication saves the scale tensor for backward."""

    def forward(self, x):
        return x * ((torch.rand_like(x) > 0.25).to(x.dtype) / 0.75)


def _dropout_case():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), ScaleDropout(), nn.Linear(128, 8))
    return model, torch.randn(256, 64), torch.randn(256, 8)


def _step(model, x, target, policy):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    with hpcdl.compressed(model, policy) as session:
        loss = (model(x) * target).sum()
    loss.backward()
    if policy.wants_gradients():
        policy.record_gradients(model)
    return session


def test_a_two_valued_slot_is_stored_exactly():
    model, x, target = _dropout_case()
    policy = Policy.adaptive()
    _step(model, x, target, policy)  # the probe
    slot = policy.controller.slots["2#0"]  # ScaleDropout's saved scale tensor
    assert slot.codec == {"id": "levels"}
    assert slot.trial(slot.codec)["mse"] == 0 and slot.variance() == 0
    assert policy.controller.report()["slots"]["2#0"]["codec"] == "levels"
    # The step after the probe: the session packs the scale with levels and backward gets the very bits back.
    saved = []
    codec = policy.codec(slot.codec)
    original_encode = type(codec).encode

    def encode(self, tensor):
        saved.append(tensor.clone())
        return original_encode(self, tensor)

    with mock.patch.object(type(codec), "encode", encode):
        _step(model, x, target, policy)
    assert len(saved) == 1 and torch.unique(saved[0]).numel() == 2
    assert _same_bits(codec.decode(codec.encode(saved[0])), saved[0])


@pytest.mark.parametrize("shape", [(16, 64, 32), (1 << 20,)])
def test_levels_is_ruled_out_by_the_distinct_values_of_a_few_thousand_elements(shape):
    """A tensor with many distinct values is refused for ``levels`` after counting them on CHUNK flat elements,
    whatever its shape (a small multi-dimensional tensor is its own sample: its first rows are not CHUNK values)."""
    tensor = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    counted = []
    unique = torch.unique

    def counting_unique(values, *args, **kwargs):
        counted.append(values.numel())
        return unique(values, *args, **kwargs)

    with mock.patch.object(torch, "unique", counting_unique):
        result = trial({"id": "levels"}, tensor, get_codec, threshold=0)
    assert result.nbytes == float("inf")
    assert counted == [CHUNK]


def test_a_candidate_less_faithful_than_one_that_erred_past_the_limit_is_not_encoded():
    """quant at 8 bits errs more than the limit here, so 4, 2 and 1 bits (which err more still) are not tried,
    and fp8 is not tried after bf16 did; what is tried is the very trial an unlimited run records."""
    data = F.gelu(torch.randn(64, 1024, generator=torch.Generator().manual_seed(0)))
    unlimited = trials(FAMILIES["all"], data, get_codec, threshold=0)
    by_codec = {spec_from_config(t.codec): t for t in unlimited}
    limit = min(by_codec["quant:bits=8,seed=0"].mse, by_codec["cast:bf16"].mse) / 2
    limited = trials(FAMILIES["all"], data, get_codec, threshold=0, limit=limit)
    assert [t.codec for t in limited] == [t.codec for t in unlimited]  # same order as the candidates
    for got, full in zip(limited, unlimited):
        name = spec_from_config(got.codec)
        if name in ("quant:bits=8,seed=0", "cast:bf16", "levels"):
            assert got == full
        else:
            assert got.nbytes == math.inf and got.mse == math.inf and not got.safe and full.mse > limit


@pytest.mark.parametrize("kind,reach,crosses", [("uniform", 4, True), ("uniform", 32, True), ("gelu", 4, False),
                                                ("gelu", 32, True)])
def test_leaving_out_candidates_that_err_past_the_limit_changes_no_choice(kind, reach, crosses):
    """The exact replay's limit is the error variance the largest bound a probe may give a slot allows, times
    LIMIT_MARGIN; below it, the cheapest codec among the trials it made is the cheapest among all candidates.
    Swept over allowed variances up to the most a decision may allow (uniform noise, where quant beats sz, and
    a GELU output), for a slot that may reach 4x the bound it is tried at (where trials are left out) and 32x
    (where quant at 2 bits and fp8 are choices). On the GELU output up to 4x, sz (with the entropy stage's codes
    layout) is the cheapest at every variance, so that sweep checks the pruning without crossing codecs."""
    generator = torch.Generator().manual_seed(0)
    data = torch.rand(65536, generator=generator) + 1.0 if kind == "uniform" else \
        F.gelu(torch.randn(65536, generator=generator))
    controller = AdaptiveController()
    trial_bound = 0.01 * float(data.max() - data.min())  # the recorders' probe_rel of its range
    largest = reach * trial_bound  # the largest bound the decision may give the slot (passed as its limit)
    entropy = controller.options.entropy  # as the controller's exact replay measures: its sz bytes are with it
    full = RecordingPolicy({}, candidates=FAMILIES["all"], keep_samples=True, entropy=entropy)
    limited = RecordingPolicy({}, candidates=FAMILIES["all"], bound_limits={"t#0": largest}, keep_samples=True,
                              entropy=entropy)
    slots = []
    for recorder in (full, limited):
        recorder._key = "t#0"
        record = recorder._record(data, None)
        slots.append(Slot(numel=record.numel, value_range=record.value_range, nbytes=record.nbytes,
                          trials=[vars(t) for t in record.trials], kappa=record.trial_mse / (record.trial_bound ** 2 / 3)))
    everything, pruned = slots
    controller.slots["t#0"] = everything
    tried, all_tried = (sum(math.isfinite(t["mse"]) for t in slot.trials) for slot in (pruned, everything))
    assert tried < all_tried if reach == 4 else tried <= all_tried
    most = everything.kappa * largest ** 2 / 3
    chosen = set()
    crossings = [1.05 * t["mse"] for t in everything.trials if t["mse"] <= most]  # where a codec becomes allowed
    for allowed in sorted([*crossings, *(most * torch.logspace(-6, 0, 61)).tolist()]):
        pruned.bound = everything.bound = math.sqrt(3 * allowed / everything.kappa)  # as decide sets them
        sz_bytes = controller._sz_bytes_at_bounds(["t#0"], {"t#0": allowed}, {"t#0": record.sample})["t#0"]
        choice = controller._cheapest(everything, allowed, sz_bytes)
        assert controller._cheapest(pruned, allowed, sz_bytes) == choice
        chosen.add(spec_from_config(choice))
    assert (len(chosen) >= 2) == crosses  # the sweep crosses from one codec to another


def _controller_on(tensor: torch.Tensor, allowed: float) -> AdaptiveController:
    """A controller with one slot holding ``tensor`` as a probe records it (trial encodes, its sample kept), whose
    budget allows the error variance ``allowed``: one module of sensitivity 1 whose gradient's sampling variance
    is allowed / alpha."""
    controller = AdaptiveController()
    recorder = RecordingPolicy({}, candidates=FAMILIES["all"], keep_samples=True, entropy=controller.options.entropy)
    record = recorder._record(tensor, None)
    slot = Slot(numel=record.numel, value_range=record.value_range, nbytes=record.nbytes,
                trials=[vars(trial) for trial in record.trials], kappa=record.trial_mse / (record.trial_bound ** 2 / 3),
                sensitivity={"m": 1.0}, measured_bound=record.value_range)
    controller.slots["t#0"] = slot
    controller.noise = {"m": allowed / controller.options.alpha}
    controller.decide({"m": GradStat(norm=1.0, max_abs=1.0, numel=1)}, {"t#0": record.sample})
    return controller


def _sz_bytes(controller: AdaptiveController, tensor: torch.Tensor) -> int:
    """sz's packed bytes of ``tensor`` (under the sample size: encoded whole) at the bound the controller decided for
    its one slot, with its entropy stage: what its decision compared."""
    bound = controller.slots["t#0"].bound
    packed = get_codec(with_stage({"id": "sz", "mode": "abs", "bound": bound}, controller.options.entropy)).encode(tensor)
    return len(packed.header) + packed.data.numel()


def test_quant_is_not_tried_on_a_tensor_with_zeros_except_by_the_actnn_baseline():
    """Stochastic rounding moves values across zero, which the sign rule refuses where a tensor has zeros: the
    adaptive controller's exact replay does not try quant there (nor does it choose it); the ActNN baseline,
    which quantizes ReLU outputs, does."""
    relu = torch.relu(torch.randn(65536, generator=torch.Generator().manual_seed(0)))
    dense = relu + 1.0
    adaptive = RecordingPolicy({}, candidates=FAMILIES["all"])
    actnn = RecordingPolicy({}, candidates=FAMILIES["quant"], sign_rule=False)

    def quant_trials(recorder, tensor):
        return [t for t in recorder._record(tensor, None).trials if t.codec["id"] == "quant"]

    assert all(t.nbytes == float("inf") and not t.safe for t in quant_trials(adaptive, relu))
    assert all(t.nbytes < relu.nbytes and t.safe for t in quant_trials(adaptive, dense))
    assert all(t.nbytes < relu.nbytes and not t.safe for t in quant_trials(actnn, relu))  # encoded, fails the rule
    assert AdaptiveController.sign_rule and not ActnnController.sign_rule


def test_quant_is_chosen_where_it_meets_the_target_in_fewer_bytes_than_sz():
    noise = torch.rand(65536, generator=torch.Generator().manual_seed(0)) + 1.0  # no structure for sz's predictor
    quant8 = {"id": "quant", "bits": 8, "seed": 0}
    probe = _controller_on(noise, 1.0).slots["t#0"]
    allowed = 1.05 * probe.trial(quant8)["mse"]
    controller = _controller_on(noise, allowed)
    slot = controller.slots["t#0"]
    assert slot.codec == quant8, slot.codec
    assert slot.variance() <= allowed
    assert slot.trial(quant8)["nbytes"] < _sz_bytes(controller, noise)  # measured: quant is the smaller


def test_sz_is_chosen_where_it_meets_the_target_in_fewer_bytes_than_quant():
    generator = torch.Generator().manual_seed(0)
    spiky = torch.randn(65536, generator=generator) * (1 + 50 * (torch.rand(65536, generator=generator) < 0.01))
    # a spike in most groups of 256 sets quant's step; sz's bins follow the bound, whatever the spikes
    quant8 = {"id": "quant", "bits": 8, "seed": 0}
    allowed = 1.05 * _controller_on(spiky, 1.0).slots["t#0"].trial(quant8)["mse"]
    controller = _controller_on(spiky, allowed)
    slot = controller.slots["t#0"]
    assert slot.codec is None and slot.config()["id"] == "sz"
    assert slot.variance() <= allowed
    assert _sz_bytes(controller, spiky) < slot.trial(quant8)["nbytes"]


def test_a_codec_that_moves_values_across_zero_is_not_offered_where_the_tensor_has_zeros():
    relu = F.relu(torch.randn(65536, generator=torch.Generator().manual_seed(0)))  # a ReLU output: half zeros
    controller = _controller_on(relu, 1.0)  # a loose target: every codec meets it
    slot = controller.slots["t#0"]
    quant = [t for t in slot.trials if t["codec"]["id"] == "quant"]
    assert quant and all(t["safe"] == 0 for t in quant)  # quant decodes zeros to nonzero values
    assert slot.codec is None or slot.codec["id"] != "quant"


UNCOMPRESSED = 2_196_292  # bytes the CNN's step saves uncompressed (tests/test_adaptive_budget.py)


@pytest.mark.parametrize("fraction", [1 / 6, 1 / 12])
def test_budget_mode_with_codec_choice_packs_within_the_budget(fraction):
    budget = int(UNCOMPRESSED * fraction)
    torch.manual_seed(0)
    model = WideCNN(channels=8, depth=4)
    policy = Policy.adaptive(budget=budget, probe_every=10**6)
    wide_cnn_step(model, policy)
    controller = policy.controller
    assert controller.options.codecs == "all" and controller.predicted_bytes() <= budget
    for seed in (0, 1):
        stats = wide_cnn_step(model, policy, seed)
        assert stats.packed_bytes <= budget, (stats.packed_bytes, budget)


def test_actnn_packs_within_its_bits_with_quant_at_1_2_4_or_8_bits():
    torch.manual_seed(0)
    model = WideCNN(channels=8, depth=4)
    policy = hpcdl.runtime.policy_from_spec("actnn:bits=2")
    assert policy.describe() == "actnn:bits=2"
    wide_cnn_step(model, policy)  # the probe
    controller = policy.controller
    chosen = [slot.codec for slot in controller.slots.values() if slot.codec is not None]
    assert chosen and all(c["id"] == "quant" and c["bits"] in QUANT_BITS for c in chosen)
    assert len({c["bits"] for c in chosen}) > 1  # allocated per slot, not uniform
    quantized = [slot for slot in controller.slots.values() if slot.codec is not None]
    assert controller.byte_budget() == pytest.approx(sum(slot.trial({**QUANT_ONE_BIT})["nbytes"] + slot.numel / 8
                                                         for slot in quantized))
    packed = []
    original_encode = Quant.encode

    def encode(self, tensor):
        result = original_encode(self, tensor)
        packed.append(result.nbytes)
        return result

    for seed in (0, 1):
        packed.clear()
        with mock.patch.object(Quant, "encode", encode):
            wide_cnn_step(model, policy, seed)
        assert len(packed) == len(quantized) and sum(packed) <= controller.byte_budget(), (sum(packed), controller.byte_budget())
    record = controller.report()
    assert record["budget_bytes"] == controller.byte_budget() >= record["predicted_bytes"]
    assert {row["codec"] for row in record["slots"].values()} - {"none"} <= {f"quant:bits={b},seed=0" for b in QUANT_BITS}


QUANT_ONE_BIT = {"id": "quant", "bits": 1, "seed": 0}


def test_actnn_method_spec_runs_a_training_step(tmp_path):
    from hpcdl.train import load_config, run_training

    method = parse_method("actnn:bits=2")
    assert method.kind == "codec" and method.codec_config == {"id": "actnn", "bits": 2}
    assert hpcdl.runtime.policy_from_spec(method.policy).describe() == "actnn:bits=2"
    config = load_config("hep-particles", overrides=[
        "data.dataset=synthetic", "data.synthetic_samples=32", "model.scale=tiny", "train.batch=16",
        "train.steps_per_epoch=2", "train.epochs=1", "logging.progress=false", *method.overrides()])
    result = run_training(config, run_dir=tmp_path / "run")
    assert result.steps == 2 and result.method == "codec:actnn:bits=2"
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    decisions = [record for record in records if record["kind"] == "compression"]
    assert decisions and decisions[0]["predicted_bytes"] <= decisions[0]["budget_bytes"]
    assert any(row["codec"].startswith("quant:bits=") for row in decisions[0]["slots"].values())


def test_bad_codec_choice_options_say_what_is_right():
    with pytest.raises(hpcdl.runtime.PolicySpecError, match="codecs is one of all, sz, quant"):
        hpcdl.runtime.policy_from_spec("adaptive:codecs=zfp")
    with pytest.raises(hpcdl.runtime.PolicySpecError, match="between 1 and 8"):
        hpcdl.runtime.policy_from_spec("actnn:bits=12")
    assert AdaptiveOptions.parse({"codecs": "sz"}).codecs == "sz"
