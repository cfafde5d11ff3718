"""What machine a benchmark ran on, recorded beside its numbers so a reader can tell runs apart.

Load and OpenMP's wait policy are part of it: on a shared node they change codec timings by 2x and more.
"""

from __future__ import annotations

import os
import platform

import torch


def describe_machine() -> dict:
    """Platform, processor, cores, the 1-minute load average, torch and its threads, OpenMP's wait policy."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "openmp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset (spins, then sleeps)"),
    }
