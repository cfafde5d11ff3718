"""The entropy stage's gain (docs/codecs.md#entropy): the floating tensors of at least 64 KiB that each tiny zoo
model saves in its first training step (random weights, the model's example batch), packed with sz at rel 1e-1
and 1e-2 and with 2-bit quant: alone, with zstd over the codec's stream as it is (the stage's only layout before
2026-12-04, its layout for codecs without block codes), and with the stage (for sz: zstd over its codes repacked
whole, hpcdl/compress/codes.py). Times: medians of 3 rounds, one thread, encode and decode of all the tensors,
relative to the codec alone in the same round.

Run: python docs/results/entropy-gain.py > docs/results/entropy-gain.txt
"""
import statistics
import time

import torch
import zstandard

from hpcdl.compress import get_codec
from hpcdl.compress.nested import header_prefix
from hpcdl.memory import Workload
from hpcdl.runtime.observe import observe_saved

torch.set_num_threads(1)
ROUNDS = 3
CODECS = ({"id": "sz", "mode": "rel", "bound": 1e-1}, {"id": "sz", "mode": "rel", "bound": 1e-2},
          {"id": "quant", "bits": 2, "seed": 0})
HEADER = 32  # about what the stage's own header adds (codec id, dtype, shape, a field, checksums)


def timed(function):
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def zstd_over_stream(packed) -> bytes:
    """zstd (level 1) over the serialised stream: the stage's layout for codecs without block codes."""
    return zstandard.ZstdCompressor(level=1).compress(torch.cat([header_prefix(packed.header), packed.data]).numpy())


for name, batch in (("hep-cnn", 64), ("particle-transformer", 64), ("deeplabv3p-climate", 8), ("resnet18-cifar", 32)):
    model, x, y, loss = Workload.of(name, scale="tiny").build(batch, 0)
    saved = {}

    def keep(tensor, module, saved=saved):
        if tensor.dtype.is_floating_point and tensor.numel() * tensor.element_size() >= 65536:
            saved[(tensor.untyped_storage().data_ptr(), tensor._version)] = tensor.detach().clone()

    with observe_saved(model, keep):
        loss(model(x), y)
    tensors = list(saved.values())
    raw = sum(t.numel() * t.element_size() for t in tensors)
    for config in CODECS:
        plain, staged = get_codec(config), get_codec({**config, "entropy": "zstd"})
        times: dict[str, list[float]] = {key: [] for key in ("encode", "stream", "staged", "decode", "staged decode")}
        for _ in range(ROUNDS):
            seconds, plain_packed = timed(lambda: [plain.encode(t) for t in tensors])
            times["encode"].append(seconds)
            seconds, squeezed = timed(lambda: [zstd_over_stream(p) for p in plain_packed])
            times["stream"].append(times["encode"][-1] + seconds)
            seconds, staged_packed = timed(lambda: [staged.encode(t) for t in tensors])
            times["staged"].append(seconds)
            times["decode"].append(timed(lambda: [plain.decode(p) for p in plain_packed])[0])
            times["staged decode"].append(timed(lambda: [staged.decode(p) for p in staged_packed])[0])
        median = {key: statistics.median(values) for key, values in times.items()}
        plain_bytes = sum(p.nbytes for p in plain_packed)
        stream_bytes = sum(len(s) + HEADER for s in squeezed)
        staged_bytes = sum(p.nbytes for p in staged_packed)
        label = ":".join(str(v) for k, v in config.items() if k in ("id", "bound", "bits"))
        print(f"{name:22s} {label:8s} {len(tensors):3d} tensors {raw / 2**20:5.1f} MiB  ratio alone {raw / plain_bytes:6.2f}x"
              f"  zstd over the stream {raw / stream_bytes:6.2f}x  the stage {raw / staged_bytes:6.2f}x"
              f" ({stream_bytes / staged_bytes:.2f}x of zstd over the stream)  time vs alone: zstd over the stream"
              f" encode {median['stream'] / median['encode']:.2f}x, the stage encode"
              f" {median['staged'] / median['encode']:.2f}x decode {median['staged decode'] / median['decode']:.2f}x",
              flush=True)
