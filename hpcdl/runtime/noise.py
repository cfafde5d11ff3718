"""Each module's gradient sampling variance, from the gradients of three consecutive steps (the adaptive budget).

The adaptive controller holds each module's predicted compression error under a fraction ``alpha`` of the
variance its minibatch gradient already has from the sampling of the batch, so that the compression noise
hides under SGD's own noise (the comparison GACT and ActNN make; docs/adaptive.md). That variance is

    V_m = E || g_m - E g_m ||^2      (g_m: module m's gradient of one step's batch, after the reduction over ranks)

Estimate: with ``g_t = G(theta_t) + xi_t`` (``G`` the full-data gradient, the ``xi_t`` independent with
``E||xi_t||^2 = V``), the second difference ``g_{t+1} - 2 g_t + g_{t-1}`` is ``xi_{t+1} - 2 xi_t + xi_{t-1}``
plus the second difference of ``G`` along the optimizer's path, which is of the order of the learning rate
squared. So ``E||g_{t+1} - 2 g_t + g_{t-1}||^2 = 6 V``: the drift of the true gradient between the steps
cancels to first order (a first difference ``g_{t+1} - g_t`` would count it as noise and loosen the bounds).

Memory: not whole gradients. Each parameter keeps the same :data:`SAMPLE` coordinates at every step (fixed
random ones, or all of a smaller parameter), and ``numel / k`` times their sum of squares estimates the squared
norm (unbiased over the choice of coordinates). One estimate is one draw of a chi-square-like variable, so the
controller averages the estimates of its probes (:func:`blend`).
"""

from __future__ import annotations

import torch

from hpcdl.runtime.observe import ROOT

#: Coordinates sampled per parameter; a parameter with fewer is taken whole.
SAMPLE = 1024
#: Weight of the newest estimate in the running mean of a module's variance (see :func:`blend`).
NEWEST_WEIGHT = 0.5


def _coordinates(numel: int, index: int) -> torch.Tensor | None:
    """The fixed coordinates sampled from a parameter of ``numel`` elements (the ``index``-th one); None: all."""
    if numel <= SAMPLE:
        return None
    generator = torch.Generator().manual_seed(index)
    # a copy: the slice alone would keep the whole permutation alive, 8 bytes per parameter element for the run
    return torch.randperm(numel, generator=generator)[:SAMPLE].clone()


class GradientSamples:
    """Fixed coordinates of each module's parameter gradients at consecutive steps, and the variance they give."""

    def __init__(self) -> None:
        self.steps: list[int] = []                  # the steps sampled, oldest first (at most 3, consecutive)
        self.samples: list[dict[str, list[torch.Tensor]]] = []
        self.scales: dict[str, list[float]] = {}    # per module and parameter: numel / coordinates sampled
        self._coordinates: dict[int, torch.Tensor | None] = {}

    def add(self, model: torch.nn.Module, step: int) -> None:
        """Sample the gradients of ``step``, forgetting samples that are not of the two steps just before it."""
        if self.steps and self.steps[-1] != step - 1:
            self.steps, self.samples = [], []
        sample: dict[str, list[torch.Tensor]] = {}
        for name, module in model.named_modules():
            parts, scales = [], []
            for param in module.parameters(recurse=False):
                if param.grad is None or not param.grad.numel():
                    continue
                if id(param) not in self._coordinates:  # the n-th parameter met gets the n-th fixed choice
                    self._coordinates[id(param)] = _coordinates(param.numel(), len(self._coordinates))
                chosen = self._coordinates[id(param)]
                flat = param.grad.detach().reshape(-1)
                if chosen is not None:
                    chosen = chosen.to(flat.device)
                parts.append((flat if chosen is None else flat[chosen]).double().cpu())
                scales.append(1.0 if chosen is None else param.numel() / len(chosen))
            if parts:
                sample[name or ROOT] = parts
                self.scales[name or ROOT] = scales
        self.steps, self.samples = [*self.steps, step][-3:], [*self.samples, sample][-3:]

    def state_dict(self) -> dict:
        """The samples kept for the next estimate (a resumed run estimates as the uninterrupted one)."""
        return {"steps": list(self.steps), "scales": dict(self.scales),
                "samples": [{m: [t.tolist() for t in parts] for m, parts in sample.items()} for sample in self.samples]}

    def load_state_dict(self, state: dict) -> None:
        self.steps, self.scales = [int(step) for step in state["steps"]], dict(state["scales"])
        self.samples = [{m: [torch.tensor(values, dtype=torch.float64) for values in parts]
                         for m, parts in sample.items()} for sample in state["samples"]]

    def variance(self) -> dict[str, float]:
        """Per module, ``||g_{t+1} - 2 g_t + g_{t-1}||^2 / 6`` from the last three steps; empty until there are three."""
        if len(self.samples) < 3:
            return {}
        older, middle, newest = self.samples
        variance: dict[str, float] = {}
        for module, parts in newest.items():
            if module not in older or module not in middle or len(older[module]) != len(parts):
                continue
            total = sum(scale * float((c - 2 * b + a).square().sum())
                        for scale, a, b, c in zip(self.scales[module], older[module], middle[module], parts))
            variance[module] = total / 6
        self.steps, self.samples = [], []  # an estimate uses its samples once
        return variance


def blend(old: dict[str, float], new: dict[str, float]) -> dict[str, float]:
    """The running mean of each module's variance: ``NEWEST_WEIGHT`` on the newest estimate (a module not
    estimated this time keeps its old value; a new one starts at its estimate)."""
    merged = dict(old)
    for module, value in new.items():
        merged[module] = value if module not in old else NEWEST_WEIGHT * value + (1 - NEWEST_WEIGHT) * old[module]
    return merged
