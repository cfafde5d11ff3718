"""Ops whose backward compares the tensors they saved for equality, whose saves a session keeps exact.

The backward of ``amax``/``amin`` (and ``aminmax``), of a whole-tensor ``max``/``min``/``median``/``nanmedian`` and
of the norms that are a maximum (vector norms, distances, ``F.normalize`` and the triplet loss of order +-inf;
matrix norms of order +-1, +-2, +-inf) sends the gradient to the elements of the saved input that *equal* the saved
result, divided by how many do. A lossy copy of the input (or of the result) matches no element however small its
error: the division is 0/0 and the gradient NaN (``amax``, the norms), or it is lost (``max()``, ``median()``,
``cdist``). So whatever such an op saves while :class:`ExactSaves` is active is kept as it is by the session
(:meth:`hpcdl.runtime.session.Session.pack`), never shared with a lossy copy of the same tensor; everything else is
compressed as before. The same ops with a ``dim`` that return indices (``max(x, 1)``, ``median(x, 1)``) save the
indices, which stay exact anyway.

Which call runs is known only at the Python level, so the mode intercepts the calls (a ``TorchFunctionMode``,
as :mod:`hpcdl.runtime.chunked` does for batch norms) and marks the saves made while one runs.
"""

from __future__ import annotations

import math
import threading

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

# Always compared for equality in backward.
_REDUCTIONS = (torch.amax, torch.amin, torch.aminmax, torch.Tensor.amax, torch.Tensor.amin, torch.Tensor.aminmax)
# Compared for equality when called on the whole tensor (no dim, no second tensor): otherwise indices or a mask.
_WHOLE_TENSOR = (torch.max, torch.min, torch.median, torch.nanmedian,
                 torch.Tensor.max, torch.Tensor.min, torch.Tensor.median, torch.Tensor.nanmedian)
# Norms and distances: the position and name of their order argument, and its default. Python-level functions
# that take a norm's order (F.normalize) are here themselves: the mode does not see the calls they make.
_NORMS = {
    torch.norm: (1, "p", "fro"), torch.Tensor.norm: (1, "p", "fro"),
    torch.linalg.vector_norm: (1, "ord", 2), torch.linalg.norm: (1, "ord", None),
    torch.linalg.matrix_norm: (1, "ord", "fro"), F.normalize: (1, "p", 2.0),
    torch.dist: (2, "p", 2), torch.Tensor.dist: (2, "p", 2), torch.cdist: (2, "p", 2.0),
    torch.renorm: (1, "p", 2), torch.Tensor.renorm: (1, "p", 2),
    torch.pairwise_distance: (2, "p", 2.0), F.triplet_margin_loss: (4, "p", 2),
}
_MATRIX_ORDERS = (1, -1, 2, -2, math.inf, -math.inf)  # a maximum or minimum over columns, rows or singular values
#: Every function the mode looks at; any other call passes straight through.
WATCHED = frozenset((*_REDUCTIONS, *_WHOLE_TENSOR, *_NORMS))

_state = threading.local()


def saving_for_equality() -> bool:
    """Whether the tensors autograd saves now are saved by an op that compares them for equality in backward."""
    return getattr(_state, "depth", 0) > 0


def compares_saved(func, args: tuple, kwargs: dict) -> bool:
    """Whether the call ``func(*args, **kwargs)`` is one of the ops of the module docstring."""
    if func in _REDUCTIONS:
        return True
    if func in _WHOLE_TENSOR:
        return len(args) == 1 and not kwargs
    if func not in _NORMS:
        return False
    position, name, default = _NORMS[func]
    order = kwargs.get(name, args[position] if len(args) > position else default)
    if not isinstance(order, (int, float)):  # "fro", "nuc", None (2-norm or Frobenius)
        return False
    if func is torch.linalg.matrix_norm or (func is torch.linalg.norm and _matrix_norm(args, kwargs)):
        return order in _MATRIX_ORDERS
    return math.isinf(order)


def _matrix_norm(args: tuple, kwargs: dict) -> bool:
    """Whether a ``torch.linalg.norm`` call computes a matrix norm: two dims, or none on a 2-D input."""
    dim = kwargs.get("dim", args[2] if len(args) > 2 else None)
    if dim is None:
        return isinstance(args[0], torch.Tensor) and args[0].dim() == 2
    return isinstance(dim, (tuple, list)) and len(dim) == 2


class ExactSaves(TorchFunctionMode):
    """While active, marks the saves of the ops of the module docstring (:func:`saving_for_equality`)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in WATCHED or not compares_saved(func, args, kwargs):
            return func(*args, **kwargs)
        _state.depth = getattr(_state, "depth", 0) + 1
        try:
            return func(*args, **kwargs)
        finally:
            _state.depth -= 1
