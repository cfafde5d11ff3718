"""Other work on the machine while a benchmark runs: processes that each keep one core busy with torch ops.

A codec in a training job never has the machine to itself: the step's own intra-op threads, data-loader
workers and other ranks hold cores. ``background_load(n)`` starts ``n`` processes that multiply matrices
on one torch thread each (a stand-in for those threads), and stops them when the block ends, so a
benchmark can report its throughput on a loaded machine next to an idle one.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

LOAD_PROGRAM = (
    "import torch\n"
    "torch.set_num_threads(1)\n"
    "a = torch.randn(384, 384)\n"
    "while True:\n"
    "    a = torch.tanh(a @ a)\n"
)


@contextlib.contextmanager
def background_load(processes: int) -> Iterator[list[subprocess.Popen]]:
    """Keep ``processes`` cores busy with torch matrix products inside the block (0: nothing runs)."""
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 0:
        raise ValueError(f"the background load is a number of busy processes >= 0, got {processes!r}")
    workers = [subprocess.Popen([sys.executable, "-c", LOAD_PROGRAM], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(processes)]
    try:
        yield workers
    finally:
        for worker in workers:
            worker.kill()
        for worker in workers:
            worker.wait()
