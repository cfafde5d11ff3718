"""Where in one deeplabv3p-climate training step at DeepCAM's full input the resident memory peaks, layer by layer.

Runs one warm-up step, then one measured step with a hook before and after every leaf module: each hook reads
the resident set's high-water mark since the previous hook (``VmHWM``, then reset through
``/proc/self/clear_refs``), so every interval between two hooks gets its own peak above the step's start. This
is the quantity ``hpcdl bench memory`` measures (the fresh-process RSS peak), located. Prints the 12 highest
intervals with the resident size after each and the bytes the session held packed then. The process re-executes
itself once with glibc's mmap threshold lowered, as the bench's measuring processes run
(:func:`hpcdl.memory.allocator.child_env`).

Arguments: method spec (``sz:rel=1e-2``), batch (2), torch threads (2).
"""
import sys

import torch

from hpcdl.memory import Workload
from hpcdl.memory.allocator import run_with_child_env
from hpcdl.memory.peak import status_bytes
from hpcdl.runtime.methods import Codec, train_step
from hpcdl.runtime.policy import policy_from_spec
from hpcdl.runtime.session import active_session

run_with_child_env()  # first: the measured steps run as the bench's measuring processes do
spec = sys.argv[1] if len(sys.argv) > 1 else "sz:rel=1e-2"
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 2
torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 2)
model, x, y, loss = Workload.of("deeplabv3p-climate", scale="full").build(batch, 0)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
method = Codec(policy_from_spec(spec))
train_step(model, method, x, y, loss, optimizer)  # warm-up: the momentum buffers exist before the measured step
optimizer.zero_grad(set_to_none=True)

intervals = []  # (label, high-water mark above the start, resident after, packed bytes held)


def mark(label: str) -> None:
    session = active_session()
    intervals.append((label, status_bytes("VmHWM") - start, status_bytes("VmRSS") - start,
                      session.held_bytes if session is not None else 0))
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")


names = {module: name for name, module in model.named_modules()}
for module in model.modules():
    if not list(module.children()):
        module.register_forward_pre_hook(lambda m, _: mark("forward, up to " + names[m]))
        module.register_forward_hook(lambda m, _, __: mark("forward, in " + names[m]))


def marked_loss(output, target):
    mark("forward, model end")
    value = loss(output, target)
    mark("forward, loss")
    return value


with open("/proc/self/clear_refs", "w") as clear:
    clear.write("5")
start = status_bytes("VmRSS")
train_step(model, method, x, y, marked_loss, optimizer)
mark("backward and optimizer step")
MiB = 2**20
print(f"{spec}, batch {batch}: step peak {max(i[1] for i in intervals) / MiB:.0f} MiB above the step's start")
print("    peak  resident after  packed held  interval")
for label, peak, resident, packed in sorted(intervals, key=lambda i: -i[1])[:12]:
    print(f"{peak / MiB:8.1f}  {resident / MiB:14.1f}  {packed / MiB:11.1f}  {label}")
