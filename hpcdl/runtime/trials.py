"""Trial encodes of the codecs the adaptive controller may give a saved tensor besides ``sz``.

At a probe, the exact replay encodes each slot with every candidate codec of the controller's family and
records what it measured on the real tensor: the packed bytes and the element-wise mean squared error (in
float64), so the controller's variance model is exact for every candidate, whatever its error distribution.
Candidates (docs/adaptive.md, "Codec choice"):

* ``quant`` at 1, 2, 4 and 8 bits (stochastic rounding: unbiased);
* ``cast`` to bf16 and to fp8 e4m3 (round to nearest: a small bias, errors proportional to |x|);
* ``levels``: exact for a tensor of at most 256 distinct values (a dropout scale tensor has two).

Where the controller knows the most error variance a slot can be allowed at this probe (its bound may grow
only so far: ``decide``'s cap), a candidate less faithful than one of its own kind whose error already
exceeded that is not encoded (:func:`trials`): quant's error only grows as its bits fall, a cast's as its
mantissa narrows.

Large tensors are sampled: ``SAMPLE_CHUNKS`` chunks of ``CHUNK`` elements spread evenly over the flat tensor
are encoded together and the payload bytes scaled to the whole tensor (quant's groups and the chunks both
divide 4096, so the per-group statistics scale exactly). ``levels`` must be exact on every element, so it is
tried on the whole tensor, and only when the sample has few enough distinct values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hpcdl.compress import Codec, Packed
from hpcdl.compress.entropy import with_stage
from hpcdl.compress.levels import MAX_LEVELS

#: Elements per sampled chunk, and chunks per sample (a tensor of at most CHUNK * SAMPLE_CHUNKS elements is whole).
CHUNK = 4096
SAMPLE_CHUNKS = 64

QUANT_BITS = (1, 2, 4, 8)
EXACT = {"id": "levels"}
#: quant with its own generator (seed): the global one drives dropout, and a probe replays the training forward
#: with the same random state, so a codec must not draw from it between dropout layers.
QUANT = tuple({"id": "quant", "bits": bits, "seed": 0} for bits in QUANT_BITS)
CASTS = ({"id": "cast", "dtype": "bf16"}, {"id": "cast", "dtype": "fp8_e4m3"})
#: The candidate codecs of each family a controller may choose from besides sz (``adaptive:codecs=...``).
FAMILIES: dict[str, tuple[dict, ...]] = {"all": (*QUANT, *CASTS, EXACT), "sz": (), "quant": QUANT}
#: Candidates that cannot join an arena (hpcdl.runtime.arena.member_codec): a tensor under the session's
#: threshold would be kept as it is, so they are tried only on tensors of at least the threshold's bytes.
NO_ARENA = ("quant", "cast", "levels")
#: Candidates that move values to or away from zero: stochastic rounding takes a value smaller than a grid step
#: to zero or to the step, so on a tensor with zeros they fail the sign rule (sign_safe) and are not tried
#: (0 of 540 such quant trials passed it in one-epoch runs of the three shipped CPU configs; all 1,948 on
#: tensors without zeros did).
LOSES_ZEROS = ("quant",)


#: A candidate's fidelity within its kind (:func:`trials` tries the most faithful first): quant's bits, a cast's
#: mantissa bits.
MANTISSA_BITS = {"fp16": 10, "bf16": 7, "fp8_e4m3": 3, "fp8_e5m2": 2}


def fidelity(config: dict) -> int:
    """How faithful ``config`` is among the candidates of its ``id``: more is less error on any tensor."""
    if config["id"] == "quant":
        return int(config["bits"])
    if config["id"] == "cast":
        return MANTISSA_BITS.get(config["dtype"], 0)
    return 0


@dataclass
class Trial:
    """One candidate codec's trial encode of one slot (plain data: it is part of the checkpointed state)."""

    codec: dict
    nbytes: float = math.inf  # packed bytes of the whole tensor (inf: the codec cannot encode it)
    mse: float = math.inf     # mean squared error over the finite elements, in float64
    safe: float = 0.0         # 1: the sensitivity model is taken to hold for it on this slot (see sign_safe)


def sample(data: torch.Tensor) -> torch.Tensor:
    """The contiguous ``data`` itself when small, else (flat) SAMPLE_CHUNKS chunks of CHUNK elements spread
    evenly over it."""
    if data.numel() <= CHUNK * SAMPLE_CHUNKS:
        return data
    flat = data.reshape(-1)
    rows = flat[:flat.numel() // CHUNK * CHUNK].view(-1, CHUNK)
    picked = torch.linspace(0, rows.shape[0] - 1, SAMPLE_CHUNKS, device=flat.device).round().long()
    return rows[picked].reshape(-1)


def whole_bytes(packed: Packed, data: torch.Tensor, part: torch.Tensor) -> float:
    """The packed bytes of ``data`` from the encode of its sample ``part``: the header once (with ``data``'s
    dimensions, 8 bytes each), the payload scaled (exact for ``data`` itself)."""
    return len(packed.header) + 8 * (data.dim() - part.dim()) + packed.data.numel() * data.numel() / max(part.numel(), 1)


def sign_safe(source: torch.Tensor, decoded: torch.Tensor) -> bool:
    """Whether a codec's errors stay inside what the sensitivities (measured with sz) describe: it keeps every
    element's sign and every zero (as sz does), or the tensor has no zeros at all. A zero is where a ReLU or a
    dropout mask decides what backward does; a codec that moves values across it changes the gradient by more
    than a small linear error, which no sensitivity measured with sz would predict."""
    return bool(torch.equal(torch.sign(decoded), torch.sign(source))) or bool((source != 0).all())


def mean_square_error(source: torch.Tensor, decoded: torch.Tensor) -> float:
    """Element-wise mean squared error in float64 over the finite differences (NaN/Inf kept as they are)."""
    error = decoded.double() - source.double()
    if not bool(torch.isfinite(error).all()):  # selecting the finite elements copies: only when some are not
        error = error[torch.isfinite(error)]
    return float(error.square().mean()) if error.numel() else 0.0


def trial(config: dict, data: torch.Tensor, codec_of: Callable[[dict], Codec], threshold: float,
          entropy: str = "none", has_zeros: bool = False) -> Trial:
    """``config``'s trial encode of the contiguous tensor ``data`` (sampled when large), with the entropy stage
    ``entropy`` that training adds to it (hpcdl.compress.entropy), so that the bytes are what training keeps;
    unusable without an encode where it could not be chosen (under the threshold, or ``has_zeros`` for a codec
    that moves values across zero)."""
    result = Trial(dict(config))
    if config["id"] in NO_ARENA and data.numel() * data.element_size() < threshold:
        return result
    if config["id"] in LOSES_ZEROS and has_zeros:
        return result
    part = sample(data)
    if config == EXACT:  # a few thousand values decide most tensors: a sort of the whole sample only if they do not
        if torch.unique(part.reshape(-1)[:CHUNK]).numel() > MAX_LEVELS or torch.unique(part).numel() > MAX_LEVELS:
            return result
        part = data
    codec = codec_of(with_stage(config, entropy))
    try:
        packed = codec.encode(part)
    except ValueError:  # NaN or Inf for quant, too many levels, an infinity for fp8
        return result
    decoded = codec.decode(packed)
    result.nbytes = whole_bytes(packed, data, part)
    result.mse = mean_square_error(part, decoded)
    result.safe = 1.0 if sign_safe(part, decoded) else 0.0
    return result


def trials(configs: tuple[dict, ...], data: torch.Tensor, codec_of: Callable[[dict], Codec], threshold: float,
           entropy: str = "none", has_zeros: bool = False, limit: float = math.inf) -> list[Trial]:
    """Every candidate's :func:`trial` on ``data``, in the order of ``configs``, except that a candidate less
    faithful than one of its own id whose mean squared error exceeded ``limit`` is not encoded: it would err
    more still, so it is recorded unusable (its Trial's defaults)."""
    results: dict[int, Trial] = {}
    over_limit: set[str] = set()
    for index in sorted(range(len(configs)), key=lambda i: (configs[i]["id"], -fidelity(configs[i]))):
        config = configs[index]
        if config["id"] in over_limit:
            results[index] = Trial(dict(config))
            continue
        results[index] = result = trial(config, data, codec_of, threshold, entropy, has_zeros)
        if result.mse > limit:
            over_limit.add(config["id"])
    return [results[index] for index in range(len(configs))]
