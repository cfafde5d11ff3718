"""Per-step memory peaks of a training run, one line a step: where a probe step stands against the others.

Arguments: model, scale, batch, method spec (``baseline``, ``sz:rel=1e-2``, ``adaptive:probe_every=4``), steps
(default 9). Each line is the step's peak above the memory held before it (``hpcdl.memory.peak.PeakMemory``,
resident set), and ``observed`` where the policy recorded gradients after it (probes run inside those steps).
Run it with glibc returning freed memory promptly, as ``hpcdl bench memory``'s measuring processes do:

    MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=131072 \\
        python docs/results/probe/steps.py resnet18-cifar tiny 16 adaptive:probe_every=4

The first step also pays one-time costs (libraries loaded, oneDNN's kernels built, the optimizer's state).
"""
import gc
import sys

import torch

from hpcdl.memory.peak import PeakMemory
from hpcdl.memory.step import TrainStep, Workload

model, scale, batch, method = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
steps = int(sys.argv[5]) if len(sys.argv) > 5 else 9
torch.set_num_threads(1)
step = TrainStep(Workload(model, scale), batch, policy=None if method == "baseline" else method)()
for index in range(steps):
    gc.collect()
    peak = PeakMemory("cpu", strict=True)
    peak.start()
    info = step()
    print(index, f"{peak.bytes() / 2**20:.1f} MiB", "observed" if info.get("observed_gradients") else "", flush=True)
