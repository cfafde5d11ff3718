"""Errors raised by codecs. Both are ValueErrors so callers can catch bad input in one place."""

from hpcdl.errors import HpcdlError


class CodecError(HpcdlError, ValueError):
    """A packed stream is truncated, corrupted, or was given to the wrong codec."""


class UnknownCodecError(HpcdlError, ValueError):
    """A codec config names an id that no registered codec has."""
