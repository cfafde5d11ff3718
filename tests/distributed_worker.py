"""One rank of the backend checks in test_distributed.py, run under mpirun/horovodrun/srun.

    python tests/distributed_worker.py BACKEND OUT_DIR

Each rank starts from different weights and optimizer state, calls broadcast_state, trains STEPS SGD steps
on its shard of a fixed global batch through wrap_model/wrap_optimizer, reduces two metrics and writes
OUT_DIR/rank<R>.json. The test compares that with one process training on the whole global batch,
using the same functions from this module.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn

STEPS = 3
GLOBAL_BATCH = 8
LR = 0.1
MOMENTUM = 0.9


def make_model(seed: int) -> nn.Module:
    """A small MLP with a non-parameter buffer, so that broadcast_state must move buffers too."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    model.register_buffer("output_scale", torch.rand(3) + 0.5)
    return model


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    scale = model.module.output_scale if hasattr(model, "module") else model.output_scale
    return nn.functional.cross_entropy(model(x) * scale, y)


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, 6, generator=generator)
    y = torch.randint(0, 3, (GLOBAL_BATCH,), generator=generator)
    return x, y


def warm_up_locally(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    """One plain step on rank-specific data, so that every rank has different momentum buffers."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 6, generator=generator)
    y = torch.randint(0, 3, (4,), generator=generator)
    optimizer.zero_grad()
    loss_fn(model, x, y).backward()
    optimizer.step()


def train_steps(model: nn.Module, optimizer: torch.optim.Optimizer, rank: int, size: int) -> None:
    for step in range(STEPS):
        x, y = global_batch(step)
        optimizer.zero_grad()
        loss_fn(model, x[rank::size], y[rank::size]).backward()
        optimizer.step()


def flat_parameters(model: nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def flat_momentum(optimizer: torch.optim.Optimizer) -> list[float]:
    buffers = [optimizer.state[p]["momentum_buffer"].reshape(-1) for g in optimizer.param_groups for p in g["params"]]
    return torch.cat(buffers).tolist()


def main(backend_name: str, out_dir: Path) -> None:
    from hpcdl.train.distributed import init_backend

    backend = init_backend(backend_name)
    seed = 100 + backend.rank
    model = make_model(seed)
    optimizer = make_optimizer(model)
    warm_up_locally(model, optimizer, seed)
    backend.broadcast_state(model, optimizer)
    after_broadcast = {
        "parameters": flat_parameters(model),
        "buffer": model.output_scale.tolist(),
        "momentum": flat_momentum(optimizer),
    }
    model = backend.wrap_model(model)
    optimizer = backend.wrap_optimizer(optimizer, model)
    train_steps(model, optimizer, backend.rank, backend.size)
    reduced = backend.allreduce_mean({"rank": float(backend.rank), "one": 1.0})
    backend.barrier()
    result = {
        "backend": backend.name,
        "rank": backend.rank,
        "size": backend.size,
        "local_rank": backend.local_rank,
        "device": str(backend.device),
        "after_broadcast": after_broadcast,
        "final_parameters": flat_parameters(model),
        "reduced": reduced,
    }
    (out_dir / f"rank{backend.rank}.json").write_text(json.dumps(result))
    backend.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
