"""The adaptive controller's memory-budget mode (``Policy.adaptive(budget=...)``, hpcdl/runtime/budget.py).

A step after the probe packs its saved tensors within the budget; a tighter budget loosens the bounds and
raises the predicted error; a budget the loosest bounds cannot meet says so once; the greedy allocation beats
scaling every bound by one factor at the same bytes.
"""

from __future__ import annotations

import itertools
import math
import sys
import warnings
from pathlib import Path

import pytest
import torch

from hpcdl.runtime import Policy, PolicySpecError, policy_from_spec
from hpcdl.runtime import budget as bytes_model

sys.path.insert(0, str(Path(__file__).parent))
from runtime_models import WideCNN, wide_cnn_step  # noqa: E402


def _probed(budget: int, entropy: str = "zstd"):
    """A small CNN and a budget-mode policy after its probe (step 0)."""
    torch.manual_seed(0)
    model = WideCNN(channels=8, depth=4)
    policy = Policy.adaptive(budget=budget, probe_every=10**6, entropy=entropy)
    wide_cnn_step(model, policy)
    assert policy.controller.probes == 1
    return model, policy


UNCOMPRESSED = 2_196_292  # bytes the CNN's step saves uncompressed (the first, all-exact step measures it)


@pytest.mark.parametrize("entropy,spent", [("none", 0.9), ("zstd", 0.85)])
@pytest.mark.parametrize("fraction", [1 / 3, 1 / 8])
def test_a_step_after_the_probe_packs_within_the_budget(fraction, entropy, spent):
    budget = int(UNCOMPRESSED * fraction)
    model, policy = _probed(budget, entropy)
    for seed in (0, 1):  # the probe's batch and another one
        stats = wide_cnn_step(model, policy, seed)
        assert stats.packed_bytes <= budget, (stats.packed_bytes, budget)
        # the budget is spent, not wasted (with the entropy stage the bytes per bound step are coarser: at 1/3
        # the allocation predicts 86% and packs 86%)
        assert stats.packed_bytes >= spent * budget
    assert policy.controller.predicted_bytes() <= budget


def test_a_tighter_budget_loosens_the_bounds_and_raises_the_predicted_error():
    _, loose = _probed(UNCOMPRESSED // 3)
    _, tight = _probed(UNCOMPRESSED // 8)
    loose_slots, tight_slots = loose.controller.slots, tight.controller.slots
    assert all(tight_slots[key].bound >= slot.bound for key, slot in loose_slots.items())
    assert sum(tight_slots[key].bound > slot.bound for key, slot in loose_slots.items()) >= 3
    assert sum(tight.controller.predicted_error().values()) > 2 * sum(loose.controller.predicted_error().values())


def test_an_impossible_budget_warns_once_with_the_least_achievable_bytes():
    with pytest.warns(bytes_model.AdaptiveBudgetWarning, match=r"cannot be met.*loosest bounds.*need .*KiB.*Raise the budget"):
        model, policy = _probed(30_000)  # the loosest bounds need about 40 KiB
    controller = policy.controller
    for slot in controller.slots.values():  # the loosest bounds: the grid point at or just below max_rel
        if slot.nbytes >= 1024 and slot.codec is None:  # (or a codec of fewer bytes still: codec choice)
            assert 2 ** -0.25 < slot.bound / (controller.options.max_rel * slot.value_range) <= 1 + 1e-9
    controller.next_probe = policy.step  # a second probe: no second warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", bytes_model.AdaptiveBudgetWarning)
        wide_cnn_step(model, policy)
    assert controller.probes == 2


def _uniform(choices: dict, value_ranges: dict, budget: float, fixed: float) -> dict[str, int]:
    """The baseline: one fraction of every slot's range as its bound (the grid choice nearest below it; kept
    exact below the ladder), the smallest fraction whose predicted bytes fit ``budget`` (bisection)."""
    def pick(rel: float) -> dict[str, int]:
        chosen = {}
        for key, options in choices.items():
            fitting = [i for i, option in enumerate(options) if 0 < option.bound <= rel * value_ranges[key]]
            chosen[key] = fitting[-1] if fitting else 0  # below the ladder: kept exact
        return chosen
    low, high = -20.0, math.log2(0.1)
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (low, middle) if bytes_model.total_bytes(choices, pick(2 ** middle), fixed) <= budget else (middle, high)
    return pick(2 ** high)


@pytest.mark.parametrize("fraction", [1 / 3, 1 / 6, 1 / 10])
def test_the_greedy_allocation_beats_one_scale_for_every_bound(fraction):
    _, policy = _probed(UNCOMPRESSED)
    controller = policy.controller
    choices = controller.choices(policy.grad_stats)
    budget = UNCOMPRESSED * fraction
    greedy = bytes_model.allocate(choices, budget, controller.fixed_bytes)
    uniform = _uniform(choices, {key: slot.value_range for key, slot in controller.slots.items()}, budget,
                       controller.fixed_bytes)
    assert bytes_model.total_bytes(choices, greedy, controller.fixed_bytes) <= budget
    assert bytes_model.total_bytes(choices, uniform, controller.fixed_bytes) <= budget
    assert bytes_model.total_error(choices, greedy) < bytes_model.total_error(choices, uniform)


def _actnn_greedy(slots: dict, budget: float) -> dict[str, int]:
    """ActNN's allocation: from the tightest choices, loosen by one step the slot whose next step saves the most
    bytes per unit of added error, until the bytes fit."""
    chosen = {key: 0 for key in slots}
    while bytes_model.total_bytes(slots, chosen) > budget:
        steps = [((o[chosen[k]].nbytes - o[chosen[k] + 1].nbytes) / max(o[chosen[k] + 1].error - o[chosen[k]].error, 1e-300), k)
                 for k, o in slots.items() if chosen[k] + 1 < len(o)]
        if not steps:
            break
        chosen[max(steps)[1]] += 1
    return chosen


def test_the_allocation_beats_actnns_greedy_and_is_mostly_optimal_on_small_random_cases():
    generator = torch.Generator().manual_seed(0)
    optimal = cases = 0
    for _ in range(40):
        slots = {}
        for key in "abcd":  # bytes falling and error rising with the bound, with random steps
            saved = torch.rand(4, generator=generator).cumsum(0) * 20
            added = torch.rand(4, generator=generator).cumsum(0) ** 2
            slots[key] = [bytes_model.Choice(0, 100.0, 0.0)] + [
                bytes_model.Choice(2.0 ** j, 100.0 - float(saved[j]), float(added[j])) for j in range(4)]
        for budget in (280.0, 310.0, 340.0, 370.0):
            fitting = [sum(slots[k][i].error for k, i in zip(slots, pick)) for pick in itertools.product(range(5), repeat=4)
                       if sum(slots[k][i].nbytes for k, i in zip(slots, pick)) <= budget]
            if not fitting:
                continue  # no choice fits
            best = min(fitting)
            got = bytes_model.allocate(slots, budget)
            assert bytes_model.total_bytes(slots, got) <= budget
            error = bytes_model.total_error(slots, got)
            assert error <= bytes_model.total_error(slots, _actnn_greedy(slots, budget)) + 1e-9
            optimal += error <= best + 1e-9
            cases += 1
    assert cases >= 100 and optimal >= 0.8 * cases, (optimal, cases)  # a greedy, not an exact knapsack solver


def test_the_budget_option_takes_sizes_in_specs_and_keywords():
    assert policy_from_spec("adaptive:budget=2GiB").controller.options.budget == 2 * 2**30
    assert Policy.adaptive(budget="1.5MB").controller.options.budget == 1_500_000
    assert policy_from_spec("adaptive:budget=2GiB").describe() == "adaptive:budget=2147483648"
    with pytest.raises(PolicySpecError, match="budget is a memory size"):
        policy_from_spec("adaptive:budget=lots")
