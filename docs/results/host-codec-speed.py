"""sz encode and decode speed of the host kernels on a few activation-like float32 tensors, one thread, best of 3,
without and with the zstd entropy stage (whose codes layouts run host kernels too).

Run it once per library to compare two builds of kernels/host.cpp on the same machine, alternating, e.g.
    HPCDL_HOST_LIBRARY=/path/to/other/_kernels_host*.so python docs/results/host-codec-speed.py
    python docs/results/host-codec-speed.py
Prints the active instruction-set build, then per tensor and rel bound: encode and decode GB/s of input, the
ratio and the packed bytes (identical bytes between builds show as identical sizes).
"""
import time

import torch

from hpcdl.compress import get_codec
from hpcdl.compress.blocks import host
from hpcdl.compress.entropy import with_stage

torch.manual_seed(0)
torch.set_num_threads(1)
TENSORS = {
    "relu 4Mi": torch.relu(torch.randn(4 << 20) * 2),
    "gelu 4Mi": torch.nn.functional.gelu(torch.randn(4 << 20) * 2),
    "softmax 4Mi": torch.randn(4096, 1024).softmax(-1).reshape(-1),
    "relu 104Ki": torch.relu(torch.randn(106_496) * 2),
}
print("host build", host.active_isa(), "library", host.LIBRARY._name)
for name, x in TENSORS.items():
    for bound, entropy in ((1e-2, "none"), (1e-1, "none"), (1e-2, "zstd"), (1e-1, "zstd")):
        codec = get_codec(with_stage({"id": "sz", "mode": "rel", "bound": bound}, entropy))
        packed = codec.encode(x)
        reps = max(5, int(3e7 // x.numel()))
        encode = decode = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(reps):
                packed = codec.encode(x)
            encode = min(encode, (time.perf_counter() - start) / reps)
            start = time.perf_counter()
            for _ in range(reps):
                codec.decode(packed)
            decode = min(decode, (time.perf_counter() - start) / reps)
        size = x.numel() * 4
        print(f"{name:12s} rel {bound:g} entropy {entropy:4s}: encode {size / encode / 1e9:5.2f} GB/s  decode {size / decode / 1e9:5.2f} GB/s"
              f"  ratio {size / packed.nbytes:5.2f}  bytes {packed.nbytes}")
