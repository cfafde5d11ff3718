"""Peak memory over the training steps of a run, as the trainer records it.

On CUDA: ``torch.cuda.max_memory_allocated`` since the first step (the
caching allocator's view of tensors, which is what limits the batch). On the
CPU: the process's peak resident set size (VmHWM) minus its resident size just
before the first step, after resetting the high-water mark through
``/proc/self/clear_refs``. That delta includes the data loader's prefetch
buffers and allocator slack, so it is an upper bound on the step's own
tensors; ``hpcdl.memory.peak`` measures one step in a clean subprocess when a
tighter number is wanted.
"""

from __future__ import annotations

from pathlib import Path

import torch


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field} line")


class PeakMemory:
    """Start before the first step; :meth:`bytes` is the peak since then."""

    def __init__(self, device: torch.device):
        self.device = device
        self.baseline = 0
        self.available = True

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = torch.cuda.memory_allocated(self.device)
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")  # "5" resets VmHWM to the current RSS
            self.baseline = _status_kib("VmRSS") * 1024
        except OSError:
            self.available = False  # not Linux, or /proc not writable: report 0 rather than a wrong number

    def bytes(self) -> int:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) - self.baseline
        if not self.available:
            return 0
        return max(_status_kib("VmHWM") * 1024 - self.baseline, 0)
