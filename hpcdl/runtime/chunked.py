"""Convolution backward over chunks of the batch, so its transient buffers follow a chunk, not the batch.

Once the saved activations are compressed, the step's peak sits in the backward of the widest
convolution (DeepCAM at its full input: the decoder's first 3x3 convolution, ``docs/results/scale``).
On the CPU, oneDNN's ``convolution_backward`` copies its input and the incoming gradient into its blocked
layout for the whole batch: 478 MiB at batch 4 there, a quarter of the step's peak, on top of the decoded
input, the incoming gradient and the input's gradient, which the backward needs anyway.

:func:`chunked_convolutions` patches the model's plain convolutions (``nn.Conv1d/2d/3d`` with zero
padding and their own class's forward) while it is open: a convolution whose input exceeds
``chunk_bytes`` runs its forward as usual (one call, the same output) and its backward as one
``convolution_backward`` per chunk of samples, each chunk's input gradient written into its rows of one
buffer and the weight and bias gradients summed over the chunks. The saved input is still saved once,
through autograd's saved-tensor hooks, so a compressing session packs it (or shares an already packed
copy) as before.

What it changes: the weight gradient is summed in another order, so it differs from plain autograd's
by float rounding (as it does between thread counts); the input gradient of a sample is computed
alone. Only CPU tensors are chunked: the layout copies are oneDNN's, and on CUDA the effect of chunking
on cuDNN's workspaces and speed has not been measured here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TypeGuard

import torch
from torch import nn

#: The default most bytes of a convolution's input that one chunk of its backward reads.
DEFAULT_CHUNK_BYTES = 32 << 20
_PLAIN_FORWARDS: dict[type, Callable[..., torch.Tensor]] = {
    kind: kind.forward for kind in (nn.Conv1d, nn.Conv2d, nn.Conv3d)}


class ChunkedConvolution(torch.autograd.Function):
    """``torch.convolution`` whose backward runs ``chunk`` samples at a time (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups, chunk):
        ctx.save_for_backward(x, weight)
        ctx.geometry = (stride, padding, dilation, groups)
        ctx.chunk, ctx.has_bias = chunk, bias is not None
        return torch.convolution(x, weight, bias, stride, padding, dilation, False, [0] * len(stride), groups)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.geometry
        need_x, need_weight, need_bias = ctx.needs_input_grad[:3]
        mask = [need_x, need_weight, need_bias and ctx.has_bias]
        bias_sizes = [weight.shape[0]] if ctx.has_bias else None
        grad_x = torch.empty_like(x) if need_x else None
        grad_weight = grad_bias = None
        for start in range(0, x.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            part_x, part_weight, part_bias = torch.ops.aten.convolution_backward(
                grad_out[rows], x[rows], weight, bias_sizes, stride, padding, dilation, False, [0] * len(stride),
                groups, mask)
            if need_x:
                grad_x[rows].copy_(part_x)
            if mask[1]:
                grad_weight = part_weight if grad_weight is None else grad_weight.add_(part_weight)
            if mask[2]:
                grad_bias = part_bias if grad_bias is None else grad_bias.add_(part_bias)
            del part_x  # before the next chunk's is allocated
        return grad_x, grad_weight, grad_bias, None, None, None, None, None


def _chunk_samples(x: torch.Tensor, chunk_bytes: int) -> int:
    """Samples per chunk: as many as fit in ``chunk_bytes``, at least one."""
    return max(1, chunk_bytes // max(1, x[0].numel() * x.element_size()))


def _chunked_forward(module: nn.modules.conv._ConvNd, chunk_bytes: int) -> Callable[[torch.Tensor], torch.Tensor]:
    plain = _PLAIN_FORWARDS[type(module)]
    batched_dims = module.weight.dim()  # (N, C, *spatial): as many dimensions as the weight has

    def forward(x: torch.Tensor) -> torch.Tensor:
        wants_grad = torch.is_grad_enabled() and (x.requires_grad or module.weight.requires_grad)
        if not wants_grad or x.device.type != "cpu" or x.dim() != batched_dims:
            return plain(module, x)
        chunk = _chunk_samples(x, chunk_bytes)
        if x.shape[0] <= chunk:
            return plain(module, x)
        return ChunkedConvolution.apply(x, module.weight, module.bias, module.stride, module.padding,
                                        module.dilation, module.groups, chunk)

    return forward


def _chunkable(module: nn.Module) -> TypeGuard[nn.modules.conv._ConvNd]:
    """A convolution whose forward is the plain one: its class's own, zero padding given as numbers."""
    return (type(module) in _PLAIN_FORWARDS and "forward" not in vars(module) and module.padding_mode == "zeros"
            and not isinstance(module.padding, str))


def chunked_convolutions(model: nn.Module, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> contextlib.AbstractContextManager[int]:
    """A context in which ``model``'s plain convolutions run their backward in chunks of at most ``chunk_bytes`` of
    input (0: none); it yields how many convolutions it patched, and leaves the model as it was on exit."""
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 0:
        raise ValueError(f"chunk_bytes is the most input bytes one chunk of a convolution's backward reads, an int "
                         f">= 0 (default {DEFAULT_CHUNK_BYTES}; 0 runs every backward on the whole batch), "
                         f"got {chunk_bytes!r}")
    return _patched(model, chunk_bytes)


@contextlib.contextmanager
def _patched(model: nn.Module, chunk_bytes: int) -> Iterator[int]:
    patched = []
    try:
        for module in (model.modules() if chunk_bytes else ()):
            if _chunkable(module):
                module.forward = _chunked_forward(module, chunk_bytes)
                patched.append(module)
        yield len(patched)
    finally:
        for module in patched:
            del module.forward
