"""The codec registry: ``get_codec(config)`` and ``register_codec(cls)``.

Built-in codecs live in their own modules and are imported the first time their
id is asked for, so a codec whose optional dependency is missing costs nothing
until used, and then says what to install.
"""

from __future__ import annotations

import importlib

from hpcdl.compress.base import Codec
from hpcdl.compress.errors import UnknownCodecError

_BUILTIN_MODULES = {
    "raw": "hpcdl.compress.raw",
    "cast": "hpcdl.compress.cast",
    "bitmask": "hpcdl.compress.bitmask",
    "int": "hpcdl.compress.intcodec",
    "quant": "hpcdl.compress.quant",
    "sz": "hpcdl.compress.sz",
    "sz3": "hpcdl.compress.peers",
    "zfp": "hpcdl.compress.peers",
}
_REGISTRY: dict[str, type[Codec]] = {}


def register_codec(cls: type[Codec], *, replace: bool = False) -> type[Codec]:
    """Register a Codec subclass under its ``codec_id``; usable as a class decorator."""
    if not (isinstance(cls, type) and issubclass(cls, Codec)):
        raise TypeError(f"register_codec takes a Codec subclass, got {cls!r}")
    existing = _REGISTRY.get(cls.codec_id)
    if existing is not None and existing is not cls and not replace:
        raise ValueError(f"codec id {cls.codec_id!r} is already registered by {existing.__qualname__}; pass replace=True")
    _REGISTRY[cls.codec_id] = cls
    return cls


def known_codec_ids() -> list[str]:
    return sorted(set(_BUILTIN_MODULES) | set(_REGISTRY))


def codec_class(codec_id: str) -> type[Codec]:
    """The class registered for ``codec_id``, importing its built-in module if needed."""
    if codec_id not in _REGISTRY and codec_id in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[codec_id])
    if codec_id not in _REGISTRY:
        raise UnknownCodecError(f"unknown codec id {codec_id!r}; known ids: {', '.join(known_codec_ids())}")
    return _REGISTRY[codec_id]


def get_codec(config: dict | Codec) -> Codec:
    """Build a codec from its config dict (``{"id": ..., options}``); the dict is not modified.

    >>> import torch
    >>> codec = get_codec({"id": "sz", "mode": "abs", "bound": 1e-3})
    >>> codec
    Sz(mode='abs', bound=0.001)
    >>> t = torch.linspace(-1, 1, 10_000)
    >>> packed = codec.encode(t)
    >>> packed.nbytes < t.nbytes, bool((codec.decode(packed) - t).abs().max() <= 1e-3)
    (True, True)
    """
    if isinstance(config, Codec):
        return config
    if not isinstance(config, dict):
        raise TypeError(f"a codec config is a dict like {{'id': 'sz', 'mode': 'rel', 'bound': 1e-2}}, got {config!r}")
    if "id" not in config:
        raise ValueError(f"codec config {config!r} has no 'id'; known ids: {', '.join(known_codec_ids())}")
    return codec_class(config["id"]).from_config(dict(config))
