"""Peak memory: the one mechanism behind a run's peak and a single step's peak.

* On CUDA: ``torch.cuda.max_memory_allocated`` after a reset, minus what was
  allocated at the reset (the caching allocator's view of tensors, which is what
  limits the batch).
* On the CPU: the peak resident set size (``VmHWM``, reset to the current size
  through ``/proc/self/clear_refs``) minus the resident size at the reset. With
  glibc's allocator tuned (:mod:`hpcdl.memory.allocator`) freed tensors go back to
  the system, so resident memory follows live tensors.

:class:`PeakMemory` is the tracker (start, then read); the trainer keeps one over
its whole run (it then also counts the data loader's buffers and allocator slack:
an upper bound on the step's own tensors), and :func:`measure_step` uses one
around a single warmed-up step, which :func:`hpcdl.memory.peak` runs in a clean
subprocess when a tight number is wanted.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch


def status_bytes(field_name: str) -> int:
    """A size line of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {field_name} line")


def current_bytes(device: torch.device) -> int:
    """What is allocated now: CUDA's allocated tensor bytes, or the CPU's resident set size."""
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else status_bytes("VmRSS")


def high_water_bytes(device: torch.device) -> int:
    """The most allocated since the last reset (:meth:`PeakMemory.start`): CUDA's allocated peak, or ``VmHWM``."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else status_bytes("VmHWM")


class PeakMemory:
    """Start before what is measured; :meth:`bytes` is the peak above the start since then.

    On a CPU without ``/proc/self/clear_refs`` (not Linux, or not writable) the peak is unknown:
    with ``strict`` :meth:`start` raises, otherwise :attr:`available` is False and :meth:`bytes` is 0
    (a run reports 0 rather than a wrong number).
    """

    def __init__(self, device: torch.device | str, strict: bool = False):
        self.device = torch.device(device)
        self.strict = strict
        self.baseline = 0
        self.available = True

    @property
    def kind(self) -> str:
        return "cuda_max_allocated" if self.device.type == "cuda" else "cpu_peak_rss"

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = current_bytes(self.device)
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")  # "5" resets VmHWM to the current RSS
            self.baseline = current_bytes(self.device)
        except OSError as err:
            if self.strict:
                raise RuntimeError(f"measuring a CPU peak needs Linux's /proc/self/clear_refs to reset the peak RSS "
                                   f"({err}); measure on a Linux host, or on CUDA") from err
            self.available = False

    def bytes(self) -> int:
        if self.device.type == "cuda":
            return high_water_bytes(self.device) - self.baseline
        if not self.available:
            return 0
        return max(high_water_bytes(self.device) - self.baseline, 0)


@dataclass(frozen=True)
class PeakReport:
    """A step's own peak memory (``peak_bytes``) and what the step reported (activation byte counts)."""

    peak_bytes: int
    before_bytes: int
    device: str
    method: str
    info: dict = field(default_factory=dict)

    @property
    def worst_bytes(self) -> int:
        """The most the method's steps peak at: the usual step's, or a learning step's (a probe) if higher."""
        return max(self.peak_bytes, self.info.get("learning_peak_bytes", 0))

    @property
    def activation_ratio(self) -> float:
        packed = self.info.get("activation_packed_bytes", 0)
        return self.info.get("activation_original_bytes", 0) / packed if packed else 1.0


#: The most steps :func:`measure_step` measures past the warm-up while they are learning steps (see there).
MAX_LEARNING_STEPS = 3


def measure_step(setup: Callable, device: torch.device) -> PeakReport:
    """Set up, run one warm-up step, then measure one step in this process.

    A step whose info says ``observed_gradients`` (an adaptive policy sampling gradients or probing, which
    replays the model uncompressed) is not the method's usual step: it is measured, and the next step is
    measured instead, at most :data:`MAX_LEARNING_STEPS` times. The report is the first usual step's (or the
    last one measured); its info holds ``learning_steps`` (how many were passed over) and
    ``learning_peak_bytes`` (the most they peaked at, which a run meets at every probe).
    """
    step = setup()
    step()
    cuda = device.type == "cuda"
    learning_peak, learning_steps = 0, 0
    while True:
        gc.collect()
        if cuda:
            torch.cuda.synchronize(device)
        tracker = PeakMemory(device, strict=True)
        tracker.start()
        info = step() or {}
        if cuda:
            torch.cuda.synchronize(device)
        if not info.get("observed_gradients") or learning_steps == MAX_LEARNING_STEPS:
            break
        learning_steps += 1
        learning_peak = max(learning_peak, tracker.bytes())
    if learning_steps:
        info = {**info, "learning_steps": learning_steps, "learning_peak_bytes": learning_peak}
    return PeakReport(tracker.bytes(), tracker.baseline, str(device) if cuda else "cpu", tracker.kind, info)
