"""First-probe cost of Policy.adaptive() on the zoo's tiny models (batch 8): slots, closed forms, replays.

Counts the replays by wrapping Replayer.run, so that it also measures trees older than the reports' ``replays``
field: ``PYTHONPATH=<tree> python tools/count_replays.py deeplabv3p-climate hep-cnn`` (docs/adaptive.md).
"""
import sys
import time

import torch

from hpcdl.models import registry
from hpcdl.runtime import Policy, probe
from hpcdl.runtime.fidelity import step_gradients

calls = 0
run = probe.Replayer.run
def counted(self, *a, **k):
    global calls
    calls += 1
    return run(self, *a, **k)
probe.Replayer.run = counted
for name in sys.argv[1:]:
    fam = registry.family(name)
    torch.manual_seed(0)
    model = fam.build("tiny")
    x, y = fam.example_batch("tiny", 8, torch.Generator().manual_seed(0))
    calls = 0
    policy = Policy.adaptive()
    start = time.perf_counter()
    step_gradients(model, x, lambda out, fam=fam, y=y: fam.loss(out, y), policy)
    seconds = time.perf_counter() - start
    c = policy.controller
    print(f"{name:24s} slots {len(c.slots):3d} closed-form {sum(s.closed_form for s in c.slots.values()):3d} "
          f"replays {calls:3d}  step+probe {seconds:.2f} s")
