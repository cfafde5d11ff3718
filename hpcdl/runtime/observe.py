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
from dataclasses import dataclass

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from hpcdl.runtime.classify import ModelStorages, pool_window

ROOT = "(model)"  # the label of the model itself (its empty module name)
OUTSIDE = "(outside)"  # saved while no module of the model runs


@dataclass(frozen=True)
class Frame:
    """One running module as :class:`ModuleTracker` sees it: its label, the ``window`` codec config of its indices
    when it is a max pool, and its input's shape when it is a batch norm (whose backward reads that saved input
    channel by channel: :func:`~hpcdl.runtime.classify.normalized_channels`)."""

    label: str
    window: dict | None = None
    batch_norm_input: tuple[int, ...] | None = None

    @classmethod
    def of(cls, label: str, module: torch.nn.Module, args: tuple) -> Frame:
        normalized = isinstance(module, _BatchNorm) and bool(args) and isinstance(args[0], torch.Tensor)
        return cls(label, pool_window(module, args), tuple(args[0].shape) if normalized else None)


class ModuleTracker:
    """The innermost running module of ``model`` while the context is open: its name (:attr:`current`) and what
    it tells about the tensors it saves (:attr:`frame`)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.frames: list[Frame] = []
        self._handles: list = []

    @property
    def current(self) -> str:
        return self.frames[-1].label if self.frames else OUTSIDE

    @property
    def frame(self) -> Frame:
        return self.frames[-1] if self.frames else Frame(OUTSIDE)

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
        self.frames.clear()

    def _enter(self, label: str):
        def hook(module, args):
            self.frames.append(Frame.of(label, module, args))
        return hook

    def _leave(self, label: str):
        def hook(module, args, output):
            if self.frames and self.frames[-1].label == label:
                self.frames.pop()
        return hook


@contextlib.contextmanager
def observe_saved(model: torch.nn.Module, on_saved: Callable[[torch.Tensor, str], None]) -> Iterator[None]:
    """Call ``on_saved(tensor, module name)`` for each activation ``model`` saves for backward inside the block."""
    owned = ModelStorages(model)
    with ModuleTracker(model) as modules:
        def pack(tensor: torch.Tensor) -> torch.Tensor:
            if not owned.owns(tensor):
                on_saved(tensor, modules.current)
            return tensor.detach()  # not the tensor itself: an op's saved output would hold the op (a leak)

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            yield
