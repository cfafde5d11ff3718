"""The base of the block codecs (``sz``, ``int``): one definition of what every block stream shares.

:class:`BlockCodec` owns the parts of encode and decode that do not depend on what a block holds: the
backend choice, the raw fallback (a payload that would be larger than the tensor's own bytes is stored as
those bytes, with flag ``FLAG_RAW``), the payload checksum, and the header checks on decode (dtype, flags,
block size, payload length, checksum) that run before any kernel reads the payload. A subclass says
what its header fields are (``fields``, a struct format, and the hooks that write and read them) and how
its blocks are encoded and decoded with a backend (hpcdl.compress.blocks.protocol.BlockKernels).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

import torch

from hpcdl.compress.base import Codec, Packed
from hpcdl.compress.blocks import backend_module
from hpcdl.compress.blocks.protocol import BlockKernels, BlockPayload
from hpcdl.compress.blocks.stream import BLOCK, Layout, check_payload_length, raw_payload, raw_payload_size
from hpcdl.compress.checksum import aligned_payload, payload_checksum, verified_payload
from hpcdl.compress.errors import CodecError
from hpcdl.compress.header import Header, read_header, write_header

FLAG_RAW = 1  # the payload is the tensor's bytes, zero-padded to 8 (docs/format.md)

State = TypeVar("State")  # what a codec's blocks need besides the tensor, e.g. sz's quantizer parameters


@dataclass(frozen=True)
class StreamCounts:
    """The header fields every block stream has, wherever its codec's field format puts them."""

    flags: int
    block: int
    n_words: int
    n_outliers: int


class BlockCodec(Codec, Generic[State]):
    """A codec whose payload is a block stream (hpcdl.compress.blocks.stream). ``encode_with`` and
    ``decode_with`` take a backend name ("auto", "reference", "host", "cuda"): tests compare their bytes."""

    fields: ClassVar[str]  # struct format of the codec's header fields (docs/format.md)
    retired_fields: ClassVar[dict[int, str]] = {}  # field sizes of earlier formats -> why they are not read
    #: Whether every code is at most MAX_Q in magnitude (sz's quantizer guarantees it; ``int``'s codes are any
    #: int32): only such streams take the entropy stage's codes layouts (hpcdl.compress.codes).
    bounded_codes: ClassVar[bool] = False

    # ---------------------------------------------------------------- what a subclass says

    @abstractmethod
    def _prepare(self, flat: torch.Tensor, kernels: BlockKernels) -> State:
        """What encoding the flat tensor with ``kernels`` needs besides it (written to the header, raw or not)."""

    @abstractmethod
    def _encode_blocks(self, kernels: BlockKernels, flat: torch.Tensor, state: State,
                       raw_size: int) -> tuple[State, BlockPayload | None]:
        """The state as encoding completed it (sz on a GPU measures rel's range there) and the payload of
        ``flat``, or None when it would be larger than ``raw_size`` bytes."""

    @abstractmethod
    def _header_fields(self, state: State, flags: int, n_words: int, n_outliers: int) -> tuple:
        """The header fields, in the order of ``fields``."""

    @classmethod
    @abstractmethod
    def _read_fields(cls, header: Header) -> tuple[StreamCounts, State] | None:
        """The common counts and the state of a header whose dtype is one of ``dtypes``; None when the
        codec's own fields are impossible."""

    @classmethod
    @abstractmethod
    def _decode_blocks(cls, kernels: BlockKernels, header: Header, state: State, layout: Layout,
                       data: torch.Tensor) -> torch.Tensor:
        """The flat decoded tensor of a non-raw, aligned payload ``data`` of the length ``layout`` implies; the
        codec checks it against ``header.checksum`` (the kernels may fuse that check into decoding)."""

    @classmethod
    def _code_count(cls, numel: int, dtype: torch.dtype) -> int:
        """Elements the blocks hold for a tensor of ``numel`` elements of ``dtype`` (int64 takes two each)."""
        return numel

    # ---------------------------------------------------------------- shared by every block codec

    def _encode(self, tensor: torch.Tensor) -> Packed:
        return self.encode_with(tensor, "auto")

    def _decode(self, packed: Packed) -> torch.Tensor:
        return self.decode_with(packed, "auto")

    def encode_with(self, tensor: torch.Tensor, backend: str) -> Packed:
        """Encode with a chosen implementation ("reference", "host", "cuda" or "auto")."""
        if not isinstance(tensor, torch.Tensor) or tensor.dtype not in self.dtypes:
            return self.encode(tensor)  # raises the contract's TypeError
        kernels = backend_module(backend, tensor.device)
        flat = tensor.detach().contiguous().reshape(-1)
        state = self._prepare(flat, kernels)
        state, encoded = self._encode_blocks(kernels, flat, state, raw_payload_size(flat.numel(), flat.dtype))
        if encoded is None:
            flags, n_words, n_outliers = FLAG_RAW, 0, 0
            data = raw_payload(flat)
            checksum = payload_checksum(data, kernels)
        else:
            flags = 0
            data, n_words, n_outliers, checksum = encoded
        header = write_header(self.codec_id, tensor.dtype, tensor.shape, self.fields,
                              *self._header_fields(state, flags, n_words, n_outliers), checksum=checksum)
        return Packed(header, data)

    @classmethod
    def read_stream_header(cls, header_bytes: bytes) -> tuple[Header, StreamCounts, State, Layout]:
        """The header of one of this codec's streams, its counts and state, and the layout of its payload (a raw
        fallback's payload is the tensor's bytes instead); CodecError for a header this codec cannot have
        written."""
        header = read_header(header_bytes, cls.codec_id, cls.fields, cls.retired_fields)
        dtype, numel = header.dtype, header.numel
        read = cls._read_fields(header) if dtype in cls.dtypes else None
        if read is None or read[0].flags not in (0, FLAG_RAW) or read[0].block != BLOCK:
            raise CodecError(f"{cls.codec_id} packed header has impossible fields {header.fields} for {dtype}: "
                             "corrupted")
        counts, state = read
        layout = Layout(cls._code_count(numel, dtype), counts.n_words, counts.n_outliers, dtype.itemsize)
        return header, counts, state, layout

    @classmethod
    def decode_with(cls, packed: Packed, backend: str) -> torch.Tensor:
        """Decode with a chosen implementation, after checking the header and the payload against each other."""
        if not isinstance(packed, Packed):
            raise TypeError(f"{cls.codec_id} decodes a Packed, got {type(packed).__name__}")
        header, counts, state, layout = cls.read_stream_header(packed.header)
        dtype, numel = header.dtype, header.numel
        raw = counts.flags == FLAG_RAW
        check_payload_length(packed.data, raw_payload_size(numel, dtype) if raw else layout.total, cls.codec_id)
        kernels = backend_module(backend, packed.device)
        if raw:
            data = verified_payload(packed.data, header, kernels)
            return data[: numel * dtype.itemsize].clone().view(dtype).reshape(header.shape)
        return cls._decode_blocks(kernels, header, state, layout, aligned_payload(packed.data)).reshape(header.shape)
