"""The activations a benchmark compresses: what autograd saves for backward in real models on real-looking input.

:func:`saved_activations` runs one forward pass under :func:`hpcdl.runtime.observe.observe_saved` and keeps
every saved tensor except the model's parameters and buffers (and views of them), once per storage.
:func:`natural_images` draws images with the power-law spectrum of natural photographs and correlated
colour channels, so that the CNN and the vision transformer see smooth, structured input rather than white noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hpcdl import models
from hpcdl.runtime.classify import kind_of, storage_key
from hpcdl.runtime.observe import observe_saved

SPECTRAL_EXPONENT = 1.25
# (model name, scale, batch size): a ResNet-style CNN and a transformer, full size and --quick
WORKLOADS = {
    "full": (("resnet18", "small", 16), ("vit", "small", 8)),
    "quick": (("resnet18", "tiny", 1), ("vit", "tiny", 1)),
}


@dataclass(frozen=True)
class Activations:
    """The tensors one model saved for backward, with where they came from."""

    model: str
    scale: str
    batch_size: int
    tensors: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)


def natural_images(batch: int, channels: int, height: int, width: int, generator: torch.Generator) -> torch.Tensor:
    """Images with a power-law amplitude spectrum 1/f**SPECTRAL_EXPONENT, standardised per image.

    The exponent gives neighbouring pixels a correlation of about 0.92, as in natural photographs.
    Channels share one luminance field plus a weaker field of their own, as colour channels do.
    """
    fy = torch.fft.fftfreq(height).abs().unsqueeze(1)
    fx = torch.fft.rfftfreq(width).unsqueeze(0)
    amplitude = torch.sqrt(fx**2 + fy**2).clamp_min(1.0 / max(height, width)) ** -SPECTRAL_EXPONENT

    def field(count: int) -> torch.Tensor:
        spectrum = torch.randn(count, height, width // 2 + 1, 2, generator=generator)
        return torch.fft.irfft2(torch.view_as_complex(spectrum) * amplitude, s=(height, width))

    images = field(batch).unsqueeze(1) + 0.3 * field(batch * channels).reshape(batch, channels, height, width)
    mean = images.mean(dim=(1, 2, 3), keepdim=True)
    std = images.std(dim=(1, 2, 3), keepdim=True)
    return (images - mean) / std


def saved_activations(model: torch.nn.Module, inputs: torch.Tensor) -> list[torch.Tensor]:
    """Every tensor ``model(inputs)`` saves for backward, minus parameters and buffers, one per storage.

    Where a storage was saved through several views, the view with the most elements is kept.
    """
    by_storage: dict[tuple, torch.Tensor] = {}

    def keep(tensor: torch.Tensor, _module: str) -> None:
        if kind_of(tensor) is not None and tensor.numel() > 0:
            key = storage_key(tensor)
            if key not in by_storage or tensor.numel() > by_storage[key].numel():
                by_storage[key] = tensor.detach()

    with observe_saved(model, keep):
        model(inputs)
    return list(by_storage.values())


def benchmark_activations(quick: bool = False, seed: int = 0, device: str = "cpu") -> list[Activations]:
    """The saved activations of each workload (``WORKLOADS``) on natural-looking images, on ``device``."""
    generator = torch.Generator().manual_seed(seed)
    captured = []
    for name, scale, batch in WORKLOADS["quick" if quick else "full"]:
        torch.manual_seed(seed)  # the model's initial weights
        model = models.get(name, scale=scale).to(device).train()
        channels, height, width = models.family(name).input_shape(scale)
        inputs = natural_images(batch, channels, height, width, generator).to(device)
        captured.append(Activations(name, scale, batch, saved_activations(model, inputs)))
    return captured


def describe(activations: Activations) -> dict:
    """JSON-safe summary: model, scale, batch, tensor count and bytes per dtype."""
    per_dtype: dict[str, int] = {}
    for tensor in activations.tensors:
        key = str(tensor.dtype).removeprefix("torch.")
        per_dtype[key] = per_dtype.get(key, 0) + tensor.numel() * tensor.element_size()
    return {
        "model": activations.model,
        "scale": activations.scale,
        "batch_size": activations.batch_size,
        "tensors": len(activations.tensors),
        "bytes": activations.nbytes,
        "bytes_per_dtype": per_dtype,
        "largest_tensor_bytes": max((t.numel() * t.element_size() for t in activations.tensors), default=0),
    }
