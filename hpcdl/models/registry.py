"""The model registry: ``get(name, scale, **kw)``, ``family(name)``, ``names()``.

A :class:`ModelFamily` (one registered model at all its scales) says everything a trainer, a memory study or a benchmark needs
to drive a model without knowing its class: the task, the input it takes at each
scale, how to make a random batch of that input, the loss, and the blocks to recompute in
backward (PyTorch's activation checkpointing). The built-in models register themselves from
:mod:`hpcdl.models.catalog`, which the package ``hpcdl.models`` imports (this module never imports it:
the catalog depends on the registry, not the other way round).

``ModelSpec`` and ``spec(name)`` are the old names of :class:`ModelFamily` and :func:`family`, kept for one
release ("spec" in hpcdl now means only a method spec string such as ``"sz:rel=1e-2"``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from hpcdl.errors import HpcdlError

TASKS = ("segmentation", "classification", "language")


class ModelError(HpcdlError, ValueError):
    """An unknown model or scale, or a model description that cannot be registered."""


class ModelOptionError(HpcdlError, TypeError):
    """Constructor options a model does not take (a TypeError, as Python's own for an unknown keyword)."""


@dataclass(frozen=True)
class Scale:
    """One size of a model: constructor keyword arguments and the per-sample input shape they take."""

    kwargs: dict
    input_shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelFamily:
    """One registered model at all its scales: what it is for and what it takes; see the module docstring.

    ``scale_table`` returns {scale name: :class:`Scale`}; it is a function so that a model's
    scales are built only when asked for.
    ``make_input`` overrides how :meth:`example_batch` draws inputs (the particle
    transformer draws zero-padded particle sets).
    """

    name: str
    task: str
    num_classes: int
    scales: tuple[str, ...]
    model_class: type[nn.Module]
    scale_table: Callable[[], dict[str, Scale]]
    input_dtype: torch.dtype = torch.float32
    default_dataset: str | None = None
    description: str = ""
    make_input: Callable[[tuple[int, ...], int, torch.Generator | None], torch.Tensor] | None = field(
        default=None, repr=False
    )

    def __post_init__(self):
        if self.task not in TASKS:
            raise ModelError(f"model {self.name!r}: task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if not self.scales:
            raise ModelError(f"model {self.name!r} declares no scales")

    def scale(self, scale: str) -> Scale:
        if scale not in self.scales:
            raise ModelError(f"model {self.name!r} has no scale {scale!r}; its scales are {', '.join(self.scales)}")
        return self.scale_table()[scale]

    def input_shape(self, scale: str) -> tuple[int, ...]:
        """Per-sample input shape at ``scale`` (no batch dimension)."""
        return self.scale(scale).input_shape

    def build(self, scale: str = "small", **overrides) -> nn.Module:
        """A freshly initialised model at ``scale``; ``overrides`` replace constructor arguments."""
        kwargs = dict(self.scale(scale).kwargs)
        accepted = set(inspect.signature(self.model_class).parameters)
        unknown = sorted(set(overrides) - accepted)
        if unknown:
            raise ModelOptionError(
                f"model {self.name!r} does not take {', '.join(unknown)}; it takes {', '.join(sorted(accepted))}"
            )
        kwargs.update(overrides)
        return self.model_class(**kwargs)

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The model's top-level blocks in execution order, each called once per forward.

        Wrapping each block's forward in ``torch.utils.checkpoint`` recomputes its activations in
        backward (activation checkpointing, the ``recompute`` method) block by block; the blocks are disjoint.
        """
        if not isinstance(model, self.model_class):
            raise TypeError(f"model family {self.name!r} describes {self.model_class.__name__} models, got {type(model).__name__}")
        return list(model.checkpoint_blocks())

    def example_batch(
        self, scale: str, batch_size: int, generator: torch.Generator | None = None,
        input_shape: tuple[int, ...] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Random (x, y) of the right shapes and dtypes on the CPU, for memory and speed runs only.

        x: standard normal floats, or uniform token ids for language models; y: uniform
        class ids (N,), per-pixel class ids (N, H, W), or next-token ids (N, T). Nothing
        about it is learnable beyond memorisation: never report accuracy on it.
        ``input_shape`` replaces the scale's per-sample shape (same number of dimensions), e.g. a
        fully convolutional model at another image size.
        """
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ModelError(f"batch_size must be a positive int, got {batch_size!r}")
        shape = self.input_shape(scale)
        if input_shape is not None:
            if len(input_shape) != len(shape) or not all(isinstance(n, int) and n > 0 for n in input_shape):
                raise ModelError(f"input_shape for {self.name} is {len(shape)} positive sizes like "
                                 f"{'x'.join(map(str, shape))} (its {scale} shape), got {input_shape!r}")
            shape = tuple(input_shape)
        if self.task == "language":
            tokens = torch.randint(self.num_classes, (batch_size, shape[0] + 1), generator=generator)
            return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        if self.make_input is not None:
            x = self.make_input(shape, batch_size, generator)
        else:
            x = torch.randn((batch_size, *shape), generator=generator)
        target_shape = (batch_size, *shape[-2:]) if self.task == "segmentation" else (batch_size,)
        return x, torch.randint(self.num_classes, target_shape, generator=generator)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of the model's logits against class ids, per sample, pixel or token."""
        if self.task == "language":
            return F.cross_entropy(output.flatten(0, 1), target.flatten())
        return F.cross_entropy(output, target)


#: The old name of :class:`ModelFamily` (kept for one release).
ModelSpec = ModelFamily

_REGISTRY: dict[str, ModelFamily] = {}


def register(model_family: ModelFamily, *, replace: bool = False) -> ModelFamily:
    """Add a model to the registry (built-ins register from :mod:`hpcdl.models.catalog`)."""
    if model_family.name in _REGISTRY and not replace:
        raise ModelError(f"model {model_family.name!r} is already registered; pass replace=True")
    _REGISTRY[model_family.name] = model_family
    return model_family


def names() -> list[str]:
    """Every registered model name, in registration order (climate, HEP, vision, text)."""
    return list(_REGISTRY)


def family(name: str) -> ModelFamily:
    """The :class:`ModelFamily` of ``name``; unknown names raise ModelError (a ValueError) listing the known ones."""
    if name not in _REGISTRY:
        raise ModelError(f"unknown model {name!r}; known models: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


#: The old name of :func:`family` (kept for one release).
spec = family


def get(name: str, scale: str = "small", **kw) -> nn.Module:
    """A freshly initialised model ``name`` at ``scale``; ``kw`` override constructor arguments (e.g. in_channels)."""
    return family(name).build(scale, **kw)
