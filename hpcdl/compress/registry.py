"""The codec registry: ``get_codec(config)`` and ``register_codec(cls)``.

Three sources of codecs, looked up in this order:

- codecs registered in this process (``@register_codec``);
- the built-ins, each in its own module, imported the first time its id is asked for, so a codec
  whose optional dependency is missing costs nothing until used, and then says what to install;
- codecs of other installed distributions, named by an entry point in the group ``hpcdl.codecs``
  (``<codec id> = <module>:<Codec subclass>``), found the first time an id is not one of the above
  (one scan of the installed metadata per process) and loaded on first use. A codec installed this
  way is known in every process that sees the distribution: ``hpcdl train``, a Slurm job, the
  measuring subprocess of :mod:`hpcdl.memory`, without an import anywhere.

Any codec's config may add ``"entropy": "zstd"``: ``get_codec`` then wraps the codec in the lossless zstd
stage of :mod:`hpcdl.compress.entropy` (spec ``sz:rel=1e-2,entropy=zstd``); and ``"channels": d``: the codec's
bound then holds per channel (index of dim ``d``) in units of that channel's spread
(:mod:`hpcdl.compress.channels`, spec ``sz:abs=0.05,channels=1``). The channels stage goes outside, so that
the entropy stage sees the block streams of its inner codec, whose codes it compresses (and each chunk of a
large tensor's is compressed on its own).
"""

from __future__ import annotations

import functools
import importlib
from importlib import metadata

from hpcdl.compress.base import Codec
from hpcdl.compress.errors import UnknownCodecError

#: The entry-point group a distribution declares its codecs in.
ENTRY_POINT_GROUP = "hpcdl.codecs"

_BUILTIN_MODULES = {
    "raw": "hpcdl.compress.raw",
    "cast": "hpcdl.compress.cast",
    "bitmask": "hpcdl.compress.bitmask",
    "int": "hpcdl.compress.intcodec",
    "levels": "hpcdl.compress.levels",
    "window": "hpcdl.compress.window",
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


@functools.cache
def _entry_points() -> dict[str, metadata.EntryPoint]:
    """Codec id -> entry point of the ``hpcdl.codecs`` group; scanned once per process (a built-in id wins)."""
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name not in _BUILTIN_MODULES}


def known_codec_ids() -> list[str]:
    """Every codec id ``get_codec`` accepts here: built-in, registered and installed through entry points."""
    return sorted(set(_BUILTIN_MODULES) | set(_REGISTRY) | set(_entry_points()))


def _load_entry_point(codec_id: str, entry: metadata.EntryPoint) -> None:
    """Import the codec an entry point names and register it (if its module did not already)."""
    where = f"entry point {codec_id} = {entry.value} (group {ENTRY_POINT_GROUP}"
    where += f", distribution {entry.dist.name})" if entry.dist is not None else ")"
    try:
        loaded = entry.load()
    except Exception as err:  # a broken third-party package: say which one, whatever it raised
        raise UnknownCodecError(codec_id, known_codec_ids(),
                                reason=f"codec {codec_id!r} failed to load from its {where}: "
                                       f"{type(err).__name__}: {err}") from err
    if not (isinstance(loaded, type) and issubclass(loaded, Codec)) or loaded.codec_id != codec_id:
        raise UnknownCodecError(codec_id, known_codec_ids(),
                                reason=f"codec {codec_id!r}: its {where} must name a Codec subclass whose codec_id "
                                       f"is {codec_id!r}, got {loaded!r}")
    if _REGISTRY.get(codec_id) is not loaded:
        register_codec(loaded)


def codec_class(codec_id: str) -> type[Codec]:
    """The class registered for ``codec_id``, importing its built-in module or loading its entry point if needed."""
    if not isinstance(codec_id, str):
        raise UnknownCodecError(codec_id, known_codec_ids(), reason=f"a codec id is a string, got {codec_id!r}")
    if codec_id not in _REGISTRY:
        if codec_id in _BUILTIN_MODULES:
            importlib.import_module(_BUILTIN_MODULES[codec_id])
        elif codec_id in _entry_points():
            _load_entry_point(codec_id, _entry_points()[codec_id])
    if codec_id not in _REGISTRY:
        raise UnknownCodecError(codec_id, known_codec_ids())
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
    if "channels" in config:  # any codec's bound per channel, in units of its spread (hpcdl.compress.channels)
        from hpcdl.compress.channels import ChannelScale

        inner = {key: value for key, value in config.items() if key != "channels"}
        return ChannelScale(get_codec(inner), config["channels"])
    if "entropy" in config:  # any codec with the lossless zstd stage over its stream (hpcdl.compress.entropy)
        from hpcdl.compress.entropy import EntropyStage

        inner = {key: value for key, value in config.items() if key != "entropy"}
        return EntropyStage(get_codec(inner), config["entropy"])
    return codec_class(config["id"]).from_config(dict(config))
