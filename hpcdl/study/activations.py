"""What the activations autograd saves look like, per module: the data behind the distribution plot.

One forward pass of a model on a real batch, under :func:`hpcdl.runtime.observe.observe_saved`,
records for each module the floating-point tensors saved for backward (parameters and buffers
excluded, each storage counted once): element count, bytes, fraction of exact zeros, range, mean,
standard deviation and quantiles. Error-bounded compressors do well on smooth, narrow-range or
sparse data (many zeros after ReLU) and badly on wide, heavy-tailed data; these numbers let a
reader see which a layer is.
"""

from __future__ import annotations

import torch
from torch import nn

from hpcdl.runtime.classify import storage_key
from hpcdl.runtime.observe import observe_saved

QUANTILES = (0.001, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 0.999)
# Values per module kept for the quantiles (torch.quantile takes at most 16M elements).
SAMPLE_LIMIT = 1 << 20


def capture_activation_stats(model: nn.Module, inputs: torch.Tensor) -> dict[str, dict]:
    """Run ``model(inputs)`` once (training mode, gradients on) and summarise what it saves, by module name."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"capture_activation_stats takes an nn.Module, got {type(model).__name__}")
    seen_storages: set[tuple] = set()
    saved: dict[str, list[torch.Tensor]] = {}

    def keep(tensor: torch.Tensor, module: str) -> None:
        if tensor.is_floating_point() and tensor.numel() > 0:
            storage = storage_key(tensor)
            if storage not in seen_storages:
                seen_storages.add(storage)
                saved.setdefault(module, []).append(tensor.detach().clone())

    was_training = model.training
    model.train()
    try:
        with observe_saved(model, keep):
            model(inputs)
    finally:
        model.train(was_training)
    return {name: summarise(tensors) for name, tensors in saved.items()}


def summarise(tensors: list[torch.Tensor]) -> dict:
    """Counts, min and max over all elements; quantiles, mean and std over an even subsample of at most SAMPLE_LIMIT values."""
    numel = sum(t.numel() for t in tensors)
    flat = torch.cat([_even_sample(t.reshape(-1), max(1, SAMPLE_LIMIT * t.numel() // numel)) for t in tensors])
    flat = flat.to(torch.float64)
    finite = flat[torch.isfinite(flat)]
    zeros = sum(int((t == 0).sum()) for t in tensors)
    stats = {
        "tensors": len(tensors),
        "numel": numel,
        "bytes": sum(t.numel() * t.element_size() for t in tensors),
        "zero_fraction": zeros / numel,
        "nonfinite": int(flat.numel() - finite.numel()),
    }
    if finite.numel():
        values = torch.quantile(finite, torch.tensor(QUANTILES, dtype=torch.float64)).tolist()
        full_finite = [t[torch.isfinite(t)] for t in tensors]
        stats.update(
            min=min(float(t.min()) for t in full_finite if t.numel()),
            max=max(float(t.max()) for t in full_finite if t.numel()),
            mean=float(finite.mean()),
            std=float(finite.std()) if finite.numel() > 1 else 0.0,
            quantiles={f"{q:g}": value for q, value in zip(QUANTILES, values)},
        )
    return stats


def _even_sample(flat: torch.Tensor, limit: int) -> torch.Tensor:
    if flat.numel() <= limit:
        return flat
    step = -(-flat.numel() // limit)
    return flat[::step]
