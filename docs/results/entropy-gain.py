"""The zstd entropy stage's gain (docs/codecs.md#entropy): the floating tensors of at least 64 KiB that each tiny
zoo model saves in its first training step (random weights, the model's example batch), packed with sz at rel
1e-1 and 1e-2 and 2-bit quant, without and with the stage; zstd's speed over the packed bytes, one thread.

Run: python docs/results/entropy-gain.py > docs/results/entropy-gain.txt
"""
import time

import torch

from hpcdl.compress import get_codec
from hpcdl.memory import Workload
from hpcdl.runtime.observe import observe_saved

torch.set_num_threads(1)
CODECS = ({"id": "sz", "mode": "rel", "bound": 1e-1}, {"id": "sz", "mode": "rel", "bound": 1e-2},
          {"id": "quant", "bits": 2, "seed": 0})
for name, batch in (("hep-cnn", 64), ("particle-transformer", 64), ("deeplabv3p-climate", 8), ("resnet18-cifar", 32)):
    model, x, y, loss = Workload.of(name, scale="tiny").build(batch, 0)
    saved = {}

    def keep(tensor, module):
        if tensor.dtype.is_floating_point and tensor.numel() * tensor.element_size() >= 65536:
            saved[(tensor.untyped_storage().data_ptr(), tensor._version)] = tensor.detach().clone()

    with observe_saved(model, keep):
        loss(model(x), y)
    raw = sum(t.numel() * t.element_size() for t in saved.values())
    for config in CODECS:
        plain, staged = get_codec(config), get_codec({**config, "entropy": "zstd"})
        plain_bytes = sum(plain.encode(t).nbytes for t in saved.values())
        start = time.perf_counter()
        staged_bytes = sum(staged.encode(t).nbytes for t in saved.values())
        staged_s = time.perf_counter() - start
        start = time.perf_counter()
        for t in saved.values():
            plain.encode(t)
        plain_s = time.perf_counter() - start
        zstd_mb_s = plain_bytes / max(staged_s - plain_s, 1e-9) / 1e6
        label = ":".join(str(v) for k, v in config.items() if k in ("id", "bound", "bits"))
        print(f"{name:22s} {label:10s} {len(saved):3d} tensors {raw / 2**20:7.1f} MiB  ratio {raw / plain_bytes:6.2f}x"
              f" -> {raw / staged_bytes:6.2f}x with zstd ({plain_bytes / staged_bytes:.2f}x)  encode time"
              f" {staged_s / plain_s:.2f}x  (zstd ~{zstd_mb_s:.0f} MB/s of packed bytes)")
