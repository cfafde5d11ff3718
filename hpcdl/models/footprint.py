"""Measure the activation memory of a training step: what autograd saves for backward.

Runs one real forward and backward under :func:`hpcdl.runtime.observe.observe_saved`
and records every tensor autograd saves, except the model's own parameters and
buffers (recognised by storage, so views of a parameter count as the parameter).
These saved tensors are exactly what hpcdl's activation compression replaces, so the
measurement says how much memory compression can act on.

With ``device="fake"`` the step runs under PyTorch's ``FakeTensorMode``: tensors
claim to be on the CPU, so every operator (``scaled_dot_product_attention``
included) takes the same kernel and saves the same tensors as a real CPU step, but
no data exist and nothing is computed. Full-scale configurations (DeepCAM's 768 x 1152
input, GPT-2 at 1024 tokens) are then measured in seconds on any machine; the tests
check that fake and real CPU steps count the same bytes. A GPU step can save
different tensors where cuDNN or the attention kernels differ; measure with
``device="cuda"`` there.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from hpcdl.models.registry import ModelError, family
from hpcdl.runtime.classify import storage_key
from hpcdl.runtime.observe import observe_saved


@dataclass(frozen=True)
class SavedBytes:
    """Bytes autograd held for backward after one forward.

    ``unique``: distinct storages (the memory actually held; a tensor saved by two
    operations, e.g. a ReLU output that the next convolution also saves, counts once).
    ``total``: summed over every save, as a per-tensor compressor would see them.
    """

    unique: int
    total: int
    tensors: int


def saved_bytes(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, loss_fn) -> SavedBytes:
    """Run ``loss_fn(model(inputs), targets).backward()`` once and count what autograd saved in between."""
    storages: dict[tuple, int] = {}
    total = tensors = 0

    def count(tensor: torch.Tensor, _module: str) -> None:
        nonlocal total, tensors
        storages[storage_key(tensor)] = tensor.untyped_storage().nbytes()
        total += tensor.numel() * tensor.element_size()
        tensors += 1

    with observe_saved(model, count):
        loss = loss_fn(model(inputs), targets)
    loss.backward()
    return SavedBytes(unique=sum(storages.values()), total=total, tensors=tensors)


@dataclass(frozen=True)
class ModelFootprint:
    """A model at one scale: parameter count, per-sample input shape and activation bytes per sample."""

    name: str
    scale: str
    parameters: int
    input_shape: tuple[int, ...]
    activation_bytes_per_sample: int
    saved_bytes_per_sample: int
    device: str


# The old name, kept for one release: hpcdl.runtime.classify.Footprint is another thing (a tensor's storage span).
Footprint = ModelFootprint


def measure(name: str, scale: str, device: str = "fake") -> ModelFootprint:
    """Measure model ``name`` at ``scale`` with training-mode steps at batch 1 and batch 2.

    Per-sample bytes are the difference between the two batches, so batch-independent
    saved tensors (e.g. normalisation statistics) do not inflate them. ``device`` is
    ``"fake"`` (shapes only, see the module docstring) or a real torch device
    (``"cpu"``, ``"cuda"``) on which the model and batch are built and run.
    """
    model_family = family(name)
    if device == "fake":
        # Private but stable since PyTorch 2.0; tests compare it against real CPU steps.
        from torch._subclasses.fake_tensor import FakeTensorMode

        context, torch_device = FakeTensorMode(), torch.device("cpu")
    else:
        context, torch_device = contextlib.nullcontext(), _real_device(device)
    with context:
        with torch_device:
            model = model_family.build(scale)
        model.train()
        generator = torch.Generator().manual_seed(0)
        counts = []
        for batch_size in (1, 2):
            x, y = model_family.example_batch(scale, batch_size, generator)
            counts.append(saved_bytes(model, x.to(torch_device), y.to(torch_device), model_family.loss))
            model.zero_grad(set_to_none=True)
        parameters = sum(p.numel() for p in model.parameters())
    return ModelFootprint(
        name=name,
        scale=scale,
        parameters=parameters,
        input_shape=model_family.input_shape(scale),
        activation_bytes_per_sample=counts[1].unique - counts[0].unique,
        saved_bytes_per_sample=counts[1].total - counts[0].total,
        device=device,
    )


def _real_device(device: str) -> torch.device:
    try:
        torch_device = torch.device(device)
    except RuntimeError:
        raise ModelError(f"unknown device {device!r}; use 'fake', 'cpu' or 'cuda'") from None
    if torch_device.type == "meta":
        raise ModelError("device 'meta' picks other attention kernels than a real step; use 'fake' for shape-only runs")
    if torch_device.type == "cuda" and not torch.cuda.is_available():
        raise ModelError("device 'cuda' asked for but no CUDA device is available; use 'fake' or 'cpu'")
    return torch_device
