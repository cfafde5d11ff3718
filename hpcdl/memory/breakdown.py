"""What a measured step's peak is made of: the parts measured inside the step, and what is left unexplained.

A step's peak (:func:`hpcdl.memory.peak`) is the most memory the step used above what existed when it
started. What existed already is the state a training step keeps between steps: the parameters
("weights"), the buffers, the optimizer state and the batch; their sizes are exact tensor sizes and they
are reported beside the peak as the *resident* part, not inside it. Inside the step, this module
measures (:class:`StepProbe`, called by :class:`hpcdl.memory.TrainStep`'s step):

- ``gradients``: the parameter gradients after backward (exact tensor sizes; the step starts with none);
- ``held_after_forward``: memory in use at the end of the forward above the step's start (measured:
  CUDA's allocated bytes or the CPU's resident size), i.e. what autograd keeps for backward plus the
  output and the loss. On the CPU the resident size grows only by pages the process did not have
  already, so allocations that reuse heap pages freed earlier (small packed buffers) are missed;
- ``packed_activations``: what a compressing session holds at the end of the forward
  (:attr:`hpcdl.runtime.session.Session.held_bytes`, exact; None for a method without a session);
- ``forward_peak``: the most in use during the forward above the step's start (measured), so that the
  step's peak is known to lie in the forward (equal) or in backward (larger);
- ``decoded_peak``: the most bytes of decoded activations alive at once in backward (the session counts
  each decoded span until autograd frees it);
- ``largest_packed_original``: the largest saved tensor a codec packed, before packing: it lives
  uncompressed until the forward code drops it. It is transient in the forward and so not one of the
  parts below, which are the ones alive together in backward;
- ``held_originals_peak``: the most bytes of already packed tensors' originals that something other than
  autograd still held (the batch, a residual's input, a skip connection kept in a local) when a later
  tensor was packed (:attr:`hpcdl.runtime.stats.Stats.held_originals_peak_bytes`): forward memory that
  compression cannot take away. Not summed either.

:func:`breakdown` then writes the peak as ``gradients + saved_activations + decoded_peak +
remainder``, where ``saved_activations`` is ``packed_activations`` for a compressing method (exact)
and ``held_after_forward`` otherwise (measured). The remainder is defined as the difference and holds
what is not measured apart: the gradients of activations in backward, the codec's scratch space,
tensors kept raw (under the session's size threshold) and the output and loss of a compressing
method, the optimizer step's temporaries and allocator slack. It is negative when the measured parts were not all alive at the peak (activations
are freed during backward while the gradients fill up). Nothing here is estimated.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from hpcdl.memory.peak import PeakReport, current_bytes, high_water_bytes
from hpcdl.runtime.session import active_session
from hpcdl.runtime.stats import Stats


def tensor_bytes(value) -> int:
    """Bytes of the tensors in ``value`` (a tensor, or lists, tuples and dicts of them; anything else counts 0)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(item) for item in value)
    if isinstance(value, dict):
        return sum(tensor_bytes(item) for item in value.values())
    return 0


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors the optimizer keeps between steps (SGD's momentum, Adam's two moments, ...)."""
    return sum(tensor_bytes(state) for state in optimizer.state.values())


@dataclass(frozen=True)
class StepParts:
    """The parts one step measured, in bytes (see the module docstring); None: not measured by this method."""

    weights: int
    buffers: int
    optimizer_state: int
    batch: int
    gradients: int
    held_after_forward: int
    forward_peak: int
    packed_activations: int | None
    largest_packed_original: int | None
    decoded_peak: int | None
    held_originals_peak: int | None = None


class StepProbe:
    """Reads memory at the start of a step and at the end of its forward; one per measured step function."""

    def __init__(self, device: torch.device):
        self.device = device
        self.start_bytes = 0
        self.after_forward = 0
        self.forward_peak = 0
        self.packed: int | None = None

    def start(self) -> None:
        """Call first thing in the step (the high-water mark was reset just before it)."""
        self.start_bytes = current_bytes(self.device)
        self.after_forward = self.forward_peak = 0
        self.packed = None

    def forward_end(self) -> None:
        """Call once the loss is computed, still inside the method's context (its session, if any, is open)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.after_forward = current_bytes(self.device) - self.start_bytes
        self.forward_peak = high_water_bytes(self.device) - self.start_bytes
        session = active_session()
        self.packed = session.held_bytes if session is not None else None

    def parts(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch, gradients: int,
              stats: Stats | None) -> StepParts:
        """The step's parts, once its backward and optimizer step have run (``gradients`` read before release)."""
        return StepParts(
            weights=tensor_bytes(list(model.parameters())),
            buffers=tensor_bytes(list(model.buffers())),
            optimizer_state=optimizer_state_bytes(optimizer),
            batch=tensor_bytes(batch),
            gradients=gradients,
            held_after_forward=self.after_forward,
            forward_peak=self.forward_peak,
            packed_activations=self.packed,
            largest_packed_original=stats.largest_packed_original if stats is not None else None,
            decoded_peak=stats.decoded_peak_bytes if stats is not None else None,
            held_originals_peak=stats.held_originals_peak_bytes if stats is not None else None,
        )


def breakdown(report: PeakReport) -> dict:
    """The peak of ``report`` written as its measured parts plus the remainder; see the module docstring.

    ``resident`` (weights, buffers, optimizer state, batch) existed before the step and is not in
    ``peak``; ``footprint`` is both together, what a device must hold.
    """
    if "parts" not in report.info:
        raise ValueError("this report has no step parts: measure a hpcdl.memory.TrainStep, whose step records them")
    parts = StepParts(**report.info["parts"])
    resident = parts.weights + parts.buffers + parts.optimizer_state + parts.batch
    saved = parts.packed_activations if parts.packed_activations is not None else parts.held_after_forward
    summed = parts.gradients + saved + (parts.decoded_peak or 0)
    return {
        **asdict(parts),
        "saved_activations": saved,
        "resident": resident,
        "peak": report.peak_bytes,
        "peak_in": "forward" if parts.forward_peak >= report.peak_bytes else "backward",
        "remainder": report.peak_bytes - summed,
        "footprint": resident + report.peak_bytes,
    }
