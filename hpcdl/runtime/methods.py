"""Activation methods as objects, and :func:`train_step`, the one definition of a training step under a method.

An activation method decides what autograd keeps for backward while a forward runs:

- :class:`Plain` (``none``): plain autograd, the baseline;
- :class:`Codec` (``codec``): the saved tensors compressed by a :class:`~hpcdl.runtime.policy.Policy`
  through :func:`hpcdl.runtime.session.compressed`;
- :class:`Recompute` (``recompute``): each given block recomputed in backward
  (``torch.utils.checkpoint``, non-reentrant) instead of saving its activations: what PyTorch calls
  activation (or gradient) checkpointing. ``Checkpoint`` and the name ``checkpoint`` are its old
  spellings, kept for one release (a training checkpoint is the saved run state, :mod:`hpcdl.train.checkpoint`);
- :class:`Offload` (``offload``): saved tensors moved to pinned host memory
  (``torch.autograd.graph.save_on_cpu``); CUDA only.

Every method has one interface: :meth:`ActivationMethod.prepare` checks the model once (before
training), :meth:`ActivationMethod.context` is the context a forward runs in and yields the
:class:`~hpcdl.runtime.stats.Stats` of what it saved (None if it keeps no statistics), and
:meth:`ActivationMethod.observe_gradients` runs once the gradients are final, only for a method whose
:meth:`ActivationMethod.wants_gradients` says so (a Codec whose policy's controller asks for
gradient statistics). Methods compose like PyTorch's memory context managers:
``Recompute(blocks) + Codec(policy)`` recomputes the blocks and compresses everything outside them,
each block's inputs, and what each block's recomputation saves in backward
(:mod:`hpcdl.runtime.recompute`; ``Recompute`` alone is ``torch.utils.checkpoint``, non-reentrant).

Why here, in the runtime layer: the trainer (``hpcdl.train``) and the measurement package
(``hpcdl.memory``) must both run exactly this step, and ``hpcdl.memory`` sits below the trainer,
so the step cannot live in ``hpcdl.train``. The methods are contexts over autograd's saved
tensors, which is what the runtime owns (the session is one of them); they need nothing above the
runtime: the blocks to recompute are passed in (a list or a function of the model), so this
module does not import ``hpcdl.models``. Every method is picklable when its parts are (module-level
functions, policies), so a measuring subprocess can rebuild the step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.utils.checkpoint

from hpcdl.runtime.arena import DEFAULT_ARENA_BYTES
from hpcdl.runtime.chunked import DEFAULT_CHUNK_BYTES
from hpcdl.runtime.policy import Policy, as_policy
from hpcdl.runtime.recompute import buffers_kept
from hpcdl.runtime.session import DEFAULT_THRESHOLD, active_session, compressed
from hpcdl.runtime.stats import Stats


class ActivationMethod:
    """The interface every activation method implements; see the module docstring.

    ``name`` is the method's config name (``none``, ``codec``, ``recompute``, ``offload``, or
    parts joined by ``+``). ``hooks_saved_tensors`` is True for methods that install
    ``saved_tensors_hooks`` (only the innermost pair applies, so a combination holds at most one).
    """

    name: str = ""
    hooks_saved_tensors: bool = False

    def prepare(self, model: torch.nn.Module) -> None:
        """Check once, before training, that this method can run on ``model`` (raise ValueError if not)."""

    def context(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Stats | None]:
        """The context one forward of ``model`` runs in; it yields this step's saved-tensor Stats or None."""
        return contextlib.nullcontext()

    def wants_gradients(self) -> bool:
        """Whether this step should call :meth:`observe_gradients` (reading gradients costs a pass and a sync)."""
        return False

    def observe_gradients(self, model: torch.nn.Module) -> None:
        """Called with the model's final gradients (reduced across ranks, before the optimizer step)."""

    def parts(self) -> tuple[ActivationMethod, ...]:
        return (self,)

    def __add__(self, other: ActivationMethod) -> ActivationMethod:
        return compose(self, other)

    def describe(self) -> str:
        return self.name


class Plain(ActivationMethod):
    """``none``: autograd saves what it saves."""

    name = "none"

    def __eq__(self, other) -> bool:
        return type(other) is Plain

    def __hash__(self) -> int:
        return hash(Plain)

    def __repr__(self) -> str:
        return "Plain()"


@dataclass(eq=False)
class Codec(ActivationMethod):
    """``codec``: compress what autograd saves with ``policy`` (a Policy, method spec or codec config).

    Tensors under ``threshold`` bytes stay raw, except floating ones saved inside the model's forward, which are
    compressed together in arenas of ``arena_bytes`` (0: none); ``verify`` checks each decompressed tensor (a
    test mode); convolutions (forward and backward) and batch norms (backward) whose input exceeds ``chunk_bytes``
    run in chunks of the batch (:mod:`hpcdl.runtime.chunked`; 0: whole).
    """

    policy: Policy | str | dict
    threshold: int = DEFAULT_THRESHOLD
    verify: bool = False
    arena_bytes: int = DEFAULT_ARENA_BYTES
    chunk_bytes: int = DEFAULT_CHUNK_BYTES

    name = "codec"
    hooks_saved_tensors = True

    def __post_init__(self):
        self.policy = as_policy(self.policy)
        if self.policy is None:
            raise ValueError("Codec needs a policy that compresses; for no compression use Plain() (method none)")

    @contextlib.contextmanager
    def context(self, model: torch.nn.Module) -> Iterator[Stats]:
        with compressed(
            model, self.policy, threshold=self.threshold, verify=self.verify, arena_bytes=self.arena_bytes,
            chunk_bytes=self.chunk_bytes,
        ) as session:
            yield session.stats

    def wants_gradients(self) -> bool:
        assert isinstance(self.policy, Policy)  # coerced in __post_init__
        return self.policy.wants_gradients()

    def observe_gradients(self, model: torch.nn.Module) -> None:
        assert isinstance(self.policy, Policy)
        self.policy.record_gradients(model)

    def describe(self) -> str:
        assert isinstance(self.policy, Policy)
        return f"codec:{self.policy.describe()}"


def model_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks a zoo model names through its ``checkpoint_blocks()`` (what ``ModelFamily.blocks`` returns)."""
    blocks = getattr(model, "checkpoint_blocks", None)
    if blocks is None:
        raise ValueError(f"{type(model).__name__} has no checkpoint_blocks(); pass Recompute(blocks=...) the modules "
                         "to recompute (a list, or a function of the model returning one)")
    return list(blocks())


@dataclass(eq=False)
class Recompute(ActivationMethod):
    """``recompute``: each block's forward recomputed in backward instead of saving its activations.

    PyTorch's activation (gradient) checkpointing at block granularity; ``Checkpoint`` is its old name.

    ``blocks`` is a list of modules of the model, or a function ``model -> list of modules`` (default
    :func:`model_blocks`; pass ``ModelFamily.blocks`` for a zoo model). The blocks are wrapped only
    while the context is open, so the model is left as it was (evaluation runs it plainly). A block's
    buffers are put back after its recomputation, so batch norms update their running statistics once a
    step, as without recomputation (plain ``torch.utils.checkpoint`` updates them twice).
    """

    blocks: Sequence[torch.nn.Module] | Callable[[torch.nn.Module], Sequence[torch.nn.Module]] = model_blocks

    name = "recompute"

    def _blocks_of(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        blocks = list(self.blocks(model) if callable(self.blocks) else self.blocks)
        if not blocks:
            raise ValueError(f"Recompute found no blocks to recompute in {type(model).__name__}; pass blocks=...")
        return blocks

    def prepare(self, model: torch.nn.Module) -> None:
        self._blocks_of(model)

    @contextlib.contextmanager
    def context(self, model: torch.nn.Module) -> Iterator[None]:
        blocks = self._blocks_of(model)
        patched = []
        try:
            for block in blocks:
                own = "forward" in vars(block)
                forward = block.forward

                def recomputed(*args, _forward=forward, _block=block, **kwargs):
                    session = active_session()
                    if session is not None and session.policy is not None:
                        return session.recompute(_forward, *args, **kwargs)
                    return torch.utils.checkpoint.checkpoint(
                        _forward, *args, use_reentrant=False,
                        context_fn=lambda: (contextlib.nullcontext(), buffers_kept(_block)), **kwargs)

                block.forward = recomputed
                patched.append((block, own, forward))
            yield None
        finally:
            for block, own, forward in reversed(patched):
                if own:
                    block.forward = forward
                else:
                    del block.forward

    def __eq__(self, other) -> bool:
        return type(other) is Recompute and other.blocks is self.blocks

    __hash__ = object.__hash__


#: The old name of :class:`Recompute` (kept for one release): activation recomputation, not a training checkpoint.
Checkpoint = Recompute


@dataclass(eq=False)
class Offload(ActivationMethod):
    """``offload``: saved tensors moved to (pinned) host memory during forward, back for backward; CUDA only."""

    pin_memory: bool = True

    name = "offload"
    hooks_saved_tensors = True

    def prepare(self, model: torch.nn.Module) -> None:
        devices = {parameter.device.type for parameter in model.parameters()}
        if devices != {"cuda"}:
            raise ValueError("compression.method: offload moves saved activations from GPU to pinned host memory "
                             "and needs CUDA; on a CPU use none, codec or recompute")

    def context(self, model: torch.nn.Module):
        return torch.autograd.graph.save_on_cpu(pin_memory=self.pin_memory)


class Combined(ActivationMethod):
    """Several methods at once: every part's context is entered (in order) around the forward."""

    hooks_saved_tensors = True

    def __init__(self, methods: Sequence[ActivationMethod]):
        flat = [part for method in methods for part in _checked(method).parts() if not isinstance(part, Plain)]
        kinds = [part.name for part in flat]
        repeated = sorted({kind for kind in kinds if kinds.count(kind) > 1})
        if repeated:
            raise ValueError(f"a combination holds each method once; {', '.join(repeated)} is given twice")
        hooking = [part.name for part in flat if part.hooks_saved_tensors]
        if len(hooking) > 1:
            raise ValueError(f"{' and '.join(hooking)} both hook autograd's saved tensors and only the innermost hooks "
                             "apply, so they cannot combine; combine recompute with one of them")
        self.methods = tuple(flat)
        self.hooks_saved_tensors = bool(hooking)
        self.name = "+".join(kinds) or "none"

    def parts(self) -> tuple[ActivationMethod, ...]:
        return self.methods

    def prepare(self, model: torch.nn.Module) -> None:
        for method in self.methods:
            method.prepare(model)

    @contextlib.contextmanager
    def context(self, model: torch.nn.Module) -> Iterator[Stats | None]:
        with contextlib.ExitStack() as stack:
            yielded = [stack.enter_context(method.context(model)) for method in self.methods]
            yield next((stats for stats in yielded if isinstance(stats, Stats)), None)

    def wants_gradients(self) -> bool:
        return any(method.wants_gradients() for method in self.methods)

    def observe_gradients(self, model: torch.nn.Module) -> None:
        for method in self.methods:
            if method.wants_gradients():
                method.observe_gradients(model)

    def describe(self) -> str:
        return "+".join(method.describe() for method in self.methods) or "none"

    def __eq__(self, other) -> bool:
        return isinstance(other, Combined) and other.methods == self.methods

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"compose({', '.join(map(repr, self.methods))})"


def _checked(method) -> ActivationMethod:
    if not isinstance(method, ActivationMethod):
        raise TypeError(f"methods combine with other activation methods (Plain, Codec, Recompute, Offload), "
                        f"got {type(method).__name__}")
    return method


def compose(*methods: ActivationMethod) -> ActivationMethod:
    """One method doing all of ``methods``: e.g. ``compose(Recompute(blocks), Codec(policy))``."""
    combined = Combined(methods)
    if not combined.methods:
        return Plain()
    return combined.methods[0] if len(combined.methods) == 1 else combined


def _final_after_backward(optimizer: torch.optim.Optimizer) -> contextlib.AbstractContextManager:
    """One process, or DDP: the gradients are final when backward returns."""
    return contextlib.nullcontext()


# -- the step -------------------------------------------------------------------------------------------
@dataclass
class StepResult:
    """What one :func:`train_step` gives back: the loss (detached), the method's saved-tensor Stats (or None),
    and whether the method observed this step's gradients (a learning controller's sampling or probe step,
    whose memory and time are not those of its other steps)."""

    loss: torch.Tensor
    stats: Stats | None
    observed_gradients: bool = False


def train_step(
    model: torch.nn.Module,
    method: ActivationMethod,
    x,
    y,
    loss_fn: Callable,
    optimizer: torch.optim.Optimizer,
    *,
    forward: Callable | None = None,
    scheduler=None,
    reduced_gradients: Callable[[torch.optim.Optimizer], contextlib.AbstractContextManager] | None = None,
) -> StepResult:
    """One training step of ``model`` under ``method``: the only definition of it in hpcdl.

    Zeroes the gradients, runs ``loss_fn(forward(x), y)`` inside ``method.context(model)``,
    backpropagates, lets the method observe the gradients if it asks to, steps ``optimizer`` (and
    ``scheduler`` if given). ``forward`` is what is called on ``x`` (default ``model``; the trainer
    passes its data-parallel wrapper, whose backward all-reduces the gradients).
    ``reduced_gradients(optimizer)``: a context in which the gradients are final and
    ``optimizer.step()`` does not reduce them again (the trainer passes its distributed backend's;
    Horovod reduces inside ``optimizer.step()``); the default suits one process and DDP, whose
    backward ends with the reduction. The trainer, the measured step of :mod:`hpcdl.memory` and the
    study all call this function.
    """
    optimizer.zero_grad(set_to_none=True)
    with method.context(model) as stats:
        loss = loss_fn((forward or model)(x), y)
    loss.backward()
    observed = method.wants_gradients()
    if observed:
        with (reduced_gradients or _final_after_backward)(optimizer):
            method.observe_gradients(model)
            optimizer.step()
    else:
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return StepResult(loss.detach(), stats, observed)
