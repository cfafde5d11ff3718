"""What a saved tensor is, and where in its storage it lives.

:func:`kind_of` names what autograd saved: a floating ``activation``, a boolean
``mask`` or an integer ``index``. :class:`Footprint` is the span of storage
elements a strided tensor touches, which is how the session recognises one
storage saved several times (a ReLU output that the next conv also saves, or a
transposed view) and rebuilds each view with its own size, strides and offset.
:class:`ModelStorages` recognises parameters and buffers, including views of
them such as the transposed weight that ``Linear`` saves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def kind_of(tensor: torch.Tensor) -> str | None:
    """``"activation"``, ``"mask"`` or ``"index"``; None for dtypes no codec handles (complex, quantized)."""
    if tensor.dtype == torch.bool:
        return "mask"
    if tensor.dtype.is_floating_point:
        return "activation"
    if tensor.dtype.is_complex or tensor.is_quantized:
        return None
    return "index"


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
    """Size, strides and storage offset of a view, and the storage span [lo, hi) it touches, in elements."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    @classmethod
    def of(cls, tensor: torch.Tensor) -> "Footprint":
        return cls(tuple(tensor.size()), tuple(tensor.stride()), tensor.storage_offset())

    @property
    def lo(self) -> int:
        return self.offset + sum((s - 1) * st for s, st in zip(self.size, self.stride) if st < 0)

    @property
    def hi(self) -> int:
        return self.offset + sum((s - 1) * st for s, st in zip(self.size, self.stride) if st > 0) + 1

    @property
    def numel(self) -> int:
        return math.prod(self.size)

    def within(self, lo: int, hi: int) -> bool:
        return lo <= self.lo and self.hi <= hi


def dense_order(tensor: torch.Tensor) -> tuple[int, ...] | None:
    """A permutation that makes ``tensor`` contiguous, if it fills its storage span exactly (e.g. a transpose).

    Returns None for views with gaps or overlaps (slices with steps, expanded
    dims, a chunk of a wider tensor), whose span holds elements they do not own.
    """
    footprint = Footprint.of(tensor)
    if footprint.hi - footprint.lo != footprint.numel:
        return None
    order = tuple(sorted(range(tensor.dim()), key=lambda d: (-tensor.stride(d), -tensor.size(d))))
    return order if tensor.permute(order).is_contiguous() else None


class ModelStorages:
    """The storages of a model's parameters and buffers, to recognise them (and views of them) when saved."""

    def __init__(self, model: torch.nn.Module):
        tensors = [*model.parameters(), *model.buffers()]
        self.pointers = {self._key(t) for t in tensors if t.numel() > 0}

    @staticmethod
    def _key(tensor: torch.Tensor) -> tuple[str, int]:
        return str(tensor.device), tensor.untyped_storage().data_ptr()

    def owns(self, tensor: torch.Tensor) -> bool:
        return self._key(tensor) in self.pointers
