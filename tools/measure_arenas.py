"""Measure what arenas (hpcdl/runtime/arena.py) do: activation ratio and gradient error, and the step peak.

For recurrent and convolutional models from tests/runtime_models.py, one training step at ``sz:rel=1e-2``:
before (``arena_bytes=0``: small saved tensors kept as they are), with arenas (the default), and sz on every
saved tensor on its own (``threshold=0, arena_bytes=0``), each with the cosine similarity of the parameter
gradients to the exact ones. ``--peak BATCH`` also measures the GRU tagger's step peak (``hpcdl.memory.peak``
in a fresh process) without compression, with the codec before arenas, and with arenas.

    PYTHONPATH=.:tests python tools/measure_arenas.py
    PYTHONPATH=.:tests python tools/measure_arenas.py --peak 32 --peak 64
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import hpcdl
import hpcdl.memory.allocator as allocator
from hpcdl import memory
from hpcdl.runtime.methods import Codec, Plain
from hpcdl.units import human_bytes

from runtime_models import LSTMCellTagger, RecurrentTagger, ResidualCNN, WideCNN, tagger_batch, wide_cnn_batch

POLICY = "sz:rel=1e-2"
VARIANTS = (("before", {"arena_bytes": 0}), ("arenas", {}), ("sz one by one", {"threshold": 0, "arena_bytes": 0}))


def step(model, x, y, session_kw=None):
    """Flat parameter gradients of one step, and the activation ratio (None without compression)."""
    model.zero_grad()
    torch.manual_seed(1)
    if session_kw is None:
        F.cross_entropy(model(x), y).backward()
        ratio = None
    else:
        with hpcdl.compressed(model, POLICY, **session_kw) as session:
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        ratio = session.stats.ratio
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]), ratio


def ratios() -> None:
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    cases = [
        ("GRU tagger h128 b32", RecurrentTagger("gru", hidden=128), tagger_batch(32, g)),
        ("GRU tagger h64 b64", RecurrentTagger("gru", hidden=64), tagger_batch(64, g)),
        ("LSTM tagger h128 b32", RecurrentTagger("lstm", hidden=128), tagger_batch(32, g)),
        ("LSTMCell loop h128 b32", LSTMCellTagger(hidden=128), tagger_batch(32, g)),
        ("ResidualCNN b8 32x32", ResidualCNN(), (torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 5, (8,), generator=g))),
        ("WideCNN b4 64x64", WideCNN(), wide_cnn_batch(4, g)),
    ]
    for name, model, (x, y) in cases:
        exact, _ = step(model, x, y)
        cells = []
        for label, session_kw in VARIANTS:
            grads, ratio = step(model, x, y, session_kw)
            cells.append(f"{label} {ratio:5.2f}x cos {F.cosine_similarity(grads, exact, dim=0).item():.5f}")
        print(f"{name:24s} " + " | ".join(cells), flush=True)


def peaks(batch_sizes: list[int]) -> None:
    # glibc then maps every block of 4 KiB or more on its own, so resident memory follows the 16 KiB gate
    # tensors too (with the default 64 KiB they come from the heap, reused across steps, and barely show)
    allocator.MMAP_THRESHOLD = 4096
    work = memory.Workload("runtime_models:recurrent_tagger", batch="runtime_models:tagger_batch")
    methods = (("none", Plain()), (f"{POLICY} arena_bytes=0", Codec(POLICY, arena_bytes=0)), (f"{POLICY} (arenas)", Codec(POLICY)))
    with memory.MeasuringProcess() as process:
        for batch in batch_sizes:
            for label, method in methods:
                report = memory.peak(memory.TrainStep(work, batch_size=batch, method=method), process=process)
                print(f"GRU tagger b{batch:<3d} {label:26s} peak {human_bytes(report.peak_bytes):>10s}  "
                      f"activation ratio {report.activation_ratio:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peak", type=int, action="append", default=[], metavar="BATCH",
                        help="also measure the GRU tagger's step peak at this batch size (repeatable)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ratios()
    if args.peak:
        peaks(args.peak)


if __name__ == "__main__":
    main()
