"""The activation method a config's ``compression`` section names, as a :mod:`hpcdl.runtime.methods` object.

The trainer, its measured batch search and the study build the method here, so ``compression.method``
means one thing everywhere: ``none`` -> Plain, ``codec`` -> Codec(policy), ``recompute`` ->
Recompute(the model's blocks), ``offload`` -> Offload, ``recompute+codec`` / ``recompute+offload``
-> their composition. (The old spelling ``checkpoint`` is translated to ``recompute`` when the config is read.)
"""

from __future__ import annotations

from collections.abc import Callable

from hpcdl.runtime.methods import ActivationMethod, Codec, Offload, Plain, Recompute, compose, model_blocks
from hpcdl.train.config import method_parts


def compression_policy(compression: dict):
    """The runtime Policy that ``compression.method: codec`` names (per-module globs over a default, or a
    controller such as ``{id: adaptive}``); else None."""
    if "codec" not in method_parts(compression):
        return None
    from hpcdl.runtime.policy import Policy, policy_from_config

    default = compression["codec"]
    if compression["per_module"]:
        return Policy.per_module(compression["per_module"], default=default)
    return policy_from_config(default)


def session_kwargs(compression: dict) -> dict:
    """The session options of a ``compression`` section (the size below which saved tensors stay raw)."""
    return {} if compression["min_bytes"] is None else {"threshold": compression["min_bytes"]}


def method_name(compression: dict) -> str:
    """The method as a run records it: ``none``, ``codec:<spec>``, ``recompute``, ``recompute+codec:<spec>``..."""
    from hpcdl.runtime.policy import spec_from_config

    return "+".join(f"codec:{spec_from_config(compression['codec'])}" if part == "codec" else part
                    for part in method_parts(compression))


def activation_method(compression: dict, blocks: Callable = model_blocks, policy=None) -> ActivationMethod:
    """The method object of a resolved ``compression`` section.

    ``blocks`` finds the blocks ``recompute`` recomputes (e.g. ``ModelFamily.blocks``; the default asks
    the model's ``checkpoint_blocks()`` and pickles, for a measuring subprocess). ``policy``: the
    Policy to compress with (the trainer passes the one it checkpoints); default built from the section.
    """
    parts: list[ActivationMethod] = []
    for part in method_parts(compression):
        if part == "codec":
            parts.append(Codec(policy if policy is not None else compression_policy(compression),
                               **session_kwargs(compression)))
        elif part == "recompute":
            parts.append(Recompute(blocks))
        elif part == "offload":
            parts.append(Offload())
        else:
            parts.append(Plain())
    return compose(*parts)
