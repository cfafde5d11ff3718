"""What a measured step runs: a :class:`Workload` (model and data) and a :class:`TrainStep`.

A :class:`TrainStep` builds the model, a batch and the optimizer, and returns a step function
that calls :func:`hpcdl.runtime.methods.train_step`, the function the trainer calls, under the
step's activation method. Everything in it must be picklable, because on the CPU it is rebuilt in
a measuring subprocess: models are named by their ``hpcdl.models`` name, by ``"module:function"``,
or given as module-level callables; the optimizer as a module-level factory (e.g. a
``functools.partial`` of ``hpcdl.train.optim.build_optimizer``).

A step at a large input can take minutes, and a probe runs several: every step a :class:`TrainStep` runs
logs its time (a warm-up step or the measured one) to :data:`log`, and :func:`step_progress` hands those
lines to a callback, here or from a measuring process (:mod:`hpcdl.memory.process` sends them back).
"""

from __future__ import annotations

import copy
import importlib
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace

import torch
import torch.nn.functional as F

from hpcdl.memory.breakdown import StepProbe, tensor_bytes
from hpcdl.runtime import methods
from hpcdl.runtime.methods import ActivationMethod, Codec, Plain
from hpcdl.runtime.policy import Policy, as_policy
from hpcdl.runtime.session import DEFAULT_THRESHOLD

#: Where every step a :class:`TrainStep` runs reports its time (INFO); see :func:`step_progress`.
log = logging.getLogger(__name__)


class _Forward(logging.Handler):
    def __init__(self, callback: Callable[[str], None]):
        super().__init__(logging.INFO)
        self.callback = callback

    def emit(self, record: logging.LogRecord) -> None:
        self.callback(record.getMessage())


@contextmanager
def step_progress(callback: Callable[[str], None]) -> Iterator[None]:
    """While inside, each line a :class:`TrainStep`'s steps log (one per step: warm-up or measured, its time)
    goes to ``callback`` and nowhere else."""
    handler, level, propagate = _Forward(callback), log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate


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
    ``loss(output, y)`` default to the zoo model family's ``example_batch`` and
    ``loss``; a custom model needs ``batch`` (its loss defaults to
    cross-entropy for integer targets, else mean squared error).
    ``input_shape`` (zoo models) replaces the scale's per-sample input shape.
    """

    model: str | Callable
    scale: str = "small"
    options: dict = field(default_factory=dict)
    batch: str | Callable | None = None
    loss: str | Callable | None = None
    input_shape: tuple[int, ...] | None = None

    @classmethod
    def of(cls, model, **kw) -> Workload:
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
            shape = f", input {'x'.join(map(str, self.input_shape))}" if self.input_shape else ""
            return f"{self.zoo_name} ({self.scale}{shape})"
        return self.model if isinstance(self.model, str) else getattr(self.model, "__qualname__", repr(self.model))

    def build(self, batch_size: int, seed: int):
        """``(model, x, y, loss_fn)`` on the CPU."""
        generator = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        if self.zoo_name:
            from hpcdl import models

            family = models.family(self.zoo_name)
            model = family.build(self.scale, **self.options)
            loss = _resolve(self.loss, "loss") if self.loss else family.loss
        else:
            if self.input_shape is not None:
                raise ValueError(f"input_shape applies to hpcdl.models models; {self.describe()} takes its batch from batch=")
            model = _resolve(self.model, "model")(**self.options)
            if not isinstance(model, torch.nn.Module):
                raise TypeError(f"model factory {self.describe()} returned {type(model).__name__}, not an nn.Module")
            if self.batch is None:
                raise ValueError(f"model {self.describe()} is not from hpcdl.models, so pass batch=... "
                                 "(a callable or 'module:function' taking (batch_size, generator) -> (x, y))")
            loss = _resolve(self.loss, "loss") if self.loss else _default_loss
        x, y = self.draw(batch_size, generator)
        return model, x, y, loss

    def draw(self, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch ``(x, y)`` on the CPU: ``batch``'s, or the zoo model family's ``example_batch``."""
        if self.batch is not None:
            return _resolve(self.batch, "batch")(batch_size, generator)
        from hpcdl import models

        assert self.zoo_name is not None  # a model from elsewhere has a batch (build refuses it otherwise)
        return models.family(self.zoo_name).example_batch(self.scale, batch_size, generator, self.input_shape)


def default_optimizer(parameters) -> torch.optim.Optimizer:
    """The optimizer of a measured step that names none: SGD with momentum (one state tensor per parameter)."""
    return torch.optim.SGD(parameters, lr=1e-3, momentum=0.9)


def step_method(method: ActivationMethod | None, policy, threshold: int) -> ActivationMethod:
    """The activation method of a step given either a method object or a policy (None: the baseline)."""
    if method is not None:
        if policy is not None:
            raise ValueError("give a step either method= (an activation method) or policy=, not both; "
                             "for recomputation with a codec use method=Recompute() + Codec(policy)")
        if not isinstance(method, ActivationMethod):
            raise TypeError(f"method must be an activation method of hpcdl.runtime.methods (Plain, Codec, "
                            f"Recompute, Offload or a combination), got {type(method).__name__}")
        return method
    policy = as_policy(policy)
    return Plain() if policy is None else Codec(policy, threshold)


def method_policies(method: ActivationMethod) -> list[Policy]:
    """The policies of ``method``'s compressing parts: what in it can learn from the steps it runs."""
    return [part.policy for part in method.parts() if isinstance(part, Codec) and isinstance(part.policy, Policy)]


@dataclass(frozen=True)
class TrainStep:
    """One training step of ``workload`` at ``batch_size`` under an activation method.

    The method is ``method`` (an :mod:`hpcdl.runtime.methods` object), or else ``policy``
    compressing (a Policy, spec or codec config; None: the baseline, ``threshold``: the session's
    size threshold). ``optimizer`` builds the optimizer from the parameters (default SGD with
    momentum; the trainer's batch search passes the run's own). Calling it builds the model, batch
    and optimizer on ``device`` and returns the step function (a setup for
    :func:`hpcdl.memory.peak`): :func:`hpcdl.runtime.methods.train_step`, then the gradients
    released, so the measured step starts where a previous step left off; ``warmup_steps`` more than one
    runs that many less one steps before returning it, each on a batch of its own
    (:func:`~hpcdl.memory.peak.measure_step` runs the last warm-up step, on the measured batch), for a
    method whose usual step comes only after several and learns from their batches (an adaptive policy's
    decisions after a few probes, its noise estimate from the gradients of different batches). The step
    returns the
    session's activation byte counts, the name of the step function it ran and the parts of its
    memory (``parts``, a :class:`~hpcdl.memory.breakdown.StepParts` as a dict; see
    :func:`hpcdl.memory.breakdown.breakdown`).

    With one warm-up step, a method whose first step learns (an adaptive policy's first probe, which
    also trains under the default policy) makes that step a rehearsal: its policies are put back as
    they were before it, so the measured step is the method's first again, the step a run meets
    first, without the process's one-time costs (libraries, thread pools, the optimizer's state)
    that the warm-up absorbs. Without the rehearsal a batch search would size the batch by the
    method's later steps and a run at that batch could fail at its first.
    """

    workload: Workload
    batch_size: int
    policy: Policy | str | dict | None = None
    device: str = "cpu"
    threshold: int = DEFAULT_THRESHOLD
    seed: int = 0
    method: ActivationMethod | None = None
    optimizer: Callable | None = None
    warmup_steps: int = 1

    def __post_init__(self):
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {self.batch_size!r}")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 1:
            raise ValueError(f"warmup_steps must be a positive int, got {self.warmup_steps!r}")
        step_method(self.method, self.policy, self.threshold)  # a bad combination fails here, not in the child

    def __call__(self) -> Callable[[], dict]:
        device = torch.device(self.device)
        model, x, y, loss_fn = self.workload.build(self.batch_size, self.seed)
        model, x, y = model.to(device), x.to(device), y.to(device)
        model.train()
        optimizer = (self.optimizer or default_optimizer)(model.parameters())
        method = step_method(self.method, self.policy, self.threshold)
        method.prepare(model)
        step_function = methods.train_step
        name = f"{step_function.__module__}.{step_function.__qualname__}"
        policies = method_policies(method)
        first_states = [copy.deepcopy(policy.state_dict()) for policy in policies] if self.warmup_steps == 1 else []

        probe = StepProbe(device)
        steps_run = 0

        def loss_at_forward_end(output, target):
            loss = loss_fn(output, target)
            probe.forward_end()
            return loss

        def step(batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict:
            nonlocal steps_run
            inputs, targets = (x, y) if batch is None else batch
            started = time.perf_counter()
            probe.start()
            result = step_function(model, method, inputs, targets, loss_at_forward_end, optimizer)
            steps_run += 1
            log.info("%s: %.1f s%s", f"warm-up step {steps_run} of {self.warmup_steps}"
                     if steps_run <= self.warmup_steps else "measured step", time.perf_counter() - started,
                     " (a learning step: the method observed gradients)" if result.observed_gradients else "")
            if steps_run == 1 and first_states and result.observed_gradients:
                for policy, state in zip(policies, first_states):  # once: the states need no second copy
                    policy.load_state_dict(state)
                log.info("the method's first step learned: it was a rehearsal, and the method starts over, so the "
                         "step measured next is its first")
            gradients = tensor_bytes([p.grad for p in model.parameters() if p.grad is not None])
            optimizer.zero_grad(set_to_none=True)
            stats = result.stats
            return {
                "activation_original_bytes": stats.original_bytes if stats else 0,
                "activation_packed_bytes": stats.packed_bytes if stats else 0,
                "step_function": name,
                "observed_gradients": result.observed_gradients,
                "method": method.describe(),
                "parts": asdict(probe.parts(model, optimizer, (x, y), gradients, stats)),
            }

        for index in range(1, self.warmup_steps):
            inputs, targets = self.workload.draw(self.batch_size, torch.Generator().manual_seed(self.seed + index))
            step((inputs.to(device), targets.to(device)))
        return step
