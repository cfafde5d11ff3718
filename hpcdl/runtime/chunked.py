"""Convolutions and batch norms over chunks of the batch, so their transient buffers follow a chunk.

Once the saved activations are compressed, the step's peak sits in the widest layers (DeepCAM at its
full input: the decoder's and stage 1's, ``docs/results/scale``). Some of their buffers grow with the
batch although the layer does not need them whole:

- oneDNN copies a convolution's input and output (forward), or its input and incoming gradient
  (backward), into its blocked layout for the whole batch (478 MiB in the decoder's first convolution's
  backward at DeepCAM's batch 4; about 55 MiB a sample in its forward);
- the CPU ``native_batch_norm_backward`` allocates a second input-sized buffer beside the input's gradient.

They come on top of the input, the output or incoming gradient, and the input's gradient, which the
layer needs anyway. :func:`chunked_layers` patches the model's plain convolutions (``nn.Conv1d/2d/3d``
with zero padding) and batch norms (``nn.BatchNorm1d/2d/3d``), each with its own class's forward, while it
is open. A layer whose input exceeds ``chunk_bytes`` runs per chunk of samples:

- a convolution: its forward one chunk at a time, each chunk's output written into its rows of one output
  (in the first chunk's memory format); its backward one ``convolution_backward`` per chunk, each chunk's
  input gradient written into its rows of one buffer, the weight and bias gradients summed over the chunks
  (in float32 for a half-precision weight, rounded to it once);
- a batch norm in training: its forward as before (one call, the same output and running statistics); in
  backward the per-channel sums of the incoming gradient and of its product with the centred input, one
  chunk at a time, then the input gradient one chunk at a time from the closed form
  ``w * invstd * (dy - mean(dy) - (x - mean) * invstd^2 * mean(dy * (x - mean)))``, computed in place in the
  chunk's rows of the input gradient for float32 and float64 inputs (the sums hold one chunk-sized temporary;
  the gradient none, where the formula written out would hold up to three); a half-precision input's is
  computed in float32 (its statistics too, where a half-precision model has them in half precision) and
  rounded once.

The saved input is still saved once, through autograd's saved-tensor hooks, so a compressing session
packs it (or shares an already packed copy) as before. In backward, each chunk of the input is read once;
where the session decoded the input for this backward alone (``claim``), the input's gradient is written
over it, each chunk right after its last use, instead of into a new input-sized buffer.

What it changes: sums run in another order and oneDNN may pick another kernel for a smaller batch, so
outputs and gradients differ from plain autograd's by float rounding (as they do between thread counts).
Only CPU tensors are chunked: the buffers above are the CPU kernels', and on CUDA the effect of chunking
on cuDNN's workspaces and speed has not been measured here.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable, Iterator
from typing import TypeGuard

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

#: The default most bytes of a layer's input that one chunk of it reads.
DEFAULT_CHUNK_BYTES = 32 << 20
_CONVOLUTIONS: dict[type, Callable[..., torch.Tensor]] = {
    kind: kind.forward for kind in (nn.Conv1d, nn.Conv2d, nn.Conv3d)}
_BATCH_NORMS: dict[type, Callable[..., torch.Tensor]] = {
    kind: kind.forward for kind in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)}
_BATCH_NORM_SIGNATURE = inspect.signature(F.batch_norm)


def _claim_nothing(tensor: torch.Tensor) -> bool:
    """The default owner's answer: no saved input is ours to overwrite."""
    return False


class ChunkedConvolution(torch.autograd.Function):
    """``torch.convolution`` whose forward and backward run ``chunk`` samples at a time (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups, chunk, claim=_claim_nothing):
        ctx.save_for_backward(x, weight)
        ctx.geometry = (stride, padding, dilation, groups)
        ctx.chunk, ctx.has_bias, ctx.claim = chunk, bias is not None, claim

        def convolve(part: torch.Tensor) -> torch.Tensor:
            return torch.convolution(part, weight, bias, stride, padding, dilation, False, [0] * len(stride), groups)

        if x.shape[0] <= chunk:
            return convolve(x)
        first = convolve(x[:chunk])
        out_format = _memory_format(first)
        if out_format is None:
            return torch.cat([first] + [convolve(x[start:start + chunk]) for start in range(chunk, x.shape[0], chunk)])
        out = torch.empty((x.shape[0], *first.shape[1:]), dtype=first.dtype, device=first.device,
                          memory_format=out_format)
        out[:chunk] = first
        del first
        for start in range(chunk, x.shape[0], chunk):
            out[start:start + chunk] = convolve(x[start:start + chunk])
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.geometry
        need_x, need_weight, need_bias = ctx.needs_input_grad[:3]
        mask = [need_x, need_weight, need_bias and ctx.has_bias]
        bias_sizes = [weight.shape[0]] if ctx.has_bias else None
        grad_x = (x if ctx.claim(x) else torch.empty_like(x)) if need_x else None
        grad_weight = grad_bias = None
        total = torch.promote_types(weight.dtype, torch.float32)  # the chunks' weight and bias gradients sum in it
        for start in range(0, x.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            part_x, part_weight, part_bias = torch.ops.aten.convolution_backward(
                grad_out[rows], x[rows], weight, bias_sizes, stride, padding, dilation, False, [0] * len(stride),
                groups, mask)
            if need_x:
                grad_x[rows].copy_(part_x)  # over x[rows] where x was claimed: its last use was just above
            if mask[1]:
                grad_weight = part_weight.to(total) if grad_weight is None else grad_weight.add_(part_weight)
            if mask[2]:
                grad_bias = part_bias.to(total) if grad_bias is None else grad_bias.add_(part_bias)
            del part_x  # before the next chunk's is allocated
        grad_weight = None if grad_weight is None else grad_weight.to(weight.dtype)  # a half-precision weight's
        grad_bias = None if grad_bias is None else grad_bias.to(weight.dtype)        # sums rounded once, at the end
        return grad_x, grad_weight, grad_bias, None, None, None, None, None, None


def _memory_format(tensor: torch.Tensor) -> torch.memory_format | None:
    """The standard memory format ``tensor`` is dense in (contiguous, or channels-last for 4-D and 5-D), if any."""
    channels_last = {4: torch.channels_last, 5: torch.channels_last_3d}.get(tensor.dim())
    for memory_format in (torch.contiguous_format, channels_last):
        if memory_format is not None and tensor.is_contiguous(memory_format=memory_format):
            return memory_format
    return None


def _chunk_samples(x: torch.Tensor, chunk_bytes: int) -> int:
    """Samples per chunk: as many as fit in ``chunk_bytes``, at least one (any number for an empty batch)."""
    return max(1, chunk_bytes // max(1, math.prod(x.shape[1:]) * x.element_size()))


class ChunkedBatchNorm(torch.autograd.Function):
    """Training-mode ``native_batch_norm`` whose backward runs ``chunk`` samples at a time (see the module)."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum, eps, chunk, claim=_claim_nothing):
        out, mean, invstd = torch.ops.aten.native_batch_norm(x, weight, bias, running_mean, running_var, True,
                                                             momentum, eps)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.chunk, ctx.claim = chunk, claim
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, mean, invstd = ctx.saved_tensors
        need_x, need_weight, need_bias = ctx.needs_input_grad[:3]
        per_channel = (1, -1) + (1,) * (x.dim() - 2)
        dims = [0, *range(2, x.dim())]
        exact = torch.promote_types(mean.dtype, torch.float32)  # what sums and factors are computed in
        mean, invstd = mean.to(exact), invstd.to(exact)  # widened where a half-precision model has them in half
        centre = mean.view(per_channel)
        chunks = [slice(start, start + ctx.chunk) for start in range(0, x.shape[0], ctx.chunk)]
        sum_dy = torch.zeros_like(mean)
        sum_dy_centred = torch.zeros_like(mean)  # sum of dy * (x - mean), per channel
        for rows in chunks:  # one chunk-sized temporary at a time
            dy = grad_out[rows]
            sum_dy += dy.sum(dims, dtype=exact)  # a half-precision sum would be rounded to 8 or 11 bits
            sum_dy_centred += (x[rows] - centre).mul_(dy).sum(dims)
        grad_x = None
        if need_x:
            count = x.numel() // x.shape[1]
            scale = (invstd if weight is None else weight * invstd).view(per_channel)
            mean_dy = (sum_dy / count).view(per_channel)
            slope = (sum_dy_centred * invstd * invstd / count).view(per_channel)
            grad_x = x if ctx.claim(x) else torch.empty_like(x)
            in_place = torch.promote_types(x.dtype, exact) == x.dtype  # not a half-precision input
            for rows in chunks:  # where x was claimed, its rows are read here for the last time
                if in_place:  # the formula below computed in the chunk's rows of grad_x: no temporary
                    part = torch.sub(x[rows], centre, out=grad_x[rows])
                    part.mul_(slope).sub_(grad_out[rows]).add_(mean_dy).mul_(-scale)
                else:  # in the statistics' precision, rounded to the input's once
                    grad_x[rows] = (grad_out[rows] - mean_dy - (x[rows] - centre) * slope) * scale
        grad_weight = sum_dy_centred * invstd if need_weight else None
        grad_bias = sum_dy if need_bias else None
        return grad_x, grad_weight, grad_bias, None, None, None, None, None, None


def _chunked_convolution(module: nn.modules.conv._ConvNd, chunk_bytes: int, active: Callable[[], bool],
                         claim: Callable[[torch.Tensor], bool]) -> Callable[[torch.Tensor], torch.Tensor]:
    plain = _CONVOLUTIONS[type(module)]
    batched_dims = module.weight.dim()  # (N, C, *spatial): as many dimensions as the weight has

    def forward(x: torch.Tensor) -> torch.Tensor:
        wants_grad = torch.is_grad_enabled() and (x.requires_grad or module.weight.requires_grad)
        chunk = _chunk_samples(x, chunk_bytes)
        if not wants_grad or x.device.type != "cpu" or x.dim() != batched_dims or x.shape[0] <= chunk or not active():
            return plain(module, x)
        return ChunkedConvolution.apply(x, module.weight, module.bias, module.stride, module.padding,
                                        module.dilation, module.groups, chunk, claim)

    return forward


class _BatchNormCalls(TorchFunctionMode):
    """Routes a batch norm module's own ``F.batch_norm`` call to :class:`ChunkedBatchNorm` when it trains on a
    large CPU input, so that the module's forward (its momentum and batch counter) runs unchanged."""

    def __init__(self, chunk_bytes: int, active: Callable[[], bool], claim: Callable[[torch.Tensor], bool]):
        super().__init__()
        self.chunk_bytes, self.active, self.claim = chunk_bytes, active, claim

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.batch_norm:
            return func(*args, **kwargs)
        call = _BATCH_NORM_SIGNATURE.bind(*args, **kwargs)
        call.apply_defaults()
        x, running_mean, running_var, weight, bias, training, momentum, eps = call.arguments.values()
        wants_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
        chunk = _chunk_samples(x, self.chunk_bytes)
        if not training or not wants_grad or x.device.type != "cpu" or x.dim() < 2 or x.shape[0] <= chunk \
                or not self.active():
            return func(*args, **kwargs)
        return ChunkedBatchNorm.apply(x, weight, bias, running_mean, running_var, momentum, eps, chunk, self.claim)


def _chunked_batch_norm(module: nn.modules.batchnorm._BatchNorm, chunk_bytes: int, active: Callable[[], bool],
                        claim: Callable[[torch.Tensor], bool]) -> Callable[[torch.Tensor], torch.Tensor]:
    plain = _BATCH_NORMS[type(module)]

    def forward(x: torch.Tensor) -> torch.Tensor:
        with _BatchNormCalls(chunk_bytes, active, claim):
            return plain(module, x)

    return forward


def _plain_convolution(module: nn.Module) -> TypeGuard[nn.modules.conv._ConvNd]:
    """A convolution with its class's own forward and zero padding given as numbers."""
    return (type(module) in _CONVOLUTIONS and "forward" not in vars(module) and module.padding_mode == "zeros"
            and not isinstance(module.padding, str))


def _plain_batch_norm(module: nn.Module) -> TypeGuard[nn.modules.batchnorm._BatchNorm]:
    """A batch norm with its class's own forward."""
    return type(module) in _BATCH_NORMS and "forward" not in vars(module)


def chunked_layers(model: nn.Module, chunk_bytes: int = DEFAULT_CHUNK_BYTES, active: Callable[[], bool] = lambda: True,
                   claim: Callable[[torch.Tensor], bool] = _claim_nothing) -> contextlib.AbstractContextManager[int]:
    """A context in which ``model``'s plain convolutions (forward and backward) and batch norms (backward) run in
    chunks of at most ``chunk_bytes`` of input (0: none); it yields how many layers it patched, and leaves the model as it was on
    exit.

    ``active()`` is asked at each call; a layer runs plainly when it says False. A session passes "my hooks (or
    my recomputed blocks') are the innermost saved-tensor hooks": inside a region checkpointed with
    ``torch.utils.checkpoint`` the layers must run plainly, since the region's recomputation in backward runs
    after the session closed, without these patches, and must save the same tensors as its forward did.

    ``claim(x)`` is asked in backward about the saved input: True says that ``x`` is the caller's alone (a session
    says so for a span it decoded for this backward and nothing else holds), and the layer then writes the input's
    gradient over it, one chunk after that chunk's last use, instead of into a new input-sized buffer."""
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 0:
        raise ValueError(f"chunk_bytes is the most input bytes one chunk of a layer reads, an int "
                         f">= 0 (default {DEFAULT_CHUNK_BYTES}; 0 runs every layer on the whole batch), "
                         f"got {chunk_bytes!r}")
    return _patched(model, chunk_bytes, active, claim)


@contextlib.contextmanager
def _patched(model: nn.Module, chunk_bytes: int, active: Callable[[], bool],
             claim: Callable[[torch.Tensor], bool]) -> Iterator[int]:
    patched: list[nn.Module] = []
    try:
        for module in (model.modules() if chunk_bytes else ()):
            if _plain_convolution(module):
                forward = _chunked_convolution(module, chunk_bytes, active, claim)
            elif _plain_batch_norm(module):
                forward = _chunked_batch_norm(module, chunk_bytes, active, claim)
            else:
                continue
            patched.append(module)
            patched[-1].forward = forward
        yield len(patched)
    finally:
        for module in patched:
            del module.forward
