"""Which codec each saved tensor gets: :class:`Policy`, the :class:`Controller` interface, and method specs.

A :class:`Policy` routes by what a saved tensor is. Boolean tensors (dropout
masks) go to the exact ``bitmask`` codec and integer tensors to the exact ``int``
codec (the indices of an ``nn.MaxPool1d/2d/3d`` to ``window``, which stores each
as its tap inside the pooling window), because a lossy mask or index would change
which elements backward touches. Floating tensors ("activations") go to
whatever the policy's :class:`Controller` chooses.

A controller is the seam for adaptive compression: it is asked once per saved
floating tensor with a :class:`SavedTensorInfo` (module name, kind, shape,
dtype, step, and the gradient statistics of the previous step) and returns a
codec config, or ``None`` to keep the tensor as it is. :meth:`Policy.static`
and :meth:`Policy.per_module` are the two built-in controllers;
``Policy(MyController())`` plugs in another one.

Method specs are the short strings that the trainer, the study and the command
line use to name a policy: ``"sz:rel=1e-2"``, ``"quant:bits=2,group_size=256"``,
``"cast:bf16"``, ``"raw"``. :func:`policy_from_spec` parses one and
:func:`spec_from_config` writes one back.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

import torch

from hpcdl.compress import ERROR_BOUND_MODES, FLOAT_DTYPES, Codec, get_codec
from hpcdl.errors import HpcdlError
from hpcdl.runtime.ranks import Ranks, default_ranks


class PolicySpecError(HpcdlError, ValueError):
    """A method spec or codec config a policy cannot use; the message shows the accepted form."""


#: The policy hpcdl compresses with when none is named: the shipped configs, the demo and the README use it
#: (through :meth:`Policy.default`, :func:`default_codec_config` and the config schema). Chosen by issue 13's
#: rule, the best compression ratio that keeps the gradient cosine >= 0.99 on the issue's two reproductions
#: and on every model of the zoo at its full input size; the measurement is docs/results/gradients/.
DEFAULT_POLICY_SPEC = "sz:rel=1e-3"

MASK_CODEC = {"id": "bitmask"}
INDEX_CODEC = {"id": "int"}


@dataclass(frozen=True)
class GradStat:
    """Statistics of one module's parameter gradients after a backward pass."""

    norm: float
    max_abs: float
    numel: int


@dataclass(frozen=True)
class SavedTensorInfo:
    """What a controller may look at when it chooses a codec for one saved tensor."""

    module: str
    kind: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    step: int
    grad_stats: Mapping[str, GradStat] = field(default_factory=dict)
    window: dict | None = None  # an index saved by a max pool: the ``window`` codec config of its geometry
    channels: int | None = None  # a batch norm's saved input: the dim of the encoded tensor that indexes channels


class Controller(ABC):
    """Chooses the codec of each saved floating tensor; implement this for an adaptive policy.

    ``choose`` runs inside autograd's pack hook, once per saved floating tensor
    above the session's size threshold and once per smaller one saved inside the
    model's forward (those join the session's arenas), so keep it cheap.

    Gradient statistics cost a pass over every gradient and a copy to the host,
    so they are read only for a controller that asks: when ``wants_gradients(step)``
    is True, the training step calls :meth:`Policy.record_gradients` once the
    distributed backend has finished reducing the gradients (so every rank sees
    the same, averaged statistics), and ``observe`` gets them;
    ``info.grad_stats`` of the next step carries the same mapping.

    ``state_dict``/``load_state_dict`` hold what the controller learned, so a
    resumed run continues with it (the trainer's checkpoints store it through
    :meth:`Policy.state_dict`).

    A controller that measures on its own rank's batch averages over the ranks
    with :meth:`ranks` (what :meth:`Policy.average_over` was given, else
    torch.distributed's default group when initialised), so every rank decides the same.
    """

    _ranks: Ranks | None = None  # set by Policy.average_over

    def ranks(self) -> Ranks:
        """The data-parallel ranks to average measurements over (see :mod:`hpcdl.runtime.ranks`)."""
        return self._ranks if self._ranks is not None else default_ranks()

    @abstractmethod
    def choose(self, info: SavedTensorInfo) -> dict | None:
        """A codec config such as ``{"id": "sz", "mode": "rel", "bound": 1e-2}``, or None to keep the tensor."""

    def configs(self) -> list[dict]:
        """Every config this controller can return, so that a policy can validate them up front."""
        return []

    def wants_gradients(self, step: int) -> bool:
        """Whether the step numbered ``step`` (forwards so far) should read gradient statistics; default never."""
        return False

    def watch(self, model: torch.nn.Module, step: int, threshold: int) -> contextlib.AbstractContextManager:
        """A context the session enters around the forward numbered ``step`` of ``model`` (its pack threshold
        in bytes given), so a controller can watch the forward it compresses; default nothing."""
        return contextlib.nullcontext()

    def saved(self, step: int, original_bytes: int, packed_bytes: int) -> None:  # noqa: B027  (optional hook)
        """Called as the session of forward ``step`` closes, with what it saved for backward: the bytes
        uncompressed and as held (packed, or kept as they were); default nothing."""

    def observe(self, step: int, grad_stats: Mapping[str, GradStat]) -> None:  # noqa: B027  (optional hook)
        """Called with this step's gradient statistics when :meth:`wants_gradients` said so."""

    def describe(self) -> str:
        """A short name for logs and run records: a method spec where there is one, else the class name."""
        return type(self).__name__

    def report(self) -> dict | None:
        """What the controller decided since the last call, as plain data for the run's metrics (the trainer
        writes it to metrics.jsonl as a ``"compression"`` record); None when nothing changed (the default)."""
        return None

    def state_dict(self) -> dict:
        """What this controller learned, as plain data (numbers, strings, lists, dicts); default nothing."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`'s output; a controller that keeps no state takes only ``{}``."""
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state, but was given {sorted(state)}: the state "
                             "comes from another controller")


class StaticController(Controller):
    """The same codec for every floating tensor."""

    def __init__(self, config: dict | None):
        self.config = config

    def choose(self, info: SavedTensorInfo) -> dict | None:
        return self.config

    def configs(self) -> list[dict]:
        return [self.config] if self.config is not None else []

    def describe(self) -> str:
        return spec_from_config(self.config)


class PerModuleController(Controller):
    """The codec of the first glob pattern (in the given order) that matches the module's qualified name."""

    def __init__(self, patterns: Mapping[str, dict | None], default: dict | None):
        if not isinstance(patterns, Mapping) or not all(isinstance(key, str) for key in patterns):
            raise TypeError(f"per_module takes a dict of glob pattern -> codec config, got {patterns!r}")
        self.patterns = dict(patterns)
        self.default = default

    def choose(self, info: SavedTensorInfo) -> dict | None:
        for pattern, config in self.patterns.items():
            if fnmatch.fnmatchcase(info.module, pattern):
                return config
        return self.default

    def configs(self) -> list[dict]:
        return [c for c in [*self.patterns.values(), self.default] if c is not None]


class Policy:
    """Routes each saved tensor to a codec: masks and indices exactly, activations by a controller."""

    def __init__(self, controller: Controller, *, masks: dict | None = MASK_CODEC, indices: dict | None = INDEX_CODEC):
        if not isinstance(controller, Controller):
            raise TypeError(f"Policy takes a Controller, got {type(controller).__name__}; use Policy.static(config)")
        self.controller = controller
        self.masks = masks
        self.indices = indices
        self.step = 0
        self.grad_stats: dict[str, GradStat] = {}
        self.warned_modules: set[str] = set()  # modules whose codec failure was already reported
        self._codecs: dict[str, Codec] = {}
        for config in controller.configs():
            self._check_activation_codec(config)
        for config, dtype in ((masks, torch.bool), (indices, torch.int64)):
            if config is not None and dtype not in self.codec(config).dtypes:
                raise PolicySpecError(f"codec {config!r} cannot encode {dtype} tensors")

    @classmethod
    def static(cls, config: dict | None, **routing) -> Policy:
        """One codec config for every floating tensor (None keeps them as they are)."""
        return cls(StaticController(config), **routing)

    @classmethod
    def default(cls, **routing) -> Policy:
        """The policy hpcdl uses when none is named (:data:`DEFAULT_POLICY_SPEC`).

        >>> Policy.default()
        Policy(sz:rel=0.001)
        """
        policy = policy_from_config(default_codec_config(), **routing)
        assert policy is not None, "the default policy compresses"
        return policy

    @classmethod
    def per_module(cls, patterns: Mapping[str, dict | None], default: dict | None = None, **routing) -> Policy:
        """Codec configs by glob over qualified module names, e.g. ``{"encoder.*": {...}}``; first match wins."""
        return cls(PerModuleController(patterns, default), **routing)

    @classmethod
    def adaptive(cls, **options) -> Policy:
        """Error bounds that follow each saved tensor's effect on the parameter gradients
        (:class:`hpcdl.runtime.adaptive.AdaptiveController`; its options, all optional, as keywords)."""
        return cls(controller_from_config({"id": "adaptive", **options}))

    def __getstate__(self) -> dict:
        # Built codecs may hold native handles; a copy (e.g. in a measuring subprocess) rebuilds them.
        return {**self.__dict__, "_codecs": {}}

    def codec(self, config: dict) -> Codec:
        """The codec for ``config``, built once and reused (building validates the config)."""
        if not isinstance(config, dict):
            raise TypeError(f"a codec config is a dict like {{'id': 'sz', 'mode': 'rel', 'bound': 1e-2}}, got {config!r}")
        key = json.dumps(config, sort_keys=True, default=str)
        if key not in self._codecs:
            self._codecs[key] = get_codec(config)
            self._codecs[key].restart_random(self.step)  # as if built before this step (see watch)
        return self._codecs[key]

    def _check_activation_codec(self, config: dict) -> None:
        codec = self.codec(config)
        if not codec.dtypes & FLOAT_DTYPES:
            raise PolicySpecError(
                f"codec {config!r} cannot encode floating tensors, so it cannot compress activations; "
                "use a float codec such as {'id': 'sz', 'mode': 'rel', 'bound': 1e-2} or {'id': 'raw'}"
            )

    def codec_for(self, info: SavedTensorInfo) -> Codec | None:
        """The codec for one saved tensor, or None to keep it as it is."""
        if info.kind == "mask":
            config = self.masks
        elif info.kind == "index":
            # max-pool indices of a known geometry get the int codec's geometry-aware form
            config = info.window if info.window is not None and self.indices == INDEX_CODEC else self.indices
        else:
            config = self.controller.choose(info)
        return None if config is None else self.codec(config)

    def counted_bytes(self, tensor: torch.Tensor, nbytes: int) -> int:
        """The bytes a saved tensor counts for against the session's size threshold: its own ``nbytes``
        (a probe's replay of part of a batch counts more: :class:`hpcdl.runtime.probe.RecordingPolicy`)."""
        return nbytes

    def info(self, module: str, kind: str, tensor: torch.Tensor, window: dict | None = None,
             channels: int | None = None) -> SavedTensorInfo:
        return SavedTensorInfo(module, kind, tuple(tensor.shape), tensor.dtype, self.step, self.grad_stats, window,
                               channels)

    def wants_gradients(self) -> bool:
        """Whether this step's gradient statistics should be read (the controller decides; see :class:`Controller`)."""
        return self.controller.wants_gradients(self.step)

    def watch(self, model: torch.nn.Module, threshold: int) -> contextlib.AbstractContextManager:
        """The controller's context around this step's compressed forward (see :meth:`Controller.watch`); first
        restarts the random generators of the codecs built so far at this step (:meth:`Codec.restart_random`)."""
        for codec in self._codecs.values():
            codec.restart_random(self.step)
        return self.controller.watch(model, self.step, threshold)

    def forward_closed(self, original_bytes: int, packed_bytes: int) -> None:
        """The session of this step's forward closed, having saved these bytes (uncompressed, as held): the
        controller hears of them (:meth:`Controller.saved`) and the policy's step moves on."""
        self.controller.saved(self.step, original_bytes, packed_bytes)
        self.step += 1

    def record_gradients(self, model: torch.nn.Module) -> dict[str, GradStat]:
        """Summarise each module's own parameter gradients and pass them to the controller.

        Call after the gradients are final (reduced across ranks), and only when :meth:`wants_gradients`.
        """
        stats = gradient_stats(model)
        self.grad_stats = stats
        self.controller.observe(self.step, stats)
        return stats

    def average_over(self, ranks: Ranks) -> None:
        """Average the controller's measurements over these ranks (the distributed backend supplies them; the
        trainer passes its backend's, so Horovod ranks, which have no torch.distributed group, decide alike)."""
        self.controller._ranks = ranks

    def state_dict(self) -> dict:
        """The policy's progress as plain data: its step, the last gradient statistics, the controller's state."""
        return {"step": self.step, "grad_stats": {name: asdict(stat) for name, stat in self.grad_stats.items()},
                "controller": self.controller.state_dict()}

    def load_state_dict(self, state: Mapping) -> None:
        """Continue from :meth:`state_dict`'s output (a state without ``controller``, from before it existed, is
        taken as the controller's empty state)."""
        try:
            step, grad_stats = state["step"], {name: GradStat(**stat) for name, stat in state["grad_stats"].items()}
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"a policy state is {{'step', 'grad_stats', 'controller'}} as Policy.state_dict() "
                             f"writes it; this one fails with {type(err).__name__}: {err}") from None
        self.controller.load_state_dict(dict(state.get("controller") or {}))
        self.step, self.grad_stats = int(step), grad_stats

    def describe(self) -> str:
        """A short name: the method spec of a static or adaptive policy, else the controller's class name."""
        return self.controller.describe()

    def __repr__(self) -> str:
        return f"Policy({self.describe()})"


def gradient_stats(model: torch.nn.Module) -> dict[str, GradStat]:
    """Each module's own parameter gradients summarised (L2 norm, largest magnitude, element count).

    One batched computation on the gradients' device (``torch._foreach_norm``, then a segment sum and
    maximum per module) and one copy of the results to the host, instead of two host syncs per parameter.
    """
    names: list[str] = []
    grads: list[torch.Tensor] = []
    owner: list[int] = []
    numel: list[int] = []
    for name, module in model.named_modules():
        own = [p.grad.detach() for p in module.parameters(recurse=False) if p.grad is not None]
        if own:
            names.append(name or "(model)")
            numel.append(sum(g.numel() for g in own))
            for grad in own:
                if grad.numel():  # an empty gradient adds nothing to either statistic
                    grads.append(grad)
                    owner.append(len(names) - 1)
    if not names:
        return {}
    device = grads[0].device if grads else torch.device("cpu")
    sums = torch.zeros(len(names), dtype=torch.float64, device=device)
    maxima = torch.zeros(len(names), dtype=torch.float64, device=device)
    if grads:
        index = torch.tensor(owner, device=device)
        norms = torch.stack([n.to(device, torch.float64) for n in torch._foreach_norm(grads)])
        largest = torch.stack([n.to(device, torch.float64) for n in torch._foreach_norm(grads, math.inf)])
        sums.index_add_(0, index, norms.square())
        maxima.scatter_reduce_(0, index, largest, "amax")
    norm_list, max_list = torch.stack([sums.sqrt(), maxima]).tolist()  # the one copy to the host
    return {name: GradStat(norm=n, max_abs=m, numel=c) for name, n, m, c in zip(names, norm_list, max_list, numel)}


# Controllers named like a codec in a method spec or a config's compression.codec: id -> factory(options).
_CONTROLLERS: dict[str, Callable[[dict], Controller]] = {}


def register_controller(controller_id: str, factory: Callable[[dict], Controller]) -> None:
    """Make ``controller_id`` a method-spec id (``"adaptive:alpha=1e-2"``) built by ``factory(options)``.

    The factory checks its options and raises :class:`PolicySpecError` for bad ones. Controllers register
    themselves from their module (``hpcdl.runtime`` imports them), because they build on this one.
    """
    if controller_id in _CONTROLLERS and _CONTROLLERS[controller_id] is not factory:
        raise ValueError(f"controller id {controller_id!r} is already registered")
    _CONTROLLERS[controller_id] = factory


def is_controller_config(config: dict | None) -> bool:
    """Whether ``config`` names a registered controller (``{"id": "adaptive", ...}``) rather than a codec."""
    return isinstance(config, dict) and config.get("id") in _CONTROLLERS


def controller_from_config(config: dict) -> Controller:
    """The controller a ``{"id": "adaptive", options}`` config names, its options checked."""
    if not is_controller_config(config):
        raise PolicySpecError(f"{config!r} names no controller; controllers are {sorted(_CONTROLLERS)}")
    return _CONTROLLERS[config["id"]]({key: value for key, value in config.items() if key != "id"})


def policy_from_config(config: dict | None, **routing) -> Policy | None:
    """A Policy from a codec config (static), a controller config (``{"id": "adaptive"}``), or None (no compression)."""
    if config is None:
        return None
    if is_controller_config(config):
        return Policy(controller_from_config(config), **routing)
    return Policy.static(config, **routing)


# Options given without a key, by codec id: "cast:bf16" means dtype=bf16.
_POSITIONAL_OPTION = {"cast": "dtype"}


def _parse_value(text: str):
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


def config_from_spec(spec: str) -> dict | None:
    """``"sz:rel=1e-2"`` -> ``{"id": "sz", "mode": "rel", "bound": 0.01}``; ``"none"`` -> None.

    >>> config_from_spec("sz:rel=1e-2")
    {'id': 'sz', 'mode': 'rel', 'bound': 0.01}
    >>> config_from_spec("quant:bits=2,group_size=128")
    {'id': 'quant', 'bits': 2, 'group_size': 128}
    >>> config_from_spec("none") is None
    True
    >>> config_from_spec("sz:rel")
    Traceback (most recent call last):
    ...
    hpcdl.runtime.policy.PolicySpecError: option 'rel' in 'sz:rel' needs the form key=value (e.g. 'sz:rel=1e-2')
    """
    if not isinstance(spec, str) or not spec.strip():
        raise PolicySpecError(f"a method spec is a string like 'sz:rel=1e-2', 'quant:bits=2', 'cast:bf16' or 'raw', got {spec!r}")
    codec_id, _, options = spec.strip().partition(":")
    if codec_id == "none":
        if options:
            raise PolicySpecError(f"method spec 'none' takes no options, got {spec!r}")
        return None
    config: dict = {"id": codec_id}
    for option in filter(None, (o.strip() for o in options.split(","))):
        key, equals, value = option.partition("=")
        if not equals:
            if codec_id not in _POSITIONAL_OPTION:
                raise PolicySpecError(f"option {option!r} in {spec!r} needs the form key=value (e.g. 'sz:rel=1e-2')")
            key, value = _POSITIONAL_OPTION[codec_id], option
        if key in ERROR_BOUND_MODES:
            config["mode"], config["bound"] = key, _parse_value(value)
        else:
            config[key] = _parse_value(value)
    if is_controller_config(config):
        controller_from_config(config)  # refuse bad options now, with the controller's own message
    else:
        get_codec(config)  # refuse an unknown id or bad options now, with the codec's own message
    return config


def spec_from_config(config: dict | None) -> str:
    """The inverse of :func:`config_from_spec`, for display: ``{"id": "sz", "mode": "rel", "bound": 0.01}`` -> ``"sz:rel=0.01"``."""
    if config is None:
        return "none"
    options = []
    rest = {key: value for key, value in config.items() if key != "id"}
    if "mode" in rest and "bound" in rest:
        options.append(f"{rest.pop('mode')}={rest.pop('bound')!r}")
    positional = _POSITIONAL_OPTION.get(config["id"])
    if positional in rest:
        options.append(str(rest.pop(positional)))
    options.extend(f"{key}={value}" for key, value in rest.items())
    return config["id"] + (":" + ",".join(options) if options else "")


def default_codec_config() -> dict:
    """The codec config of :data:`DEFAULT_POLICY_SPEC` (a fresh dict), for a config's ``compression.codec``.

    >>> default_codec_config()
    {'id': 'sz', 'mode': 'rel', 'bound': 0.001}
    """
    config = config_from_spec(DEFAULT_POLICY_SPEC)
    assert config is not None, "the default policy compresses"
    return config


def policy_from_spec(spec: str, **routing) -> Policy | None:
    """A :class:`Policy` from a method spec (static for a codec, adaptive for ``adaptive[:options]``);
    ``"none"`` gives None (no compression).

    >>> policy_from_spec("cast:bf16")
    Policy(cast:bf16)
    >>> policy_from_spec("adaptive:alpha=1e-3")
    Policy(adaptive:alpha=0.001)
    >>> spec_from_config({"id": "sz", "mode": "rel", "bound": 0.01})
    'sz:rel=0.01'
    """
    return policy_from_config(config_from_spec(spec), **routing)


def as_policy(policy: Policy | str | dict | None) -> Policy | None:
    """A :class:`Policy` (or None: nothing compressed) from a Policy, a method spec, a codec config dict or None.

    The one place that turns what users pass as ``policy=`` into a Policy; the session, the
    activation methods and :mod:`hpcdl.memory` all call it.
    """
    if policy is None or isinstance(policy, Policy):
        return policy
    if isinstance(policy, str):
        return policy_from_spec(policy)
    if isinstance(policy, dict):
        return policy_from_config(policy)
    raise TypeError(f"policy must be a hpcdl.Policy, a method spec like 'sz:rel=1e-2', a codec config dict or None, "
                    f"got {type(policy).__name__}")
