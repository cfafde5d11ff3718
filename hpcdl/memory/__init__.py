"""The real peak memory of a training step, and the largest batch that fits a budget.

Users care about peak memory, not the sum of saved tensors: the peak also holds
the layer being computed, gradients, codec scratch space and what backward
decompresses. So this package measures it, on the step the trainer runs
(:func:`hpcdl.runtime.methods.train_step`), never on a copy of it.

- :mod:`~hpcdl.memory.peak`: the peak mechanism (CUDA allocator peak; CPU peak
  RSS above a reset high-water mark), the trainer's run-long tracker and a
  single step's measurement;
- :mod:`~hpcdl.memory.allocator`: glibc tuning so that resident memory follows
  live tensors (a fresh process's environment, or ``mallopt`` in this one);
- :mod:`~hpcdl.memory.step`: :class:`Workload` and :class:`TrainStep`, the
  picklable description of one step (model, batch, method, optimizer), whose steps log their times
  (:func:`step_progress` shows them);
- :mod:`~hpcdl.memory.process`: :func:`peak`, measuring on CUDA here and on the
  CPU in a fresh measuring process (:class:`MeasuringProcess`; :class:`FreshProcesses` starts one per
  measurement), after one
  warm-up step, the measured step's peak above what existed before it;
- :mod:`~hpcdl.memory.breakdown`: :func:`breakdown`, a measured peak written as its
  parts (gradients, what the forward left held, packed activations, decoded tensors in backward)
  plus the unexplained remainder, beside the resident weights, buffers, optimizer state and batch;
- :mod:`~hpcdl.memory.search`: :func:`max_batch` / :func:`search_batch`, the
  largest per-device batch within a budget over measured peaks (doubling, then
  bisection).
"""

from hpcdl.memory.allocator import MMAP_THRESHOLD, return_freed_memory_to_os
from hpcdl.memory.breakdown import StepParts, breakdown
from hpcdl.memory.peak import PeakMemory, PeakReport
from hpcdl.memory.process import FreshProcesses, MeasuringProcess, MeasuringProcessError, peak
from hpcdl.memory.search import BatchSearch, max_batch, search_batch
from hpcdl.memory.step import TrainStep, Workload, step_progress

__all__ = [
    "BatchSearch", "FreshProcesses", "MMAP_THRESHOLD", "MeasuringProcess", "MeasuringProcessError", "PeakMemory", "PeakReport", "StepParts", "TrainStep",
    "Workload", "breakdown", "max_batch", "peak", "return_freed_memory_to_os", "search_batch",
    "step_progress",
]
