"""How the adaptive controller shares each module's gradient-error budget among the saved tensors that reach it.

Slot ``i`` (``n_i`` elements) compressed with error variance ``v_i`` adds ``S_im * v_i`` to module ``m``'s squared
gradient error, and module ``m`` may take ``B_m`` (``alpha`` times its gradient's sampling variance). The bytes
of slot ``i`` fall by about ``n_i / 2 * log2(v_i)`` bits as ``v_i`` grows, so the variances that cost the fewest
bits solve

    maximise  sum_i n_i log v_i   subject to   sum_i S_im v_i <= B_m  for every module m,   v_i <= c_i

(``c_i``: the slot's cap). It is concave in ``log v``, and its optimum (KKT) is
``v_i = min(c_i, n_i / (2 sum_m lambda_m S_im))`` with a multiplier ``lambda_m >= 0`` per module, positive only where
the module's budget is used up. :func:`allocate` finds the multipliers by the multiplicative fixed point
``lambda_m <- lambda_m * (used_m / B_m)^(3/4)`` (a module that uses less than its budget lowers its price, one that
uses more raises it), then scales every slot down by the worst overrun among the modules it reaches, so every
budget holds exactly whether or not the iteration has converged.

The controller's earlier rule gave slot ``i`` the share ``n_i / sum_{j reaches m} n_j`` of every module's budget and
took the tightest: feasible, but a slot that another module holds tight leaves its share of this one unused, and
a batch norm's input, which reaches its own module and every module before it, got a small share of each. That
rule is the starting point here and a floor: :func:`allocate` returns whichever of the two spends fewer bits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

#: The fixed point's exponent (1 overshoots where slots reach several modules), its iterations at most, and the
#: largest relative change of any slot's variance in one iteration that ends it early.
STEP = 0.75
ITERATIONS = 2000
TOLERANCE = 1e-7


def allocate(numel: Mapping[str, float], sensitivity: Mapping[str, Mapping[str, float]],
             budget: Mapping[str, float], cap: Mapping[str, float]) -> dict[str, float]:
    """Per slot, the largest error variance the modules' budgets allow when they are shared to cost the fewest bits.

    ``numel[i]`` (> 0), ``cap[i]`` (> 0, may be inf), ``sensitivity[i][m]`` (``S_im``; only modules in ``budget``
    with ``budget[m] > 0`` count). A slot that reaches no such module gets its cap."""
    def priced(key: str) -> dict[str, float]:
        return {m: s for m, s in sensitivity.get(key, {}).items() if s > 0 and budget.get(m, 0.0) > 0}

    result = {key: float(cap[key]) for key in numel if not priced(key)}
    keys = sorted(key for key in numel if key not in result)
    if not keys:
        return result
    modules = sorted({m for key in keys for m in priced(key)})
    column = {m: j for j, m in enumerate(modules)}
    S = torch.zeros(len(keys), len(modules), dtype=torch.float64)
    for i, key in enumerate(keys):
        for m, s in priced(key).items():
            S[i, column[m]] = s
    n = torch.tensor([float(numel[key]) for key in keys], dtype=torch.float64)
    c = torch.tensor([float(cap[key]) for key in keys], dtype=torch.float64)
    B = torch.tensor([float(budget[m]) for m in modules], dtype=torch.float64)
    reaches = S > 0
    shared = _shared(S, n, B, c, reaches)
    optimal = _feasible(_multipliers(S, n, B, c, reaches), S, B, reaches)
    best = optimal if _bits_saved(optimal, n) >= _bits_saved(shared, n) else shared
    result.update((key, float(v)) for key, v in zip(keys, best))
    return result


def _variances(lam: torch.Tensor, S: torch.Tensor, n: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The KKT variances for the multipliers ``lam`` (the cap where no module prices the slot)."""
    price = S @ lam
    return torch.where(price > 0, torch.minimum(c, n / (2 * price.clamp(min=1e-300))), c)


def _multipliers(S, n, B, c, reaches) -> torch.Tensor:
    """The variances at the fixed point of the multipliers, from the shared rule's prices; the iteration stops once
    no slot's variance moves by more than TOLERANCE (relative) in a step."""
    lam = (reaches.double().T @ n) / (2 * B)
    v = _variances(lam, S, n, c)
    for _ in range(ITERATIONS):
        lam = (lam * ((S.T @ v) / B) ** STEP).clamp(min=1e-300)
        moved, v = v, _variances(lam, S, n, c)
        finite = torch.isfinite(v) & torch.isfinite(moved)
        if not bool(finite.any()) or float((v[finite] / moved[finite]).log().abs().max()) <= TOLERANCE:
            break
    return v


def _feasible(v, S, B, reaches) -> torch.Tensor:
    """``v`` with each slot scaled down by the largest overrun ``used_m / B_m`` among the modules it reaches: every
    module's error then stays within its budget (each of its terms shrank by at least that module's factor)."""
    over = ((S.T @ v) / B).clamp(min=1.0)
    worst = torch.where(reaches, over.expand_as(S), torch.ones_like(S)).amax(dim=1)
    return v / worst


def _shared(S, n, B, c, reaches) -> torch.Tensor:
    """The earlier rule: slot ``i`` takes ``n_i / sum_{j reaches m} n_j`` of each module's budget, the tightest."""
    reach = reaches.double().T @ n
    allowed = torch.where(reaches, (B * n[:, None] / reach) / S.clamp(min=1e-300), torch.full_like(S, math.inf))
    return torch.minimum(c, allowed.amin(dim=1))


def _bits_saved(v: torch.Tensor, n: torch.Tensor) -> float:
    """``sum_i n_i log2 v_i`` over the slots with a finite variance (what the allocation maximises)."""
    finite = torch.isfinite(v) & (v > 0)
    return float((n[finite] * v[finite].log2()).sum())
