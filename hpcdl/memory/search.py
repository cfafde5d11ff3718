"""The largest batch whose measured training-step peak fits a budget: steps of 1, 2, 4, ... away from a start
batch until one probe fits and one does not, then bisection between them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hpcdl.memory.peak import PeakReport, measure_step
from hpcdl.memory.process import FreshProcesses, MeasuringProcess
from hpcdl.memory.step import TrainStep, Workload, step_method
from hpcdl.runtime.methods import ActivationMethod
from hpcdl.runtime.policy import Policy, as_policy
from hpcdl.runtime.session import DEFAULT_THRESHOLD
from hpcdl.units import parse_bytes


@dataclass(frozen=True)
class BatchSearch:
    """The largest batch whose measured peak fits ``budget_bytes``, and every probe behind it."""

    batch_size: int
    peak_bytes: int
    budget_bytes: int
    policy: str
    probes: tuple[tuple[int, PeakReport], ...]
    hit_limit: bool

    @property
    def report(self) -> PeakReport:
        return dict(self.probes)[self.batch_size]


def search_batch(
    model,
    policy: Policy | str | dict | None,
    budget_bytes: int | str,
    *,
    device: str = "cpu",
    start: int = 1,
    limit: int = 1 << 16,
    threshold: int = DEFAULT_THRESHOLD,
    seed: int = 0,
    threads: int | None = None,
    on_probe: Callable[[int, PeakReport], None] | None = None,
    process: MeasuringProcess | FreshProcesses | None = None,
    method: ActivationMethod | None = None,
    optimizer: Callable | None = None,
    warmup_steps: int = 1,
    **workload,
) -> BatchSearch:
    """Search measured peaks for the largest batch within ``budget_bytes``; see :func:`max_batch`.

    ``method`` (an :mod:`hpcdl.runtime.methods` object, instead of ``policy``), ``optimizer`` (a
    picklable ``parameters -> Optimizer``) and ``warmup_steps`` are passed to every probe's :class:`TrainStep`.
    """
    budget = parse_bytes(budget_bytes)
    if not (isinstance(start, int) and isinstance(limit, int) and 1 <= start <= limit):
        raise ValueError(f"need 1 <= start <= limit, got start={start!r}, limit={limit!r}")
    work = Workload.of(model, **workload)
    policy = as_policy(policy)
    chosen = step_method(method, policy, threshold)  # a bad method/policy pair fails before any probe
    label = policy.describe() if policy is not None else chosen.describe()
    probes: dict[int, PeakReport] = {}
    target = torch.device(device)
    child = (process or MeasuringProcess(threads)) if target.type == "cpu" else None

    def fits(batch_size: int) -> bool:
        step = TrainStep(work, batch_size, policy, device, threshold, seed, method, optimizer, warmup_steps)
        try:
            report = child.peak(step) if child else measure_step(step, target)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            report = PeakReport(budget + 1, 0, str(target), "cuda_out_of_memory")
        probes[batch_size] = report
        if on_probe is not None:
            on_probe(batch_size, report)
        return report.worst_bytes <= budget  # a run must also fit its learning steps (an adaptive policy's probes)

    try:
        good, bad = _bracket(fits, start, limit)
        while bad is not None and bad - good > 1:
            middle = (good + bad) // 2
            if fits(middle):
                good = middle
            else:
                bad = middle
    finally:
        if child is not None and child is not process:
            child.close()
    if good == 0:
        raise ValueError(
            f"budget {budget} bytes is smaller than the measured peak of one sample of {work.describe()} with "
            f"method {label} ({probes[1].peak_bytes} bytes); raise the budget, pick a smaller scale or compress more"
        )
    hit_limit = bad is None
    return BatchSearch(good, probes[good].peak_bytes, budget, label, tuple(sorted(probes.items())), hit_limit)


def _bracket(fits: Callable[[int], bool], start: int, limit: int) -> tuple[int, int | None]:
    """The largest batch found to fit (0: none) and the smallest found not to (None: every batch up to ``limit``
    fits), probing away from ``start`` in steps of 1, 2, 4, ...: up while the probes fit, down while they do not.

    Probes grow in cost with the batch, so a good guess is worth most: a start at the answer costs two probes
    (the start and the batch above it), a start of 1 probes 1, 2, 4, 8, ... (doubling)."""
    step = 1
    if fits(start):
        good = start
        while good < limit:
            candidate = min(good + step, limit)
            if not fits(candidate):
                return good, candidate
            good, step = candidate, 2 * step
        return good, None
    bad = start
    while bad > 1:
        candidate = max(bad - step, 1)
        if fits(candidate):
            return candidate, bad
        bad, step = candidate, 2 * step
    return 0, bad


def max_batch(model, policy: Policy | str | dict | None, budget_bytes: int | str, **kw) -> int:
    """The largest per-device batch whose measured training-step peak fits ``budget_bytes``.

    ``model`` is a :class:`Workload`, an ``hpcdl.models`` name (``scale=``,
    ``options=``), a ``(name, scale[, options])`` tuple, or a picklable
    model factory / ``"module:function"`` with ``batch=``. ``policy`` None is
    the uncompressed baseline. Probes away from ``start`` (default 1) in steps
    of 1, 2, 4, ... until one batch fits and the next probed does not, then
    bisects; raises ValueError if one sample does not fit. Keyword arguments
    as :func:`search_batch`.
    """
    return search_batch(model, policy, budget_bytes, **kw).batch_size
