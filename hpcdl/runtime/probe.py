"""Measuring what a saved tensor's compression error does to the parameter gradients: the adaptive controller's probe.

A probe step of :class:`~hpcdl.runtime.adaptive.AdaptiveController` goes like this:

1. While the step's compressed forward runs, :class:`Capture` (entered by the session through
   ``Controller.watch``) keeps the model's call arguments, the random-number state they ran with, and, via
   tensor hooks, the gradient backward brings to each output. Nothing else is held.
2. Once the step's gradients are final, :func:`replay` runs the same forward again (same RNG state, so the same
   dropout masks; the model's buffers restored afterwards, so batch-norm running statistics move once) inside a
   session whose :class:`RecordingPolicy` names every saved tensor the way the training session's ``choose``
   calls meet them (:class:`SlotNames`), and backpropagates the captured output gradients with
   ``torch.autograd.grad`` (the parameters' ``.grad`` are left alone).

   * the *exact* replay keeps every tensor as it is and records, per slot, its size, range, zero count and the
     mean squared error of an ``sz`` abs trial encode at the slot's probe bound; and, per call of a Linear or
     Conv layer, which slot its input is and the squared norm of its output gradient (for the closed form); a
     batch norm's input is recorded in channel units (:func:`in_channel_units`), as the ``channels`` stage the
     controller compresses it through sees it;
   * in the adaptive controller's budget mode the exact replay also records each slot's packed ``sz`` bytes at
     a ladder of bounds (``size_rels``), and the bytes of everything saved (``Replay.held_bytes``);
   * with codec choice on (the controller's ``codecs`` family), the exact replay also trial-encodes each slot
     with the family's candidate codecs (:mod:`hpcdl.runtime.trials`: bytes, mean squared error) and keeps
     the sample it encoded (:class:`KeptSample`), on which the controller measures ``sz``'s bytes at the bound
     it decides, to compare them;
   * a *perturbed* replay compresses one slot with ``sz`` at its probe bound and keeps the rest exact; its
     gradients minus the exact ones are that slot's measured effect, per module. The check replay compresses
     every slot with the codec in effect. Compressing a saved tensor changes nothing in the forward, so these
     replays run no forward: each is a backward through the exact replay's graph, kept for them, with its slots
     compressed as the training session would compress them (:class:`Replayer`, ``Session.substituted``).

The exact replays hold their activations uncompressed (they measure against exact gradients). Where even the
fewest rows' would outweigh what the step held packed, the first replay is a reference compressed as the
training step was, and the perturbed replays measure against it (:class:`Replayer`). So that a probe does
not need the memory of a whole uncompressed step, the replays run on the first ``rows`` samples of the
captured batch where the call can be cut (:meth:`Capture.batch_rows`: every tensor argument and output
gradient shares its first dimension), and what they measure is scaled to the whole batch: packed sizes and
element counts of the tensors that carry the batch dimension by ``batch / rows``; gradient deviations and
output-gradient norms by the same factor, because a weight gradient's error from independent errors in
``rows`` samples is a sum of ``rows`` independent terms (the output gradients keep the whole batch's
``1 / batch`` scaling). See docs/adaptive.md.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields

import torch
from torch import nn

from hpcdl.compress import Codec
from hpcdl.compress.channels import channel_exponents, channel_units, with_channels
from hpcdl.compress.entropy import with_stage
from hpcdl.runtime.classify import Footprint, Layout
from hpcdl.runtime.observe import ROOT
from hpcdl.runtime.policy import Policy, SavedTensorInfo, StaticController
from hpcdl.runtime.recompute import buffers_kept
from hpcdl.runtime.session import Session, compressed
from hpcdl.runtime.trials import Trial, mean_square_error, sample, trials, whole_bytes

#: How far above the error variance a slot may be allowed (RecordingPolicy._error_limit) a candidate's error must
#: be before its less faithful kin are not tried: each rank measures its own batch, and they average.
LIMIT_MARGIN = 4.0

#: The fewest samples a probe's replays run on (:meth:`Capture.replay_rows`): a batch norm over pooled features
#: needs two.
MIN_REPLAY_ROWS = 2

#: Uncompressed bytes a probe's replays may always hold (:meth:`Capture.replay_rows`): fewer samples than
#: ``probe_rows`` measure sensitivities more noisily, which is worth it only where the replays' memory matters.
REPLAY_BYTES_FLOOR = 64 * 2**20

#: Layers whose saved input enters only their weight gradient, linearly: the closed form applies.
CLOSED_FORM_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


class SlotNames:
    """Names the saved floating tensors of one forward in the order the session meets them: ``module#k``.

    The training session and the probe's replay ask in the same order (same model, same inputs, same
    threshold), so a name means the same tensor in both.
    """

    def __init__(self) -> None:
        self.step: int | None = None
        self.counts: dict[str, int] = {}

    def next(self, module: str, step: int) -> str:
        if step != self.step:
            self.step, self.counts = step, {}
        index = self.counts.get(module, 0)
        self.counts[module] = index + 1
        return f"{module}#{index}"


def _first_rows(value, rows: int):
    """``value`` (a tensor or a nested tuple, list or dict of them) with every tensor cut to its first ``rows``."""
    if isinstance(value, torch.Tensor):
        return value[:rows]
    if isinstance(value, (tuple, list)):
        return type(value)(_first_rows(item, rows) for item in value)
    if isinstance(value, dict):
        return {key: _first_rows(item, rows) for key, item in value.items()}
    return value


def _tensors(value) -> list[torch.Tensor]:
    """The tensors in a (nested) tuple, list or dict output, in a fixed order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for key in sorted(value, key=str) for t in _tensors(value[key])]
    return []


class Capture:
    """What a probe needs from one training forward: the model, its call, its RNG state, its outputs' gradients."""

    def __init__(self, model: nn.Module, threshold: int):
        self.model, self.threshold = model, threshold
        self.args: tuple = ()
        self.kwargs: dict = {}
        self.rng: torch.Tensor | None = None
        self.cuda_rng: list[torch.Tensor] | None = None
        self.output_grads: dict[int, torch.Tensor] = {}
        self.called = False
        self.original_bytes = 0  # what the captured forward saved for backward, uncompressed (set as it closes)
        self.packed_bytes = 0    # ... and as its session held it, packed or kept
        self._handles: list = []

    def __enter__(self) -> Capture:
        self._handles = [self.model.register_forward_pre_hook(self._before, with_kwargs=True),
                         self.model.register_forward_hook(self._after)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _before(self, module, args, kwargs):
        if self.called:  # the model ran twice in one step: replay the first call only
            return
        self.args, self.kwargs, self.called = args, kwargs, True
        self.rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def _after(self, module, args, output):
        if self.output_grads or not self.called:
            return
        for index, tensor in enumerate(_tensors(output)):
            if tensor.requires_grad:
                tensor.register_hook(self._keep(index))

    def _keep(self, index: int):
        def hook(grad: torch.Tensor) -> None:
            self.output_grads[index] = grad.detach()
        return hook

    def batch_rows(self) -> int | None:
        """The captured call's batch size: the first dimension every tensor argument and output gradient shares,
        or None when they share none (the call cannot be cut into a sub-batch)."""
        tensors = [*_tensors(self.args), *_tensors(self.kwargs), *self.output_grads.values()]
        sizes = {int(t.shape[0]) if t.dim() else -1 for t in tensors}
        return sizes.pop() if len(sizes) == 1 and min(sizes) > 0 else None

    def replay_rows(self, most: int, memory: float) -> int | None:
        """The samples the replays run on: at most ``most``, and no more than keep their uncompressed saved
        tensors within ``memory`` times the bytes the captured step held packed (or :data:`REPLAY_BYTES_FLOOR`
        if more), so that a probe, which runs once the step's own packed tensors are freed, needs little more
        memory than the step did; never fewer than :data:`MIN_REPLAY_ROWS`. None: the call cannot be cut
        (:meth:`batch_rows`), and the replays run the whole batch."""
        batch = self.batch_rows()
        if batch is None:
            return None
        fitting = math.floor(batch * self._allowed(memory) / self.original_bytes) if self.original_bytes else batch
        return min(batch, max(MIN_REPLAY_ROWS, min(most, fitting)))

    def replay_fits(self, rows: int | None, memory: float) -> bool:
        """Whether replays of ``rows`` samples (None: the whole call) keep their uncompressed saved tensors within
        the allowance of :meth:`replay_rows`. Where they do not (even :data:`MIN_REPLAY_ROWS` samples outweigh
        the step's packed bytes, or the call cannot be cut), the probe does not keep the exact replay's graph for
        the replays after it (:class:`Replayer`): each replay then frees its saved tensors as its backward goes,
        as a training step does, at the price of its own forward, and a probe step needs no more memory than an
        uncompressed step of ``rows`` samples."""
        batch = self.batch_rows()
        share = min(rows, batch) / batch if rows and batch else 1.0
        return self.original_bytes * share <= self._allowed(memory)

    def _allowed(self, memory: float) -> float:
        """The uncompressed bytes a probe's replays may hold: ``memory`` times the step's packed bytes, at least
        :data:`REPLAY_BYTES_FLOOR`."""
        return max(memory * self.packed_bytes, REPLAY_BYTES_FLOOR)

    @property
    def complete(self) -> bool:
        """Whether the forward ran and backward reached at least one output."""
        return self.called and bool(self.output_grads)


@dataclass
class SlotRecord:
    """One saved floating tensor as the exact replay met it."""

    numel: int
    value_range: float
    nonzero: int
    trial_bound: float = 0.0
    trial_mse: float = 0.0  # mean squared error of an sz abs encode at trial_bound
    storage: tuple = ()
    nbytes: int = 0         # the tensor's bytes as autograd would hold it
    sizes: list[float] = field(default_factory=list)  # sz abs packed bytes at each of the policy's size_rels
    trials: list[Trial] = field(default_factory=list)  # the candidate codecs' trial encodes
    channels: int | None = None  # a batch norm's input: the encoded tensor's channel dim; then every number above
                                 # but numel, nonzero and nbytes is of the tensor in channel units (in_channel_units)
    sample: KeptSample | None = None  # what the trial encodes encoded, where the policy keeps it (keep_samples)
    call: int = 0  # which call of its module saved it first (its index among the module's calls in the forward)


@dataclass
class KeptSample:
    """A slot's sample as the exact replay trial-encoded it (:func:`~hpcdl.runtime.trials.sample`), kept past the
    replay so that a codec's bytes can be measured on it later: sz's at the bound a probe decides.

    Where the replay keeps its graph, which holds the slot's tensor anyway, the sample is not copied: ``of`` is
    that tensor (sharing its storage) and the sample is taken from it again when needed, the same chunks. A
    replay whose graph is not kept after all copies it out (:meth:`copied`)."""

    part: torch.Tensor | None  # the sample, or None: taken from ``of`` when needed
    source: torch.Tensor  # the slot's tensor the sample is of, as a meta tensor (its shape: whole_bytes)
    factor: float = 1.0   # what a sub-batch replay's bytes are multiplied by (SlotRecord's numbers are)
    of: torch.Tensor | None = None  # the slot's tensor itself, where a kept graph holds it

    def sample(self) -> torch.Tensor:
        """The sample: kept, or taken from the slot's tensor."""
        if self.part is not None:
            return self.part
        assert self.of is not None
        return sample(self.of)

    def copied(self) -> None:
        """Keep the sample itself instead of the slot's tensor."""
        self.part, self.of = self.sample(), None

    def packed_bytes(self, codec: Codec) -> float:
        """``codec``'s packed bytes of the slot's tensor, from an encode of the sample, as a trial's."""
        part = self.sample()
        return whole_bytes(codec.encode(part), self.source, part) * self.factor


@dataclass
class LayerCall:
    """One call of a Linear/Conv layer in the exact replay: its input's storage and its output gradient's norm^2."""

    module: str
    fan_in: int
    storage: tuple
    delta_sq: float = 0.0


@dataclass
class Replay:
    """What one replay gives: the parameters' gradients, or per module their squared deviation from another
    replay's (``Replayer.run(against=...)``); what it met."""

    grads: list[torch.Tensor | None]  # per parameter of Replayer.params; [] for a replay run against another
    slots: dict[str, SlotRecord] = field(default_factory=dict)
    layer_calls: list[LayerCall] = field(default_factory=list)
    held_bytes: float = 0.0  # the uncompressed bytes of everything the replay saved, every saved tensor once
    scale: float = 1.0  # whole batch / replayed rows: what the gradient deviations are multiplied by
    # the module calls (module, index of its call) some output of which backward brought a nonzero gradient, where
    # the replay recorded them (the exact one: Replayer.run's live_calls); None: not recorded
    live_calls: set[tuple[str, int]] | None = None
    # a perturbing replay after a reference one: per perturbed slot the reference compressed, the mean square of
    # its error against the reference (RecordingPolicy.perturbation_mse); other slots' is their trial_mse
    perturbation_mse: dict[str, float] = field(default_factory=dict)
    # a replay run against another: per module (Replayer.owners), ||its gradient - the other's||^2 scaled to the
    # whole batch, for the modules where it is not zero (empty for a replay not run against another)
    deviation: dict[str, float] = field(default_factory=dict)


def parameter_owners(model: nn.Module, params: list[nn.Parameter]) -> list[str]:
    """The module name (as gradient statistics name it) owning each of ``params``."""
    owner = {id(p): name or ROOT for name, module in model.named_modules() for p in module.parameters(recurse=False)}
    return [owner[id(p)] for p in params]


def squared_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    """``||got - want||^2`` of two gradients, summed in float64 with one temporary the size of ``got``."""
    return float(torch.sub(got, want).square_().sum(dtype=torch.float64))


def in_channel_units(tensor: torch.Tensor, channels: int) -> torch.Tensor:
    """What the ``channels`` stage hands its inner codec for ``tensor``: the source the session encodes, each channel
    scaled by its power of two (:func:`hpcdl.compress.channels.channel_units`)."""
    return channel_units(Layout.of(Footprint.of(tensor)).source(tensor.detach()), channels)[0]


def slot_codec(config: dict, record: SlotRecord) -> dict:
    """``config`` as it applies to the slot ``record`` describes: per channel for a batch norm's input."""
    return with_channels(config, record.channels)


def _storage_of(tensor: torch.Tensor) -> tuple:
    return (tensor.device, tensor.untyped_storage().data_ptr(), tensor._version)


def sz_abs(bound: float) -> dict:
    """The codec config the adaptive controller uses: ``sz`` with an absolute bound."""
    return {"id": "sz", "mode": "abs", "bound": bound}


@dataclass(frozen=True)
class SlotInfo(SavedTensorInfo):
    """A saved activation as a replay's policy is asked about it, with its slot's name."""

    slot: str = ""


class RecordingPolicy(Policy):
    """The replay's policy: names each slot as training does; records it (exact replay) or compresses one slot."""

    def __init__(self, trial_bounds: dict[str, float] | None = None, probe_rel: float = 1e-2,
                 perturb: dict[str, dict] | None = None, size_rels: tuple[float, ...] = (),
                 candidates: tuple[dict, ...] = (), threshold: int = 0, whole_numel: dict[str, int] | None = None,
                 entropy: str = "none", per_channel: bool = True, sign_rule: bool = True,
                 bare: set[str] | None = None, bound_limits: dict[str, float] | None = None, growth: float = 2.0,
                 keep_samples: bool = False, in_effect: Callable[[str, SlotRecord], dict | None] | None = None):
        super().__init__(StaticController(None), masks=None, indices=None)
        self.entropy = entropy  # the entropy stage training adds to every codec: sizes and trials measure with it
        self.per_channel = per_channel  # exact replay: batch norms' inputs are recorded in channel units
        self.sign_rule = sign_rule  # the controller refuses codecs that move values across zero: do not try them
        self.bare = bare or set()  # exact replay: slots recorded without trial encodes (kept as they are anyway)
        # exact replay: the largest bound the decision may give each slot before it is measured again (at least
        # growth times its trial bound, which it may be measured at now), from which a candidate's error rules
        # out its less faithful kin (trials.trials); None: every candidate is tried
        self.bound_limits, self.growth = bound_limits, growth
        self.names = SlotNames()
        self.trial_bounds, self.probe_rel = trial_bounds, probe_rel
        self.size_rels = size_rels  # exact replay: also the packed size at these fractions of each slot's range
        self.keep_samples = keep_samples  # exact replay: keep each slot's sample in its record (SlotRecord.sample)
        self.graph_kept = False  # set by the Replayer: this replay's graph is to be kept (it holds the slots' tensors)
        self.candidates, self.threshold = candidates, threshold  # exact replay: trial encodes of these codecs
        self.perturb = perturb or {}  # slot -> the codec config it is compressed with (the rest kept exact)
        # reference replay (where an exact one does not fit): slot, its record -> the codec the training session
        # compresses it with now (None: kept), which the replay compresses it with too; None: an exact replay
        self.in_effect = in_effect
        # slot -> the codec config it is compressed with where not perturbed: a reference replay's (chosen from
        # in_effect), or, in a perturbing replay after one, the reference's (set by the Replayer)
        self.compressed: dict[str, dict] = {}
        # perturbing replay after a reference: a perturbed slot the reference compressed -> the mean square of
        # the difference of the two codecs' decoded values (its error against the reference), measured
        self.perturbation_mse: dict[str, float] = {}
        self.slots: dict[str, SlotRecord] = {}
        self.whole_numel = whole_numel or {}  # slot -> its element count in the training step (of the whole batch)
        self.rows, self.scale = 0, 1.0  # set by the Replayer: replayed samples (0: all), whole batch / rows
        self.started: dict[str, int] = {}  # set by the Replayer: per module, the calls its forward has begun
        self._key = ""

    def counted_bytes(self, tensor: torch.Tensor, nbytes: int) -> int:
        """A tensor of the replayed sub-batch (its first dimension a multiple of the replayed rows) counts at
        the whole batch's size, so that the replay keeps, shares and names tensors as the training step did."""
        if self.rows and tensor.dim() and tensor.shape[0] % self.rows == 0:
            return round(nbytes * self.scale)
        return nbytes

    def info(self, module: str, kind: str, tensor: torch.Tensor, window: dict | None = None,
             channels: int | None = None) -> SavedTensorInfo:
        info = super().info(module, kind, tensor, window, channels)
        if kind != "activation":
            return info
        self._key = self.names.next(module, self.step)
        if self.trial_bounds is not None:
            record = self.slots[self._key] = self._record(tensor, self.trial_bounds.get(self._key),
                                                          channels if self.per_channel else None)
            record.call = self.started.get(module, 1) - 1
            if self.in_effect is not None and not self._small(tensor):
                config = self.in_effect(self._key, record)
                if config is not None:
                    self.compressed[self._key] = config
        elif self._key in self.perturb and self._key in self.compressed:
            self.perturbation_mse[self._key] = self._difference(tensor, self.compressed[self._key],
                                                                self.perturb[self._key])
        return SlotInfo(**{f.name: getattr(info, f.name) for f in fields(info)}, slot=self._key)

    def codec_for(self, info: SavedTensorInfo):
        if not isinstance(info, SlotInfo):
            return None
        config = self.perturb.get(info.slot) or self.compressed.get(info.slot)
        return None if config is None else self.codec(config)

    def _difference(self, tensor: torch.Tensor, reference: dict, perturbed: dict) -> float:
        """The mean square of ``perturbed``'s decoded ``tensor`` minus ``reference``'s (codec configs), in the units
        of the tensor's channels where ``perturbed`` bounds it per channel (as the slot's trial error is then)."""
        source = Layout.of(Footprint.of(tensor)).source(tensor.detach())
        reference_codec, perturbed_codec = self.codec(reference), self.codec(perturbed)
        squares = perturbed_codec.decode(perturbed_codec.encode(source))
        squares.sub_(reference_codec.decode(reference_codec.encode(source))).square_()  # one more slot-sized tensor
        channels = perturbed.get("channels")
        if channels is None:
            return float(squares.mean(dtype=torch.float64))
        weights = torch.ldexp(torch.ones((), dtype=torch.float64), -2 * channel_exponents(source, channels).double())
        per_channel = squares.sum([dim for dim in range(squares.dim()) if dim != channels], dtype=torch.float64)
        return float((per_channel * weights).sum() / squares.numel())

    def _small(self, tensor: torch.Tensor) -> bool:
        """Whether the session takes ``tensor`` for one under its size threshold: a reference replay keeps those as
        they are, since the session would pack them together in arenas with a member codec of its own, whose error
        :meth:`_difference` does not measure. Its element bytes, not its storage span's: a view whose span is
        larger is taken for small and kept, never the reverse."""
        return self.counted_bytes(tensor, tensor.numel() * tensor.element_size()) < self.threshold

    def _record(self, tensor: torch.Tensor, bound: float | None, channels: int | None = None) -> SlotRecord:
        data = tensor.detach() if channels is None else in_channel_units(tensor, channels)
        finite = data[torch.isfinite(data)] if not bool(torch.isfinite(data).all()) else data
        low, high = (finite.aminmax() if finite.numel() else (torch.zeros(()), torch.zeros(())))
        record = SlotRecord(numel=data.numel(), value_range=float(high - low), nonzero=int(torch.count_nonzero(data)),
                            storage=_storage_of(tensor), nbytes=data.numel() * data.element_size(),
                            channels=channels)
        record.trial_bound = bound if bound else record.value_range * self.probe_rel
        if self._key not in self.bare:
            # the tensor the graph saved, contiguous, shares its storage with what the trials encode
            self._trial_encodes(record, data.contiguous(), held=channels is None and tensor.is_contiguous())
        if self.rows and self.whole_numel.get(self._key, record.numel) != record.numel:
            factor = self.whole_numel[self._key] / record.numel  # a sub-batch of a tensor of the whole batch
            record.numel, record.nbytes = round(record.numel * factor), round(record.nbytes * factor)
            record.nonzero = round(record.nonzero * factor)
            record.sizes = [size * factor for size in record.sizes]
            for candidate in record.trials:
                candidate.nbytes *= factor
            if record.sample is not None:
                record.sample.factor = factor
        return record

    def _trial_encodes(self, record: SlotRecord, source: torch.Tensor, held: bool = False) -> None:
        """What the exact replay encodes ``source`` (a slot's contiguous tensor) with, on its sample
        (:func:`~hpcdl.runtime.trials.sample`): sz at the trial bound (its error), sz at the ladder of
        ``size_rels`` (bytes), every candidate codec (bytes, error, sign rule). The sample is kept where
        ``keep_samples`` says: as ``source`` itself where ``held`` (it shares the saved tensor's storage) and the
        graph is kept, which holds that anyway."""
        part = sample(source)
        if self.keep_samples and record.value_range > 0:
            shape = torch.empty(source.shape, device="meta")
            by_reference = held and self.graph_kept and part.numel() < source.numel()
            record.sample = KeptSample(None, shape, of=source) if by_reference else KeptSample(part, shape)
        if record.trial_bound > 0:
            codec = self.codec(sz_abs(record.trial_bound))
            record.trial_mse = mean_square_error(part, codec.decode(codec.encode(part)))
        if record.value_range > 0:
            record.sizes = [whole_bytes(self.codec(with_stage(sz_abs(rel * record.value_range), self.entropy))
                                        .encode(part), source, part) for rel in self.size_rels]
        has_zeros = self.sign_rule and record.nonzero < record.numel
        # the session's threshold applies to the training step's tensor, of which a sub-batch replay has a part
        threshold = self.threshold * record.numel / max(self.whole_numel.get(self._key, record.numel), 1)
        record.trials = trials(self.candidates, source, self.codec, threshold, self.entropy, has_zeros,
                               self._error_limit(record))

    def _error_limit(self, record: SlotRecord) -> float:
        """The most error variance the slot's decision may allow at this probe: sz's measured error at the trial
        bound scaled to the largest bound it may get, with :data:`LIMIT_MARGIN` to spare (other ranks measure
        their own batches); infinite where not known."""
        if self.bound_limits is None or record.trial_bound <= 0:
            return math.inf
        largest = max(self.bound_limits.get(self._key, 0.0), self.growth * record.trial_bound)
        return LIMIT_MARGIN * record.trial_mse * (largest / record.trial_bound) ** 2


class _Backward:
    """Where each backward through a replayed forward's graph records its Linear/Conv output gradients' squared
    norms: ``calls`` (a list like the forward's, one LayerCall per call), and the module calls some output of which
    got a nonzero gradient: ``live`` (module, index of its call); nowhere while they are None."""

    def __init__(self, calls: list[LayerCall] | None, live: set[tuple[str, int]] | None = None):
        self.calls, self.live = calls, live


@contextlib.contextmanager
def _module_calls(model: nn.Module, calls: list[LayerCall], backward: _Backward,
                 started: dict[str, int]) -> Iterator[None]:
    """Record each Linear/Conv call's input storage in ``calls``, and in every backward through the graph its
    output gradient's squared norm, and which module calls' outputs got a nonzero gradient, where ``backward``
    says; count in ``started`` the calls each module's forward has begun."""
    handles = []
    running: dict[int, list[int]] = {}  # id(module) -> the indices of its calls in progress (in started's count)
    layer_call: dict[int, int] = {}  # id(module) -> the index in ``calls`` of its Linear/Conv call in progress

    def watcher(name: str, fan_in: int | None):
        def before(module, args):
            running.setdefault(id(module), []).append(started.get(name, 0))
            started[name] = started.get(name, 0) + 1
            if fan_in is not None and args and isinstance(args[0], torch.Tensor):
                layer_call[id(module)] = len(calls)
                calls.append(LayerCall(name, fan_in, _storage_of(args[0])))

        def after(module, args, output):
            call = (name, running[id(module)].pop())
            for tensor in _tensors(output) if backward.live is not None else ():
                if tensor.requires_grad:
                    tensor.register_hook(lambda grad: _mark_live(backward.live, call, grad))
            index = layer_call.pop(id(module), None)
            if index is not None and isinstance(output, torch.Tensor) and output.requires_grad:
                def grad_norm(grad: torch.Tensor) -> None:
                    if backward.calls is not None:
                        backward.calls[index].delta_sq += float(grad.double().square().sum())
                output.register_hook(grad_norm)
        return before, after

    for name, module in model.named_modules():
        fan_in = module.weight[0].numel() if isinstance(module, CLOSED_FORM_LAYERS) else None
        before, after = watcher(name or ROOT, fan_in)
        handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _mark_live(live: set[tuple[str, int]] | None, call: tuple[str, int], grad: torch.Tensor) -> None:
    """Add ``call`` (module, call index) to ``live`` (where it is recorded) when ``grad``, the gradient of one of
    its outputs, is not all zero."""
    if live is not None and call not in live and bool(grad.any()):
        live.add(call)


@dataclass
class _Graph:
    """The exact replay's forward, kept for more backward passes (:meth:`Replayer.run`)."""

    session: Session
    pairs: list[tuple[torch.Tensor, torch.Tensor]]  # the outputs and the captured gradients backward starts from
    calls: list[LayerCall]  # its Linear/Conv calls (their delta_sq: the exact backward's)
    backward: _Backward
    held_bytes: float


class Replayer:
    """Runs a captured forward again under a given policy, leaving the model's buffers and the RNG as they were.

    The exact replay's graph may be kept (``run(..., keep=True)``): a perturbed replay then runs only a backward
    through it, with its slots compressed as its policy says (:meth:`Session.substituted`), since compressing a
    saved tensor changes nothing in the forward (the same inputs, RNG state and so dropout masks: the same
    values). That skips the forward of every replay after the first. The graph holds the exact forward's saved
    tensors until the probe ends (:meth:`restored`), also through its backward passes, which otherwise free
    them as they go; the adaptive controller keeps it where that fits its memory allowance
    (:meth:`Capture.replay_fits`). A forward with blocks recomputed in backward (:meth:`Session.recompute`: they
    run once) is not kept: each replay then runs whole.

    Where the exact replay's uncompressed saved tensors do not fit, the first replay is a *reference* instead,
    which compresses every slot as the training step does (``RecordingPolicy.in_effect``): each replay then runs
    whole (a forward and a backward that frees as it goes, as a compressed training step), compressing what the
    reference compressed but for the slots it perturbs, which it encodes from their values with the perturbing
    codec. A perturbed slot's error against the reference is then the difference of the two codecs' errors,
    whose mean square the replay measures (``Replay.perturbation_mse``) for the sensitivity to divide by. (Not
    through a kept compressed graph: re-encoding a slot's decoded values with sz at the bound they were
    decoded at changes nothing.)
    """

    def __init__(self, capture: Capture, rows: int | None = None):
        """``rows``: replay only that many samples of the batch, where the call can be cut and has more."""
        self.capture = capture
        self.model = capture.model
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.owners = parameter_owners(self.model, self.params)
        batch = capture.batch_rows()
        self.scale = 1.0  # whole batch / replayed rows: what the gradient deviations are multiplied by
        self.rows = 0  # the replayed samples when they are part of the batch
        self.args, self.kwargs, self.output_grads = capture.args, capture.kwargs, capture.output_grads
        if rows and batch and rows < batch:
            self.scale, self.rows = batch / rows, rows
            self.args, self.kwargs = _first_rows(capture.args, rows), _first_rows(capture.kwargs, rows)
            self.output_grads = {index: grad[:rows] for index, grad in capture.output_grads.items()}
        self._graph: _Graph | None = None
        #: a reference replay's compressed slots and their codec configs (RecordingPolicy.in_effect), which the
        #: replays after it compress too, but the slots they perturb
        self.compressed: dict[str, dict] = {}

    @contextlib.contextmanager
    def restored(self) -> Iterator[None]:
        """Around all replays of one probe: the buffers and RNG state of now come back afterwards."""
        rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        try:
            with buffers_kept(self.model):
                yield
        finally:
            self._graph = None  # its saved tensors go
            torch.set_rng_state(rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)

    def run(self, policy: RecordingPolicy, layer_calls: bool = False, keep: bool = False,
            live_calls: bool = False, against: Replay | None = None) -> Replay:
        """One replay under ``policy``; ``layer_calls``: record its Linear/Conv calls (:class:`LayerCall`);
        ``keep``: keep its graph for the replays after it (the exact one's: see the class); ``live_calls``:
        record which module calls' outputs its backward brings a nonzero gradient (``Replay.live_calls``);
        ``against``: compare its gradients with that replay's as they come (``Replay.deviation``;
        :meth:`_gradients`) instead of returning them."""
        if self._graph is not None:
            return self._backward_again(policy, layer_calls, against)
        capture = self.capture
        assert capture.rng is not None  # set by the captured forward (Capture.complete)
        torch.set_rng_state(capture.rng)
        if capture.cuda_rng is not None:
            torch.cuda.set_rng_state_all(capture.cuda_rng)
        calls: list[LayerCall] = []
        backward = _Backward(calls if layer_calls else None, set() if live_calls else None)
        policy.started = {}
        watching = (_module_calls(self.model, calls, backward, policy.started) if keep or layer_calls or live_calls
                    else contextlib.nullcontext())
        policy.rows, policy.scale, policy.graph_kept = self.rows, self.scale, keep
        if policy.trial_bounds is None:  # a perturbing replay
            policy.compressed = dict(self.compressed)
        with torch.enable_grad(), watching:
            with compressed(self.model, policy, threshold=capture.threshold) as session:
                outputs = _tensors(self.model(*self.args, **self.kwargs))
            pairs = [(outputs[i], g) for i, g in sorted(self.output_grads.items()) if i < len(outputs)]
            keep = policy.graph_kept = keep and not session.recomputed_blocks
            if not keep:  # no graph will hold the slots' tensors: their samples are copied out
                for record in policy.slots.values():
                    if record.sample is not None and record.sample.of is not None:
                        record.sample.copied()
            grads, deviation = self._gradients(pairs, keep, against)
        held = session.stats.original_bytes * self.scale
        live, backward.live = backward.live, None  # the kept graph's later backward passes record none
        if keep:
            self._graph = _Graph(session, pairs, calls, backward, held)
        if policy.trial_bounds is not None:
            self.compressed = dict(policy.compressed)
        return Replay(grads, policy.slots, self._scaled(backward.calls), held, self.scale, live,
                      dict(policy.perturbation_mse), deviation)

    def _backward_again(self, policy: RecordingPolicy, layer_calls: bool, against: Replay | None) -> Replay:
        """A replay as a backward through the kept graph, the slots ``policy`` perturbs compressed."""
        graph = self._graph
        assert graph is not None and policy.trial_bounds is None  # a perturbing policy: nothing to record in a forward
        graph.backward.calls = [LayerCall(c.module, c.fan_in, c.storage) for c in graph.calls] if layer_calls else None
        try:
            with graph.session.substituted(policy.codec_for):
                grads, deviation = self._gradients(graph.pairs, True, against)
            recorded = self._scaled(graph.backward.calls)
        finally:
            graph.backward.calls = None
        return Replay(grads, {}, recorded, graph.held_bytes, self.scale, deviation=deviation)

    def _gradients(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], retain_graph: bool,
                   against: Replay | None) -> tuple[list[torch.Tensor | None], dict[str, float]]:
        """Backward from ``pairs`` (outputs, their captured gradients) to the parameters: their gradients, or with
        ``against`` none and per module the squared deviation from ``against``'s gradients.

        Against a replay, each parameter's gradient is compared in a hook as backward produces it, and
        ``autograd.grad`` is handed a zero-stride placeholder instead, so a replay never holds a whole set of
        gradients beside the reference's and the training step's own (at DeepCAM's full width a set is 154 MiB).
        The per-parameter values are summed per module in parameter order, whatever order backward took."""
        outputs, grad_outputs = [o for o, _ in pairs], [g for _, g in pairs]
        if against is None:
            return list(torch.autograd.grad(outputs, self.params, grad_outputs, allow_unused=True,
                                            retain_graph=retain_graph)), {}
        squares: list[float] = [0.0] * len(self.params)

        def compared(index: int, want: torch.Tensor | None):
            def hook(grad: torch.Tensor) -> torch.Tensor:
                if want is not None:
                    squares[index] = squared_difference(grad, want) * self.scale
                return grad.new_zeros(()).expand_as(grad)
            return hook

        handles = [param.register_hook(compared(index, want))
                   for index, (param, want) in enumerate(zip(self.params, against.grads))]
        try:
            torch.autograd.grad(outputs, self.params, grad_outputs, allow_unused=True, retain_graph=retain_graph)
        finally:
            for handle in handles:
                handle.remove()
        deviation: dict[str, float] = {}
        for owner, value in zip(self.owners, squares):
            if value > 0:
                deviation[owner] = deviation.get(owner, 0.0) + value
        return [], deviation

    def _scaled(self, calls: list[LayerCall] | None) -> list[LayerCall]:
        """``calls`` with their output gradients' norms scaled to the whole batch (none: [])."""
        for call in calls or []:
            call.delta_sq *= self.scale
        return calls or []
