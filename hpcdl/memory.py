"""The real peak memory of a training step, and the largest batch that fits a budget.

Users care about peak memory, not the sum of saved tensors: the peak also holds
the layer being computed, gradients, codec scratch space and what backward
decompresses. So this module measures it.

* On CUDA, in this process: ``torch.cuda.max_memory_allocated`` after a reset,
  minus what was allocated before the step.
* On the CPU, in a fresh Python process started with glibc's
  ``MALLOC_MMAP_THRESHOLD_`` set small, so every freed tensor goes back to the
  system and resident memory follows live tensors. The step's peak is the
  peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs``) minus
  the resident set just before the step, after the model, data and optimizer
  exist and one warm-up step has run, so the number is the step's own.

:func:`peak` measures one step; :func:`max_batch` searches over measured peaks
(doubling, then bisection) for the largest per-device batch within a budget.

A step is described by a :class:`TrainStep` (a :class:`Workload`, a batch
size and a policy). Everything in it must be picklable, because on the CPU it
is rebuilt in the child process: models are named by their ``hpcdl.models``
name, by ``"module:function"``, or given as module-level callables.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import pickle
import struct
import subprocess
import sys
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from hpcdl.runtime.policy import Policy, policy_from_spec
from hpcdl.runtime.session import DEFAULT_THRESHOLD, compressed

# glibc serves allocations at least this large with mmap and unmaps them on free.
MMAP_THRESHOLD = 64 * 1024
_CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(2 * MMAP_THRESHOLD)}


# -- what a step runs ---------------------------------------------------------------------------------------
def _resolve(reference, what: str) -> Callable:
    """A callable from ``"module:function"`` or a callable itself."""
    if callable(reference):
        return reference
    if isinstance(reference, str) and ":" in reference:
        module_name, _, attribute = reference.partition(":")
        try:
            return getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"cannot load {what} {reference!r}: {err}") from err
    raise TypeError(f"{what} must be a callable or a 'module:function' string, got {reference!r}")


def _default_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for integer targets (class dim 1), mean squared error otherwise."""
    if target.dtype.is_floating_point:
        return F.mse_loss(output, target)
    return F.cross_entropy(output, target)


@dataclass(frozen=True)
class Workload:
    """A model and how to feed it, picklable.

    ``model`` is an ``hpcdl.models`` name (built at ``scale`` with ``options``),
    a ``"module:function"`` string, or a module-level callable returning an
    ``nn.Module``. ``batch(batch_size, generator) -> (x, y)`` and
    ``loss(output, y)`` default to the zoo spec's ``example_batch`` and
    ``loss``; a custom model needs ``batch`` (its loss defaults to
    cross-entropy for integer targets, else mean squared error).
    """

    model: str | Callable
    scale: str = "small"
    options: dict = field(default_factory=dict)
    batch: str | Callable | None = None
    loss: str | Callable | None = None

    @classmethod
    def of(cls, model, **kw) -> "Workload":
        """From a Workload, a zoo name or callable, or the trainer's ``(name, scale[, options])`` tuple."""
        if isinstance(model, Workload):
            return replace(model, **kw) if kw else model
        if isinstance(model, tuple):
            if not 2 <= len(model) <= 3:
                raise ValueError(f"a model tuple is (name, scale) or (name, scale, options), got {model!r}")
            work = cls(model[0], model[1], dict(model[2]) if len(model) == 3 else {})
            return replace(work, **kw) if kw else work
        return cls(model, **kw)

    @property
    def zoo_name(self) -> str | None:
        return self.model if isinstance(self.model, str) and ":" not in self.model else None

    def describe(self) -> str:
        if self.zoo_name:
            return f"{self.zoo_name} ({self.scale})"
        return self.model if isinstance(self.model, str) else getattr(self.model, "__qualname__", repr(self.model))

    def build(self, batch_size: int, seed: int):
        """``(model, x, y, loss_fn)`` on the CPU."""
        generator = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        if self.zoo_name:
            from hpcdl import models

            spec = models.spec(self.zoo_name)
            model = spec.build(self.scale, **self.options)
            make_batch = _resolve(self.batch, "batch") if self.batch else \
                (lambda size, gen: spec.example_batch(self.scale, size, gen))
            loss = _resolve(self.loss, "loss") if self.loss else spec.loss
        else:
            model = _resolve(self.model, "model")(**self.options)
            if not isinstance(model, torch.nn.Module):
                raise TypeError(f"model factory {self.describe()} returned {type(model).__name__}, not an nn.Module")
            if self.batch is None:
                raise ValueError(f"model {self.describe()} is not from hpcdl.models, so pass batch=... "
                                 "(a callable or 'module:function' taking (batch_size, generator) -> (x, y))")
            make_batch = _resolve(self.batch, "batch")
            loss = _resolve(self.loss, "loss") if self.loss else _default_loss
        x, y = make_batch(batch_size, generator)
        return model, x, y, loss


def _as_policy(policy) -> Policy | None:
    if policy is None or isinstance(policy, Policy):
        return policy
    if isinstance(policy, str):
        return policy_from_spec(policy)
    if isinstance(policy, dict):
        return Policy.static(policy)
    raise TypeError(f"policy must be a Policy, a method spec like 'sz:rel=1e-2', a codec config or None, got {policy!r}")


@dataclass(frozen=True)
class TrainStep:
    """One SGD training step of ``workload`` at ``batch_size``, compressed by ``policy`` (None: baseline).

    Calling it builds the model, batch and optimizer on ``device`` and returns
    the step function (a setup for :func:`peak`); the step returns the
    session's activation byte counts.
    """

    workload: Workload
    batch_size: int
    policy: Policy | str | dict | None = None
    device: str = "cpu"
    threshold: int = DEFAULT_THRESHOLD
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {self.batch_size!r}")

    def __call__(self) -> Callable[[], dict]:
        device = torch.device(self.device)
        model, x, y, loss_fn = self.workload.build(self.batch_size, self.seed)
        model, x, y = model.to(device), x.to(device), y.to(device)
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        policy = _as_policy(self.policy)

        def step() -> dict:
            session = compressed(model, policy, threshold=self.threshold) if policy is not None else None
            with session if session is not None else contextlib.nullcontext():
                loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            stats = session.stats if session is not None else None
            return {
                "activation_original_bytes": stats.original_bytes if stats else 0,
                "activation_packed_bytes": stats.packed_bytes if stats else 0,
            }

        return step


# -- measuring one step -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PeakReport:
    """A step's own peak memory (``peak_bytes``) and what the step reported (activation byte counts)."""

    peak_bytes: int
    before_bytes: int
    device: str
    method: str
    info: dict = field(default_factory=dict)

    @property
    def activation_ratio(self) -> float:
        packed = self.info.get("activation_packed_bytes", 0)
        return self.info.get("activation_original_bytes", 0) / packed if packed else 1.0


def _status_bytes(field_name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {field_name} line")


def _measure_here(setup: Callable, device: torch.device) -> PeakReport:
    """Set up, run one warm-up step, then measure one step in this process."""
    step = setup()
    step()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        info = step()
        torch.cuda.synchronize(device)
        return PeakReport(torch.cuda.max_memory_allocated(device) - before, before, str(device),
                          "cuda_max_allocated", info or {})
    before = _status_bytes("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident size
    except OSError as err:
        raise RuntimeError(f"measuring a CPU peak needs Linux's /proc/self/clear_refs to reset the peak RSS ({err}); "
                           "measure on a Linux host, or on CUDA") from err
    info = step()
    return PeakReport(_status_bytes("VmHWM") - before, before, "cpu", "cpu_peak_rss", info or {})


class MeasuringProcess:
    """A fresh Python process that measures the steps sent to it (pickles over its stdin and stdout).

    Each measurement builds its own state and resets the high-water mark, so one process can serve many; pass it
    as ``process=`` to :func:`peak` and :func:`search_batch` to pay for starting Python and torch once.
    """

    def __init__(self, threads: int | None = None):
        env = {**os.environ, **_CHILD_ENV, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        threads = threads or torch.get_num_threads()
        self.process = subprocess.Popen(
            [sys.executable, "-c", f"import hpcdl.memory as m; m._serve({int(threads)})"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
        )

    def peak(self, setup: Callable) -> PeakReport:
        payload = pickle.dumps(setup)
        try:
            self.process.stdin.write(struct.pack("<Q", len(payload)) + payload)
            self.process.stdin.flush()
            reply = _read_frame(self.process.stdout)
        except (BrokenPipeError, EOFError):
            code = self.process.wait()
            raise RuntimeError(f"the measuring process died (exit status {code}); see its stderr above") from None
        status, value = pickle.loads(reply)
        if status == "error":
            kind, message, trace = value
            error = {"ValueError": ValueError, "TypeError": TypeError}.get(kind, RuntimeError)
            raise error(f"{message}\n(in the measuring process:)\n{trace}" if error is RuntimeError else message)
        return value

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()
        self.process.stdout.close()
        self.process.stdout.close()  # else a ResourceWarning at garbage collection (an error under pytest)

    def __enter__(self) -> "MeasuringProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _read_frame(stream) -> bytes:
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError
    (size,) = struct.unpack("<Q", head)
    body = stream.read(size)
    if len(body) < size:
        raise EOFError
    return body


def _serve(threads: int) -> None:
    """The child's loop: read a setup, measure it, write the report; until stdin closes."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever the model prints goes to stderr, not into the reply stream
    torch.set_num_threads(threads)
    while True:
        try:
            setup = pickle.loads(_read_frame(sys.stdin.buffer))
        except EOFError:
            return
        try:
            reply = ("ok", _measure_here(setup, torch.device("cpu")))
        except Exception as err:
            reply = ("error", (type(err).__name__, str(err), traceback.format_exc()))
        payload = pickle.dumps(reply)
        replies.write(struct.pack("<Q", len(payload)) + payload)
        replies.flush()


def _device_of(setup) -> torch.device:
    return torch.device(setup.device if isinstance(setup, TrainStep) else "cpu")


def peak(
    setup: Callable, *, device: str | None = None, threads: int | None = None, process: MeasuringProcess | None = None
) -> PeakReport:
    """The true peak memory of one training step, above what existed before it.

    ``setup`` is a picklable zero-argument callable that builds the state
    (model, data, optimizer) and returns the step function, e.g. a
    :class:`TrainStep`. The step runs once to warm up, then once measured. On
    CUDA it runs here; on the CPU in a fresh process, or in ``process`` if
    given (module-level callables only; their module must be importable there).
    """
    if not callable(setup):
        raise TypeError(f"peak takes a setup callable (e.g. hpcdl.memory.TrainStep) that returns the step, got {setup!r}")
    target = torch.device(device) if device else _device_of(setup)
    if target.type == "cuda":
        return _measure_here(setup, target)
    if target.type != "cpu":
        raise ValueError(f"peak measures on 'cpu' or 'cuda', got {target}")
    if process is not None:
        return process.peak(setup)
    with MeasuringProcess(threads) as fresh:
        return fresh.peak(setup)


# -- the batch it buys --------------------------------------------------------------------------------------
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


def _parse_budget(budget) -> int:
    from hpcdl.train.config import parse_bytes

    return parse_bytes(budget)


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
    process: MeasuringProcess | None = None,
    **workload,
) -> BatchSearch:
    """Search measured peaks for the largest batch within ``budget_bytes``; see :func:`max_batch`."""
    budget = _parse_budget(budget_bytes)
    if not (isinstance(start, int) and isinstance(limit, int) and 1 <= start <= limit):
        raise ValueError(f"need 1 <= start <= limit, got start={start!r}, limit={limit!r}")
    work = Workload.of(model, **workload)
    policy = _as_policy(policy)
    label = policy.describe() if policy is not None else "none"
    probes: dict[int, PeakReport] = {}
    target = torch.device(device)
    child = (process or MeasuringProcess(threads)) if target.type == "cpu" else None

    def fits(batch_size: int) -> bool:
        step = TrainStep(work, batch_size, policy, device, threshold, seed)
        try:
            report = child.peak(step) if child else _measure_here(step, target)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            report = PeakReport(budget + 1, 0, str(target), "cuda_out_of_memory")
        probes[batch_size] = report
        if on_probe is not None:
            on_probe(batch_size, report)
        return report.peak_bytes <= budget

    try:
        good, bad = 0, None
        if fits(start):
            good = start
            while bad is None and good < limit:
                candidate = min(2 * good, limit)
                if fits(candidate):
                    good = candidate
                else:
                    bad = candidate
        else:
            bad = start
        if bad is not None:
            while bad - good > 1:
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
            f"policy {label} ({probes[1].peak_bytes} bytes); raise the budget, pick a smaller scale or compress more"
        )
    hit_limit = bad is None
    return BatchSearch(good, probes[good].peak_bytes, budget, label, tuple(sorted(probes.items())), hit_limit)


def max_batch(model, policy: Policy | str | dict | None, budget_bytes: int | str, **kw) -> int:
    """The largest per-device batch whose measured training-step peak fits ``budget_bytes``.

    ``model`` is a :class:`Workload`, an ``hpcdl.models`` name (``scale=``,
    ``options=``), a ``(name, scale[, options])`` tuple, or a picklable
    model factory / ``"module:function"`` with ``batch=``. ``policy`` None is
    the uncompressed baseline. Doubles the batch from ``start`` until the
    measured peak exceeds the budget, then bisects; raises ValueError if one
    sample does not fit. Keyword arguments as :func:`search_batch`.
    """
    return search_batch(model, policy, budget_bytes, **kw).batch_size
