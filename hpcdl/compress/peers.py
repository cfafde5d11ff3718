"""Peer codecs for side-by-side comparison only: ``sz3`` (SZ3 through pysz) and ``zfp`` (zfpy, fixed accuracy).

Both run on CPU tensors (a CUDA tensor is refused; copy it to the host yourself if you mean to), take float32
and float64, and need the optional extra ``hpcdl[peers]``. Modes ``abs`` and ``rel``; ``rel`` is turned into
an absolute bound with :meth:`ErrorBound.absolute` (``bound * (max - min)`` over the finite values), because
zfp has only an absolute tolerance and because that keeps SZ3's ``rel`` identical to ours. The tensor goes to
the library as 2-D (leading dimensions merged into rows), which measured best for both on conv activations.

Measured behaviour (tests/test_codecs_peers.py asserts it; docs/codecs.md has the details):
- sz3 holds the bound on every finite value and returns NaN and +-Inf exactly, but neither preserves 0.0
  nor signs (a small positive value may decode to 0 or below).
- zfp holds the bound on finite values when the tensor is all finite, but does not preserve zero or signs,
  and a NaN or Inf destroys its whole 4^d block: it comes back as a finite number and its finite neighbours
  leave the bound.

The library's bytes follow an hpcdl header whose fields hold the absolute bound and the stream length, and
whose payload checksum covers the stream; decode checks both before handing bytes to the library, whose
decoders do not validate their input, and maps whatever the library raises to CodecError.
"""

from __future__ import annotations

import importlib
import math
from abc import abstractmethod

import numpy as np
import torch

from hpcdl.compress.base import Codec, ErrorBound, Packed, check_mode
from hpcdl.compress.checksum import payload_checksum, verified_payload
from hpcdl.compress.errors import CodecError
from hpcdl.compress.header import read_header, write_header
from hpcdl.compress.registry import register_codec

_HEADER_FIELDS = "dQ"  # absolute bound, library stream length
# (rows, last dim): on ReLU conv activations (8, 32, 64, 64) at rel 1e-2 this gave both libraries their best
# ratio (sz3 11.0x vs 10.1x as 3-D and 9.4x as 4-D; zfp 5.0x vs 3.5x and 2.9x), so the comparison is fair to them.
_MAX_LIBRARY_DIMS = 2
_NUMPY_DTYPES = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}
# What the libraries raise for a stream they cannot decode; decode turns each into CodecError.
_LIBRARY_ERRORS = (ValueError, RuntimeError, IndexError, OverflowError, MemoryError)


class PeerCodec(Codec):
    """What ``sz3`` and ``zfp`` share: options, CPU-only check, header with checksum, shape folding."""

    modes = ("abs", "rel")
    dtypes = frozenset(_NUMPY_DTYPES)
    error_bounded = True
    package: str

    def __init__(self, mode: str = "rel", bound: float = 1e-2):
        check_mode(self.codec_id, mode, self.modes)
        self.error_bound = ErrorBound(mode, bound)
        self.library = _import_library(self.package, self.codec_id)

    def get_config(self) -> dict:
        return {"id": self.codec_id, "mode": self.error_bound.mode, "bound": self.error_bound.bound}

    def _encode(self, tensor: torch.Tensor) -> Packed:
        if tensor.device.type != "cpu":
            raise ValueError(f"peer codec {self.codec_id!r} runs on CPU tensors only, got one on {tensor.device}; "
                             "use sz for device tensors or pass tensor.cpu()")
        array = tensor.detach().contiguous().numpy()
        absolute = self.error_bound.absolute(tensor)
        stream = self._compress(array.reshape(_library_shape(tensor.shape)), absolute) if array.size else b""
        data = torch.frombuffer(bytearray(stream), dtype=torch.uint8) if stream else torch.empty(0, dtype=torch.uint8)
        header = write_header(self.codec_id, tensor.dtype, tensor.shape, _HEADER_FIELDS, absolute, len(stream),
                              checksum=payload_checksum(data))
        return Packed(header, data)

    def _decode(self, packed: Packed) -> torch.Tensor:
        header = read_header(packed.header, self.codec_id, _HEADER_FIELDS)
        absolute, length = header.fields
        if header.dtype not in _NUMPY_DTYPES or not (math.isfinite(absolute) and absolute >= 0):
            raise CodecError(f"{self.codec_id} header has dtype {header.dtype} and bound {absolute}: corrupted")
        if packed.data.numel() != length:
            raise CodecError(f"{self.codec_id} payload has {packed.data.numel()} bytes, the header says {length}")
        stream = verified_payload(packed.data, header).cpu().numpy().tobytes()
        if header.numel == 0:
            return torch.empty(header.shape, dtype=header.dtype)
        if length == 0:
            raise CodecError(f"{self.codec_id} payload is empty but the header holds {header.numel} values")
        try:
            array = self._decompress(stream, _NUMPY_DTYPES[header.dtype], _library_shape(header.shape), absolute)
        except _LIBRARY_ERRORS as err:  # pysz reports a malformed stream as IndexError, among others
            raise CodecError(f"{self.codec_id} could not decode the stream: {type(err).__name__}: {err}") from err
        if array.size != header.numel or array.dtype != _NUMPY_DTYPES[header.dtype]:
            raise CodecError(f"{self.codec_id} decoded {array.size} {array.dtype} values, the header says "
                             f"{header.numel} {header.dtype}: the stream is corrupted")
        return torch.from_numpy(np.ascontiguousarray(array)).reshape(header.shape)

    @abstractmethod
    def _compress(self, array: np.ndarray, absolute: float) -> bytes:
        """The library's stream for ``array`` at absolute error bound ``absolute``."""

    @abstractmethod
    def _decompress(self, stream: bytes, dtype: np.dtype, shape: tuple[int, ...], absolute: float) -> np.ndarray:
        """The array the library decodes from ``stream`` (checked to be the one ``_compress`` wrote)."""


@register_codec
class Sz3(PeerCodec):
    """SZ3 (pysz) in its absolute error-bound mode."""

    codec_id = "sz3"
    package = "pysz"

    def _compress(self, array: np.ndarray, absolute: float) -> bytes:
        config = self.library.szConfig()
        config.errorBoundMode = self.library.szErrorBoundMode.ABS
        config.absErrorBound = absolute
        compressed, _ratio = self.library.sz.compress(array, config)
        return compressed.tobytes()

    def _decompress(self, stream: bytes, dtype: np.dtype, shape: tuple[int, ...], absolute: float) -> np.ndarray:
        array, _config = self.library.sz.decompress(np.frombuffer(stream, dtype=np.uint8), dtype, shape)
        return array


@register_codec
class Zfp(PeerCodec):
    """zfp (zfpy) in fixed-accuracy mode, tolerance = the absolute bound.

    The stream keeps zfp's own header (shape, type, mode; about 12 bytes), and decode refuses a stream whose
    zfp header disagrees with hpcdl's: zfp's decoder trusts the shape it is given and reads past the end of a
    stream shorter than that shape needs (a segfault, found by tests/stream_fuzz.py)."""

    codec_id = "zfp"
    package = "zfpy"

    def _compress(self, array: np.ndarray, absolute: float) -> bytes:
        return self.library.compress_numpy(array, tolerance=absolute, write_header=True)

    def _decompress(self, stream: bytes, dtype: np.dtype, shape: tuple[int, ...], absolute: float) -> np.ndarray:
        array = self.library.decompress_numpy(stream)
        if array.shape != shape or array.dtype != dtype:
            raise CodecError(f"zfp stream holds {array.shape} {array.dtype}, the hpcdl header says {shape} {dtype}: "
                             "the stream is corrupted")
        return array


def _import_library(package: str, codec_id: str):
    try:
        return importlib.import_module(package)
    except ImportError as err:
        raise ImportError(
            f"codec {codec_id!r} needs the Python package {package!r}: pip install {package} "
            "(or pip install 'hpcdl[peers]')"
        ) from err


def _library_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` with leading dimensions merged down to at most ``_MAX_LIBRARY_DIMS``; a 0-d tensor as one value."""
    shape = tuple(shape) or (1,)
    merged = len(shape) - _MAX_LIBRARY_DIMS + 1
    if merged > 1:
        shape = (math.prod(shape[:merged]),) + shape[merged:]
    return shape
