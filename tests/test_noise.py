"""The gradient sampling variance behind the adaptive budget (hpcdl.runtime.noise): the estimate is unbiased,
the drift of the true gradient between steps cancels, and the controller uses it once it has one."""

from __future__ import annotations

import math

import torch
from torch import nn

from hpcdl.runtime import Policy, compressed
from hpcdl.runtime.noise import SAMPLE, GradientSamples, blend
from hpcdl.runtime.observe import ROOT


def _with_gradients(model: nn.Module, gradients: list[torch.Tensor]) -> nn.Module:
    for param, grad in zip(model.parameters(), gradients):
        param.grad = grad.reshape(param.shape).clone()
    return model


def _estimate(model, true_gradient, drift, sigma, generator) -> dict[str, float]:
    samples = GradientSamples()
    for step in range(3):
        grads = [g + step * d + sigma * torch.randn(g.shape, generator=generator, dtype=torch.float64).float()
                 for g, d in zip(true_gradient, drift)]
        samples.add(_with_gradients(model, grads), step)
    return samples.variance()


def test_the_estimate_is_the_sampling_variance_and_a_linear_drift_cancels():
    """Gradients G + t * D + noise of known variance: the mean estimate over 200 trials is within 5% of the
    variance, with a drift D 30 times the noise's size (a first difference would be 450 times too large)."""
    generator = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(100, 50), nn.Linear(50, 3))  # one weight above SAMPLE coordinates (5000)
    shapes = [p.shape for p in model.parameters()]
    true_gradient = [torch.randn(shape, generator=generator) for shape in shapes]
    drift = [30 * 0.01 * torch.randn(shape, generator=generator) for shape in shapes]
    sigma = 0.01
    trials = [_estimate(model, true_gradient, drift, sigma, generator) for _ in range(200)]
    assert any(p.numel() > SAMPLE for p in model.parameters())
    for name, module in model.named_modules():
        own = list(module.parameters(recurse=False))
        if not own:
            continue
        variance = sum(p.numel() for p in own) * sigma ** 2
        mean = sum(trial[name or ROOT] for trial in trials) / len(trials)
        assert math.isclose(mean, variance, rel_tol=0.05), (name, mean, variance)


def test_the_samples_hold_their_coordinates_not_the_parameters_size():
    """The samples of a large parameter's gradient take memory of the order of SAMPLE, not of the parameter: a
    view of the whole random permutation the coordinates are drawn from held 8 bytes per parameter element for
    the run (323 MiB at DeepCAM's full width, 40 M parameters)."""
    model = nn.Linear(1000, 1000)
    samples = GradientSamples()
    for step in range(3):
        samples.add(_with_gradients(model, [torch.randn(p.shape) for p in model.parameters()]), step)
    held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in [*samples._coordinates.values(), *(t for s in samples.samples for ts in s.values() for t in ts)]
            if t is not None}
    assert sum(held.values()) <= 3 * (SAMPLE + 1000) * 8 + SAMPLE * 8  # three steps' float64 samples, one choice


def test_only_three_consecutive_steps_give_an_estimate():
    model = nn.Linear(4, 2)
    samples = GradientSamples()
    for step in (0, 1, 3, 4):  # a gap after step 1: steps 0 and 1 are forgotten
        samples.add(_with_gradients(model, [torch.randn(8), torch.randn(2)]), step)
    assert samples.variance() == {}
    samples.add(_with_gradients(model, [torch.randn(8), torch.randn(2)]), 5)
    assert set(samples.variance()) == {ROOT}
    assert samples.variance() == {}, "an estimate uses its samples once"


def test_blend_averages_the_newest_estimate_with_the_old_ones():
    assert blend({"a": 4.0, "b": 1.0}, {"a": 2.0, "c": 5.0}) == {"a": 3.0, "b": 1.0, "c": 5.0}


def test_the_controller_budgets_against_the_estimated_variance_after_its_first_probe():
    """Probes at steps 0, 4 and 8: the first has no gradients before it and falls back on ||g||^2; the next two
    sample steps 2-4 and 6-8, and every budgeted module then has a positive variance that the decisions use."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    policy = Policy.adaptive(probe_every=4, reruns=10)
    controller = policy.controller
    noise_after = {}
    for step in range(9):
        x = torch.randn(256, 32)
        with compressed(model, policy, threshold=0):
            loss = (model(x) - x[:, :1]).square().mean()
        optimizer.zero_grad()
        loss.backward()
        if policy.wants_gradients():
            policy.record_gradients(model)
        noise_after[step] = dict(controller.noise)
    assert controller.probes == 3
    assert noise_after[0] == {} and noise_after[3] == {}
    assert set(noise_after[4]) == {"0", "2", "4"} and all(v > 0 for v in noise_after[4].values())
    reference = controller.reference(policy.grad_stats)
    assert all(reference[m] == controller.noise[m] / controller.correction.get(m, 1.0) for m in controller.noise)
    report = controller.check  # the last probe's check: what it measured corrects what the model predicted
    assert report and all(row["noise"] == controller.noise.get(m, 0.0) for m, row in report.items())
    assert all(controller.correction[m] == max(1.0, row["measured"] / row["predicted"])
               for m, row in report.items() if row["predicted"] > 0)
