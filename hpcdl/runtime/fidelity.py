"""How far a policy moves the parameter gradients: one step's gradients, exact and compressed, compared.

Issue 13's measure of whether a policy is safe to use: the cosine between the concatenated parameter
gradients of one forward and backward under the policy and those of the same step kept exact (same weights,
same input, same dropout masks), and the worst such cosine over the modules that own parameters. The tests of
the reproductions, ``hpcdl bench gradients`` and the check of the default policy all measure it here.

>>> import torch
>>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
>>> x = torch.randn(64, 8)
>>> exact = step_gradients(model, x, lambda out: out.square().mean()).gradients
>>> step = step_gradients(model, x, lambda out: out.square().mean(), "sz:rel=1e-3")
>>> gradient_cosine(step.gradients, exact) > 0.99
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from hpcdl.runtime.policy import Policy, as_policy
from hpcdl.runtime.session import compressed
from hpcdl.runtime.stats import Stats


@dataclass
class StepGradients:
    """The parameter gradients of one step (by parameter name), what its session saved (None when exact), and
    whether the policy read the gradients afterwards (an adaptive policy's probe step)."""

    gradients: dict[str, torch.Tensor]
    stats: Stats | None
    probed: bool


def step_gradients(model: torch.nn.Module, inputs, loss_fn: Callable[[object], torch.Tensor],
                   policy: Policy | str | dict | None = None, *, seed: int = 0) -> StepGradients:
    """One forward and backward of ``model`` on ``inputs``, compressed under ``policy`` (exact when None).

    The global RNG is seeded with ``seed`` before the forward, so every call draws the same dropout masks.
    A policy that asks for gradient statistics (:meth:`Policy.wants_gradients`) gets them after backward, as
    :func:`hpcdl.runtime.methods.train_step` gives them: an adaptive policy probes on such a step and
    compresses on the next ones. No optimizer step: the weights stay as they are, so calls compare.
    """
    policy = as_policy(policy)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    if policy is None:
        loss_fn(model(inputs)).backward()
        stats = None
    else:
        with compressed(model, policy) as session:
            loss = loss_fn(model(inputs))
        loss.backward()
        stats = session.stats
    probed = policy is not None and policy.wants_gradients()
    if policy is not None and probed:
        policy.record_gradients(model)
    gradients = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return StepGradients(gradients, stats, probed)


def _flat(gradients: Mapping[str, torch.Tensor], names) -> torch.Tensor:
    return torch.cat([gradients[name].detach().flatten().double() for name in names])


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    norms = float(a.norm()) * float(b.norm())
    return float(a @ b) / norms if norms > 0 else math.nan


def _same_names(got: Mapping[str, torch.Tensor], exact: Mapping[str, torch.Tensor]) -> list[str]:
    if set(got) != set(exact):
        raise ValueError(f"the two steps have gradients of different parameters: only in one, "
                         f"{sorted(set(got) ^ set(exact))[:5]}; compare two steps of the same model")
    return list(exact)


def gradient_cosine(got: Mapping[str, torch.Tensor], exact: Mapping[str, torch.Tensor]) -> float:
    """Cosine of the concatenated gradients ``got`` to ``exact`` (both by parameter name), in float64."""
    names = _same_names(got, exact)
    return _cosine(_flat(got, names), _flat(exact, names))


def module_cosines(got: Mapping[str, torch.Tensor], exact: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Per module that owns parameters (``layer1.0.conv1`` for ``layer1.0.conv1.weight``), the cosine of its
    gradients to the exact ones; modules whose exact gradient is zero (undefined cosine) are left out."""
    owned: dict[str, list[str]] = {}
    for name in _same_names(got, exact):
        owned.setdefault(name.rpartition(".")[0] or "(model)", []).append(name)
    cosines = {module: _cosine(_flat(got, names), _flat(exact, names)) for module, names in owned.items()}
    return {module: cosine for module, cosine in cosines.items() if not math.isnan(cosine)}
