"""The adaptive controller's memory-budget mode: per-slot ``sz`` bounds that minimise the predicted gradient error
under a byte budget for the saved activations (``Policy.adaptive(budget=...)``; docs/adaptive.md derives it).

* **Bytes.** A probe encodes each slot with ``sz`` at the fractions :func:`size_rels` of its value range (a
  4x ladder from ``max_rel`` down); between those points the packed bytes are interpolated linearly in
  ``log2 bytes`` against ``log2 bound`` (sz's bits per element fall by about one per doubling of the bound, less
  at loose bounds where they approach their floor). Bounds outside the measured ladder are not offered, except
  0: the slot kept as it is, at its own bytes.
* **Error.** A slot at bound ``eb`` adds ``weight * kappa * eb^2 / 3`` to the predicted error, ``weight`` being
  its sensitivities summed over modules, each divided by that module's squared gradient norm (so the objective
  is the sum over modules of the per-module ratio that ``alpha`` bounds in the default mode).
* **Allocation.** Like ActNN's greedy bit allocation: start with every slot kept exact, then repeatedly take the
  step that saves the most bytes per unit of added error until the predicted bytes fit. One walk steps along
  each slot's lower convex hull of (bytes, error), so one slot's steps come in order of rising cost and the walk
  stops at a point of the multiple-choice knapsack's LP frontier; the other is ActNN's, one ladder step at a
  time. Each is followed by a pass that spends the bytes the final step overshot by tightening slots again
  (any ladder point) while they fit, and the walk of less error wins: never worse than ActNN's greedy.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Size measurements per slot at each probe: max_rel * 4^-k for k below this (0.1 down to 6e-6 of the range).
SIZE_POINTS = 8
#: Candidate bounds per octave (the controller's grid).
STEPS_PER_OCTAVE = 4
#: The allocation plans for this fraction less than the budget: the interpolated sizes ran up to 0.4% low on
#: the small CNN of tests/test_adaptive_budget.py with sz alone, and up to 2.9% low with the entropy stage's codes
#: layouts (whose bytes step where the code width changes, between the ladder's points); the next batch packs a
#: little differently.
HEADROOM = 0.05


class AdaptiveBudgetWarning(UserWarning):
    """Even the loosest bounds the controller allows (``max_rel`` of each range) exceed the memory budget."""


def size_rels(max_rel: float) -> tuple[float, ...]:
    """The fractions of a slot's value range at which a probe measures its packed bytes, loosest first."""
    return tuple(max_rel * 4.0 ** -k for k in range(SIZE_POINTS))


@dataclass(frozen=True)
class Choice:
    """One bound (or codec) a slot may take, with its predicted packed bytes and predicted gradient error."""

    bound: float  # sz abs bound; 0 with no codec: kept as it is
    nbytes: float
    error: float
    codec: dict | None = None  # another codec than sz (a trial encode's, hpcdl.runtime.trials)


def with_codecs(options: Sequence[Choice], codecs: Sequence[Choice]) -> list[Choice]:
    """A slot's sz choices (:func:`choices`, kept exact first) with other codecs' points added, in the order the
    allocation walks them: most bytes first (ties: least error first). Points that save nothing over keeping
    the tensor as it is are left out."""
    added = [c for c in codecs if c.nbytes < options[0].nbytes and math.isfinite(c.error)]
    return walk_order([*options, *added])


def walk_order(options: Sequence[Choice]) -> list[Choice]:
    """Choices in the order the allocation walks them: most bytes first (ties: least error first)."""
    return sorted(options, key=lambda c: (-c.nbytes, c.error))


def packed_bytes(rels: Sequence[float], sizes: Sequence[float], rel: float) -> float:
    """Predicted packed bytes at bound ``rel * range``: log-log interpolation between the measured ``sizes``
    (at ``rels``, loosest first); ``rel`` must lie inside the measured ladder."""
    x = math.log2(rel)
    points = [(math.log2(r), math.log2(max(s, 1.0))) for r, s in zip(rels, sizes)][::-1]  # tightest first
    if not points[0][0] - 1e-9 <= x <= points[-1][0] + 1e-9:
        raise ValueError(f"bound {rel!r} of the range lies outside the measured ladder {list(rels)}")
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return 2.0 ** (y0 + (y1 - y0) * (x - x0) / (x1 - x0))
    return 2.0 ** points[-1][1]


def error_weight(sensitivity: Mapping[str, float], reference: Mapping[str, float]) -> float:
    """sum_m S_im / R_m over the modules with a reference ``R_m`` (the controller's: the sampling variance of the
    module's gradient, or its squared norm): the slot's error per unit of error variance, relative to it."""
    return sum(s / reference[m] for m, s in sensitivity.items() if reference.get(m, 0.0) > 0)


def choices(nbytes: int, value_range: float, rels: Sequence[float], sizes: Sequence[float],
            error_per_square: float) -> list[Choice]:
    """A slot's candidate bounds, tightest first: kept exact, then the grid bounds inside the measured ladder
    (``error_per_square``: weight * kappa / 3, the predicted error per eb^2)."""
    options = [Choice(0.0, float(nbytes), 0.0)]
    if value_range <= 0 or len(sizes) != len(rels) or not sizes:
        return options
    low, high = math.log2(min(rels) * value_range), math.log2(max(rels) * value_range)
    for step in range(math.ceil(low * STEPS_PER_OCTAVE - 1e-9), math.floor(high * STEPS_PER_OCTAVE + 1e-9) + 1):
        bound = 2.0 ** (step / STEPS_PER_OCTAVE)
        rel = min(max(bound / value_range, min(rels)), max(rels))
        options.append(Choice(bound, min(packed_bytes(rels, sizes, rel), float(nbytes)), error_per_square * bound ** 2))
    return options


def _hull(options: Sequence[Choice]) -> list[int]:
    """Indices of the lower convex hull of (bytes saved, error added), tightest first: costs rise along it."""
    hull = [0]
    for j in range(1, len(options)):
        if options[j].nbytes >= options[hull[-1]].nbytes:
            continue  # saves nothing over a tighter bound
        while len(hull) >= 2 and _cost(options, hull[-2], hull[-1]) >= _cost(options, hull[-1], j):
            hull.pop()
        hull.append(j)
    return hull


def _cost(options: Sequence[Choice], tighter: int, looser: int) -> float:
    """Error added per byte saved by moving from ``tighter`` to ``looser``."""
    return (options[looser].error - options[tighter].error) / (options[tighter].nbytes - options[looser].nbytes)


def allocate(slots: Mapping[str, Sequence[Choice]], budget: float, fixed: float = 0.0) -> dict[str, int]:
    """Per slot, the index of its choice: least total error with ``fixed`` + the chosen bytes <= ``budget``.

    Two greedy walks from the tightest choices (module docstring): along each slot's convex hull, and ActNN's
    one step at a time; each followed by a tightening pass, the one of less error kept (neither wins every
    discrete case). When even the loosest choices do not fit, each slot gets its loosest (fewest bytes) choice.
    """
    hulls = {key: _hull(options) for key, options in slots.items()}
    walks = [_greedy(slots, hulls, budget, fixed), _greedy(slots, {k: list(range(len(o))) for k, o in slots.items()}, budget, fixed)]
    if total_bytes(slots, walks[0], fixed) > budget:
        return {key: min(range(len(options)), key=lambda i: options[i].nbytes) for key, options in slots.items()}
    walks = [_tighten(slots, walk, budget - total_bytes(slots, walk, fixed)) for walk in walks
             if total_bytes(slots, walk, fixed) <= budget]
    return min(walks, key=lambda walk: total_error(slots, walk))


def _greedy(slots: Mapping[str, Sequence[Choice]], paths: Mapping[str, list[int]], budget: float,
            fixed: float) -> dict[str, int]:
    """From each path's first choice, repeatedly take the path step of least error per byte saved until the
    bytes fit (or no step is left)."""
    at = {key: 0 for key in slots}
    total = fixed + sum(slots[key][path[0]].nbytes for key, path in paths.items())
    heap = [(_step_cost(slots[key], path[0], path[1]), key) for key, path in paths.items() if len(path) > 1]
    heapq.heapify(heap)
    while total > budget and heap:
        _, key = heapq.heappop(heap)
        path, options = paths[key], slots[key]
        total -= options[path[at[key]]].nbytes - options[path[at[key] + 1]].nbytes
        at[key] += 1
        if at[key] + 1 < len(path):
            heapq.heappush(heap, (_step_cost(options, path[at[key]], path[at[key] + 1]), key))
    return {key: paths[key][at[key]] for key in slots}


def _step_cost(options: Sequence[Choice], tighter: int, looser: int) -> float:
    """:func:`_cost`, infinite for a step that saves no bytes."""
    saved = options[tighter].nbytes - options[looser].nbytes
    return (options[looser].error - options[tighter].error) / saved if saved > 0 else math.inf


def _tighten(slots: Mapping[str, Sequence[Choice]], chosen: dict[str, int], spare: float) -> dict[str, int]:
    """Spend ``spare`` bytes: repeatedly make the tightening that removes the most error and still fits."""
    while True:
        best: tuple[float, str, int, float] | None = None
        for key, index in chosen.items():
            options = slots[key]
            for j in range(index):
                extra = options[j].nbytes - options[index].nbytes
                gain = options[index].error - options[j].error
                if extra <= spare and gain > 0 and (best is None or gain > best[0]):
                    best = (gain, key, j, extra)
        if best is None:
            return chosen
        _, key, j, extra = best
        chosen[key], spare = j, spare - extra


def total_bytes(slots: Mapping[str, Sequence[Choice]], chosen: Mapping[str, int], fixed: float = 0.0) -> float:
    return fixed + sum(slots[key][index].nbytes for key, index in chosen.items())


def total_error(slots: Mapping[str, Sequence[Choice]], chosen: Mapping[str, int]) -> float:
    return sum(slots[key][index].error for key, index in chosen.items())
