"""The self-describing header every codec writes in front of its payload.

Layout (little-endian)::

    magic      4 bytes  b"HPCD"
    version    u8       HEADER_VERSION
    id_len     u8       length of the codec id
    codec_id   id_len bytes of ASCII
    dtype      u8       code from DTYPE_CODES
    ndim       u8       number of dimensions (<= MAX_NDIM)
    shape      ndim x i64
    fields_len u16      length of the codec's own fields
    fields     fields_len bytes, packed with the codec's struct format
    checksum   u64      payload checksum (hpcdl.compress.checksum), the same definition for every codec
    crc        u32      CRC-32 (zlib) of the whole header with these 4 bytes zeroed

Reading validates every length before it is used and checks the CRC, so a
truncated or corrupted header raises :class:`CodecError` instead of reading out
of bounds or describing the wrong tensor. Version 1 (before every stream
carried a checksum) is refused with a message that says so.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from hpcdl.compress.errors import CodecError

MAGIC = b"HPCD"
HEADER_VERSION = 2  # 2: every header ends with the payload checksum and its own CRC-32
MAX_NDIM = 32

DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    torch.float64: 4,
    torch.bool: 5,
    torch.uint8: 6,
    torch.int8: 7,
    torch.int16: 8,
    torch.int32: 9,
    torch.int64: 10,
    torch.float8_e4m3fn: 11,
}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


@dataclass(frozen=True)
class Header:
    """What a codec needs to know about the tensor a stream holds."""

    codec_id: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    fields: tuple
    checksum: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def write_header(codec_id: str, dtype: torch.dtype, shape, fields_format: str = "", *fields, checksum: int) -> bytes:
    """Serialise a header; ``fields`` are packed with ``struct`` format ``"<" + fields_format``, ``checksum`` is
    the payload's :func:`hpcdl.compress.checksum.payload_checksum`."""
    if dtype not in DTYPE_CODES:
        raise TypeError(f"dtype {dtype} has no stream code; known: {sorted(map(str, DTYPE_CODES))}")
    shape = tuple(int(s) for s in shape)
    if len(shape) > MAX_NDIM:
        raise ValueError(f"tensors of {len(shape)} dimensions are not supported (at most {MAX_NDIM})")
    ident = codec_id.encode("ascii")
    packed_fields = struct.pack("<" + fields_format, *fields)
    blob = b"".join(
        [
            MAGIC,
            struct.pack("<BB", HEADER_VERSION, len(ident)),
            ident,
            struct.pack("<BB", DTYPE_CODES[dtype], len(shape)),
            struct.pack(f"<{len(shape)}q", *shape),
            struct.pack("<H", len(packed_fields)),
            packed_fields,
            struct.pack("<Q", checksum),
        ]
    )
    return blob + struct.pack("<I", zlib.crc32(blob + bytes(4)))


class _Reader:
    """Bounds-checked sequential reads from a byte string."""

    def __init__(self, blob: bytes):
        self.blob = blob
        self.pos = 0

    def take(self, count: int, what: str) -> bytes:
        if count < 0 or self.pos + count > len(self.blob):
            raise CodecError(
                f"packed header is truncated: {what} needs {count} bytes at offset {self.pos}, "
                f"but the header has {len(self.blob)} bytes"
            )
        chunk = self.blob[self.pos : self.pos + count]
        self.pos += count
        return chunk

    def unpack(self, fmt: str, what: str) -> tuple:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))


def peek_codec_id(blob: bytes) -> str:
    """The codec id a header names, after checking magic and version."""
    reader = _Reader(blob)
    magic = reader.take(4, "magic")
    if magic != MAGIC:
        raise CodecError(f"not an hpcdl packed stream: magic is {magic!r}, expected {MAGIC!r}")
    version, id_len = reader.unpack("BB", "version and id length")
    if version != HEADER_VERSION:
        old = " (version 1 streams, written before every codec stored a payload checksum, must be re-encoded)" \
            if version == 1 else ""
        raise CodecError(f"packed stream has header version {version}; this hpcdl reads version {HEADER_VERSION}{old}")
    try:
        return reader.take(id_len, "codec id").decode("ascii")
    except UnicodeDecodeError as err:
        raise CodecError("packed header's codec id is not ASCII: the stream is corrupted") from err


def read_header(blob: bytes, codec_id: str, fields_format: str = "", retired: Mapping[int, str] | None = None) -> Header:
    """Parse and validate a header written by ``codec_id`` with ``fields_format``, checking its CRC-32.
    ``retired`` maps the field sizes of the codec's earlier stream formats to why they are no longer read."""
    found = peek_codec_id(blob)
    if found != codec_id:
        raise CodecError(
            f"packed data was made by codec {found!r}; decode it with get_codec(...) of that codec, not {codec_id!r}"
        )
    reader = _Reader(blob)
    reader.take(4 + 2 + len(found), "magic, version and codec id")
    dtype_code, ndim = reader.unpack("BB", "dtype and ndim")
    if dtype_code not in CODE_DTYPES:
        raise CodecError(f"packed header names unknown dtype code {dtype_code}: the stream is corrupted")
    if ndim > MAX_NDIM:
        raise CodecError(f"packed header claims {ndim} dimensions (at most {MAX_NDIM}): the stream is corrupted")
    shape = reader.unpack(f"{ndim}q", "shape")
    if any(s < 0 for s in shape) or math.prod(shape) >= 2**62:
        raise CodecError(f"packed header has an impossible shape {shape}: the stream is corrupted")
    (fields_len,) = reader.unpack("H", "fields length")
    expected = struct.calcsize("<" + fields_format)
    if retired and fields_len in retired and fields_len != expected:
        raise CodecError(f"packed {codec_id!r} stream has {fields_len} bytes of fields, an earlier format that this "
                         f"hpcdl does not read: {retired[fields_len]}")
    if fields_len != expected:
        raise CodecError(
            f"packed header of {codec_id!r} has {fields_len} bytes of fields, expected {expected}: "
            "the stream is corrupted or from another format version"
        )
    fields = struct.unpack("<" + fields_format, reader.take(fields_len, "codec fields"))
    checksum, crc = reader.unpack("QI", "payload checksum and header CRC")
    if reader.pos != len(blob):
        raise CodecError(f"packed header has {len(blob) - reader.pos} trailing bytes: the stream is corrupted")
    if zlib.crc32(blob[:-4] + bytes(4)) != crc:
        raise CodecError(f"{codec_id} packed header fails its CRC-32 check: the header is corrupted")
    return Header(codec_id=found, dtype=CODE_DTYPES[dtype_code], shape=tuple(shape), fields=fields, checksum=checksum)
