"""Step time of deeplabv3p-climate at its full input, batch 2: baseline, sz rel 1e-2 with its large layers run
in chunks (the session's default), and sz with chunk_bytes=0; interleaved in one process, the order rotating each
round, median after a warm-up round. Arguments: torch threads (2), timed rounds (4), batch (2)."""
import os, statistics, sys, time, torch
from hpcdl.memory import Workload
from hpcdl.runtime.methods import Codec, Plain, train_step
from hpcdl.runtime.policy import policy_from_spec
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 2
model, x, y, loss = Workload.of("deeplabv3p-climate", scale="full").build(batch, 0)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
methods = {"baseline": Plain(), "sz chunked": Codec(policy_from_spec("sz:rel=1e-2")),
           "sz whole": Codec(policy_from_spec("sz:rel=1e-2"), chunk_bytes=0)}
names = list(methods)
times = {name: [] for name in methods}
for rep in range(rounds + 1):
    for name in names[rep % 3:] + names[:rep % 3]:
        start = time.perf_counter()
        train_step(model, methods[name], x, y, loss, optimizer)
        if rep:
            times[name].append(time.perf_counter() - start)
base = statistics.median(times["baseline"])
for name, values in times.items():
    median = statistics.median(values)
    print(f"{name:<11} median {median:6.2f} s  steps {[round(v, 2) for v in values]}  vs baseline {median / base:.3f}x")
print("load average", os.getloadavg(), "torch threads", torch.get_num_threads(), "batch", batch)
