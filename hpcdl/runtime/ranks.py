"""Averaging numbers over data-parallel ranks: the seam between a controller's measurements and the backend.

A controller that measures on its own rank's batch (the adaptive controller's probe) averages its
measurements over the ranks before it decides, so that every rank decides the same. The runtime does not
know the communication library: the training loop's distributed backend hands the policy a :class:`Ranks`
(:meth:`hpcdl.runtime.policy.Policy.average_over`; the trainer does, for torch.distributed and Horovod
alike). Without one, :func:`default_ranks` reduces through torch.distributed's default process group when
one is initialised (a user's own DDP loop), else there is one rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Ranks:
    """How many data-parallel ranks there are, and the element-wise mean of a list of floats over them.

    ``mean`` is a collective: every rank calls it at the same point with a list of the same length, and every
    rank gets the same (bit for bit) result.
    """

    size: int
    mean: Callable[[list[float]], list[float]]


ONE_RANK = Ranks(1, list)


def _torch_distributed_mean(values: list[float]) -> list[float]:
    dist = torch.distributed
    device = (torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl"
              else torch.device("cpu"))
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return (tensor / dist.get_world_size()).tolist()


def default_ranks() -> Ranks:
    """torch.distributed's default group when one is initialised, else one rank."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return Ranks(dist.get_world_size(), _torch_distributed_mean)
    return ONE_RANK
