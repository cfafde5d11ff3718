"""Optimizers and learning-rate schedules for large global batches.

Large data-parallel batches need the learning rate scaled with the batch
(linear scaling: ``lr * global_batch / base_batch``), a warm-up so the scaled
rate does not blow up the first steps, and, at the largest batches, layer-wise
adaptive rates: LARS (You, Gitman, Ginsburg 2017, for SGD) and LAMB (You et al.
2019, for Adam; DeepCAM trains with it). Both are written here because torch
does not ship them.
"""

from __future__ import annotations

import functools
import math

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def _trust_ratio(weight: torch.Tensor, update: torch.Tensor, coefficient: float = 1.0) -> torch.Tensor:
    """``coefficient * ||w|| / ||u||``, or 1 where either norm is zero (a fresh zero layer, a zero gradient)."""
    weight_norm, update_norm = weight.norm(), update.norm()
    usable = (weight_norm > 0) & (update_norm > 0)
    return torch.where(usable, coefficient * weight_norm / update_norm, torch.ones_like(weight_norm))


class LARS(Optimizer):
    """SGD with momentum and a layer-wise trust ratio ``eta * ||w|| / ||g + wd * w||``.

    Parameters with one dimension or fewer (biases, normalisation scales) get
    neither weight decay nor the trust ratio, as in the LARS paper's and MLPerf's
    reference implementations.
    """

    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 trust_coefficient: float = 1e-3):
        if lr < 0 or momentum < 0 or weight_decay < 0 or trust_coefficient <= 0:
            raise ValueError(f"LARS needs lr, momentum, weight_decay >= 0 and trust_coefficient > 0; got "
                             f"lr={lr}, momentum={momentum}, weight_decay={weight_decay}, "
                             f"trust_coefficient={trust_coefficient}")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      trust_coefficient=trust_coefficient))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                update = param.grad
                if param.ndim > 1:
                    update = update.add(param, alpha=group["weight_decay"])
                    update = update * _trust_ratio(param, update, group["trust_coefficient"])
                state = self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = update.clone()
                else:
                    state["momentum_buffer"].mul_(group["momentum"]).add_(update)
                param.add_(state["momentum_buffer"], alpha=-group["lr"])
        return loss


class LAMB(Optimizer):
    """Adam moments with decoupled weight decay and a layer-wise trust ratio ``||w|| / ||r||``.

    ``r = m_hat / (sqrt(v_hat) + eps) + weight_decay * w`` with bias-corrected
    moments; the step is ``w -= lr * trust * r``.
    """

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0):
        if lr < 0 or eps <= 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"LAMB needs lr, weight_decay >= 0, eps > 0 and betas in [0, 1); got lr={lr}, "
                             f"betas={betas}, eps={eps}, weight_decay={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)
                state["step"] += 1
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(param.grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(param.grad, param.grad, value=1 - beta2)
                m_hat = exp_avg / (1 - beta1 ** state["step"])
                v_hat = exp_avg_sq / (1 - beta2 ** state["step"])
                update = m_hat / (v_hat.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(param, alpha=group["weight_decay"])
                param.sub_(update * (group["lr"] * _trust_ratio(param, update)))
        return loss


def effective_lr(optimizer_config: dict, global_batch: int) -> float:
    """The peak learning rate after batch scaling (``linear``: lr * global_batch / base_batch)."""
    lr = optimizer_config["lr"]
    if optimizer_config["lr_scaling"] == "linear":
        return lr * global_batch / optimizer_config["base_batch"]
    return lr


def build_optimizer(parameters, optimizer_config: dict, global_batch: int) -> Optimizer:
    """The optimizer a resolved ``optimizer`` config section names, at the batch-scaled peak rate."""
    name, lr = optimizer_config["name"], effective_lr(optimizer_config, global_batch)
    wd, betas = optimizer_config["weight_decay"], tuple(optimizer_config["betas"])
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=lr, momentum=optimizer_config["momentum"], weight_decay=wd)
    if name == "adamw":
        return torch.optim.AdamW(parameters, lr=lr, betas=betas, eps=optimizer_config["eps"], weight_decay=wd)
    if name == "lamb":
        return LAMB(parameters, lr=lr, betas=betas, eps=optimizer_config["eps"], weight_decay=wd)
    if name == "lars":
        return LARS(parameters, lr=lr, momentum=optimizer_config["momentum"], weight_decay=wd,
                    trust_coefficient=optimizer_config["trust_coefficient"])
    raise ValueError(f"unknown optimizer {name!r}; use one of sgd, adamw, lamb, lars")


def optimizer_factory(optimizer_config: dict, global_batch: int):
    """A picklable ``parameters -> Optimizer`` of :func:`build_optimizer`, for a step measured in another process."""
    return functools.partial(build_optimizer, optimizer_config=dict(optimizer_config), global_batch=global_batch)


class WarmupSchedule:
    """Learning-rate multiplier per step: linear warm-up from 1/warmup to 1, then constant or cosine decay.

    A callable object rather than a closure so LambdaLR's state_dict records it.
    """

    def __init__(self, warmup_steps: int, total_steps: int, schedule: str, min_fraction: float = 0.0):
        if schedule not in ("constant", "cosine"):
            raise ValueError(f"unknown schedule {schedule!r}; use constant or cosine")
        self.warmup_steps, self.total_steps = warmup_steps, max(total_steps, 1)
        self.schedule, self.min_fraction = schedule, min_fraction

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return 1.0
        decay_steps = max(self.total_steps - self.warmup_steps, 1)
        progress = min((step - self.warmup_steps) / decay_steps, 1.0)
        return self.min_fraction + (1 - self.min_fraction) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: Optimizer, optimizer_config: dict, total_steps: int) -> LambdaLR:
    """Warm-up then the configured schedule over ``total_steps`` optimizer steps, stepped once per step."""
    return LambdaLR(optimizer, WarmupSchedule(optimizer_config["warmup_steps"], total_steps,
                                              optimizer_config["schedule"], optimizer_config["min_lr_fraction"]))
