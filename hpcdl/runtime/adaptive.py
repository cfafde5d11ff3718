"""Adaptive compression: each saved tensor's ``sz`` abs bound from a gradient-error budget (``Policy.adaptive()``).

A static range-relative bound does not follow what backward does with a tensor: batch norm divides each
channel by its own spread, softmax probabilities are read relative to their (tiny) values. This controller
gives each saved floating tensor ("slot", named ``module#k`` by :class:`~hpcdl.runtime.probe.SlotNames`) an
absolute ``sz`` bound ``eb_i`` chosen so that the predicted parameter-gradient error of every module stays
below ``alpha`` times the sampling variance its gradient already has (SGD's own noise). The model
(docs/adaptive.md derives it):

* an error of mean square ``v_i`` in slot ``i`` adds ``S_im * v_i`` to module ``m``'s squared gradient error
  (``S_im``: the slot's sensitivity); ``v_i = kappa_i * eb_i^2 / 3`` (uniform error on the elements ``sz``
  does not keep exactly; ``kappa_i`` measured by a trial encode);
* ``S_im`` is the closed form ``fan_in_m * ||delta_m||^2`` where slot ``i`` is the input of a Linear/Conv
  layer ``m`` (and nothing else bends it, which the first measurement checks), else measured: the probe
  compresses that slot alone and compares the gradients with exact ones (:mod:`hpcdl.runtime.probe`; where an
  uncompressed replay does not fit, with those of a replay compressed as the step was);
* the modules' budgets ``alpha * V_m`` are shared among the slots that reach them so that the total bits
  (``n_i`` per halving of ``eb_i``) are fewest: the optimum of that concave problem, every budget held
  (:mod:`hpcdl.runtime.error_budget`);
* a batch norm's saved input is bounded per channel, in units of a power of two near each channel's spread
  (:mod:`hpcdl.compress.channels`), because batch norm's backward reads it so; its range, trial encodes and
  sensitivity are of the tensor in those units (``Slot.per_channel``);
* ``V_m``, the sampling variance of module ``m``'s gradient, is estimated from the gradients of the two steps
  before each probe and the probe's own (:mod:`hpcdl.runtime.noise`) and averaged over the probes; until the
  first estimate (the first probe, at step 0, has no steps before it) ``0.1 * ||g_m||^2`` stands in for it
  (:data:`UNMEASURED_NOISE`).

With ``budget=`` (a memory size) the bounds instead minimise the predicted error under a byte budget for a
step's saved tensors (:mod:`hpcdl.runtime.budget`).

Probes run on step 0, then every ``probe_every`` steps, and soon after a slot appears that was never
measured. ``||g_m||`` and the gradient samples come from :meth:`Policy.record_gradients` (after the
distributed reduction); the
probes' measurements are averaged over the ranks the distributed backend supplies (:mod:`hpcdl.runtime.ranks`),
so every rank decides the same bounds.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar

import torch

from hpcdl.compress import get_codec
from hpcdl.compress.channels import with_channels
from hpcdl.compress.entropy import METHODS as ENTROPY_METHODS
from hpcdl.compress.entropy import with_stage
from hpcdl.runtime import budget, error_budget
from hpcdl.runtime.noise import GradientSamples, blend
from hpcdl.runtime.observe import OUTSIDE
from hpcdl.runtime.policy import (
    Controller,
    GradStat,
    PolicySpecError,
    SavedTensorInfo,
    default_codec_config,
    register_controller,
    spec_from_config,
)
from hpcdl.runtime.probe import (
    Capture,
    KeptSample,
    RecordingPolicy,
    Replay,
    Replayer,
    SlotNames,
    SlotRecord,
    slot_codec,
    sz_abs,
)
from hpcdl.runtime.trials import FAMILIES, QUANT_BITS, Trial
from hpcdl.units import human_bytes, parse_bytes

ENTROPY_STAGES = ("none", *ENTROPY_METHODS)
#: How a batch norm's saved input is bounded: per channel, in units of each channel's spread, or like any slot.
CHANNEL_UNITS = ("batchnorm", "none")
#: Options that take one of these names.
_NAMED_CHOICES = {"codecs": tuple(FAMILIES), "entropy": ENTROPY_STAGES, "channels": CHANNEL_UNITS}

#: A closed form counts as confirmed when the measurement is within this factor of it.
CLOSED_FORM_TOLERANCE = 2.0
#: A reference replay's perturbation of a slot already compressed at its trial bound: sz at this multiple of it.
OFFSET_BOUND = math.sqrt(2)
#: Relative change of a Linear/Conv output gradient's squared norm that counts as a changed backward flow
#: (_Measurement): unbent, the replays compute the same numbers; bent, they move by about the compression's error.
FLOW_TOLERANCE = 1e-6
#: Until a module's gradient variance is estimated (the first probe), it counts as this fraction of the squared
#: gradient norm: a cautious start, under which the default alpha keeps the cosine to the exact gradient at least
#: 1 / sqrt(1 + alpha * UNMEASURED_NOISE) = 0.995.
UNMEASURED_NOISE = 0.1
#: The smallest slots whose bytes together are at most this fraction of all slots' are kept as they are, never
#: measured (AdaptiveController._negligible): they add at most this fraction of the uncompressed bytes to the
#: packed ones (a 15x ratio becomes 14.8x at worst), and each saves a replay per probe.
NEGLIGIBLE_BYTES = 1e-3
#: A bound may grow at most this factor per probe (see decide).
GROWTH = 2.0
#: The fields of a report that measure the controller's own cost in this process: its wall time (:class:`_Clock`;
#: differs between runs and ranks) and the replays its last probe ran (differs between ranks: each confirms its
#: closed forms on its own batch, see _Measurement).
COST_FIELDS = ("controller_seconds", "wall_seconds", "controller_fraction", "controller_seconds_total",
               "controller_fraction_total", "replays")
#: Bounds are rounded down to a grid of 2^(1/4) steps, so that a long run builds a bounded set of codecs.
GRID_STEPS_PER_OCTAVE = 4


@dataclass(frozen=True)
class ControllerOptions:
    """Parsing and display shared by the option dataclasses of the controllers here (numbers, and the named
    options ``budget`` and ``codecs``)."""

    controller_id: ClassVar[str] = ""
    example: ClassVar[str] = ""

    @classmethod
    def parse(cls, options: Mapping):
        """The options from a method spec's or config's ``{name: value}``; a bad one is a PolicySpecError."""
        known = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise PolicySpecError(f"{cls.controller_id} takes the options {', '.join(known)}; got unknown "
                                  f"{', '.join(unknown)} (e.g. '{cls.example}')")
        values: dict = {}
        for name, value in options.items():
            if name == "budget":
                try:
                    values[name] = parse_bytes(value)
                except (TypeError, ValueError) as err:
                    raise PolicySpecError(f"{cls.controller_id} option budget is a memory size like 2GiB or "
                                          f"500000000: {err}") from None
                continue
            if name in _NAMED_CHOICES:
                if value not in _NAMED_CHOICES[name]:
                    raise PolicySpecError(f"{cls.controller_id} option {name} is one of "
                                          f"{', '.join(_NAMED_CHOICES[name])}, got {value!r}")
                values[name] = value
                continue
            integral = known[name] == "int"
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (integral and value != int(value)):
                raise PolicySpecError(f"{cls.controller_id} option {name} must be "
                                      f"{'an integer' if integral else 'a number'}, got {value!r}")
            if not value > 0 or not math.isfinite(value):
                raise PolicySpecError(f"{cls.controller_id} option {name} must be positive and finite, got {value!r}")
            values[name] = int(value) if integral else float(value)
        return cls(**values)

    def changed(self) -> dict:
        """The options that differ from the defaults (what the method spec shows)."""
        default = type(self)()
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)}


@dataclass(frozen=True)
class AdaptiveOptions(ControllerOptions):
    """The adaptive controller's options (method spec ``adaptive:alpha=0.1,probe_every=200``)."""

    alpha: float = 0.1        # per module: predicted ||gradient error||^2 <= alpha * gradient sampling variance
    probe_every: int = 200    # steps between probes (with reruns, what keeps the overhead under 3%: docs/adaptive.md)
    reruns: int = 2           # measured (not closed-form) slots re-measured per probe after the first, oldest first
    probe_rel: float = 1e-2   # first probe bound of a slot never measured, as a fraction of its value range
    max_rel: float = 0.5      # no bound above this fraction of the slot's value range
    probe_rows: int = 16      # the replays run on at most this many samples of the batch (docs/adaptive.md) ...
    probe_memory: float = 1.0  # ... and on no more than hold this multiple of the step's packed bytes uncompressed
    budget: int = 0           # bytes for a step's saved tensors: least predicted error within it (0: alpha rule)
    codecs: str = "all"       # the candidate codecs besides sz (hpcdl.runtime.trials.FAMILIES; "sz": sz only)
    entropy: str = "zstd"     # the lossless stage over every chosen codec's stream ("none": without; compress.entropy)
    channels: str = "batchnorm"  # batch norms' inputs bounded per channel in units of its spread ("none": not)

    controller_id: ClassVar[str] = "adaptive"
    example: ClassVar[str] = "adaptive:alpha=0.1,probe_every=200"


@dataclass(frozen=True)
class ActnnOptions(ControllerOptions):
    """The ActNN baseline's options (method spec ``actnn:bits=2``)."""

    bits: float = 2.0         # average quant bits per element of the compressed slots (plus quant's statistics)
    probe_every: int = 200    # as AdaptiveOptions
    reruns: int = 2
    probe_rel: float = 1e-2

    controller_id: ClassVar[str] = "actnn"
    example: ClassVar[str] = "actnn:bits=2"


@dataclass
class Slot:
    """What the controller knows of one saved tensor (plain data: it is the checkpointed state)."""

    numel: int = 0
    value_range: float = 0.0
    kappa: float = 1.0               # measured mean squared error / (bound^2 / 3)
    sensitivity: dict[str, float] = field(default_factory=dict)  # module -> S_im
    closed_form: bool = False        # S from fan_in * ||delta||^2 (times calibration) between measurements
    calibration: float = 1.0         # measured / closed-form sensitivity at the last measurement
    measured_at: int = -1            # probe number of the last perturbed measurement (-1: never)
    measured_bound: float = 0.0      # the bound that measurement compressed with
    bound: float = 0.0               # the decided sz abs bound (0: keep the tensor as it is)
    nbytes: int = 0                  # the tensor's bytes uncompressed
    sizes: list[float] = field(default_factory=list)  # sz packed bytes at budget.size_rels(max_rel) (budget mode,
                                                      # codec choice)
    trials: list[dict] = field(default_factory=list)  # the candidate codecs' trial encodes (trials.Trial as dicts)
    codec: dict | None = None        # the chosen codec when it is not sz (then ``bound`` is only sz's allowed bound)
    per_channel: bool = False        # a batch norm's input: everything above (range, kappa, bounds, sizes, trials,
                                     # sensitivity) is of the tensor in channel units (hpcdl.compress.channels)

    def config(self) -> dict | None:
        """The codec this slot is compressed with: the chosen codec, sz at ``bound``, or None (kept as it is)."""
        if self.codec is not None:
            return self.codec
        return sz_abs(self.bound) if self.bound > 0 else None

    def trial(self, codec: dict) -> dict:
        """The trial encode of ``codec`` (a Trial as a dict); one that never ran counts as unusable."""
        return next((t for t in self.trials if t["codec"] == codec), asdict(Trial(codec)))

    def variance(self) -> float:
        """The mean squared error of the codec in effect: measured for a trial codec, kappa * eb^2 / 3 for sz."""
        if self.codec is not None:
            return self.trial(self.codec)["mse"]
        return self.kappa * self.bound ** 2 / 3


def _on_grid(bound: float) -> float:
    """``bound`` rounded down to the 2^(1/GRID_STEPS_PER_OCTAVE) grid."""
    return 2.0 ** (math.floor(math.log2(bound) * GRID_STEPS_PER_OCTAVE) / GRID_STEPS_PER_OCTAVE)


class AdaptiveController(Controller):
    """Per-slot ``sz`` abs bounds from a gradient-error budget; see the module docstring and docs/adaptive.md."""

    #: A trial codec must keep every zero and sign where the tensor has zeros (usable, trials.sign_safe).
    sign_rule: ClassVar[bool] = True

    def __init__(self, options: AdaptiveOptions | None = None):
        self.options = options or AdaptiveOptions()
        self.slots: dict[str, Slot] = {}
        self.probes = 0           # probes run so far
        self.next_probe = 0       # the step whose forward the next probe captures
        self.names = SlotNames()
        self.capture: Capture | None = None
        self.clock = _Clock()     # the controller's wall time (not state: it differs between runs)
        self.replays = 0          # replays the last probe ran (not state, like the clock; probe.Replayer)
        self.fixed_bytes = 0.0    # budget mode: bytes of the saved tensors that are no slot (masks, indices, ...)
        self.budget_warned = False
        self.check: dict[str, dict[str, float]] = {}  # the last probe's predicted vs measured error (see probe)
        self.whole_numel: dict[str, int] = {}  # slot -> elements in the probe step's forward (whole batch)
        self.noise: dict[str, float] = {}  # per module, the sampling variance of its gradient (hpcdl.runtime.noise)
        self.correction: dict[str, float] = {}  # per module, measured / predicted error of the last check, if > 1
        self.samples = GradientSamples()  # the gradients of the steps just before the next probe
        self._sampled: torch.nn.Module | None = None  # the model of a step whose gradients are sampled
        self._unreported = False  # a probe decided since the last report()

    # -- the Controller interface -------------------------------------------------------------------------
    def choose(self, info: SavedTensorInfo) -> dict | None:
        key = self.names.next(info.module, info.step)
        if self.capture is not None:  # a probe step: its replays may run on a sub-batch of this one
            self.whole_numel[key] = math.prod(info.shape)
        # a new tensor: measure it soon (not one the loss saves outside the model's forward: no replay meets it)
        if key not in self.slots and info.module != OUTSIDE:
            self.next_probe = min(self.next_probe, info.step + 1)
        return with_stage(self.in_effect(key, info.channels), self.options.entropy)

    def in_effect(self, key: str, channels: int | None) -> dict | None:
        """The codec slot ``key`` is compressed with now, without the entropy stage (lossless: it changes no
        value), or None (kept as it is); ``channels``: the channel dim of its tensor where that is a batch norm's
        input. hpcdl's default policy's codec until a probe measures the slot, so step 0 is no uncompressed step,
        and where a bound in channel units meets a tensor without channels (it applies only through the
        channels stage)."""
        slot = self.slots.get(key)
        if slot is None or (slot.per_channel and channels is None):
            return default_codec_config()
        return with_channels(slot.config(), channels) if slot.per_channel else slot.config()

    def watch(self, model: torch.nn.Module, step: int, threshold: int) -> contextlib.AbstractContextManager:
        self.clock.start()
        # The two steps before a probe and the probe itself sample their gradients (the noise estimate).
        self._sampled = model if self.next_probe - 2 <= step <= self.next_probe else None
        if step < self.next_probe:
            self.capture = None
            return contextlib.nullcontext()
        self.capture = Capture(model, threshold)
        return self.capture

    def saved(self, step: int, original_bytes: int, packed_bytes: int) -> None:
        if self.capture is not None:  # what the probe step saved sets how many samples its replays may run
            self.capture.original_bytes, self.capture.packed_bytes = original_bytes, packed_bytes

    def wants_gradients(self, step: int) -> bool:
        return self._sampled is not None or (self.capture is not None and self.capture.complete)

    def observe(self, step: int, grad_stats: Mapping[str, GradStat]) -> None:
        capture, self.capture = self.capture, None
        model, self._sampled = self._sampled, None  # not kept: a policy is copied into measuring processes
        start = time.perf_counter()
        if model is not None:
            self.samples.add(model, step - 1)  # `step` counts this step's forward already
        if capture is None or not capture.complete:
            self.clock.spent(time.perf_counter() - start)
            return
        self.noise = blend(self.noise, self.samples.variance())
        self.probe(capture, grad_stats)
        self.next_probe = step - 1 + self.options.probe_every  # `step` counts the captured forward already
        self.clock.spent(time.perf_counter() - start)

    @property
    def probe_seconds(self) -> float:
        """Wall seconds this controller spent probing in this process."""
        return self.clock.seconds

    def describe(self) -> str:
        return spec_from_config({"id": self.options.controller_id, **self.options.changed()})

    def state_dict(self) -> dict:
        return {"options": asdict(self.options), "probes": self.probes, "next_probe": self.next_probe,
                "fixed_bytes": self.fixed_bytes, "slots": {key: asdict(slot) for key, slot in self.slots.items()},
                "noise": dict(self.noise), "correction": dict(self.correction),
                "samples": self.samples.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        try:
            slots = {key: Slot(**slot) for key, slot in state["slots"].items()}
            probes, next_probe = int(state["probes"]), int(state["next_probe"])
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"an adaptive controller state is {{'options', 'probes', 'next_probe', 'slots'}} as "
                             f"AdaptiveController.state_dict() writes it; this one fails with {err!r}") from None
        self.slots, self.probes, self.next_probe = slots, probes, next_probe
        self.fixed_bytes = float(state.get("fixed_bytes", 0.0))
        self.noise = {module: float(value) for module, value in state.get("noise", {}).items()}
        self.correction = {module: float(value) for module, value in state.get("correction", {}).items()}
        if "samples" in state:
            self.samples.load_state_dict(state["samples"])

    # -- probing and deciding -----------------------------------------------------------------------------
    def probe(self, capture: Capture, grad_stats: Mapping[str, GradStat]) -> None:
        """Measure the slots of the captured step (exact or reference replay, closed forms, perturbed replays),
        then decide. The first replay is exact where its uncompressed saved tensors fit the memory allowance
        (:meth:`Capture.replay_fits`), else a reference that compresses every slot as the step did
        (:class:`~hpcdl.runtime.probe.Replayer`): then no check replay runs (it measures against exact
        gradients), and the corrections stay as they were."""
        rows = capture.replay_rows(self.options.probe_rows, self.options.probe_memory)
        # exact only where it fits on every rank: the check replay's reduction is a collective all ranks must call
        exact = self.ranks().mean([float(capture.replay_fits(rows, self.options.probe_memory))])[0] == 1.0
        replayer = Replayer(capture, rows=rows)
        modules = sorted(set(replayer.owners))  # the same list on every rank: the axis of the reductions over ranks
        # slots negligible at the last probe are recorded without trial encodes: they stay as they are
        bare = self._negligible({key: slot.nbytes for key, slot in self.slots.items()})
        with replayer.restored():
            trial_bounds = {key: slot.bound for key, slot in self.slots.items() if slot.bound}
            reference = replayer.run(RecordingPolicy(trial_bounds, self.options.probe_rel,
                                                     size_rels=self.size_rels(), candidates=self.candidates(),
                                                     threshold=capture.threshold, whole_numel=self.whole_numel,
                                                     entropy=self.options.entropy,
                                                     per_channel=self.options.channels == "batchnorm",
                                                     sign_rule=self.sign_rule, bare=bare,
                                                     bound_limits=self.bound_limits(), growth=GROWTH,
                                                     keep_samples=self._measures_sz_at_decision(),
                                                     in_effect=None if exact else self._in_effect_of),
                                     layer_calls=True, live_calls=True, keep=exact)
            closed = _closed_forms(reference)
            self.fixed_bytes = float(reference.held_bytes - sum(record.nbytes for record in reference.slots.values()))
            for key, record in reference.slots.items():
                slot = self.slots.setdefault(key, Slot())
                if slot.per_channel != (record.channels is not None):  # measured in other units: measure afresh
                    slot = self.slots[key] = Slot(per_channel=record.channels is not None)
                slot.numel, slot.value_range = record.numel, record.value_range
                slot.nbytes, slot.sizes = record.nbytes, [float(size) for size in record.sizes]
                slot.trials = [asdict(trial) for trial in record.trials]
                slot.kappa = record.trial_mse / (record.trial_bound ** 2 / 3) if record.trial_bound > 0 else 0.0
                if slot.closed_form and key in closed:
                    slot.sensitivity = {m: slot.calibration * v for m, v in closed[key].items()}
            # the check: the decisions in effect, all at once, against exact gradients (none to compare with
            # after a reference replay)
            in_effect = {key: slot_codec(config, reference.slots[key]) for key, slot in self.slots.items()
                         if exact and key in reference.slots and (config := slot.config()) is not None}
            measured_now = (replayer.run(RecordingPolicy(perturb=in_effect), against=reference).deviation
                            if in_effect else {})
            # nothing sz changes in an all-zero slot: no effect to measure
            to_measure = [key for key in self._to_measure(reference.slots) if reference.slots[key].trial_mse > 0]
            without_effect = [key for key, slot in self.slots.items()
                              if key in reference.slots and reference.slots[key].trial_mse > 0
                              and slot.measured_at >= 0 and not slot.sensitivity and key not in to_measure]
            silent = _silent(to_measure, reference, closed)
            measure = _Measurement(replayer, reference, closed)
            measure.without_effect(without_effect + silent)
            measure.each([key for key in to_measure if key not in silent])
            for key, (sensitivity, calibration) in measure.results.items():
                slot = self.slots[key]
                slot.sensitivity, slot.closed_form = sensitivity, calibration is not None
                slot.measured_at, slot.measured_bound = self.probes, reference.slots[key].trial_bound
                if calibration is not None:
                    slot.calibration = calibration
            self.replays = 1 + bool(in_effect) + measure.replays
        for key in list(self.slots):
            if key not in reference.slots:
                del self.slots[key]  # no longer saved (the model changed)
        self._reduce_over_ranks(modules)
        self.check = self._check(in_effect, measured_now, grad_stats, modules)
        self.correction.update((m, max(1.0, row["measured"] / row["predicted"]))
                               for m, row in self.check.items() if row["predicted"] > 0)
        self.probes += 1
        self.decide(grad_stats, {key: record.sample for key, record in reference.slots.items() if record.sample})
        self._unreported = True

    def _in_effect_of(self, key: str, record: SlotRecord) -> dict | None:
        """:meth:`in_effect` for a slot a reference replay recorded (``record``)."""
        return self.in_effect(key, record.channels)

    def candidates(self) -> tuple[dict, ...]:
        """The codecs the first replay trial-encodes each slot with (besides sz)."""
        return FAMILIES[self.options.codecs]

    def bound_limits(self) -> dict[str, float] | None:
        """Per slot, the largest bound :meth:`decide` may give it at this probe (its cap, less ``max_rel``), unless
        it is measured now at a larger trial bound: what lets the first replay leave out candidates that err too
        much (:func:`hpcdl.runtime.trials.trials`). None in budget mode, where the byte budget sets the bounds."""
        if self.options.budget:
            return None
        return {key: GROWTH * max(slot.measured_bound, slot.bound) for key, slot in self.slots.items()}

    def size_rels(self) -> tuple[float, ...]:
        """Where the first replay measures each slot's sz bytes: the ladder, when bytes decide the bounds (budget
        mode); nothing otherwise."""
        return budget.size_rels(self.options.max_rel) if self.options.budget else ()

    def _measures_sz_at_decision(self) -> bool:
        """Whether :meth:`decide` measures sz's bytes at the bounds it decides, on the first replay's samples: where
        sz competes with other codecs on bytes under the alpha rule (budget mode has the ladder)."""
        return not self.options.budget and bool(self.candidates())

    def _check(self, in_effect: Mapping[str, dict], measured: Mapping[str, float],
               grad_stats: Mapping[str, GradStat], modules: list[str]) -> dict[str, dict[str, float]]:
        """Per module, the squared gradient error the bounds in effect before this probe were predicted to cause
        (with this probe's sensitivities) and the one a replay with all of them compressed measured (averaged over
        ranks and divided by the world size, like the sensitivities), the squared gradient norm and the gradient's
        sampling variance (0 until estimated)."""
        if not in_effect:
            return {}
        ranks = self.ranks()
        mean = ranks.mean([measured.get(m, 0.0) for m in modules])
        predicted = {m: 0.0 for m in modules}
        for key in in_effect:
            slot = self.slots[key]
            for module, sensitivity in slot.sensitivity.items():
                predicted[module] = predicted.get(module, 0.0) + sensitivity * slot.variance()
        return {m: {"predicted": predicted[m], "measured": value / ranks.size,
                    "grad_sq": grad_stats[m].norm ** 2 if m in grad_stats else 0.0, "noise": self.noise.get(m, 0.0)}
                for m, value in zip(modules, mean) if value > 0 or predicted[m] > 0}

    def report(self) -> dict | None:
        """After a probe: each slot's codec and bound, the bounds' predicted (and, in budget mode, bytes), the
        check of the bounds in effect before the probe (:meth:`_check`), totals as scalars for the loggers, and
        the controller's own wall time (:class:`_Clock`)."""
        if not self._unreported:
            return None
        self._unreported = False
        slots = {key: {"codec": spec_from_config(slot.config()),
                       "bound": slot.bound, "rel": slot.bound / slot.value_range if slot.value_range > 0 else 0.0,
                       **({"per_channel": True} if slot.per_channel else {})}
                 for key, slot in self.slots.items()}
        record: dict = {"probe": self.probes, "slots": slots, "predicted_error": self.predicted_error(),
                        "check": self.check}
        if self.check:
            record["check_predicted_total"] = sum(row["predicted"] for row in self.check.values())
            record["check_measured_total"] = sum(row["measured"] for row in self.check.values())
        if self.byte_budget():
            record["budget_bytes"], record["predicted_bytes"] = self.byte_budget(), self.predicted_bytes()
        record.update(self.clock.lap(), replays=self.replays)
        return record

    def byte_budget(self) -> float:
        """The bytes the decisions are held to (0: none, the ``alpha`` rule decides)."""
        return self.options.budget

    def _to_measure(self, seen: Mapping[str, SlotRecord]) -> list[str]:
        """Slots to perturb this probe: every one never measured, then the oldest measured ones (closed forms,
        refreshed every probe, after the others); not the negligible ones (:meth:`_negligible`)."""
        negligible = self._negligible({key: record.nbytes for key, record in seen.items()})
        fresh = [key for key in seen if self.slots[key].measured_at < 0 and key not in negligible]
        stale = sorted((key for key in seen if self.slots[key].measured_at >= 0),
                       key=lambda key: (self.slots[key].closed_form, self.slots[key].measured_at, key))
        return fresh + stale[:self.options.reruns]

    def _negligible(self, nbytes: Mapping[str, float]) -> set[str]:
        """Under the alpha rule, the smallest slots (``nbytes``: each slot's bytes) whose bytes together are at
        most NEGLIGIBLE_BYTES of all the slots' (batch-norm statistics, per-channel scales): never measured, so
        kept as they are. Compressing them could save that fraction at most, and measuring each costs a replay.
        A byte budget (and the ActNN baseline, which compresses everything) measures every slot."""
        if self.byte_budget():
            return set()
        allowed, running, negligible = NEGLIGIBLE_BYTES * sum(nbytes.values()), 0.0, set()
        for key in sorted(nbytes, key=lambda key: (nbytes[key], key)):
            running += nbytes[key]
            if running > allowed:
                break
            negligible.add(key)
        return negligible

    def _reduce_over_ranks(self, modules: list[str]) -> None:
        """Average over the ranks what each measured on its own batch, so that every rank decides the same bounds.

        Per slot: kappa, range, the bound its sensitivity was measured at, whether the closed form held (kept only
        where it held on every rank), its calibration, when it was last measured, its sensitivity to every module
        in ``modules`` (the same list on every rank), its size ladder (when measured) and its trial encodes (a
        trial is safe only where it is safe on every rank: the mean of the 0/1 flags is 1); and the fixed bytes.
        The averaged gradient carries 1/world of one rank's error variance, so the sensitivities are divided by it.
        """
        ranks = self.ranks()
        if ranks.size == 1:
            return
        keys = sorted(self.slots)
        ladder, candidates = len(self.size_rels()), len(self.candidates())
        flat: list[float] = []
        for key in keys:
            slot = self.slots[key]
            flat += [slot.kappa, slot.value_range, slot.measured_bound, float(slot.closed_form), slot.calibration,
                     float(slot.measured_at)]
            flat += [slot.sensitivity.get(m, 0.0) for m in modules]
            flat += (slot.sizes + [0.0] * ladder)[:ladder]  # a rank where the slot is all zeros measured no ladder
            trials = [[t[name] for name in TRIAL_STATS] for t in slot.trials]
            flat += [v for row in (trials + [UNUSABLE] * candidates)[:candidates] for v in row]
        mean = ranks.mean(flat + [self.fixed_bytes])
        width = 6 + len(modules) + ladder + len(TRIAL_STATS) * candidates
        for index, key in enumerate(keys):
            row = mean[index * width:(index + 1) * width]
            slot = self.slots[key]
            slot.kappa, slot.value_range, slot.measured_bound = row[0], row[1], row[2]
            slot.closed_form, slot.calibration, slot.measured_at = row[3] == 1.0, row[4], math.floor(row[5])
            slot.sensitivity = {m: s / ranks.size for m, s in zip(modules, row[6:6 + len(modules)]) if s > 0}
            sizes = row[6 + len(modules):6 + len(modules) + ladder]
            slot.sizes = sizes if any(sizes) else []
            stats = row[6 + len(modules) + ladder:]
            for index_trial, t in enumerate(slot.trials):
                t.update(zip(TRIAL_STATS, stats[index_trial * len(TRIAL_STATS):(index_trial + 1) * len(TRIAL_STATS)]))
        self.fixed_bytes = mean[-1]

    def decide(self, grad_stats: Mapping[str, GradStat], samples: Mapping[str, KeptSample]) -> None:
        """Each slot's bound from the budget (module docstring, :mod:`hpcdl.runtime.error_budget`); slots that reach
        no module get the cap. Then each slot's codec: the cheapest of sz at that bound, its bytes measured on the
        slot's ``samples`` (the first replay's, averaged over the ranks that have one), and the trial codecs."""
        if self.options.budget:
            self.decide_for_bytes(grad_stats)
            return
        reference = self.reference(grad_stats)
        # sz's error may stop being uniform and independent far above the bounds it was measured at (on smooth
        # data it turns coherent). The check replay measures the bounds in effect at every probe and corrects a
        # module's prediction where it was low (reference), so a bound grows GROWTH-fold per probe at most from
        # the bound in effect: the next check measures it before it grows again.
        caps = {key: min(self.options.max_rel * slot.value_range, GROWTH * max(slot.measured_bound, slot.bound))
                for key, slot in self.slots.items()}
        priced = {key: slot for key, slot in self.slots.items() if slot.kappa > 0 and slot.numel > 0 and caps[key] > 0}
        variances = error_budget.allocate({key: slot.numel for key, slot in priced.items()},
                                          {key: slot.sensitivity for key, slot in priced.items()},
                                          {m: self.options.alpha * value for m, value in reference.items()},
                                          {key: slot.kappa * caps[key] ** 2 / 3 for key, slot in priced.items()})
        keys = sorted(self.slots)
        bounds = [min(caps[key], math.sqrt(3 * variances[key] / self.slots[key].kappa)) if key in variances
                  else caps[key] for key in keys]
        if self.ranks().size > 1:  # the same on every rank, whatever each machine's last bits of arithmetic
            bounds = self.ranks().mean(bounds)
        allowed = {}
        for key, bound in zip(keys, bounds):
            self.slots[key].bound = _on_grid(bound) if bound > 0 else 0.0
            allowed[key] = self.slots[key].kappa * bound ** 2 / 3
        sz_bytes = self._sz_bytes_at_bounds(keys, allowed, samples)
        for key in keys:
            self.slots[key].codec = self._cheapest(self.slots[key], allowed[key], sz_bytes[key])

    def _sz_bytes_at_bounds(self, keys: list[str], allowed: Mapping[str, float],
                            samples: Mapping[str, KeptSample]) -> dict[str, float]:
        """Per slot, sz's packed bytes at its bound (with the entropy stage), measured on its sample and averaged
        over the ranks that have one; 0 where no rank has one or no trial codec is ``allowed`` (its error
        variance), since then nothing competes with sz (:meth:`_cheapest`)."""
        measured: list[float] = []
        for key in keys:
            slot, part = self.slots[key], samples.get(key)
            contended = any(usable(t) and t["mse"] <= allowed[key] for t in slot.trials)
            if part is None or slot.bound <= 0 or not contended:
                measured += [0.0, 0.0]
                continue
            codec = get_codec(with_stage(sz_abs(slot.bound), self.options.entropy))
            measured += [part.packed_bytes(codec), 1.0]
        if self.ranks().size > 1:
            measured = self.ranks().mean(measured)
        return {key: nbytes / count if count else 0.0
                for key, nbytes, count in zip(keys, measured[0::2], measured[1::2])}

    def reference(self, grad_stats: Mapping[str, GradStat]) -> dict[str, float]:
        """Per module, what its budget is a fraction of: the sampling variance of its gradient (:attr:`noise`), or
        :data:`UNMEASURED_NOISE` times its squared gradient norm until the variance is estimated, divided by how
        much the last check measured above the prediction (:attr:`correction`); modules with neither are left
        out."""
        reference = {m: UNMEASURED_NOISE * stat.norm ** 2 for m, stat in grad_stats.items() if stat.norm > 0}
        reference.update((m, v) for m, v in self.noise.items() if v > 0)
        return {m: v / self.correction.get(m, 1.0) for m, v in reference.items()}

    def _cheapest(self, slot: Slot, allowed: float, sz_bytes: float) -> dict | None:
        """The codec of fewest measured bytes among those whose measured error variance is at most ``allowed``
        (the variance the budget gives the slot): a usable trial codec, or None for sz at the slot's bound
        (``sz_bytes``, as measured: 0 where not), which wins ties and whatever was not measured."""
        best, fewest = None, math.inf
        if slot.bound > 0:
            fewest = min(sz_bytes, float(slot.nbytes))
        for trial in slot.trials:
            if usable(trial) and trial["mse"] <= allowed and trial["nbytes"] < fewest:
                best, fewest = trial["codec"], trial["nbytes"]
        return best

    def _sz_bytes(self, slot: Slot) -> float:
        """Budget mode: sz's predicted packed bytes at the slot's bound, interpolated on the measured ladder (a
        bound outside it counts as the ladder's nearest end), at most the tensor's own bytes."""
        rels = budget.size_rels(self.options.max_rel)
        rel = min(max(slot.bound / slot.value_range, min(rels)), max(rels))
        return min(budget.packed_bytes(rels, slot.sizes, rel), float(slot.nbytes))

    def choices(self, grad_stats: Mapping[str, GradStat]) -> dict[str, list[budget.Choice]]:
        """Budget mode: each slot's candidate bounds with predicted bytes and error (:func:`budget.choices`), and
        its usable trial codecs at their measured bytes and error variance."""
        rels = budget.size_rels(self.options.max_rel)
        options = {}
        for key, slot in self.slots.items():
            weight = budget.error_weight(slot.sensitivity, self.reference(grad_stats))
            bounds = budget.choices(slot.nbytes, slot.value_range, rels, slot.sizes, weight * slot.kappa / 3)
            options[key] = budget.with_codecs(bounds, [budget.Choice(0.0, t["nbytes"], weight * t["mse"], t["codec"])
                                                       for t in slot.trials if usable(t)])
        return options

    def decide_for_bytes(self, grad_stats: Mapping[str, GradStat]) -> None:
        """Budget mode: the bounds of least predicted error whose predicted bytes fit ``options.budget``
        (:func:`budget.allocate`); warns once when even the loosest bounds do not fit.

        sz's error model is less sure far above the bound a sensitivity was measured at (see :meth:`decide`), but
        the byte budget is the hard limit here, so the growth cap does not apply: the next probe measures there.
        """
        options = self.choices(grad_stats)
        chosen = budget.allocate(options, self.options.budget * (1 - budget.HEADROOM), self.fixed_bytes)
        for key, index in chosen.items():
            self.slots[key].bound, self.slots[key].codec = options[key][index].bound, options[key][index].codec
        least = budget.total_bytes(options, {key: len(o) - 1 for key, o in options.items()}, self.fixed_bytes)
        if least > self.options.budget and not self.budget_warned:
            self.budget_warned = True
            warnings.warn(
                f"adaptive budget {human_bytes(self.options.budget)} cannot be met: even the loosest bounds "
                f"(max_rel={self.options.max_rel} of each saved tensor's range) are predicted to need "
                f"{human_bytes(least)} ({human_bytes(self.fixed_bytes)} of it tensors no codec touches); using "
                f"those bounds. Raise the budget to at least {human_bytes(least)}, raise max_rel, or use a smaller "
                "batch or activation checkpointing", budget.AdaptiveBudgetWarning, stacklevel=2)

    def predicted_bytes(self) -> float:
        """Budget mode: the packed bytes of a step's saved tensors the current bounds are predicted to take."""
        total = self.fixed_bytes
        for slot in self.slots.values():
            if slot.codec is not None:
                total += slot.trial(slot.codec)["nbytes"]
            elif slot.bound > 0 and slot.sizes and slot.value_range > 0:
                total += self._sz_bytes(slot)
            else:
                total += slot.nbytes
        return total

    def predicted_error(self) -> dict[str, float]:
        """Per module, the squared gradient error the current bounds are predicted to cause (sum_i S_im v_i)."""
        error: dict[str, float] = {}
        for slot in self.slots.values():
            variance = slot.variance()
            for module, sensitivity in slot.sensitivity.items():
                error[module] = error.get(module, 0.0) + sensitivity * variance
        return error


#: What a trial encode measured, averaged over ranks.
TRIAL_STATS = ("nbytes", "mse", "safe")
#: What a rank that made no trial encode of a slot sends for it: never usable.
UNUSABLE = [math.inf, math.inf, 0.0]


def usable(trial: Mapping) -> bool:
    """Whether a trial codec may be chosen: it encoded the tensor (on every rank), and its error keeps what the
    sensitivity model needs (:func:`hpcdl.runtime.trials.sign_safe`, on every rank)."""
    return trial["safe"] >= 1.0 and math.isfinite(trial["nbytes"]) and math.isfinite(trial["mse"])


class _Clock:
    """The controller's wall seconds (probes: replays, trial encodes, statistics) against the run's wall time.

    Started by the first watched forward; :meth:`lap` gives both since the last lap and since the start, for the
    ``"compression"`` records, so every run reports what the controller cost it.
    """

    def __init__(self) -> None:
        self.started = self.lapped = 0.0
        self.seconds = self.lap_seconds = 0.0

    def start(self) -> None:
        if not self.started:
            self.started = self.lapped = time.perf_counter()

    def spent(self, seconds: float) -> None:
        self.seconds += seconds
        self.lap_seconds += seconds

    def lap(self) -> dict[str, float]:
        now = time.perf_counter()
        wall, total = now - self.lapped, now - self.started
        record = {"controller_seconds": self.lap_seconds, "wall_seconds": wall,
                  "controller_fraction": self.lap_seconds / wall if wall > 0 else 0.0,
                  "controller_seconds_total": self.seconds,
                  "controller_fraction_total": self.seconds / total if total > 0 else 0.0}
        self.lapped, self.lap_seconds = now, 0.0
        return record


def _silent(keys: list[str], reference: Replay, closed: Mapping[str, dict[str, float]]) -> list[str]:
    """The slots of ``keys`` whose module call's outputs got no gradient in the first replay's backward.

    Backward is linear in the gradient it brings: where it brings none to the outputs of a module's call, the
    operations the call saved tensors for pass on zeros whatever those tensors hold, so its slots have no effect
    (the layers of a residual branch behind a batch norm whose weight is still 0, and the calls of a ReLU module
    the branch shares with the block). The call is that of a slot's first save, and another call may save the
    same tensor again (a ReLU's output, saved by the convolution reading it): so the slots are confirmed without
    effect together, by one replay, and not assumed to be. A slot with a closed form has a convolution's
    nonzero output gradient behind it, so it is not one."""
    if reference.live_calls is None:
        return []
    return [key for key in keys
            if key not in closed and (key.rpartition("#")[0], reference.slots[key].call) not in reference.live_calls]


def _closed_forms(reference: Replay) -> dict[str, dict[str, float]]:
    """Per slot that is the input of Linear/Conv calls: module -> fan_in * ||delta||^2 summed over those calls.

    Not for a slot in channel units (a batch norm's input that a layer also reads): the form assumes one error
    variance for all its elements."""
    by_storage = {record.storage: key for key, record in reference.slots.items() if record.channels is None}
    forms: dict[str, dict[str, float]] = {}
    for call in reference.layer_calls:
        key = by_storage.get(call.storage)
        if key is not None and call.delta_sq > 0:
            row = forms.setdefault(key, {})
            row[call.module] = row.get(call.module, 0.0) + call.fan_in * call.delta_sq
    return forms


class _Measurement:
    """A probe's perturbed replays: each measured slot's sensitivity, closed forms confirmed in groups.

    A slot that is only a Linear/Conv layer's input bends nothing but that layer's weight gradient: the
    layer's input gradient is computed from its weight, so the gradients flowing back (every Linear/Conv
    output gradient, ``delta``) stay exactly what they were. Slots of different layers can then be compressed
    in one replay and each layer's deviation compared with what its own slots' closed forms predict, and the
    first probe of a CNN needs one replay for all its Linear/Conv inputs instead of one each. A group confirms
    all its closed forms when every ``delta`` norm is unchanged (no slot of it bent the backward flow: a slot
    that another op also reads, like a tanh output, would), no module outside the group's moved more than
    ``_agrees`` allows one slot, and every module's deviation agrees with its prediction within
    CLOSED_FORM_TOLERANCE. Otherwise each of its slots is measured alone, as every slot without a closed form is:
    one replay more than measuring them alone from the start. (Splitting a failed group in halves cost more than
    that on the particle transformer, where several Linear inputs bend the flow a little: 65 replays for 55
    slots, against 57 this way and 56 one slot each.)
    """

    def __init__(self, replayer: Replayer, reference: Replay, closed: Mapping[str, dict[str, float]]):
        self.replayer, self.reference, self.closed = replayer, reference, closed
        self.replays = 0
        #: slot -> (its sensitivity per module, the closed form's calibration or None where it does not hold)
        self.results: dict[str, tuple[dict[str, float], float | None]] = {}

    def each(self, keys: list[str]) -> None:
        """Measure each of ``keys``: those with a closed form in one replay (:meth:`together`), the rest alone."""
        self.together([key for key in keys if key in self.closed])
        for key in keys:
            if key not in self.closed:
                self.together([key])

    def together(self, keys: list[str]) -> None:
        """Measure ``keys`` in one replay, or each alone where their closed forms do not all hold."""
        if not keys:
            return
        self.replays += 1
        policy = self._perturbing(keys)
        if len(keys) == 1:
            self._alone(keys[0], self._run(policy))
            return
        perturbed = self._run(policy, layer_calls=True)
        calibrations = self._confirmed(keys, perturbed) if _same_flow(perturbed, self.reference) else None
        if calibrations is None:
            for key in keys:
                self.together([key])
            return
        for key, calibration in calibrations.items():
            self.results[key] = ({m: calibration * v for m, v in self.closed[key].items()}, calibration)

    def without_effect(self, keys: list[str]) -> None:
        """Slots expected to have no effect, compressed together at their trial bounds in one replay: if no
        gradient moves, none has an effect (and their bounds may grow). Else the ones whose module call got no
        gradient (:func:`_silent`) are tried together again, where they are not all of them, and the rest are
        measured as :meth:`each` measures.

        They are the slots of such calls never measured, and those whose last measurement moved no gradient: a
        ReLU output that only its own backward reads (as a sign), or a tensor behind a batch norm whose weight is
        0, as a residual branch starts. Without a fresh measurement a bound without effect grows GROWTH-fold
        every probe up to ``max_rel``, and would stay there after the branch came alive."""
        if not keys:
            return
        self.replays += 1
        if not self._run(self._perturbing(keys)).deviation:
            self.results.update((key, ({}, None)) for key in keys)
            return
        silent = _silent(keys, self.reference, self.closed)
        if len(silent) < len(keys):
            self.without_effect(silent)
        self.each([key for key in keys if key not in self.results])

    def _run(self, policy: RecordingPolicy, layer_calls: bool = False) -> Replay:
        """A perturbing replay, its gradients compared with the reference's (``Replay.deviation``)."""
        return self.replayer.run(policy, layer_calls=layer_calls, against=self.reference)

    def _perturbing(self, keys: list[str]) -> RecordingPolicy:
        """A replay's policy that compresses ``keys`` with sz at their trial bounds, the rest as the reference does.

        Where the reference compressed a slot with that very codec (a reference replay, at a probe that measures
        a slot again at its bound in effect), the slot is perturbed at :data:`OFFSET_BOUND` times the bound
        instead: a perturbation must differ from what the reference holds, and sz on grids of incommensurate steps
        errs almost independently (the error that counts is measured: ``Replay.perturbation_mse``)."""
        perturb = {}
        for key in keys:
            record = self.reference.slots[key]
            config = slot_codec(sz_abs(record.trial_bound), record)
            if config == self.replayer.compressed.get(key):
                config = slot_codec(sz_abs(record.trial_bound * OFFSET_BOUND), record)
            perturb[key] = config
        return RecordingPolicy(perturb=perturb)

    def _alone(self, key: str, perturbed: Replay) -> None:
        mse = self._error(key, perturbed)
        measured = {m: dev / mse for m, dev in perturbed.deviation.items()}
        closed = self.closed.get(key)
        if closed is not None and _agrees(closed, measured):
            calibration = sum(measured.values()) / sum(closed.values())
            self.results[key] = ({m: calibration * v for m, v in closed.items()}, calibration)
        else:
            self.results[key] = (measured, None)

    def _error(self, key: str, perturbed: Replay) -> float:
        """The mean square of the error ``perturbed`` gave slot ``key`` against the reference: measured by the
        replay where the reference compressed the slot, else the slot's trial error."""
        return perturbed.perturbation_mse.get(key, self.reference.slots[key].trial_mse)

    def _confirmed(self, keys: list[str], perturbed: Replay) -> dict[str, float] | None:
        """Each slot's calibration when every module's deviation agrees with what the group's closed forms
        predict (each slot's share of a module's ratio by its predicted part); None when one does not.

        Deviation outside the group's modules is allowed up to 0.1 of the smallest slot's predicted effect, so
        that any one slot would also have passed ``_agrees`` alone."""
        deviation = perturbed.deviation
        parts = {key: {m: s * self._error(key, perturbed) for m, s in self.closed[key].items()} for key in keys}
        predicted: dict[str, float] = {}
        for part in parts.values():
            for module, value in part.items():
                predicted[module] = predicted.get(module, 0.0) + value
        outside = sum(value for module, value in deviation.items() if module not in predicted)
        if outside > 0.1 * min(sum(part.values()) for part in parts.values()):
            return None
        ratio = {module: deviation.get(module, 0.0) / value for module, value in predicted.items() if value > 0}
        if not all(1 / CLOSED_FORM_TOLERANCE <= r <= CLOSED_FORM_TOLERANCE for r in ratio.values()):
            return None
        return {key: sum(ratio[m] * v for m, v in part.items()) / sum(part.values()) for key, part in parts.items()}


def _same_flow(perturbed: Replay, reference: Replay) -> bool:
    """Whether every Linear/Conv call's output gradient kept its norm (the group bent no backward flow)."""
    if len(perturbed.layer_calls) != len(reference.layer_calls):
        return False
    return all(abs(got.delta_sq - want.delta_sq) <= FLOW_TOLERANCE * want.delta_sq
               for got, want in zip(perturbed.layer_calls, reference.layer_calls))


def _agrees(closed: Mapping[str, float], measured: Mapping[str, float]) -> bool:
    """Whether a closed form and a measurement agree: same total within the tolerance, nothing outside its modules."""
    total, got = sum(closed.values()), sum(measured.values())
    outside = sum(value for module, value in measured.items() if module not in closed)
    return total > 0 and got > 0 and outside <= 0.1 * got and 1 / CLOSED_FORM_TOLERANCE <= got / total <= CLOSED_FORM_TOLERANCE


class ActnnController(AdaptiveController):
    """The ActNN baseline (Chen et al., 2021): 1, 2, 4 or 8 quant bits per slot, from the adaptive controller's
    measured sensitivities, under a byte budget of ``bits`` average bits per element of the compressed slots
    plus quant's headers and per-group statistics as measured (docs/adaptive.md, "The ActNN baseline").

    The probes are the adaptive controller's (sensitivities measured with sz, trial encodes restricted to quant);
    the allocation is its multiple-choice knapsack (:func:`budget.allocate`) over each slot's four quant points.
    Every slot that quant can encode is compressed (ActNN keeps none exact, and quantizes ReLU outputs too: the
    sign check of the adaptive controller does not apply); the others (smaller than the session's threshold,
    or with NaN/Inf) stay as they are, outside the budget.
    """

    sign_rule: ClassVar[bool] = False  # ActNN quantizes ReLU outputs too

    def __init__(self, options: ActnnOptions | None = None):
        self.actnn = options or ActnnOptions()
        if not min(QUANT_BITS) <= self.actnn.bits <= max(QUANT_BITS):
            raise PolicySpecError(f"actnn option bits is the average quant bits per element, between {min(QUANT_BITS)} "
                                  f"and {max(QUANT_BITS)}; got {self.actnn.bits!r}")
        super().__init__(AdaptiveOptions(probe_every=self.actnn.probe_every, reruns=self.actnn.reruns,
                                         probe_rel=self.actnn.probe_rel, codecs="quant", entropy="none",
                                         channels="none"))
        self.budget_bytes = 0.0

    def describe(self) -> str:
        bits = int(self.actnn.bits) if self.actnn.bits == int(self.actnn.bits) else self.actnn.bits
        return spec_from_config({"id": self.actnn.controller_id, **self.actnn.changed(), "bits": bits})

    def size_rels(self) -> tuple[float, ...]:
        return ()  # sz is no candidate: no ladder

    def _measures_sz_at_decision(self) -> bool:
        return False  # nor sz's bytes at a decided bound

    def bound_limits(self) -> None:
        return None  # a bit budget, not bounds, decides: every bit width is a choice

    def byte_budget(self) -> float:
        return self.budget_bytes

    def choices(self, grad_stats: Mapping[str, GradStat]) -> dict[str, list[budget.Choice]]:
        """Each slot quant encodes: its quant points at their measured bytes and error variance."""
        options = {}
        for key, slot in self.slots.items():
            weight = budget.error_weight(slot.sensitivity, self.reference(grad_stats))
            points = [budget.Choice(0.0, t["nbytes"], weight * t["mse"], t["codec"]) for t in slot.trials
                      if math.isfinite(t["nbytes"]) and math.isfinite(t["mse"])]
            if points:
                options[key] = budget.walk_order(points)
        return options

    def decide(self, grad_stats: Mapping[str, GradStat], samples: Mapping[str, KeptSample]) -> None:
        """The quant bits of least predicted error within ``bits`` per element (:func:`budget.allocate`)."""
        options = self.choices(grad_stats)
        for slot in self.slots.values():
            slot.bound, slot.codec = 0.0, None
        self.budget_bytes = sum(self._uniform_bytes(self.slots[key]) for key in options)
        for key, index in budget.allocate(options, self.budget_bytes).items():
            self.slots[key].codec = options[key][index].codec

    def _uniform_bytes(self, slot: Slot) -> float:
        """A slot's share of the budget: ``bits`` per element, plus the headers and statistics quant measured (the
        1-bit encode's bytes less its codes)."""
        one_bit = next(t["nbytes"] for t in slot.trials if t["codec"]["bits"] == 1)
        return one_bit + (self.actnn.bits - 1) * slot.numel / 8

    def predicted_bytes(self) -> float:
        """The packed bytes of the quantized slots (the budget's scope)."""
        return sum(slot.trial(slot.codec)["nbytes"] for slot in self.slots.values() if slot.codec is not None)


register_controller("adaptive", lambda options: AdaptiveController(AdaptiveOptions.parse(options)))
register_controller("actnn", lambda options: ActnnController(ActnnOptions.parse(options)))
