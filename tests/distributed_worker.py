"""One rank of the backend checks, run under mpirun/horovodrun/srun, and the check of what the ranks wrote.

    python tests/distributed_worker.py BACKEND OUT_DIR

Each rank starts from different weights and optimizer state, calls broadcast_state, trains STEPS SGD steps
on its shard of a fixed global batch through wrap_model/wrap_optimizer, reduces two metrics and writes
OUT_DIR/rank<R>.json. ``check_ranks`` (used by test_distributed, test_horovod and test_slurm_jobs)
compares that with one process training on the whole global batch, with the same functions.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
from torch import nn

WORKER = str(Path(__file__).resolve())
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
        optimizer.zero_grad(set_to_none=True)  # the torch >= 2 signature the trainer uses
        loss_fn(model, x[rank::size], y[rank::size]).backward()
        optimizer.step()


def flat_parameters(model: nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def flat_momentum(optimizer: torch.optim.Optimizer) -> list[float]:
    buffers = [optimizer.state[p]["momentum_buffer"].reshape(-1) for g in optimizer.param_groups for p in g["params"]]
    return torch.cat(buffers).tolist()


def single_process_reference() -> dict:
    """What every rank must end with: rank 0's start, then STEPS steps on the whole global batch."""
    model = make_model(100)
    optimizer = make_optimizer(model)
    warm_up_locally(model, optimizer, 100)
    after_broadcast = {
        "parameters": flat_parameters(model),
        "buffer": model.output_scale.tolist(),
        "momentum": flat_momentum(optimizer),
    }
    train_steps(model, optimizer, rank=0, size=1)
    return {"after_broadcast": after_broadcast, "final_parameters": flat_parameters(model)}


def check_ranks(out_dir: Path, backend_name: str, size: int = 2) -> None:
    """Assert that the ``size`` ranks' files in ``out_dir`` match one process on the whole batch."""
    reference = single_process_reference()
    results = [json.loads((Path(out_dir) / f"rank{r}.json").read_text()) for r in range(size)]
    for rank, result in enumerate(results):
        assert (result["backend"], result["rank"], result["size"]) == (backend_name, rank, size)
        assert result["local_rank"] == rank  # one node
        assert result["device"] == "cpu"
        for key in ("parameters", "buffer", "momentum"):
            torch.testing.assert_close(
                torch.tensor(result["after_broadcast"][key]), torch.tensor(reference["after_broadcast"][key])
            )
        # Averaged gradients over equal shards == the gradient of the whole batch.
        torch.testing.assert_close(
            torch.tensor(result["final_parameters"]), torch.tensor(reference["final_parameters"]), rtol=1e-5, atol=1e-6
        )
        assert math.isclose(result["reduced"]["rank"], (size - 1) / 2) and result["reduced"]["one"] == 1.0


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
