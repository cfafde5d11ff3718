"""Method specs of the impact study, and the trainer config overrides each one means.

A method is one way of holding the activations autograd saves for backward:

``baseline``
    nothing done (``compression.method=none``).
``recompute``
    each of the model's blocks recomputed in backward instead of saving its activations
    (torch.utils.checkpoint, PyTorch's activation checkpointing; ``compression.method=recompute``).
    ``checkpoint``, its old name, still parses to the same method (named ``recompute``).
``offload``
    torch.autograd.graph.save_on_cpu (``compression.method=offload``); needs a GPU.
``ID[:OPTIONS]``
    a codec from :mod:`hpcdl.compress` through the runtime (``compression.method=codec``), e.g.
    ``sz:rel=1e-2``, ``sz:abs=1e-3``, ``quant:bits=2``, ``quant:bits=4,group_size=128``,
    ``cast:bf16``, ``raw``. The codec part is the runtime's policy spec and is parsed by
    :func:`hpcdl.runtime.policy.config_from_spec`, the one parser the runtime, trainer and study share.

The study only turns a spec into ``--set`` style overrides of the trainer's config; the trainer
does the work, so every method is measured by the same code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import yaml

from hpcdl.errors import HpcdlError
from hpcdl.train.config import LEGACY_CODEC_KEYS, METHOD_ALIASES


class MethodSpecError(HpcdlError, ValueError):
    """A study method spec that names no method, or a list of them that repeats one."""


TRAINER_METHODS = {"baseline": "none", "recompute": "recompute", "offload": "offload"}
#: Deprecated (one release): the codec keys the trainer's old flat ``compression`` section held. A method
#: spec now carries any option of its codec, as ``compression.codec``; nothing reads this list.
CODEC_CONFIG_KEYS = LEGACY_CODEC_KEYS


@dataclass(frozen=True)
class Method:
    """A parsed method spec: ``kind`` is baseline, recompute, offload or codec; ``codec`` its codec config."""

    spec: str
    kind: str
    codec: tuple[tuple[str, object], ...] = ()

    @property
    def codec_config(self) -> dict | None:
        return dict(self.codec) if self.kind == "codec" else None

    @property
    def needs_gpu(self) -> bool:
        return self.kind == "offload"

    @property
    def lossy(self) -> bool:
        """True when the method can change what backward sees (codecs other than raw/int/bitmask)."""
        return self.kind == "codec" and self.codec_config["id"] not in ("raw", "int", "bitmask")

    def overrides(self) -> list[str]:
        """Trainer config overrides (``section.key=value``) that select this method."""
        if self.kind != "codec":
            return [f"compression.method={TRAINER_METHODS[self.kind]}"]
        # The whole codec mapping, with its id, replaces the base config's codec: no option leaks in from it.
        return ["compression.method=codec", f"compression.codec={yaml_scalar(self.codec_config)}"]


def yaml_scalar(value) -> str:
    """``value`` (a scalar or a flat mapping) written on one line so that the trainer's YAML parsing of an
    override reads it back unchanged.

    PyYAML reads ``1e-2`` as a string (YAML 1.1 wants ``1.0e-2``), so floats go through its dumper.
    """
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=math.inf).split("\n", 1)[0]


def parse_method(spec: str) -> Method:
    """Parse one method spec (see the module docstring); bad specs raise MethodSpecError (a ValueError) saying what is valid."""
    if not isinstance(spec, str) or not spec.strip():
        raise MethodSpecError(f"a method spec is a non-empty string such as 'baseline' or 'sz:rel=1e-2', got {spec!r}")
    spec = METHOD_ALIASES.get(spec.strip(), spec.strip())
    if spec in TRAINER_METHODS:
        return Method(spec=spec, kind=spec)
    from hpcdl.runtime.policy import config_from_spec

    try:
        config = config_from_spec(spec)
    except ValueError as err:
        raise MethodSpecError(
            f"bad method {spec!r}: {err}; methods are {', '.join(TRAINER_METHODS)} or a codec spec "
            "such as sz:rel=1e-2, sz:abs=1e-3, quant:bits=2, cast:bf16"
        ) from err
    if config is None:  # the runtime's "none": no compression, which is the baseline
        return Method(spec=spec, kind="baseline")
    return Method(spec=spec, kind="codec", codec=tuple(config.items()))


def parse_methods(specs: str | list[str | Method]) -> list[Method]:
    """Parse a comma-separated list (or a list) of method specs, refusing duplicates.

    Commas also separate a codec's options (``quant:bits=4,group_size=128``), so a comma-separated
    piece that holds ``=`` but no ``:`` continues the previous codec spec.
    """
    pieces = [piece.strip() for piece in specs.split(",")] if isinstance(specs, str) else list(specs)
    joined: list[str] = []
    for piece in pieces:
        if joined and isinstance(piece, str) and "=" in piece and ":" not in piece:
            joined[-1] = f"{joined[-1]},{piece}"
        else:
            joined.append(piece)
    methods = [piece if isinstance(piece, Method) else parse_method(piece) for piece in joined]
    seen: dict[str, str] = {}
    for method in methods:
        key = repr(method.overrides())
        if key in seen:
            raise MethodSpecError(f"methods {seen[key]!r} and {method.spec!r} are the same method; list it once")
        seen[key] = method.spec
    if not methods:
        raise MethodSpecError("no methods given; e.g. --methods baseline,sz:rel=1e-2,recompute")
    return methods
