"""``sz``: error-bounded lossy compression of float tensors in independent 32-element blocks.

>>> codec = get_codec({"id": "sz", "mode": "rel", "bound": 1e-2})
>>> restored = codec.decode(codec.encode(activation))

Quantize by the bound (params.py), predict inside each block (none, unsigned or
1-D Lorenzo, whichever packs narrower), bit-pack each block at its own width,
keep the elements the quantizer cannot hold exactly as outliers. The format is
in docs/format.md; reference.py is its specification, and host.py (CPU) and
cuda.py (GPU) run the same kernel source, kernels/sz_block.cuh, with identical bytes.
"""

from __future__ import annotations

import warnings
from functools import partial
from types import ModuleType

import torch

from hpcdl.compress.base import ERROR_BOUND_MODES, FLOAT_DTYPES, Codec, ErrorBound, Packed, check_mode
from hpcdl.compress.checksum import payload_checksum, verified_payload
from hpcdl.compress.errors import CodecError
from hpcdl.compress.header import read_header, write_header
from hpcdl.compress.registry import register_codec
from hpcdl.compress.sz import host, reference
from hpcdl.compress.sz.params import CODE_MODES, MANTISSA_BITS, MODE_CODES, SzParams, compute_dtype
from hpcdl.compress.sz.stream import (
    BLOCK,
    Layout,
    check_payload_length,
    raw_payload,
    raw_payload_size,
    validate_block_headers,
    validate_outlier_indices,
    word_offsets,
)

BACKENDS = ("auto", "reference", "host", "cuda")
# mode code, flags, block size, pw_rel shift, bound, eb, words, outliers (docs/format.md)
FIELDS = "BBBBddQQ"
FLAG_RAW = 1
_warned_no_host = False


def backend_module(backend: str, device: torch.device) -> ModuleType:
    """The kernel implementation for ``backend`` on ``device``; "auto" picks cuda on a GPU, else host."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown sz backend {backend!r}; use one of {list(BACKENDS)}")
    if backend == "auto":
        backend = "cuda" if device.type == "cuda" else "host" if device.type == "cpu" else "reference"
    if backend == "cuda":
        if device.type != "cuda":
            raise ValueError(f"the cuda backend takes CUDA tensors, got a tensor on {device}")
        from hpcdl.compress.sz import cuda

        return cuda
    if backend == "host":
        if device.type != "cpu":
            raise ValueError(f"the host backend takes CPU tensors, got a tensor on {device}")
        if host.AVAILABLE:
            return host
        global _warned_no_host
        if not _warned_no_host:
            _warned_no_host = True
            warnings.warn("hpcdl's host kernel library is not built (pip install -e . builds it); "
                          "sz runs the slow PyTorch reference", RuntimeWarning, stacklevel=3)
    return reference


def encode_with(backend: str, tensor: torch.Tensor, mode: str, bound: float) -> Packed:
    """Encode with a chosen implementation ("reference", "host", "cuda" or "auto"): tests compare their bytes."""
    return Sz(mode, bound).encode_with(tensor, backend)


def decode_with(backend: str, packed: Packed) -> torch.Tensor:
    """Decode with a chosen implementation."""
    return Sz.decode_with(packed, backend)


def _encode_two_passes(kernels: ModuleType, x: torch.Tensor, params: SzParams,
                       raw_size: int) -> tuple[torch.Tensor, int, int, int] | None:
    """The payload of flat ``x`` as (data, words, outliers, checksum), or None when it would be larger than
    ``raw_size`` bytes: block headers and outlier counts, their prefix sums, then the words and outliers (the
    host library fuses these steps into one pass: host.sz_encode)."""
    headers, outlier_counts = kernels.sz_headers(x, params)
    offsets, n_words = word_offsets(headers)
    outlier_ends = torch.cumsum(outlier_counts, 0)
    n_outliers = int(outlier_ends[-1]) if x.numel() else 0
    layout = Layout(x.numel(), n_words, n_outliers, x.element_size())
    if layout.total > raw_size:
        return None
    data = torch.zeros(layout.total, dtype=torch.uint8, device=x.device)
    layout.headers(data).copy_(headers)
    kernels.sz_pack(x, params, headers, offsets, outlier_ends - outlier_counts, layout.words(data),
                    layout.indices(data), layout.values(data, x.dtype))
    return data, n_words, n_outliers, payload_checksum(data, kernels)


@register_codec
class Sz(Codec):
    """Error-bounded block codec: ``Sz(mode="rel", bound=1e-2)``; modes abs, rel, pw_rel."""

    codec_id = "sz"
    modes = ERROR_BOUND_MODES
    dtypes = FLOAT_DTYPES
    error_bounded = True

    def __init__(self, mode: str = "rel", bound: float = 1e-2):
        check_mode(self.codec_id, mode, self.modes)
        self.error_bound = ErrorBound(mode, bound)

    def get_config(self) -> dict:
        return {"id": self.codec_id, "mode": self.error_bound.mode, "bound": self.error_bound.bound}

    def _encode(self, tensor: torch.Tensor) -> Packed:
        return self.encode_with(tensor, "auto")

    def _decode(self, packed: Packed) -> torch.Tensor:
        return self.decode_with(packed, "auto")

    def encode_with(self, tensor: torch.Tensor, backend: str) -> Packed:
        if not isinstance(tensor, torch.Tensor) or tensor.dtype not in self.dtypes:
            return self.encode(tensor)  # raises the contract's TypeError
        kernels = backend_module(backend, tensor.device)
        x = tensor.detach().contiguous().reshape(-1)
        n = x.numel()
        params = SzParams.for_tensor(self.error_bound.mode, self.error_bound.bound, x)
        raw_size = raw_payload_size(n, x.dtype)
        encode = host.sz_encode if kernels is host else partial(_encode_two_passes, kernels)
        encoded = encode(x, params, raw_size)
        if encoded is None:
            flags, n_words, n_outliers = FLAG_RAW, 0, 0
            data = raw_payload(x)
            checksum = payload_checksum(data, kernels)
        else:
            flags = 0
            data, n_words, n_outliers, checksum = encoded
        header = write_header(
            self.codec_id, tensor.dtype, tensor.shape, FIELDS, MODE_CODES[params.mode], flags, BLOCK, params.shift,
            params.bound, params.eb, n_words, n_outliers, checksum=checksum,
        )
        return Packed(header, data)

    @classmethod
    def decode_with(cls, packed: Packed, backend: str) -> torch.Tensor:
        if not isinstance(packed, Packed):
            raise TypeError(f"sz decodes a Packed, got {type(packed).__name__}")
        header = read_header(packed.header, cls.codec_id, FIELDS)
        mode_code, flags, block, shift, bound, eb, n_words, n_outliers = header.fields
        dtype, n = header.dtype, header.numel
        if (dtype not in FLOAT_DTYPES or mode_code not in CODE_MODES or flags not in (0, FLAG_RAW) or block != BLOCK
                or shift > MANTISSA_BITS[compute_dtype(dtype)] or not eb >= 0 or n_outliers > n):
            raise CodecError(f"sz packed header has impossible fields {header.fields} for {dtype}: corrupted")
        layout = Layout(n, n_words, n_outliers, dtype.itemsize)
        check_payload_length(packed.data, raw_payload_size(n, dtype) if flags == FLAG_RAW else layout.total,
                             cls.codec_id)
        kernels = backend_module(backend, packed.device)
        data = verified_payload(packed.data, header, kernels)
        if flags == FLAG_RAW:
            return data[: n * dtype.itemsize].clone().view(dtype).reshape(header.shape)
        headers = layout.headers(data)
        indices = layout.indices(data)
        validate_outlier_indices(indices, n, cls.codec_id)
        params = SzParams(CODE_MODES[mode_code], bound, eb, shift)
        if kernels is host:  # validates the block headers itself, in the same pass as their prefix sum
            restored = host.sz_decode(headers, n_words, layout.words(data), n, dtype, params)
        else:
            validate_block_headers(headers, n_words, cls.codec_id)
            offsets, _ = word_offsets(headers)
            restored = kernels.sz_decode(headers, offsets, layout.words(data), n, dtype, params)
        restored[indices.to(torch.int64)] = layout.values(data, dtype)
        return restored.reshape(header.shape)
