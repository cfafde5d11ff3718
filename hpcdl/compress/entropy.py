"""The ``entropy`` stage: zstd over another codec's finished stream, lossless, on the host.

sz packs each block of 32 codes at one bit width and quant at a fixed number of bits: neither codes the skew of
what is left (most of a softmax's codes are the same one or two levels; a ReLU output's blocks mix zeros with
small levels). zstd at level 1 over the finished stream takes that out: on the first step's saved activations
of the zoo's tiny models 1.1-1.3x more on the CNNs, 2.3-2.6x more on the particle transformer, 1.4x on 2-bit
quant; over a run, as activations sparsify, up to 1.9x on the CNNs. It is not free: zstd runs at 180-810 MB/s
of packed bytes on one core, so sz's encode takes 1.3-1.7x as long and its decode about 2x
(docs/codecs.md#entropy has the numbers).

Config: any codec's config with ``"entropy": "zstd"`` (spec ``sz:rel=1e-2,entropy=zstd``); :func:`get_codec`
wraps the codec it names. The guarantee is the inner codec's (bound, exactness), since the stage is lossless.

Layouts. zstd over a finished stream sees what the inner codec wrote; for a block stream (``sz``, ``int``) those
are bit planes, in which zstd's Huffman stage cannot see the codes' skew. So for an ``sz`` stream (whose codes are
bounded: ``BlockCodec.bounded_codes``) the stage compresses the codes themselves, repacked whole 2, 4 or 8 bits each (:mod:`hpcdl.compress.codes`), unless its
codes are too wide for 8 bits: 1.05-1.3x fewer bytes than zstd over the stream on the zoo's activations
(docs/codecs.md#entropy). Every other inner stream (``int``'s too), and a raw fallback, is compressed as it is.

Stream: a header with codec id ``entropy``, the tensor's dtype and shape and one field, ``layout`` (u8): 0 the
inner stream stored as it is (zstd did not shrink it), 1 zstd over the inner stream, 2, 3 and 4 zstd over a block
stream's codes at 2, 4 and 8 bits. The payload is the inner codec's serialised stream (u32 header length, its
header, zeros up to a multiple of 8 bytes so that its payload is aligned, its payload:
:mod:`hpcdl.compress.nested`), with the payload replaced by the codes body for layouts 2-4, zstd-compressed for
layouts 1-4. A CUDA tensor gets the inner codec's own stream, untouched: the stage runs on the host, and a round
trip through host memory (and the synchronisations it needs) would cost more than it saves; decoding such a
stream is the inner codec's decode. Otherwise decoding checks the payload checksum, refuses a zstd frame whose
content size is unknown or larger than any stream of that tensor could be, rebuilds a block stream's payload
from its codes (refusing a body that cannot be one), then the inner codec decodes its own stream, with its own
checks (the rebuilt payload's checksum among them).
"""

from __future__ import annotations

from typing import overload

import torch

from hpcdl.compress.base import Codec, Packed
from hpcdl.compress.blocks.codec import FLAG_RAW, BlockCodec
from hpcdl.compress.checksum import payload_checksum, verified_payload
from hpcdl.compress.codes import CODE_BITS, code_bits, decode_body, encode_body
from hpcdl.compress.errors import CodecError
from hpcdl.compress.header import read_header, write_header
from hpcdl.compress.nested import header_prefix, inner_packed

STREAM_ID = "entropy"
METHODS = ("zstd",)
LEVEL = 1  # zstd's fastest regular level: the stream is already dense, higher levels gain a few percent
_FIELDS = "B"  # layout
#: The payload's layouts (the header's field): stored as it is, zstd over the inner stream, zstd over a block
#: stream's codes at each width of CODE_BITS.
STORED, ZSTD_STREAM = 0, 1
ZSTD_CODES = {bits: 2 + index for index, bits in enumerate(CODE_BITS)}
_BITS_OF = {layout: bits for bits, layout in ZSTD_CODES.items()}
_HEADER_ROOM = 1 << 16  # bytes an inner stream may have besides twice the tensor's raw bytes


@overload
def with_stage(config: dict, method: str) -> dict: ...
@overload
def with_stage(config: None, method: str) -> None: ...
def with_stage(config: dict | None, method: str) -> dict | None:
    """``config`` with the entropy stage ``method`` ("zstd"), or as it is for "none" (and for None: no codec)."""
    if config is None or method == "none":
        return config
    if method not in METHODS:
        raise ValueError(f"entropy stage {method!r} is not one of {['none', *METHODS]}")
    return {**config, "entropy": method}


def _zstd():
    """The zstandard module (a dependency of hpcdl), imported on first use."""
    import zstandard

    return zstandard


class EntropyStage(Codec):
    """An inner codec whose stream is zstd-compressed on the host; built by ``get_codec`` from a config with
    ``"entropy": "zstd"``."""

    codec_id = STREAM_ID

    def __init__(self, inner: Codec, method: str = "zstd"):
        if method not in METHODS:
            raise ValueError(f"entropy stage {method!r} is not one of {list(METHODS)} (e.g. 'entropy': 'zstd')")
        if isinstance(inner, EntropyStage):
            raise ValueError("a codec config takes one entropy stage, not two")
        self.inner, self.method = inner, method

    # The stage is lossless: what the stream takes and guarantees is the inner codec's.
    @property
    def modes(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.inner.modes

    @property
    def dtypes(self) -> frozenset[torch.dtype]:  # type: ignore[override]
        return self.inner.dtypes

    @property
    def error_bounded(self) -> bool:  # type: ignore[override]
        return self.inner.error_bounded

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        return self.inner.lossless

    @property
    def whole_tensor_limit(self) -> bool:  # type: ignore[override]
        return self.inner.whole_tensor_limit

    @property
    def stream_ids(self) -> tuple[str, ...]:
        return (STREAM_ID, *self.inner.stream_ids)  # a device tensor's stream is the inner codec's

    def get_config(self) -> dict:
        return {**self.inner.get_config(), "entropy": self.method}

    def __repr__(self) -> str:
        return f"EntropyStage({self.inner!r}, {self.method!r})"

    def restart_random(self, stream: int) -> None:
        self.inner.restart_random(stream)

    def _encode(self, tensor: torch.Tensor) -> Packed:
        packed = self.inner.encode(tensor)
        if tensor.device.type != "cpu":
            return packed  # the inner codec's own stream, untouched: no host round trip, no extra sync
        prefix = header_prefix(packed.header)
        layout, body = self._body(packed)
        content = [prefix, *body]
        stream = _zstd().ZstdCompressor(level=LEVEL).compressobj(size=sum(piece.numel() for piece in content))
        squeezed = b"".join([*(stream.compress(piece.numpy()) for piece in content), stream.flush()])
        if len(squeezed) >= prefix.numel() + packed.data.numel():
            return self._packed(tensor, torch.cat([prefix, packed.data]), STORED)
        return self._packed(tensor, torch.frombuffer(bytearray(squeezed), dtype=torch.uint8), layout)

    def _body(self, packed: Packed) -> tuple[int, list[torch.Tensor]]:
        """The layout for the inner stream ``packed`` and what zstd compresses after its header: a block stream's
        codes where they fit 8 bits (and their body is no larger than the tensor's raw bytes), else its payload."""
        inner = self.inner
        if not isinstance(inner, BlockCodec) or not inner.bounded_codes or packed.codec_id != inner.codec_id:
            return ZSTD_STREAM, [packed.data]
        _, counts, _, layout = inner.read_stream_header(packed.header)
        bits = code_bits(packed.data, layout) if counts.flags != FLAG_RAW else None
        if bits is None:
            return ZSTD_STREAM, [packed.data]
        body = encode_body(packed.data, layout, bits)
        if sum(piece.numel() for piece in body) > layout.numel * layout.value_size:
            return ZSTD_STREAM, [packed.data]  # more escapes than the sample showed: bounded by the raw bytes
        return ZSTD_CODES[bits], body

    def _packed(self, tensor: torch.Tensor, data: torch.Tensor, layout: int) -> Packed:
        header = write_header(STREAM_ID, tensor.dtype, tensor.shape, _FIELDS, layout,
                              checksum=payload_checksum(data))
        return Packed(header, data)

    def _decode(self, packed: Packed) -> torch.Tensor:
        if packed.codec_id != STREAM_ID:  # a device tensor's stream: the stage did not run
            return self.inner.decode(packed)
        header = read_header(packed.header, STREAM_ID, _FIELDS)
        (layout,) = header.fields
        if layout not in (STORED, ZSTD_STREAM, *_BITS_OF) or header.dtype not in self.dtypes:
            raise CodecError(f"entropy header has impossible fields {header.fields} for {header.dtype}: corrupted")
        data = verified_payload(packed.data, header)
        limit = _HEADER_ROOM + 2 * header.numel * header.dtype.itemsize
        stream = data if layout == STORED else _decompressed(data, limit)
        inner = inner_packed(stream, limit, STREAM_ID)
        if inner.codec_id != self.inner.codec_id:
            raise CodecError(f"entropy stream holds a {inner.codec_id!r} stream, this codec's inner codec is "
                             f"{self.inner.codec_id!r}: corrupted or decoded with the wrong codec")
        if layout in _BITS_OF:
            inner = self._from_codes(inner, _BITS_OF[layout])
            del stream  # the codes body: freed before the inner decode allocates the tensor, not held beside it
        restored = self.inner.decode(inner)
        if restored.shape != header.shape or restored.dtype != header.dtype:
            raise CodecError(f"entropy stream's inner stream decodes to {tuple(restored.shape)} {restored.dtype}, "
                             f"its header says {header.shape} {header.dtype}: corrupted")
        return restored

    def _from_codes(self, inner: Packed, bits: int) -> Packed:
        """The block stream whose header is ``inner``'s and whose codes body is ``inner``'s payload."""
        if not (isinstance(self.inner, BlockCodec) and self.inner.bounded_codes):
            raise CodecError(f"entropy stream holds codes, its inner codec {self.inner.codec_id!r} takes no codes "
                             "layout: corrupted")
        _, counts, _, layout = self.inner.read_stream_header(inner.header)
        if counts.flags == FLAG_RAW:
            raise CodecError("entropy stream holds codes of a raw-fallback stream, which has none: corrupted")
        return Packed(inner.header, decode_body(inner.data, layout, bits, self.inner.codec_id))


def _decompressed(data: torch.Tensor, limit: int) -> torch.Tensor:
    """The zstd frame in ``data``, decompressed straight into a new uint8 tensor; CodecError for a frame that is
    broken, of unknown content size, or larger than ``limit`` bytes (so a forged frame cannot make decoding
    allocate without bound)."""
    zstd = _zstd()
    frame = data.numpy()
    try:
        size = zstd.frame_content_size(frame)
    except zstd.ZstdError as err:
        raise CodecError(f"entropy payload is not a zstd frame ({err}): corrupted") from None
    if size < 0 or size > limit:
        raise CodecError(f"entropy payload's zstd frame declares {size} bytes, the stream of this tensor has at "
                         f"most {limit}: corrupted")
    stream = torch.empty(size, dtype=torch.uint8)
    target, filled = stream.numpy().data, 0
    try:
        with zstd.ZstdDecompressor().stream_reader(frame) as reader:
            while filled < size and (count := reader.readinto(target[filled:])):
                filled += count
            trailing = reader.read(1)
    except zstd.ZstdError as err:
        raise CodecError(f"entropy payload does not decompress ({err}): corrupted") from None
    if filled != size or trailing:
        raise CodecError(f"entropy payload decompressed to {filled}{'+' if trailing else ''} bytes, its frame "
                         f"declares {size}: corrupted")
    return stream
