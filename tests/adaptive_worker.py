"""One rank of the adaptive controller's distributed check, run under mpirun (torch.distributed or Horovod).

    python tests/adaptive_worker.py BACKEND OUT_DIR

Every rank starts from the same weights and trains STEPS steps of a small transformer under
``Policy.adaptive(probe_every=2)`` on its own data (different tokens per rank), wired as the trainer wires it
(the backend's ranks given to the policy, the backend's model and optimizer wrappers, ``train_step`` with its
reduced-gradient context). It writes OUT_DIR/rank<R>.json: the controller's ``"compression"`` reports, its
final state, and its first loss (to show the ranks saw different data). ``test_adaptive_distributed`` compares
the ranks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from runtime_models import TransformerBlock  # noqa: E402

WORKER = str(Path(__file__).resolve())
STEPS = 6
PROBE_EVERY = 2


def main(backend_name: str, out_dir: Path) -> None:
    from hpcdl.runtime import Policy
    from hpcdl.runtime.methods import Codec, train_step
    from hpcdl.train.distributed import init_backend

    backend = init_backend(backend_name)
    torch.manual_seed(0)
    model = TransformerBlock()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    backend.broadcast_state(model, optimizer)
    policy = Policy.adaptive(probe_every=PROBE_EVERY, reruns=2)
    policy.average_over(backend.ranks())
    forward = backend.wrap_model(model)
    optimizer = backend.wrap_optimizer(optimizer, model)
    tokens = torch.randint(0, 50, (4, 33), generator=torch.Generator().manual_seed(10 + backend.rank))

    def loss_fn(logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    reports, losses = [], []
    for step in range(STEPS):
        torch.manual_seed(1000 * backend.rank + step)  # different dropout masks on every rank
        result = train_step(model, Codec(policy), tokens[:, :-1], tokens[:, 1:], loss_fn, optimizer, forward=forward,
                            reduced_gradients=backend.reduced_gradients)
        losses.append(float(result.loss))
        report = policy.controller.report()
        if report is not None:
            reports.append({"step": step, **report})
    backend.barrier()
    result = {"backend": backend.name, "rank": backend.rank, "size": backend.size, "losses": losses,
              "reports": reports, "state": policy.state_dict()["controller"]}
    (out_dir / f"rank{backend.rank}.json").write_text(json.dumps(result))
    backend.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
