"""The ``channels`` stage: another codec's bound taken per channel, in units of each channel's spread.

Batch norm's backward reads its saved input ``x`` as ``(x - mu_c) * invstd_c``, channel by channel, so an
error matters in proportion to ``invstd_c``: a bound that is one number for the whole tensor is set by the
channel of least spread, and is far tighter than the others need (issue 13's first reproduction). This stage
scales each channel by a power of two close to its spread before the inner codec sees it, so an abs bound
``b`` of the inner codec becomes ``b * 2^k_c`` on channel ``c``:

* ``k_c = round(log2(sqrt(var_c + EPS)))``, ``var_c`` the channel's (biased) variance over every other dim and
  ``EPS`` batch norm's default epsilon, so that ``2^k_c`` is within a factor ``sqrt(2)`` of ``1 / invstd_c``
  (a constant channel gets ``sqrt(EPS)``, as batch norm divides it by that);
* ``y = x * 2^-k_c`` is exact in floating point (a power of two; the exponents are clamped so that neither the
  scale nor, on overflow, any scaled value leaves the dtype's range), the inner codec encodes ``y``, and decoding
  multiplies its result by ``2^k_c``, exactly again. So the inner codec's guarantee holds on ``y`` as it is:
  ``|x' - x| <= b * 2^k_c`` elementwise for an abs bound, and zeros, signs, NaN and Inf survive as the inner
  codec keeps them. The one inexact case is a value pushed below the dtype's smallest normal number by the
  scaling (``|x| < 2^(k_c - 126)`` in float32): it rounds there, by at most the smallest subnormal times
  ``2^k_c``, and may become zero.

Config: any codec's config with ``"channels": d`` (spec ``sz:abs=0.05,channels=1``), ``d`` the dim of the
encoded tensor that indexes the channels (1 for a contiguous ``N, C, ...`` tensor; the session names it for
each saved batch-norm input, whatever its memory format). :func:`~hpcdl.compress.get_codec` wraps the inner
codec in it, with the entropy stage inside if the config has one too (around each chunk's inner stream). A tensor with at most ``d`` dims has no
channels: one exponent for all of it.

The scaled tensor is a copy, alive beside the original while the inner codec encodes it. So that the copy
(and the inner codec's own buffers) stay small next to a large tensor, a tensor of more than
:data:`CHUNK_BYTES` whose channels are not its first dim is scaled and encoded in chunks of samples (slices
of dim 0), each its own inner stream; decoding writes each chunk's result into its slice of one output.

Stream: a header with codec id ``channels``, the tensor's dtype and shape and two fields, the channel dim
(u8) and the samples per chunk (u64; 0 when the tensor is one chunk); then a payload of one int8
exponent per channel, zeros up to a multiple of 8 bytes, one u64 per chunk with the bytes of that chunk's
part, and each chunk's inner serialised stream (:mod:`hpcdl.compress.nested`), each padded with zeros to a
multiple of 8 bytes. Decoding checks the payload checksum, the dim, the chunking and every exponent against
the dtype, then the inner codec decodes each of its streams with its own checks.
"""

from __future__ import annotations

import math
from typing import overload

import torch

from hpcdl.compress.base import Codec, Packed
from hpcdl.compress.checksum import payload_checksum, verified_payload
from hpcdl.compress.errors import CodecError
from hpcdl.compress.header import read_header, write_header
from hpcdl.compress.nested import header_prefix, inner_packed

STREAM_ID = "channels"
#: What the channel variance is floored by: the default ``eps`` of ``nn.BatchNorm*d``.
EPS = 1e-5
_FIELDS = "BQ"  # the channel dim, the samples per chunk
#: The most bytes of a tensor scaled (and handed to the inner codec) at once: larger tensors go in chunks.
CHUNK_BYTES = 64 * 2**20
_HEADER_ROOM = 1 << 16  # bytes an inner stream may have besides twice the tensor's raw bytes
#: Below this fraction of the squared mean, a variance from one pass of sums is left to the exact two passes.
_CANCELLATION = 1e-3
#: Per dtype, the largest |k| for which 2^k and 2^-k are both normal numbers, and the largest finite exponent.
_EXPONENTS = {torch.float16: (13, 15), torch.bfloat16: (125, 127), torch.float32: (125, 127),
              torch.float64: (1021, 1023)}


@overload
def with_channels(config: dict, dim: int | None) -> dict: ...
@overload
def with_channels(config: None, dim: int | None) -> None: ...
def with_channels(config: dict | None, dim: int | None) -> dict | None:
    """``config`` with its bound taken per channel along ``dim``, or as it is for ``dim`` None (and for None)."""
    if config is None or dim is None:
        return config
    return {**config, "channels": dim}


class ChannelScale(Codec):
    """An inner codec that encodes each channel scaled by a power of two near its spread; built by ``get_codec``
    from a config with ``"channels": d``."""

    codec_id = STREAM_ID

    def __init__(self, inner: Codec, dim: int):
        if isinstance(dim, bool) or not isinstance(dim, int) or not 0 <= dim < 256:
            raise ValueError(f"'channels' is the dim of the encoded tensor that indexes its channels, an integer "
                             f"from 0 to 255 (1 for N, C, ... tensors); got {dim!r}")
        if isinstance(inner, ChannelScale):
            raise ValueError("a codec config takes one 'channels' stage, not two")
        if not inner.dtypes & set(_EXPONENTS):
            raise ValueError(f"'channels' scales floating tensors; codec {inner.codec_id!r} takes none")
        self.inner, self.dim = inner, dim

    # Scaling by powers of two is exact: what the stream takes and guarantees is the inner codec's, per channel.
    @property
    def modes(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.inner.modes

    @property
    def dtypes(self) -> frozenset[torch.dtype]:  # type: ignore[override]
        return frozenset(self.inner.dtypes & set(_EXPONENTS))

    @property
    def error_bounded(self) -> bool:  # type: ignore[override]
        return self.inner.error_bounded

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        return self.inner.lossless

    @property
    def whole_tensor_limit(self) -> bool:  # type: ignore[override]
        return self.inner.whole_tensor_limit

    def get_config(self) -> dict:
        return {**self.inner.get_config(), "channels": self.dim}

    def __repr__(self) -> str:
        return f"ChannelScale({self.inner!r}, dim={self.dim})"

    def restart_random(self, stream: int) -> None:
        self.inner.restart_random(stream)

    def _encode(self, tensor: torch.Tensor) -> Packed:
        exponents = channel_exponents(tensor, self.dim)
        rows = self._chunk_rows(tensor)
        scale = _powers(-exponents, tensor, self.dim)
        parts, lengths = [], []
        for start in range(0, tensor.shape[0], rows) if rows else [0]:
            scaled = (tensor.detach()[start:start + rows] if rows else tensor.detach()) * scale
            packed = self.inner.encode(scaled)
            del scaled
            device = packed.data.device
            lengths.append(header_prefix(packed.header).numel() + packed.data.numel())
            pad = torch.zeros(-lengths[-1] % 8, dtype=torch.uint8, device=device)
            parts.append(torch.cat([header_prefix(packed.header).to(device), packed.data, pad]))
        device = parts[0].device
        table = exponents.to(torch.int8).view(torch.uint8).cpu()
        table = torch.cat([table, torch.zeros(-table.numel() % 8, dtype=torch.uint8)])
        length_table = torch.tensor(lengths, dtype=torch.int64).view(torch.uint8)
        data = torch.cat([table.to(device), length_table.to(device), *parts])
        header = write_header(STREAM_ID, tensor.dtype, tensor.shape, _FIELDS, self.dim, rows,
                              checksum=payload_checksum(data))
        return Packed(header, data)

    def _chunk_rows(self, tensor: torch.Tensor) -> int:
        """Samples (slices of dim 0) per chunk: as many as fit in :data:`CHUNK_BYTES`, at least one; 0 (one
        chunk, the whole tensor) when it is small, or its channels are dim 0, or it has no dims."""
        if tensor.dim() <= self.dim or self.dim == 0 or tensor.shape[0] <= 1:
            return 0
        row_bytes = tensor[0].numel() * tensor.element_size()
        if row_bytes * tensor.shape[0] <= CHUNK_BYTES:
            return 0
        return max(1, CHUNK_BYTES // max(row_bytes, 1))

    def _decode(self, packed: Packed) -> torch.Tensor:
        header = read_header(packed.header, STREAM_ID, _FIELDS)
        dim, rows = header.fields
        if header.dtype not in self.dtypes or dim != self.dim:
            raise CodecError(f"channels header has dim {dim} for {header.dtype}, this codec scales dim {self.dim} "
                             f"of {sorted(map(str, self.dtypes))}: corrupted or decoded with the wrong codec")
        first = header.shape[0] if header.shape else 1
        if rows and (dim == 0 or len(header.shape) <= dim or rows >= first):
            raise CodecError(f"channels header has chunks of {rows} samples for a tensor of shape "
                             f"{header.shape}: corrupted")
        chunk_count = -(-first // rows) if rows else 1
        data = verified_payload(packed.data, header)
        count = header.shape[dim] if dim < len(header.shape) else 1
        table_bytes = count + (-count % 8)
        if data.numel() < table_bytes + 8 * chunk_count:
            raise CodecError(f"channels payload of {data.numel()} bytes cannot hold {count} channel exponents and "
                             f"{chunk_count} chunk lengths: corrupted")
        chunks = [(start, min(start + rows, first)) for start in range(0, first, rows)] if rows else [(0, first)]
        exponents = data[:table_bytes][:count].view(torch.int8).to(torch.int32)
        largest, _ = _EXPONENTS[header.dtype]
        if bool((exponents.abs() > largest).any()):
            raise CodecError(f"channels payload has an exponent outside +-{largest} for {header.dtype}: corrupted")
        lengths = data[table_bytes:table_bytes + 8 * len(chunks)].cpu().clone().view(torch.int64).tolist()
        at = table_bytes + 8 * len(chunks)
        padded = [length + (-length % 8) for length in lengths]
        if any(length < 0 for length in lengths) or at + sum(padded) != data.numel():
            raise CodecError(f"channels payload's chunk lengths {lengths} do not add up to its {data.numel()} "
                             f"bytes: corrupted")
        output = None
        for (start, stop), length, step in zip(chunks, lengths, padded):
            shape = (stop - start, *header.shape[1:]) if rows else header.shape
            restored = self._decode_chunk(data[at:at + length], shape, header.dtype)
            at += step
            scale = _powers(exponents.to(restored.device), restored, dim)
            if not rows:
                if restored.untyped_storage().data_ptr() == data.untyped_storage().data_ptr():
                    return restored * scale  # a decode that returns a view of its stream must not be written over
                return restored.mul_(scale)
            if output is None:
                output = torch.empty(header.shape, dtype=header.dtype, device=restored.device)
            torch.mul(restored, scale, out=output[start:stop])
            del restored
        assert output is not None  # rows > 0: at least two chunks
        return output

    def _decode_chunk(self, stream: torch.Tensor, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """One chunk's inner stream decoded, checked against the shape and dtype the header gives it."""
        limit = _HEADER_ROOM + 2 * math.prod(shape) * dtype.itemsize
        inner = inner_packed(stream, limit, STREAM_ID)
        if inner.codec_id not in self.inner.stream_ids:
            raise CodecError(f"channels stream holds a {inner.codec_id!r} stream, its inner codec "
                             f"{self.inner.codec_id!r} decodes {list(self.inner.stream_ids)}: corrupted or decoded "
                             f"with the wrong codec")
        restored = self.inner.decode(inner)
        if tuple(restored.shape) != tuple(shape) or restored.dtype != dtype:
            raise CodecError(f"channels stream's inner stream decodes to {tuple(restored.shape)} {restored.dtype}, "
                             f"its header says {tuple(shape)} {dtype}: corrupted")
        return restored


def channel_units(tensor: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``tensor`` with each channel (index of ``dim``) divided by its ``2^k_c``, exactly, and the exponents
    (:func:`channel_exponents`): what the inner codec encodes, so a codec's error measured on it is the staged
    codec's error in units of each channel's scale."""
    exponents = channel_exponents(tensor, dim)
    return tensor.detach() * _powers(-exponents, tensor, dim), exponents


def channel_exponents(tensor: torch.Tensor, dim: int) -> torch.Tensor:
    """``k_c = round(log2(sqrt(var_c + EPS)))`` per index of ``dim`` (int32), clamped so that ``2^+-k_c`` are
    normal numbers of ``tensor``'s dtype and ``tensor * 2^-k_c`` overflows nowhere it was finite. A channel with
    NaN or Inf gets ``k_c`` from its finite values (0 when it has none). A tensor without ``dim``: one ``k``.

    One pass of sums over each contiguous run of a channel (two reductions, no copy) in the usual case; the
    exact two-pass variance, in float64 and over the finite values, only where those sums cannot be trusted
    (non-finite sums, or a mean so far from zero against the spread that ``E[x^2] - E[x]^2`` cancels)."""
    data = tensor.detach()
    if data.dim() <= dim:
        data, dim = data.reshape(1, -1), 0
    if data.numel() == 0:
        return torch.zeros(data.shape[dim], dtype=torch.int32, device=data.device)
    runs = data.reshape(math.prod(data.shape[:dim]), data.shape[dim], -1)  # (before, channel, after)
    count = runs.shape[0] * runs.shape[2]
    sums = torch.float64 if data.dtype == torch.float64 else torch.float32
    if runs.shape[2] > 1:  # a channel's elements come in contiguous runs: norms of the runs, no temporary
        square_sum = torch.linalg.vector_norm(runs, dim=-1, dtype=sums).double().square().sum(0)
    else:  # channels innermost (channels-last)
        square_sum = runs.to(sums).square().sum((0, 2)).double()
    mean = runs.sum((0, 2), dtype=sums).double() / count
    variance = (square_sum / count - mean.square()).clamp(min=0.0)
    trusted = torch.isfinite(variance) & (variance > _CANCELLATION * mean.square())
    if not bool(trusted.all()):
        variance = torch.where(trusted, variance, _exact_variance(runs))
    largest, top = _EXPONENTS[tensor.dtype]
    exponents = torch.round(0.5 * torch.log2(variance + EPS)).clamp(-largest, largest).to(torch.int32)
    # |x| <= sqrt(sum of x^2) over its channel: where that, scaled, stays below the dtype's top, nothing overflows
    magnitude = torch.where(torch.isfinite(square_sum), 2 * square_sum.sqrt(), math.inf)
    if bool((torch.log2(magnitude) - exponents >= top - 1).any()):
        finite = torch.isfinite(runs)
        peak = torch.where(finite, runs.abs(), torch.zeros((), dtype=runs.dtype)).amax((0, 2)).double()
        needed = torch.ceil(torch.log2(peak.clamp(min=2.0 ** -1000))).to(torch.int32) - (top - 1)
        exponents = torch.maximum(exponents, needed.clamp(max=largest))
    return exponents


def _exact_variance(runs: torch.Tensor) -> torch.Tensor:
    """Each channel's variance over its finite values, two passes in float64 (0 for a channel without any)."""
    values = runs.double()
    finite = torch.isfinite(values)
    count = finite.sum((0, 2)).clamp(min=1)
    clean = torch.where(finite, values, 0.0)
    mean = clean.sum((0, 2)) / count
    spread = torch.where(finite, clean - mean.view(1, -1, 1), 0.0).square().sum((0, 2))
    return torch.where(torch.isfinite(spread), spread / count, 0.0)


def _powers(exponents: torch.Tensor, like: torch.Tensor, dim: int) -> torch.Tensor:
    """``2^exponents`` in ``like``'s dtype and device, shaped to broadcast along ``dim`` of ``like``."""
    powers = torch.ldexp(torch.ones((), dtype=torch.float64, device=exponents.device),
                         exponents.to(torch.float64)).to(like.dtype).to(like.device)
    if like.dim() <= dim:
        return powers.reshape(())
    shape = [1] * like.dim()
    shape[dim] = -1
    return powers.view(shape)
