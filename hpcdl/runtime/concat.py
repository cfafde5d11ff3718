"""Free a concatenation's incoming gradient once its first consumer has run, not its last.

The backward of ``torch.cat`` (and ``torch.stack``) hands each input its gradient as a view of the one
incoming gradient buffer. A view keeps the whole buffer alive until its own consumer has run, so a piece
whose consumer runs late holds every other piece's memory too. A skip connection does exactly this:
DeepCAM's decoder concatenates the upsampled ASPP output (256 channels) with reduced stage-1 features
(48 channels). The 48-channel piece waits for stage 1's backward, at the very end, and keeps the whole
304-channel, stride-4 gradient (64 MiB a sample at DeepCAM's full input) alive through the ASPP's and the
backbone's backward, where the step's peak is once activations are compressed.

:func:`concat_gradients` registers a post-hook on every large concatenation's backward node in the
graph of each forward of the model. The hook keeps as views the pieces whose consumer autograd runs first
(the highest sequence number: the engine runs ready nodes in that order) and copies the others out, so
the buffer goes once the first consumer has run. It copies only when the copied pieces are at most half
the buffer, so the moment of the copy holds at most 1.5 buffers; a concatenation of equal pieces consumed
one after another (ASPP's branches) stays as it is. Values are unchanged (a copy), so lossless policies
stay bit-identical.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

MIN_BYTES = 1 << 20
"""Incoming gradients smaller than this are left alone: the copy would cost more than the memory it frees."""

_CONCATENATIONS = frozenset({"CatBackward0", "StackBackward0"})


def _copy_late_pieces(consumer_order: tuple[int | None, ...]):
    """The post-hook of one concatenation node whose inputs' consumers have these sequence numbers (None: the
    input needs no gradient). It holds numbers, not nodes: a node held by its own hook would never be freed."""

    def hook(grad_inputs: tuple[torch.Tensor | None, ...], grad_outputs: tuple[torch.Tensor | None, ...]):
        buffer = grad_outputs[0]
        if buffer is None or buffer.nbytes < MIN_BYTES:
            return None
        pieces = {i: (grad, order) for i, (grad, order) in enumerate(zip(grad_inputs, consumer_order))
                  if grad is not None and order is not None}
        if not pieces:
            return None
        first = max(order for _, order in pieces.values())
        late = {i for i, (_, order) in pieces.items() if order != first}
        if not late or 2 * sum(pieces[i][0].nbytes for i in late) > buffer.nbytes:
            return None
        return tuple(grad.clone() if i in late and grad is not None else grad for i, grad in enumerate(grad_inputs))

    return hook


def _hook_concatenations(outputs) -> None:
    """Walk the autograd graph behind ``outputs`` and hook every concatenation node in it."""
    pending = [t.grad_fn for t in tree_leaves(outputs) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen = set(pending)
    while pending:
        node = pending.pop()
        if type(node).__name__ in _CONCATENATIONS:
            node.register_hook(_copy_late_pieces(tuple(
                None if consumer is None else consumer._sequence_nr() for consumer, _ in node.next_functions)))
        for consumer, _ in node.next_functions:
            if consumer is not None and consumer not in seen:
                seen.add(consumer)
                pending.append(consumer)


@contextlib.contextmanager
def concat_gradients(model: nn.Module) -> Iterator[None]:
    """A context in which every forward of ``model`` hooks the concatenations in its graph (see the module)."""
    handle = model.register_forward_hook(lambda _module, _inputs, outputs: _hook_concatenations(outputs))
    try:
        yield
    finally:
        handle.remove()
