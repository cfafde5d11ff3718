"""Method specs: the short names of activation methods that the study and the benchmarks share.

A method is one way of holding the activations autograd saves for backward:

``baseline``
    nothing done (``compression.method=none``).
``recompute``
    each of the model's blocks recomputed in backward instead of saving its activations
    (torch.utils.checkpoint, PyTorch's activation checkpointing; ``compression.method=recompute``).
    ``checkpoint``, its old name, still parses to the same method (named ``recompute``).
``offload``
    torch.autograd.graph.save_on_cpu (``compression.method=offload``); needs a GPU.
``POLICY``
    a policy spec of the runtime (``compression.method=codec``): a codec from :mod:`hpcdl.compress`
    and its options, e.g. ``sz:rel=1e-2``, ``sz:abs=1e-3``, ``quant:bits=2``,
    ``quant:bits=4,group_size=128``, ``cast:bf16``, ``raw``. It is parsed by
    :func:`hpcdl.runtime.policy.policy_from_spec`, the one parser the runtime, trainer, study and
    benchmarks share, so a policy spec the runtime learns (such as an adaptive policy's) is a method
    here with no change to this module.
``recompute+POLICY``, ``recompute+offload``
    recomputation combined with compression (of what the model saves, the recomputation included) or
    offloading (of what the recomputing model still saves) (``compression.method=recompute+codec`` /
    ``recompute+offload``).

This module turns a spec into the trainer's config overrides (:meth:`Method.overrides`, what the
study runs) or into the runtime's activation method object (:meth:`Method.activation_method`, what
``hpcdl bench memory`` measures), so both mean the same thing by a name. It sits in the train layer
because the study and the benchmarks, siblings above it, both parse these specs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import yaml

from hpcdl.errors import HpcdlError
from hpcdl.train.config import LEGACY_CODEC_KEYS, METHOD_ALIASES


class MethodSpecError(HpcdlError, ValueError):
    """A method spec that names no method, or a list of them that repeats one."""


#: Method specs without a policy, and the ``compression.method`` each selects.
TRAINER_METHODS = {"baseline": "none", "recompute": "recompute", "offload": "offload",
                   "recompute+offload": "recompute+offload"}
#: The prefix that combines recomputation with a policy: ``recompute+sz:rel=1e-2``.
RECOMPUTE_PREFIX = "recompute+"
#: Deprecated (one release): the codec keys the trainer's old flat ``compression`` section held. A method
#: spec now carries any option of its codec, as ``compression.codec``; nothing reads this list.
CODEC_CONFIG_KEYS = LEGACY_CODEC_KEYS


@dataclass(frozen=True)
class Method:
    """A parsed method spec.

    ``kind`` is the ``compression.method`` family it selects, named as the study records it: ``baseline``,
    ``recompute``, ``offload``, ``codec``, ``recompute+codec`` or ``recompute+offload``. For the codec
    kinds ``policy`` is the policy spec (``sz:rel=1e-2``) and ``codec`` its codec config as pairs, or for a
    controller's policy (``adaptive``, ``actnn:bits=2``) the controller's config, which ``compression.codec``
    takes as well (empty for a policy that is neither, such as one routing masks or indices).
    """

    spec: str
    kind: str
    codec: tuple[tuple[str, object], ...] = ()
    policy: str = ""

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.kind.split("+"))

    @property
    def codec_config(self) -> dict | None:
        return dict(self.codec) if "codec" in self.parts and self.codec else None

    @property
    def needs_gpu(self) -> bool:
        return "offload" in self.parts

    @property
    def lossy(self) -> bool:
        """True when the method can change what backward sees (codecs other than raw/int/bitmask)."""
        config = self.codec_config
        return "codec" in self.parts and (config is None or config["id"] not in ("raw", "int", "bitmask"))

    @property
    def trainer_method(self) -> str:
        """The ``compression.method`` value this method selects."""
        return TRAINER_METHODS.get(self.kind, self.kind)

    def overrides(self) -> list[str]:
        """Trainer config overrides (``section.key=value``) that select this method."""
        if "codec" not in self.parts:
            return [f"compression.method={self.trainer_method}"]
        if self.codec_config is None:
            raise MethodSpecError(f"method {self.spec!r}: the trainer config names one codec per run "
                                  f"(compression.codec), and policy {self.policy!r} is not one codec")
        # The whole codec mapping, with its id, replaces the base config's codec: no option leaks in from it.
        return [f"compression.method={self.trainer_method}", f"compression.codec={yaml_scalar(self.codec_config)}"]

    def activation_method(self, blocks: Callable | None = None, threshold: int | None = None):
        """The :mod:`hpcdl.runtime.methods` object of this method (picklable when ``blocks`` is).

        ``blocks``: the blocks ``recompute`` recomputes, a function of the model (default the model's
        ``checkpoint_blocks()``); ``threshold``: bytes below which the codec keeps a saved tensor
        (default the session's).
        """
        from hpcdl.runtime.methods import ActivationMethod, Codec, Offload, Plain, Recompute, compose, model_blocks
        from hpcdl.runtime.policy import policy_from_spec

        parts: list[ActivationMethod] = []
        for part in self.parts:
            if part == "codec":
                policy = policy_from_spec(self.policy)
                assert policy is not None  # parse_method gives a codec kind only to a policy that compresses
                parts.append(Codec(policy) if threshold is None else Codec(policy, threshold))
            elif part == "recompute":
                parts.append(Recompute(blocks or model_blocks))
            elif part == "offload":
                parts.append(Offload())
            else:
                parts.append(Plain())
        return compose(*parts)

    def key(self) -> str:
        """What two specs of the same method share (``sz:rel=1e-2`` and ``sz:rel=0.01``)."""
        config = self.codec_config
        return f"{self.kind} {yaml_scalar(config) if config is not None else self.policy}"


def yaml_scalar(value) -> str:
    """``value`` (a scalar or a flat mapping) written on one line so that the trainer's YAML parsing of an
    override reads it back unchanged.

    PyYAML reads ``1e-2`` as a string (YAML 1.1 wants ``1.0e-2``), so floats go through its dumper.
    """
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=math.inf).split("\n", 1)[0]


def parse_method(spec: str) -> Method:
    """Parse one method spec (see the module docstring); bad specs raise MethodSpecError (a ValueError) saying what is valid.

    >>> parse_method("recompute+sz:rel=1e-2").overrides()
    ['compression.method=recompute+codec', 'compression.codec={id: sz, mode: rel, bound: 0.01}']
    """
    if not isinstance(spec, str) or not spec.strip():
        raise MethodSpecError(f"a method spec is a non-empty string such as 'baseline' or 'sz:rel=1e-2', got {spec!r}")
    spec = "+".join(METHOD_ALIASES.get(part.strip(), part.strip()) for part in spec.strip().split("+", 1))
    if spec in TRAINER_METHODS:
        return Method(spec=spec, kind=spec)
    recompute = spec.startswith(RECOMPUTE_PREFIX)
    policy_spec = spec[len(RECOMPUTE_PREFIX):] if recompute else spec
    from hpcdl.runtime.policy import Policy, StaticController, config_from_spec, is_controller_config, policy_from_spec

    try:
        policy = policy_from_spec(policy_spec)
    except ValueError as err:
        raise MethodSpecError(
            f"bad method {spec!r}: {err}; methods are {', '.join(TRAINER_METHODS)}, a policy spec "
            "such as sz:rel=1e-2, sz:abs=1e-3, quant:bits=2, cast:bf16, or recompute+ one of those"
        ) from err
    if policy is None:  # the runtime's "none": no compression
        return Method(spec=spec, kind="recompute" if recompute else "baseline")
    assert isinstance(policy, Policy)
    controller = policy.controller
    codec = tuple(controller.config.items()) if isinstance(controller, StaticController) and controller.config else ()
    config = config_from_spec(policy_spec)
    if config is not None and is_controller_config(config):
        codec = tuple(config.items())
    return Method(spec=spec, kind="recompute+codec" if recompute else "codec", codec=codec, policy=policy_spec)


def parse_methods(specs: str | list[str | Method]) -> list[Method]:
    """Parse a comma-separated list (or a list) of method specs, refusing duplicates.

    Commas also separate a codec's options (``quant:bits=4,group_size=128``), so a comma-separated
    piece that holds ``=`` but no ``:`` continues the previous codec spec.
    """
    pieces = [piece.strip() for piece in specs.split(",")] if isinstance(specs, str) else list(specs)
    joined: list[str | Method] = []
    for piece in pieces:
        if joined and isinstance(piece, str) and "=" in piece and ":" not in piece:
            joined[-1] = f"{joined[-1]!s},{piece}"
        else:
            joined.append(piece)
    methods = [piece if isinstance(piece, Method) else parse_method(piece) for piece in joined]
    seen: dict[str, str] = {}
    for method in methods:
        key = method.key()
        if key in seen:
            raise MethodSpecError(f"methods {seen[key]!r} and {method.spec!r} are the same method; list it once")
        seen[key] = method.spec
    if not methods:
        raise MethodSpecError("no methods given; e.g. --methods baseline,sz:rel=1e-2,recompute")
    return methods
