"""Sharing the modules' gradient-error budgets among the slots that reach them (hpcdl.runtime.error_budget).

On random problems: every module's budget holds, every cap holds, no allocation spends more bits than the earlier
rule (each slot a share of each module's budget by its size, the tightest), and at the result no single slot
could take more variance on its own (the optimum of the concave problem, to the iteration's tolerance).
"""

from __future__ import annotations

import math
import random

import pytest

from hpcdl.runtime.error_budget import allocate


def _problem(rng: random.Random):
    slots, modules = rng.randint(1, 25), rng.randint(1, 15)
    numel = {f"s{i}": rng.choice([1e3, 1e4, 1e5]) * rng.random() + 1 for i in range(slots)}
    sensitivity = {key: {f"m{m}": 10 ** rng.uniform(-3, 3) for m in range(modules) if rng.random() < 0.4}
                   for key in numel}
    budget = {f"m{m}": 10 ** rng.uniform(-2, 2) for m in range(modules)}
    cap = {key: 10 ** rng.uniform(-1, 3) if rng.random() < 0.5 else math.inf for key in numel}
    return numel, sensitivity, budget, cap


def _used(module, sensitivity, variances):
    return sum(row[module] * variances[key] for key, row in sensitivity.items() if module in row)


def _shared(numel, sensitivity, budget, cap):
    reach = {m: sum(numel[key] for key, row in sensitivity.items() if m in row) for m in budget}
    return {key: min([cap[key]] + [budget[m] * numel[key] / reach[m] / s for m, s in sensitivity[key].items()])
            for key in numel}


def _bits(numel, variances):
    return sum(numel[key] * math.log2(v) for key, v in variances.items() if math.isfinite(v))


@pytest.mark.parametrize("seed", range(40))
def test_budgets_hold_and_no_slot_could_take_more(seed):
    numel, sensitivity, budget, cap = _problem(random.Random(seed))
    variances = allocate(numel, sensitivity, budget, cap)
    for module, allowed in budget.items():
        assert _used(module, sensitivity, variances) <= allowed * (1 + 1e-9)
    for key, v in variances.items():
        assert 0 < v <= cap[key]
        if not sensitivity[key]:
            assert v == cap[key]  # reaches no module: only its cap holds it
            continue
        # the most this slot alone could grow: to its cap or to the first module it fills up
        room = min([cap[key] / v] + [1 + (budget[m] - _used(m, sensitivity, variances)) / (s * v)
                                     for m, s in sensitivity[key].items()])
        assert room <= 1.05, (key, room)
    assert _bits(numel, variances) >= _bits(numel, _shared(numel, sensitivity, budget, cap)) - 1e-6


def test_a_batch_norm_input_takes_the_budget_the_layers_after_it_leave_unused():
    """A batch norm's input reaches its own module and the ones before it; slots of the layers after it reach
    those too but are held by their own modules. The earlier rule gave the input a small share of every module
    it reaches; sharing by the optimum gives it what the others leave."""
    numel = {"bn#0": 1000.0, **{f"later{i}#0": 1000.0 for i in range(9)}}
    sensitivity = {"bn#0": {"bn": 1.0, "conv": 1.0},
                   **{f"later{i}#0": {f"later{i}": 1.0, "bn": 1e-3, "conv": 1e-3} for i in range(9)}}
    budget = {"bn": 1.0, "conv": 1.0, **{f"later{i}": 1.0 for i in range(9)}}
    cap = {key: math.inf for key in numel}
    shared = _shared(numel, sensitivity, budget, cap)
    variances = allocate(numel, sensitivity, budget, cap)
    assert shared["bn#0"] == pytest.approx(0.1)  # a tenth of its module's budget: 10 slots reach it
    assert variances["bn#0"] > 0.9  # nearly all of it: the later slots use 1e-3 of it each
    assert all(variances[f"later{i}#0"] == pytest.approx(1.0, rel=0.02) for i in range(9))
