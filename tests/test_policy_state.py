"""Policy state: gradient statistics read only when the controller asks, after the reduction, in one batch;
``Policy.state_dict``/``load_state_dict``; a resumed run keeps the policy's (and its controller's) state."""

from __future__ import annotations

import contextlib
import json
import math

import pytest
import torch
from torch import nn

from hpcdl.runtime import methods, policy
from hpcdl.runtime.methods import Codec, train_step
from hpcdl.runtime.policy import Controller, GradStat, Policy
from hpcdl.train.distributed import HorovodBackend

RAW = {"id": "raw"}


class Learning(Controller):
    """Asks for gradients on every ``every``-th step and keeps a running record of them (its state)."""

    def __init__(self, every: int = 1):
        self.every, self.seen, self.norms = every, 0, []

    def choose(self, info):
        return RAW

    def configs(self):
        return [RAW]

    def wants_gradients(self, step):
        return step % self.every == 0

    def observe(self, step, grad_stats):
        self.seen += 1
        self.norms.append(round(sum(stat.norm for stat in grad_stats.values()), 6))

    def state_dict(self):
        return {"seen": self.seen, "norms": list(self.norms)}

    def load_state_dict(self, state):
        self.seen, self.norms = state["seen"], list(state["norms"])


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))


def _steps(model, method, count=4, optimizer=None, **kw):
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.01)
    for index in range(count):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(index))
        train_step(model, method, x, torch.zeros(4, 1), nn.functional.mse_loss, optimizer, **kw)


@pytest.fixture
def reads(monkeypatch):
    """Counts every read of the gradient statistics (the one function that reads gradients)."""
    count = []
    real = policy.gradient_stats
    monkeypatch.setattr(policy, "gradient_stats", lambda model: count.append(1) or real(model))
    return count


def test_the_built_in_policies_read_no_gradients(reads):
    for chosen in (Policy.static(RAW), Policy.per_module({"0": RAW}, default=None)):
        _steps(_model(), Codec(chosen, threshold=0))
        assert chosen.step == 4 and chosen.grad_stats == {}
    _steps(_model(), Codec(Policy.static(RAW), threshold=0) + methods.Recompute(lambda m: [m[0]]))
    assert reads == []


def test_a_controller_that_asks_gets_its_steps_statistics(reads):
    controller = Learning(every=2)
    chosen = Policy(controller)
    _steps(_model(), Codec(chosen, threshold=0))
    # The session counts forwards; steps 1..4 end with policy.step 1..4, of which 2 and 4 ask.
    assert len(reads) == 2 and controller.seen == 2 and chosen.step == 4


def _reference(model) -> dict[str, GradStat]:
    """The per-parameter definition the batched computation must equal."""
    stats = {}
    for name, module in model.named_modules():
        grads = [p.grad for p in module.parameters(recurse=False) if p.grad is not None]
        if grads:
            norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
            largest = max((float(g.abs().max()) for g in grads if g.numel()), default=0.0)
            stats[name or "(model)"] = GradStat(norm, largest, sum(g.numel() for g in grads))
    return stats


def test_batched_gradient_statistics_equal_the_per_parameter_reference():
    model = nn.Module()
    model.net = _model()
    model.extra = nn.Linear(3, 2)  # a module without gradients: not reported
    model.empty = nn.Parameter(torch.empty(0))  # on the root, "(model)", zero elements
    model.net[4].weight.register_hook(lambda g: g * 1e4)  # magnitudes far apart
    loss = model.net(torch.randn(5, 8)).square().mean() + model.empty.sum()
    loss.backward()
    got, want = policy.gradient_stats(model), _reference(model)
    assert set(got) == set(want) == {"(model)", "net.0", "net.2", "net.4"}
    for name in want:
        assert got[name].numel == want[name].numel
        assert got[name].norm == pytest.approx(want[name].norm, rel=1e-6)
        assert got[name].max_abs == pytest.approx(want[name].max_abs, rel=1e-6)
    assert got["(model)"] == GradStat(0.0, 0.0, 0)


class _HorovodLike(torch.optim.SGD):
    """SGD with the calls Horovod's DistributedOptimizer adds, recording their order."""

    def __init__(self, params, events):
        super().__init__(params, lr=0.01)
        self.events, self.skipping = events, False

    def synchronize(self):
        self.events.append("synchronize")

    @contextlib.contextmanager
    def skip_synchronize(self):
        self.skipping = True
        yield
        self.skipping = False

    def step(self, closure=None):
        self.events.append("step" if self.skipping else "step+synchronize")
        return super().step(closure)


def test_gradients_are_read_after_horovods_reduction_and_not_reduced_twice():
    backend = object.__new__(HorovodBackend)  # reduced_gradients needs only the optimizer
    events: list[str] = []

    class Recording(Learning):
        def observe(self, step, grad_stats):
            events.append("observe")
            super().observe(step, grad_stats)

    model = _model()
    _steps(model, Codec(Policy(Recording(every=2)), threshold=0), count=2,
           optimizer=_HorovodLike(model.parameters(), events), reduced_gradients=backend.reduced_gradients)
    # Step 1 does not ask (Horovod synchronizes in step as usual); step 2 asks: reduce, observe, step.
    assert events == ["step+synchronize", "synchronize", "observe", "step"]


def test_policy_state_round_trips_through_json():
    controller = Learning()
    chosen = Policy(controller)
    _steps(_model(), Codec(chosen, threshold=0), count=3)
    state = json.loads(json.dumps(chosen.state_dict()))
    assert state["step"] == 3 and state["controller"]["seen"] == 3 and set(state["grad_stats"]) == {"0", "2", "4"}
    fresh = Policy(Learning())
    fresh.load_state_dict(state)
    assert fresh.step == 3 and fresh.grad_stats == chosen.grad_stats
    assert fresh.controller.state_dict() == controller.state_dict()
    # A checkpoint from before the controller's state existed, and a stateless controller refusing a state.
    static = Policy.static(RAW)
    static.load_state_dict({"step": 5, "grad_stats": {}})
    assert static.step == 5 and static.state_dict() == {"step": 5, "grad_stats": {}, "controller": {}}
    with pytest.raises(ValueError, match="StaticController keeps no state, but was given \\['norms', 'seen'\\]"):
        static.load_state_dict(state)
    with pytest.raises(ValueError, match="a policy state is .* KeyError"):
        static.load_state_dict({"steps": 1})


def test_a_resumed_run_keeps_the_policys_and_its_controllers_state(tmp_path, monkeypatch):
    from hpcdl.train import load_config, run_training, trainer
    from hpcdl.train.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint

    monkeypatch.setattr(trainer, "compression_policy", lambda compression: Policy(Learning()))
    config = load_config("hep-particles", [
        "data.dataset=synthetic", "data.synthetic_samples=64", "model.scale=tiny", "train.batch=8",
        "train.steps_per_epoch=3", "train.epochs=2", "train.val_steps=1", "logging.progress=false",
        "checkpoint.every_steps=2", "checkpoint.keep=5", "compression.method=codec", "compression.codec={id: raw}"])
    run_training(config, run_dir=tmp_path / "run")
    checkpoints = tmp_path / "run" / "checkpoints"
    whole = load_checkpoint(latest_checkpoint(checkpoints))["compression"]
    assert whole["step"] == 6 and whole["controller"]["seen"] == 6 and len(whole["grad_stats"]) > 0
    middle = list_checkpoints(checkpoints)[1]
    assert load_checkpoint(middle)["compression"]["controller"]["seen"] == 4
    resumed = run_training(config, resume=middle)
    assert resumed.resumed_from_step == 4
    assert load_checkpoint(latest_checkpoint(checkpoints))["compression"] == whole
