"""Probe cost of Policy.adaptive() on the zoo's tiny models (batch 8): slots, closed forms, replays per probe.

Counts the replays by wrapping Replayer.run, so that it also measures trees older than the reports' ``replays``
field: ``PYTHONPATH=<tree> python tools/count_replays.py [--probes N] deeplabv3p-climate hep-cnn``
(docs/adaptive.md). With ``--probes N`` the model learns (plain SGD, learning rate 0.05) for 4N - 3 steps
with a probe every 4, as ``--warmup-steps 9 --methods adaptive:probe_every=4`` does for N = 3; each probe's
line also gives a digest of every slot's bound and sensitivity, which two trees that decide alike share
when run with the same number of threads (float sums depend on it).
"""
import argparse
import hashlib
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


def digest(controller) -> str:
    """The slots' bounds and sensitivities (to 9 significant digits), hashed."""
    rows = sorted((key, slot.bound, sorted((m, f"{v:.9g}") for m, v in slot.sensitivity.items()))
                  for key, slot in controller.slots.items())
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:12]


parser = argparse.ArgumentParser()
parser.add_argument("--probes", type=int, default=1)
parser.add_argument("models", nargs="+")
args = parser.parse_args()
for name in args.models:
    fam = registry.family(name)
    torch.manual_seed(0)
    model = fam.build("tiny")
    x, y = fam.example_batch("tiny", 8, torch.Generator().manual_seed(0))
    policy = Policy.adaptive(probe_every=4)
    for _ in range(4 * args.probes - 3):
        calls, probes = 0, policy.controller.probes
        start = time.perf_counter()
        gradients = step_gradients(model, x, lambda out, fam=fam, y=y: fam.loss(out, y), policy).gradients
        seconds = time.perf_counter() - start
        with torch.no_grad():
            for param_name, param in model.named_parameters():
                if param_name in gradients:
                    param -= 0.05 * gradients[param_name]
        c = policy.controller
        if c.probes > probes:
            print(f"{name:24s} probe {c.probes} slots {len(c.slots):3d} "
                  f"closed-form {sum(s.closed_form for s in c.slots.values()):3d} replays {calls:3d}  "
                  f"step+probe {seconds:.2f} s  decisions {digest(c)}", flush=True)
