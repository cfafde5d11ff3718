"""Watching what autograd saves, without changing it: the one read-only saved-tensor hook.

:func:`observe_saved` runs a block under ``torch.autograd.graph.saved_tensors_hooks`` whose pack
hook calls ``on_saved(tensor, module)`` for every saved tensor that is not one of the model's
parameters or buffers (or a view of one; :class:`~hpcdl.runtime.classify.ModelStorages`) and
returns the tensor unchanged. ``module`` is the name of the innermost module whose forward is
running (:class:`ModuleTracker`, which the compression session uses too). Storages are told apart
by :func:`~hpcdl.runtime.classify.storage_key`. The activation footprint of the model zoo, the
study's per-module activation statistics and the codec benchmark's captured activations are all
written on it; the session (which replaces what is saved) shares its module tracking and storages.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from hpcdl.runtime.classify import ModelStorages, pool_window

ROOT = "(model)"  # the label of the model itself (its empty module name)
OUTSIDE = "(outside)"  # saved while no module of the model runs


class ModuleTracker:
    """The name of the innermost running module of ``model`` (:attr:`current`) while the context is open, and
    the ``window`` codec config of its indices when it is a max pool (:attr:`current_window`)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.stack: list[str] = []
        self.windows: list[dict | None] = []
        self._handles: list = []

    @property
    def current(self) -> str:
        return self.stack[-1] if self.stack else OUTSIDE

    @property
    def current_window(self) -> dict | None:
        return self.windows[-1] if self.windows else None

    def __enter__(self) -> ModuleTracker:
        for name, module in self.model.named_modules():
            label = name or ROOT
            self._handles.append(module.register_forward_pre_hook(self._enter(label)))
            self._handles.append(module.register_forward_hook(self._leave(label), always_call=True))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.stack.clear()
        self.windows.clear()

    def _enter(self, label: str):
        def hook(module, args):
            self.stack.append(label)
            self.windows.append(pool_window(module, args))
        return hook

    def _leave(self, label: str):
        def hook(module, args, output):
            if self.stack and self.stack[-1] == label:
                self.stack.pop()
                self.windows.pop()
        return hook


@contextlib.contextmanager
def observe_saved(model: torch.nn.Module, on_saved: Callable[[torch.Tensor, str], None]) -> Iterator[None]:
    """Call ``on_saved(tensor, module name)`` for each activation ``model`` saves for backward inside the block."""
    owned = ModelStorages(model)
    with ModuleTracker(model) as modules:
        def pack(tensor: torch.Tensor) -> torch.Tensor:
            if not owned.owns(tensor):
                on_saved(tensor, modules.current)
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            yield
