"""A clean single-step peak per (model, method): the memory number least disturbed by everything else.

The trainer's peak (``peak_memory_bytes`` of a run) is measured over the whole run inside the
sweep's process; on a CPU it includes the data loader's buffers and allocator slack, and the
first run of a process also pays one-time allocations. Beside it, the study measures one training
step of each (model, scale, method) with :func:`hpcdl.memory.peak` in a separate measuring
process (glibc's mmap threshold set small, one warm-up step, then the measured step's peak RSS
above what existed before it): same model options, same per-device batch, the first training
samples of the run's own data set, the run's codec and size threshold; ``checkpoint`` wraps the
model's blocks as the trainer does. On CUDA it is ``max_memory_allocated`` around the step.
"""

from __future__ import annotations

import functools

import torch

from hpcdl.study.methods import Method


def fixed_batch(x: torch.Tensor, y: torch.Tensor, batch_size: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The given batch (``batch_size`` and ``generator`` are part of the batch-maker signature)."""
    return x[:batch_size], y[:batch_size]


def spec_loss(model: str, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    import hpcdl.models

    return hpcdl.models.spec(model).loss(output, target)


def checkpointed_model(model: str, scale: str, options: dict) -> torch.nn.Module:
    """The zoo model with each of its blocks recomputed in backward, as ``compression.method: checkpoint`` does."""
    import hpcdl.models
    from hpcdl.train.trainer import _wrap_blocks_in_checkpoint

    spec = hpcdl.models.spec(model)
    built = spec.build(scale, **options)
    _wrap_blocks_in_checkpoint(spec.blocks(built))
    return built


def step_setup(config: dict, method: Method, model_options: dict, batch: tuple[torch.Tensor, torch.Tensor],
               device: str):
    """The :class:`hpcdl.memory.TrainStep` of one step of this run's model, data batch and method."""
    from hpcdl.memory import TrainStep, Workload
    from hpcdl.runtime.session import DEFAULT_THRESHOLD

    name, scale = config["model"]["name"], config["model"]["scale"]
    x, y = batch
    make_batch = functools.partial(fixed_batch, x, y)
    loss = functools.partial(spec_loss, name)
    if method.kind == "checkpoint":
        workload = Workload(functools.partial(checkpointed_model, name, scale, dict(model_options)),
                            batch=make_batch, loss=loss)
    else:
        workload = Workload(name, scale, dict(model_options), batch=make_batch, loss=loss)
    threshold = config["compression"]["min_bytes"]
    return TrainStep(workload, batch_size=len(x), policy=method.codec_config, device=device,
                     threshold=DEFAULT_THRESHOLD if threshold is None else threshold, seed=config["train"]["seed"])
