"""What a saved tensor is, and where in its storage it lives.

:func:`kind_of` names what autograd saved: a floating ``activation``, a boolean
``mask`` or an integer ``index``. :class:`Footprint` is the span of storage
elements a strided tensor touches, which is how the session recognises one
storage saved several times (a ReLU output that the next conv also saves, or a
transposed view) and rebuilds each view with its own size, strides and offset.
:class:`ModelStorages` recognises parameters and buffers, including views of
them such as the transposed weight that ``Linear`` saves. :func:`pool_window`
names the pooling geometry of a max-pool's saved indices (the ``window`` codec).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from hpcdl.compress.window import MAX_TAPS


def kind_of(tensor: torch.Tensor) -> str | None:
    """``"activation"``, ``"mask"`` or ``"index"``; None for dtypes no codec handles (complex, quantized)."""
    if tensor.dtype == torch.bool:
        return "mask"
    if tensor.dtype.is_floating_point:
        return "activation"
    if tensor.dtype.is_complex or tensor.is_quantized:
        return None
    return "index"


_MAX_POOL_DIMS = ((nn.MaxPool3d, 3), (nn.MaxPool2d, 2), (nn.MaxPool1d, 1))


def pool_window(module: nn.Module, args: tuple) -> dict | None:
    """The ``window`` codec config for the indices ``module`` saves when it is an ``nn.MaxPool1d/2d/3d`` called on
    ``args`` (its geometry and its input's spatial size); None for any other module or an input it cannot be."""
    dims = next((d for kind, d in _MAX_POOL_DIMS if isinstance(module, kind)), None)
    if dims is None or not args or not isinstance(args[0], torch.Tensor) or args[0].dim() < dims + 1:
        return None

    def per_dim(value) -> list[int]:
        return [int(v) for v in value] if isinstance(value, (tuple, list)) else [int(value)] * dims

    kernel = per_dim(module.kernel_size)
    if math.prod(kernel) > MAX_TAPS:
        return None
    return {"id": "window", "input": list(args[0].shape[-dims:]), "kernel": kernel,
            "stride": per_dim(module.stride or module.kernel_size), "padding": per_dim(module.padding),
            "dilation": per_dim(module.dilation)}


def is_plain_strided(tensor: torch.Tensor) -> bool:
    """A dense, strided, non-subclass tensor with real storage: the only kind the session packs."""
    return (
        type(tensor) is torch.Tensor
        and tensor.layout == torch.strided
        and tensor.device.type != "meta"
        and not tensor.is_quantized
        and tensor.numel() > 0
    )


@dataclass(frozen=True)
class Footprint:
    """Size, strides and storage offset of a view, and the storage span [lo, hi) it touches, in elements.

    PyTorch strides are never negative, so the span starts at the offset.
    """

    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    @classmethod
    def of(cls, tensor: torch.Tensor) -> Footprint:
        return cls(tuple(tensor.size()), tuple(tensor.stride()), tensor.storage_offset())

    @property
    def lo(self) -> int:
        return self.offset

    @property
    def hi(self) -> int:
        return self.offset + sum((s - 1) * st for s, st in zip(self.size, self.stride)) + 1

    @property
    def numel(self) -> int:
        return math.prod(self.size)

    @property
    def distinct_size(self) -> tuple[int, ...]:
        """The size with every stride-0 (expanded) dim cut to 1: the view's distinct elements, if it has no overlap."""
        return tuple(1 if st == 0 else s for s, st in zip(self.size, self.stride))

    def within(self, lo: int, hi: int) -> bool:
        return lo <= self.lo and self.hi <= hi


@dataclass(frozen=True)
class Layout:
    """How the session packs one saved view so that any geometry restores without writing into overlapping memory.

    The view's *distinct* elements are those left when every stride-0 (expanded)
    dim is cut to size 1; ``order`` lists the dims by falling stride (memory
    order). The session packs the cheaper of two things:

    * ``span``: the storage elements [lo, hi) themselves, when there are no more of
      them than distinct elements (a contiguous tensor, a transpose, an expanded
      row, an overlapping ``unfold``). The view is rebuilt with ``as_strided`` on
      the decoded span, so it gets back its exact strides (lossless gradients stay
      bit-identical), and any other view inside the span can share the entry.
      ``dense`` says the distinct view fills the span exactly: then it is packed in
      its own (permuted) shape, with no copy, rather than as a flat run.
    * ``compact``: the distinct elements copied in memory order, when the span has
      gaps (a slice with steps, a column of a wide matrix). Rebuilt by permuting the
      decoded tensor back and expanding the stride-0 dims: the same size and the
      same order of strides, without the gaps (restoring those would cost memory).
    """

    footprint: Footprint
    span: bool
    dense: bool
    order: tuple[int, ...]

    @classmethod
    def of(cls, footprint: Footprint) -> Layout:
        distinct = footprint.distinct_size
        order = tuple(sorted(range(len(distinct)), key=lambda d: (-footprint.stride[d], -distinct[d])))
        extent, dense = 1, True  # the span of the dims seen so far, from the smallest stride up
        for d in reversed(order):
            if distinct[d] > 1:
                dense = dense and footprint.stride[d] == extent
                extent += (distinct[d] - 1) * footprint.stride[d]
        span = extent <= math.prod(distinct)
        return cls(footprint, span, span and dense, order)

    @property
    def numel(self) -> int:
        """Elements packed: the span's, or the distinct elements'."""
        return self.footprint.hi - self.footprint.lo if self.span else math.prod(self.footprint.distinct_size)

    def source(self, tensor: torch.Tensor) -> torch.Tensor:
        """What to encode for ``tensor`` (whose footprint this is): a view of its storage, or a compact copy."""
        fp = self.footprint
        shape = [fp.distinct_size[d] for d in self.order]  # the distinct elements, in memory order
        if self.dense:  # the span in that shape, with canonical strides (whatever the strides of size-1 dims were)
            return tensor.as_strided(shape, _contiguous_strides(shape), fp.lo)
        if self.span:
            return tensor.as_strided((self.numel,), (1,), fp.lo)
        return tensor.as_strided(fp.distinct_size, fp.stride, fp.offset).permute(self.order).contiguous()

    def rebuild(self, base: torch.Tensor, footprint: Footprint) -> torch.Tensor:
        """The view ``footprint`` on the decoded ``base`` (contiguous, in the shape :meth:`source` had).

        ``footprint`` is this layout's own, or in ``span`` mode any view inside the span.
        """
        if self.span:
            offset = base.storage_offset() + footprint.offset - self.footprint.lo
            return base.as_strided(footprint.size, footprint.stride, offset)
        inverse = sorted(range(len(self.order)), key=self.order.__getitem__)
        return base.permute(inverse).expand(footprint.size)


def _contiguous_strides(shape: list[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    """Which storage ``tensor`` views: equal for every view of one storage, unique among live storages.

    The address of the storage object (``_cdata``), not of its data: meta and fake tensors have
    no data address (fake tensors warn when asked) and empty storages share address zero.
    """
    return str(tensor.device), tensor.untyped_storage()._cdata


class ModelStorages:
    """The storages of a model's parameters and buffers, to recognise them (and views of them) when saved."""

    def __init__(self, model: torch.nn.Module):
        tensors = [*model.parameters(), *model.buffers()]
        self.pointers = {storage_key(t) for t in tensors if t.numel() > 0}

    def owns(self, tensor: torch.Tensor) -> bool:
        return storage_key(tensor) in self.pointers


def normalized_channels(batch_norm_input: tuple[int, ...] | None, tensor: torch.Tensor, layout: Layout) -> int | None:
    """The dim of ``layout.source(tensor)`` that indexes channels when ``tensor`` is the input a running batch norm
    saves (``batch_norm_input``: that module's input shape, or None outside a batch norm), else None.

    Batch norm's backward reads its input per channel (dim 1), so a compression error there matters in units of
    each channel's spread (:mod:`hpcdl.compress.channels`). The source is the tensor's elements in memory order,
    so a channels-last input has its channels last there; a view packed as a flat span has no channel dim.
    """
    if batch_norm_input is None or tuple(tensor.shape) != batch_norm_input or tensor.dim() < 2:
        return None
    if layout.span and not layout.dense:
        return None
    return layout.order.index(1)
