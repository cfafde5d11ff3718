"""A clean single-step peak per (model, method): the memory number least disturbed by everything else.

The trainer's peak (``peak_memory_bytes`` of a run) is measured over the whole run inside the
sweep's process; on a CPU it includes the data loader's buffers and allocator slack, and the
first run of a process also pays one-time allocations. Beside it, the study measures one training
step of each (model, scale, method) with :func:`hpcdl.memory.peak` in a separate measuring
process (glibc's mmap threshold set small, one warm-up step, then the measured step's peak RSS
above what existed before it): same model options, same per-device batch, the first training
samples of the run's own data set, the run's activation method (built from its ``compression``
section as the trainer builds it) and the run's optimizer; the step is
:func:`hpcdl.runtime.methods.train_step`, the trainer's own. On CUDA it is
``max_memory_allocated`` around the step.
"""

from __future__ import annotations

import functools

import torch


def fixed_batch(x: torch.Tensor, y: torch.Tensor, batch_size: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The given batch (``batch_size`` and ``generator`` are part of the batch-maker signature)."""
    return x[:batch_size], y[:batch_size]


def model_loss(model: str, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The registered loss of zoo model ``model`` (a module-level function, so a measuring subprocess can pickle it)."""
    import hpcdl.models

    return hpcdl.models.family(model).loss(output, target)


#: The old name of :func:`model_loss` (kept for one release).
spec_loss = model_loss


def step_setup(config: dict, model_options: dict, batch: tuple[torch.Tensor, torch.Tensor], device: str,
               global_batch: int):
    """The :class:`hpcdl.memory.TrainStep` of one step of this run's model, data batch, method and optimizer."""
    from hpcdl.memory import TrainStep, Workload
    from hpcdl.train.activation import activation_method
    from hpcdl.train.optim import optimizer_factory

    name, scale = config["model"]["name"], config["model"]["scale"]
    x, y = batch
    workload = Workload(name, scale, dict(model_options), batch=functools.partial(fixed_batch, x, y),
                        loss=functools.partial(model_loss, name))
    return TrainStep(workload, batch_size=len(x), device=device, seed=config["train"]["seed"],
                     method=activation_method(config["compression"]),
                     optimizer=optimizer_factory(config["optimizer"], global_batch))
