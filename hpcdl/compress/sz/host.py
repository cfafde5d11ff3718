"""The host build of the block kernels (hpcdl/_kernels_host*.so, built by setup.py), through ctypes.

Same functions and signatures as reference.py. Callers pass contiguous CPU
tensors whose lengths were validated and whose payloads are 8-byte aligned
(stream.aligned_payload); the C code trusts them. ctypes releases
the GIL during each call, and the library runs its block loops on OpenMP threads.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_double, c_int, c_int64, c_uint64, c_void_p
from pathlib import Path

import torch

from hpcdl.compress.header import DTYPE_CODES
from hpcdl.compress.sz.params import SzParams
from hpcdl.compress.sz.stream import block_count


def _load() -> ctypes.CDLL | None:
    package = Path(__file__).resolve().parents[2]
    for candidate in sorted(package.glob("_kernels_host*.so")):
        library = ctypes.CDLL(str(candidate))
        library.hpcdl_sz_headers.argtypes = [c_int, c_void_p, c_int64, c_int, c_double, c_double, c_double, c_int,
                                             c_void_p, c_void_p]
        library.hpcdl_sz_headers.restype = c_int64
        library.hpcdl_sz_pack.argtypes = [c_int, c_void_p, c_int64, c_int, c_double, c_double, c_double, c_int,
                                          c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_int, c_void_p]
        library.hpcdl_sz_pack.restype = c_int
        library.hpcdl_finite_range.argtypes = [c_int, c_void_p, c_int64, POINTER(c_double), POINTER(c_double)]
        library.hpcdl_finite_range.restype = c_int64
        library.hpcdl_sz_decode.argtypes = [c_int, c_void_p, c_void_p, c_void_p, c_int64, c_int, c_double, c_double,
                                            c_int, c_void_p]
        library.hpcdl_sz_decode.restype = c_int
        library.hpcdl_block_headers.argtypes = [c_void_p, c_int64, c_void_p]
        library.hpcdl_block_headers.restype = None
        library.hpcdl_pack.argtypes = [c_void_p, c_int64, c_void_p, c_void_p, c_void_p]
        library.hpcdl_pack.restype = None
        library.hpcdl_unpack.argtypes = [c_void_p, c_void_p, c_void_p, c_int64, c_void_p]
        library.hpcdl_unpack.restype = None
        library.hpcdl_checksum.argtypes = [c_void_p, c_int64]
        library.hpcdl_checksum.restype = c_uint64
        return library
    return None


LIBRARY = _load()
AVAILABLE = LIBRARY is not None


def _ptr(tensor: torch.Tensor) -> int:
    return tensor.data_ptr()


def _check(status: int) -> int:
    if status < 0:
        raise TypeError("the host kernels got a dtype they do not handle; sz takes float32, float16, bfloat16, float64")
    return status


def value_range(x: torch.Tensor) -> float:
    """max - min over the finite elements in float64, 0.0 if none: hpcdl.compress.value_range, in one pass."""
    lowest, highest = c_double(), c_double()
    finite = _check(LIBRARY.hpcdl_finite_range(DTYPE_CODES[x.dtype], _ptr(x), x.numel(), byref(lowest), byref(highest)))
    return highest.value - lowest.value if finite else 0.0


def sz_headers(x: torch.Tensor, params: SzParams) -> tuple[torch.Tensor, torch.Tensor]:
    n = x.numel()
    headers = torch.empty(block_count(n), dtype=torch.uint8)
    outlier_counts = torch.empty(block_count(n), dtype=torch.int32)
    _check(LIBRARY.hpcdl_sz_headers(DTYPE_CODES[x.dtype], _ptr(x), n, params.kernel_mode, params.eb, params.inv,
                                    params.bound, params.shift, _ptr(headers), _ptr(outlier_counts)))
    return headers, outlier_counts


def sz_pack(x: torch.Tensor, params: SzParams, headers: torch.Tensor, offsets: torch.Tensor,
            outlier_offsets: torch.Tensor, words: torch.Tensor, indices: torch.Tensor, values: torch.Tensor) -> None:
    _check(LIBRARY.hpcdl_sz_pack(DTYPE_CODES[x.dtype], _ptr(x), x.numel(), params.kernel_mode, params.eb, params.inv,
                                 params.bound, params.shift, _ptr(headers), _ptr(offsets), _ptr(outlier_offsets),
                                 _ptr(words), _ptr(indices), int(indices.dtype == torch.int64), _ptr(values)))


def block_headers(q: torch.Tensor) -> torch.Tensor:
    headers = torch.empty(block_count(q.numel()), dtype=torch.uint8)
    LIBRARY.hpcdl_block_headers(_ptr(q), q.numel(), _ptr(headers))
    return headers


def pack(q: torch.Tensor, headers: torch.Tensor, offsets: torch.Tensor, words: torch.Tensor) -> None:
    LIBRARY.hpcdl_pack(_ptr(q), q.numel(), _ptr(headers), _ptr(offsets), _ptr(words))


def unpack(headers: torch.Tensor, offsets: torch.Tensor, words: torch.Tensor, numel: int) -> torch.Tensor:
    q = torch.empty(numel, dtype=torch.int32)
    LIBRARY.hpcdl_unpack(_ptr(headers), _ptr(offsets), _ptr(words), numel, _ptr(q))
    return q


def sz_decode(headers, offsets, words, numel: int, dtype: torch.dtype, params: SzParams) -> torch.Tensor:
    out = torch.empty(numel, dtype=dtype)
    _check(LIBRARY.hpcdl_sz_decode(DTYPE_CODES[dtype], _ptr(headers), _ptr(offsets), _ptr(words), numel,
                                   params.kernel_mode, params.eb, params.bound, params.shift, _ptr(out)))
    return out


def checksum(data: torch.Tensor) -> int:
    return int(LIBRARY.hpcdl_checksum(_ptr(data), data.numel() // 8))
