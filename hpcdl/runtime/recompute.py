"""Recomputation whose recomputed tensors a session compresses: the ``recompute`` method combined with a codec.

``torch.utils.checkpoint`` keeps every tensor a block's recomputation saves raw until that tensor's consumer
has run in backward. A compressing session then packs only the blocks' inputs, and the step's peak is the
largest block's raw activations: at DeepCAM's full input the decoder's recomputation held about 280 MiB a
sample (five stride-4 maps), which set the peak of ``recompute+sz`` (``docs/results/scale``).

:class:`RecomputedBlock` is one call of a block inside an open session (:meth:`Session.recompute`):

- forward: the session packs the block's tensor inputs (what a checkpoint must keep); each tensor the
  block's own operations save becomes a :class:`Placeholder` (its position in the order they were saved);
- backward, at the first placeholder unpacked: the block's forward runs again from the unpacked inputs,
  with the forward's random-generator and autocast states (and the block's buffers put back afterwards, so a
  batch norm's running statistics are updated once a step, not twice), under the session's saved-tensor hooks
  (:meth:`Session.recomputing`), so each tensor it saves is packed as in a forward (compressed, shared with
  an earlier view, or put into an arena) and held packed. A placeholder's unpack decodes its tensor then,
  and drops the packed copy.

The recomputation must save the same tensors in the same order as the forward (a deterministic block); a
different count, shape or dtype raises :class:`RecomputationError`. A retained graph's second backward
recomputes again. The session's statistics rows keep counting what the forward saved (the blocks' inputs and
everything outside the blocks); what a recomputation packs is counted in the rows of ``Session.recompute_stats``,
since it is held only while its block's backward runs. Decoded bytes are counted in the step's statistics, as
any decoded tensor alive in backward.

This module holds no reference to the session's types: the session passes itself (``pack``, ``unpack``,
``recomputing``) and recognises its blocks' hooks through their ``session`` attribute.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from hpcdl.errors import HpcdlRunError


class RecomputationError(HpcdlRunError, RuntimeError):
    """A block's recomputation did not save what its forward saved."""


class _Packer(Protocol):
    """What a block needs of its session."""

    def pack(self, tensor: torch.Tensor) -> Any: ...

    def unpack(self, saved: Any) -> torch.Tensor: ...

    def unpack_once(self, saved: Any) -> torch.Tensor: ...

    def share(self, saved: Any) -> Any: ...

    def recomputing(self, module: str) -> contextlib.AbstractContextManager[None]: ...


class Placeholder:
    """What autograd holds for a tensor a block saved in forward: the block and the tensor's position."""

    __slots__ = ("block", "index")

    def __init__(self, block: RecomputedBlock, index: int):
        self.block, self.index = block, index


class _Input:
    """A tensor argument of a block: what the session packed, and what recomputation must give the block again."""

    __slots__ = ("saved", "requires_grad")

    def __init__(self, session: _Packer, tensor: torch.Tensor):
        self.saved = session.pack(tensor)  # a kept tensor changed in place is refused by the session's unpack
        self.requires_grad = tensor.requires_grad


class RecomputedBlock:
    """One call of a block whose forward is recomputed in backward, with the session compressing what it saves."""

    def __init__(self, session: _Packer, module: str, fn: Callable, args: tuple, kwargs: dict):
        self.session, self.module, self.fn, self.kwargs = session, module, fn, kwargs
        self.args = tuple(_Input(session, arg) if isinstance(arg, torch.Tensor) else arg for arg in args)
        self.saved: list[tuple[torch.Size, torch.dtype]] = []  # shape and dtype of each tensor the forward saved
        self.recomputed: dict[int, dict[int, Any]] = {}  # backward (graph task) -> index -> packed tensor
        self.cpu_rng = torch.get_rng_state()
        self.cuda_devices = sorted({arg.device.index or 0 for arg in args
                                    if isinstance(arg, torch.Tensor) and arg.device.type == "cuda"})
        self.cuda_rng = [torch.cuda.get_rng_state(device) for device in self.cuda_devices]
        self.autocast = {device: (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
                         for device in ("cpu", "cuda") if torch.amp.is_autocast_available(device)}

    def run(self, args: tuple) -> Any:
        """The block's forward on ``args`` (those given to the constructor), with placeholders for everything
        its operations save."""
        with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
            return self.fn(*args, **self.kwargs)

    # -- forward: placeholders -----------------------------------------------------------------------------
    def pack(self, tensor: torch.Tensor) -> Placeholder:
        self.saved.append((tensor.shape, tensor.dtype))
        return Placeholder(self, len(self.saved) - 1)

    def unpack(self, placeholder: Placeholder) -> torch.Tensor:
        task = torch._C._current_graph_task_id()  # -1 outside a backward: recompute for this one unpack
        packed = self.recomputed.get(task) if task != -1 else None
        if packed is None:
            packed = _Recomputation(self).run()
            if task != -1:
                self.recomputed[task] = packed
        if placeholder.index not in packed:
            raise RecomputationError(
                "a tensor saved inside a recomputed block was unpacked twice in one backward; call "
                "ctx.saved_tensors once per backward, or run this block without recompute")
        return self.session.unpack_once(packed.pop(placeholder.index))

    def inputs(self, unpacked: list[tuple[torch.Tensor, Any]]) -> Iterator:
        """The block's arguments again, tensors unpacked and detached, requiring gradients as they did; each
        tensor is also appended to ``unpacked`` with what the session packed for it."""
        for arg in self.args:
            if not isinstance(arg, _Input):
                yield arg
                continue
            tensor = self.session.unpack(arg.saved)
            tensor = tensor.detach().requires_grad_(arg.requires_grad)
            unpacked.append((tensor, arg.saved))
            yield tensor

    def mismatch(self, what: str) -> RecomputationError:
        return RecomputationError(
            f"the recomputation of block {self.module!r} did not save what its forward saved ({len(self.saved)} "
            f"tensors; {what}): its forward must be deterministic in what it saves (no branches on random draws "
            f"or data); run it without recompute")


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.dtype == b.dtype
            and a.shape == b.shape and a.stride() == b.stride() and a.storage_offset() == b.storage_offset())


@contextlib.contextmanager
def buffers_kept(module: object) -> Iterator[None]:
    """Leaves ``module``'s buffers (if it is a module) as they were before the context: a recomputation repeats
    a forward, and must not update a batch norm's running statistics (and its batch counter) a second time.

    The values are put back through ``.data``, without a version bump: CUDA's batch norm updates its running
    statistics without one and saves them for backward, so a tracked copy made them look modified in place."""
    buffers = [(buffer, buffer.clone()) for buffer in module.buffers()] if isinstance(module, torch.nn.Module) else []
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, before in buffers:
                buffer.data.copy_(before)


class _Recomputation:
    """One recomputation of a block in backward: its forward again, each saved tensor packed by the session."""

    def __init__(self, block: RecomputedBlock):
        self.block, self.session = block, block.session
        self.packed: dict[int, Any] = {}
        self.inputs: list[tuple[torch.Tensor, Any]] = []  # each unpacked tensor input and what the session packed

    def run(self) -> dict[int, Any]:
        """Recompute; return the packed tensors by their position in the forward's order."""
        block = self.block
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.random.fork_rng(devices=block.cuda_devices))
            torch.set_rng_state(block.cpu_rng)
            for index, state in zip(block.cuda_devices, block.cuda_rng):
                torch.cuda.set_rng_state(state, index)
            for device_type, (enabled, dtype) in block.autocast.items():
                stack.enter_context(torch.autocast(device_type, dtype=dtype, enabled=enabled))
            stack.enter_context(torch.enable_grad())
            stack.enter_context(buffers_kept(getattr(block.fn, "__self__", None)))
            inputs = tuple(block.inputs(self.inputs))
            stack.enter_context(self.session.recomputing(block.module))
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack))
            block.fn(*inputs, **block.kwargs)
        if len(self.packed) != len(block.saved):
            raise block.mismatch(f"its recomputation saved {len(self.packed)}")
        return self.packed

    def pack(self, tensor: torch.Tensor) -> int:
        index = len(self.packed)
        if index >= len(self.block.saved) or self.block.saved[index] != (tensor.shape, tensor.dtype):
            raise self.block.mismatch(f"its recomputation's tensor {index} is {tuple(tensor.shape)} {tensor.dtype}")
        given = next((saved for unpacked, saved in self.inputs if _same_view(tensor, unpacked)), None)
        # an input saved again is shared with its packed copy, not encoded a second time (a lossy codec's error
        # would add up)
        self.packed[index] = self.session.share(given) if given is not None else self.session.pack(tensor)
        return index

    def unpack(self, index: int) -> torch.Tensor:
        raise RecomputationError("a recomputed block ran backward inside its own forward; run it without recompute")
