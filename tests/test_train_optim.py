"""LARS, LAMB, learning-rate scaling and the warm-up schedule, against hand-computed updates."""

from __future__ import annotations

import math

import pytest
import torch

from hpcdl.train.config import load_config
from hpcdl.train.optim import LAMB, LARS, WarmupSchedule, build_optimizer, build_scheduler, effective_lr


def test_lamb_first_step_matches_formula():
    weight = torch.tensor([[3.0, 4.0]], requires_grad=True)
    weight.grad = torch.tensor([[0.5, -2.0]])
    LAMB([weight], lr=0.1, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01).step()
    start, grad = torch.tensor([[3.0, 4.0]]), torch.tensor([[0.5, -2.0]])
    # After one step the bias-corrected moments are g and g^2, so the Adam direction is g/(|g|+eps).
    update = grad / (grad.abs() + 1e-6) + 0.01 * start
    expected = start - 0.1 * (start.norm() / update.norm()) * update
    torch.testing.assert_close(weight.detach(), expected)


def test_lars_scales_matrices_but_not_biases():
    weight = torch.tensor([[3.0, 4.0]], requires_grad=True)
    bias = torch.tensor([1.0], requires_grad=True)
    weight.grad, bias.grad = torch.tensor([[0.0, 1.0]]), torch.tensor([2.0])
    LARS([weight, bias], lr=0.5, momentum=0.9, weight_decay=0.1, trust_coefficient=0.01).step()
    update = torch.tensor([[0.0, 1.0]]) + 0.1 * torch.tensor([[3.0, 4.0]])
    trust = 0.01 * 5.0 / update.norm()
    torch.testing.assert_close(weight.detach(), torch.tensor([[3.0, 4.0]]) - 0.5 * trust * update)
    torch.testing.assert_close(bias.detach(), torch.tensor([1.0 - 0.5 * 2.0]))


@pytest.mark.parametrize("name", ["sgd", "adamw", "lamb", "lars"])
def test_every_optimizer_fits_a_linear_regression(name):
    torch.manual_seed(0)
    inputs = torch.randn(256, 8)
    targets = inputs @ torch.randn(8, 1)
    model = torch.nn.Linear(8, 1)
    lr = {"sgd": 0.05, "adamw": 0.05, "lamb": 0.05, "lars": 0.3}[name]
    config = load_config({"model": {"name": "x"}, "optimizer": {"name": name, "lr": lr, "trust_coefficient": 0.01}})
    config = config["optimizer"]
    optimizer = build_optimizer(model.parameters(), config, global_batch=256)
    first = None
    for _ in range(200):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        first = first if first is not None else loss.item()
    assert loss.item() < 0.05 * first


def test_linear_scaling_and_warmup_then_cosine():
    config = load_config({"model": {"name": "x"}, "optimizer": {
        "lr": 0.1, "lr_scaling": "linear", "base_batch": 32, "warmup_steps": 4, "schedule": "cosine"}})["optimizer"]
    assert effective_lr(config, 128) == pytest.approx(0.4)
    model = torch.nn.Linear(2, 2)
    optimizer = build_optimizer(model.parameters(), config, global_batch=128)
    scheduler = build_scheduler(optimizer, config, total_steps=14)
    rates = []
    for _ in range(14):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates[:4] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert rates[4] == pytest.approx(0.4) and rates[9] == pytest.approx(0.4 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert all(a >= b for a, b in zip(rates[4:], rates[5:]))
    assert WarmupSchedule(0, 10, "constant")(7) == 1.0
