"""What is alive at the backward peak of one deeplabv3p-climate step at DeepCAM's full input.

Runs one warm-up step, then one profiled step (torch.profiler with profile_memory: every allocation of
PyTorch's CPU allocator, with the op that made it), finds the most bytes allocated at once in backward and
lists the allocations alive then, grouped by the op that made them. Packed activations show up under the
forward op whose save hook packed them (``aten::relu_``, ``aten::native_batch_norm``); decoded ones under the
backward node that unpacked them; oneDNN's buffers directly under ``aten::convolution_backward``. At the step's
peak (in backward) this matched the fresh-process RSS peak of ``hpcdl bench memory`` to the MiB; in the forward
it does not, because the encoder's worst-case scratch is allocated but mostly never touched.

Arguments: method spec (``sz:rel=1e-2``, ``none``, ``recompute+sz:rel=1e-2``), batch (1), torch threads (2).
"""
import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from hpcdl.memory import Workload
from hpcdl.runtime.methods import Codec, Plain, Recompute, train_step
from hpcdl.runtime.policy import policy_from_spec

spec = sys.argv[1] if len(sys.argv) > 1 else "sz:rel=1e-2"
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1
torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 2)
if spec == "none":
    method = Plain()
elif spec.startswith("recompute+"):
    method = Recompute() + Codec(policy_from_spec(spec.split("+", 1)[1]))
else:
    method = Codec(policy_from_spec(spec))
model, x, y, loss = Workload.of("deeplabv3p-climate", scale="full").build(batch, 0)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
train_step(model, method, x, y, loss, optimizer)  # warm-up: the momentum buffers exist before the profiled step
with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
    train_step(model, method, x, y, loss, optimizer)

events = []  # (time, address, bytes (negative: freed), allocator total, op stack)


def walk(node, stack):
    fields = node.extra_fields
    if type(fields).__name__ == "_ExtraFields_Allocation":
        events.append((node.start_time_ns, fields.ptr, fields.alloc_size, fields.total_allocated, stack))
        return
    for child in node.children:
        walk(child, stack + (node.name,))


for root in prof.profiler.kineto_results.experimental_event_tree():
    walk(root, ())
events.sort(key=lambda event: event[0])
backward = next(i for i, event in enumerate(events) if any("autograd::engine" in name for name in event[4]))
peak = max(range(backward, len(events)), key=lambda i: events[i][3])
forward_peak = max(event[3] for event in events[:backward])
alive = {}
for _, address, size, _, stack in events[:peak + 1]:
    if size > 0:
        alive[address] = (size, stack)
    else:
        alive.pop(address, None)
MiB = 2**20
print(f"{spec}, batch {batch}: backward peak {events[peak][3] / MiB:.0f} MiB allocated in the step (forward "
      f"{forward_peak / MiB:.0f} MiB), during {' > '.join(events[peak][4][-5:])}")
groups, counts = collections.Counter(), collections.Counter()
for size, stack in alive.values():
    key = " > ".join(stack[-9:]) or "(outside any op)"  # deep enough to tell a recomputation from a forward
    groups[key] += size
    counts[key] += 1
for key, size in groups.most_common(12):
    print(f"  {size / MiB:8.1f} MiB  x{counts[key]:<3d} {key}")
