"""The step peak of an adaptive policy's probe steps and plain steps, one by one, for deeplabv3p-climate at DeepCAM's
full input: what ``hpcdl bench memory`` measures (the fresh-process resident peak above the step's start), for
every step and not only the one after the warm-up, which is the probe's blind spot there.

One uncompressed warm-up step first (the optimizer's momentum buffers and the libraries' one-time allocations exist
before the measured steps), then ``steps`` steps under the method: with an adaptive policy the first of them
probes (its replays run inside the step, after backward). Each line: the step, its time, its peak above its
start, the bytes its session packed, and whether the method observed gradients (a probe or a gradient sample).
The process re-executes itself once with glibc's mmap threshold lowered, as the bench's measuring processes run
(:func:`hpcdl.memory.allocator.child_env`).

Arguments: method spec (``adaptive:probe_every=4``), batch (1), torch threads (2), steps (2).
"""
import sys
import time

import torch

from hpcdl.memory import Workload
from hpcdl.memory.allocator import run_with_child_env
from hpcdl.memory.peak import PeakMemory
from hpcdl.runtime.methods import Codec, Plain, train_step
from hpcdl.runtime.policy import policy_from_spec

run_with_child_env()  # first: the measured steps run as the bench's measuring processes do
spec = sys.argv[1] if len(sys.argv) > 1 else "adaptive:probe_every=4"
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1
torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 2)
steps = int(sys.argv[4]) if len(sys.argv) > 4 else 2
MiB = 2**20
model, x, y, loss = Workload.of("deeplabv3p-climate", scale="full").build(batch, 0)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
method = Codec(policy_from_spec(spec))
print(f"{spec}, batch {batch}, {torch.get_num_threads()} threads", flush=True)
for step in range(steps + 1):
    tracker = PeakMemory(torch.device("cpu"), strict=True)
    tracker.start()
    started = time.perf_counter()
    result = train_step(model, method if step else Plain(), x, y, loss, optimizer)
    optimizer.zero_grad(set_to_none=True)
    packed = result.stats.packed_bytes if result.stats else 0
    print(f"step {step}{' (uncompressed warm-up)' if not step else ''}: {time.perf_counter() - started:.1f} s, "
          f"peak {tracker.bytes() / MiB:.1f} MiB above its start, packed {packed / MiB:.1f} MiB"
          f"{', observed gradients' if result.observed_gradients else ''}", flush=True)
