"""Errors raised by codecs. Both are ValueErrors so callers can catch bad input in one place."""

from __future__ import annotations

from collections.abc import Iterable

from hpcdl.errors import HpcdlError


class CodecError(HpcdlError, ValueError):
    """A packed stream is truncated, corrupted, or was given to the wrong codec."""


class UnknownCodecError(HpcdlError, ValueError):
    """A codec config names an id that no codec has (built in, registered, or under the ``hpcdl.codecs`` entry points).

    ``codec_id`` is the id asked for and ``known_ids`` the ids there are; ``reason`` replaces "unknown" when the
    id is known but its codec could not be loaded (a third-party entry point that fails to import).
    """

    def __init__(self, codec_id: object, known_ids: Iterable[str] = (), reason: str = ""):
        self.codec_id = codec_id
        self.known_ids = sorted(known_ids)
        self.reason = reason
        what = reason or f"unknown codec id {codec_id!r}"
        super().__init__(f"{what}; known ids: {', '.join(self.known_ids)}")

    def __reduce__(self):
        # Picklable with its fields (a measuring subprocess sends its errors back).
        return type(self), (self.codec_id, self.known_ids, self.reason)
