"""Codecs for activations: the contract, the registry, and the built-in codecs.

>>> from hpcdl.compress import get_codec
>>> codec = get_codec({"id": "sz", "mode": "rel", "bound": 1e-2})
>>> restored = codec.decode(codec.encode(tensor))
"""

from hpcdl.compress.base import ERROR_BOUND_MODES, FLOAT_DTYPES, Codec, ErrorBound, Packed, check_mode, value_range
from hpcdl.compress.errors import CodecError, UnknownCodecError
from hpcdl.compress.registry import codec_class, get_codec, known_codec_ids, register_codec
from hpcdl.compress.verify import BoundReport, check_bound

__all__ = [
    "BoundReport",
    "Codec",
    "CodecError",
    "ERROR_BOUND_MODES",
    "ErrorBound",
    "FLOAT_DTYPES",
    "Packed",
    "UnknownCodecError",
    "check_bound",
    "check_mode",
    "codec_class",
    "get_codec",
    "known_codec_ids",
    "register_codec",
    "value_range",
]
