"""Errors raised by codecs. Both are ValueErrors so callers can catch bad input in one place."""


class CodecError(ValueError):
    """A packed stream is truncated, corrupted, or was given to the wrong codec."""


class UnknownCodecError(ValueError):
    """A codec config names an id that no registered codec has."""
