"""The CUDA build of the block kernels: kernels/sz_cuda.cu compiled at run time by cupy.

Implements hpcdl.compress.blocks.protocol.BlockKernels with the same per-block passes as reference.py
(sz_headers, sz_pack, decode_blocks), the same names and signatures. Tensors stay where they are:
cupy sees torch's CUDA memory through __cuda_array_interface__ (zero copy), and
kernels launch on torch's current stream. One thread handles one 32-element
block with the same block functions the host build runs, so both produce the
same bytes. cupy is imported on first use only (optional extra ``[cuda]``).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from hpcdl.compress.blocks import reference, twopass
from hpcdl.compress.blocks.params import SzParams
from hpcdl.compress.blocks.protocol import BlockPayload
from hpcdl.compress.blocks.stream import block_count

THREADS = 128
_SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64"}
# bfloat16 has no __cuda_array_interface__ type: the kernels see 16-bit storage.
_STORAGE = {torch.float16: torch.int16, torch.bfloat16: torch.int16}


def kernel_dir() -> Path:
    """kernels/ of the installed package (setup.py copies it) or of the source tree."""
    package = Path(__file__).resolve().parents[2]
    for candidate in (package / "kernels", package.parent / "kernels"):
        if (candidate / "sz_cuda.cu").is_file():
            return candidate
    raise FileNotFoundError(f"kernels/sz_cuda.cu not found next to {package}; reinstall hpcdl")


@functools.cache
def _module():
    try:
        import cupy
    except ImportError as err:
        raise ImportError("the sz codec on CUDA tensors needs cupy: pip install 'hpcdl[cuda]'") from err
    directory = kernel_dir()
    source = (directory / "sz_cuda.cu").read_text()
    return cupy, cupy.RawModule(code=source, options=("--fmad=false", "--std=c++14", f"-I{directory}"))


def _argument(cupy, value):
    """A zero-copy cupy view of a CUDA tensor (a null pointer for an empty one, which the kernels never read)."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.numel() == 0:
        return np.uint64(0)
    return cupy.asarray(value.view(_STORAGE.get(value.dtype, value.dtype)))


def _launch(name: str, numel: int, *args) -> None:
    cupy, module = _module()
    blocks = block_count(numel)
    if blocks == 0:
        return
    converted = [_argument(cupy, a) for a in args]
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    with stream:
        module.get_function(name)(((blocks + THREADS - 1) // THREADS,), (THREADS,), tuple(converted))


def _reconstruction(params: SzParams) -> list[np.float64]:
    """SzParams.reconstruction as the kernels' float64 arguments."""
    return [np.float64(value) for value in params.reconstruction]


sz_stats = reference.sz_stats  # integer sums: torch runs them on the device, with the same result as the host


def sz_headers(x: torch.Tensor, params: SzParams) -> tuple[torch.Tensor, torch.Tensor]:
    n = x.numel()
    headers = torch.empty(block_count(n), dtype=torch.uint8, device=x.device)
    outlier_counts = torch.empty(block_count(n), dtype=torch.int32, device=x.device)
    _launch(f"hpcdl_sz_headers_{_SUFFIX[x.dtype]}", n, x, np.int64(n), np.int32(params.kernel_mode),
            np.float64(params.eb), np.float64(params.inv), np.float64(params.bound), np.int32(params.shift),
            *_reconstruction(params), headers, outlier_counts)
    return headers, outlier_counts


def sz_pack(x: torch.Tensor, params: SzParams, headers: torch.Tensor, offsets: torch.Tensor,
            outlier_offsets: torch.Tensor, words: torch.Tensor, indices: torch.Tensor, values: torch.Tensor) -> None:
    n = x.numel()
    _launch(f"hpcdl_sz_pack_{_SUFFIX[x.dtype]}", n, x, np.int64(n), np.int32(params.kernel_mode),
            np.float64(params.eb), np.float64(params.inv), np.float64(params.bound), np.int32(params.shift),
            *_reconstruction(params), headers, offsets, outlier_offsets, words, indices, np.int32(indices.dtype == torch.int64), values)


def block_headers(q: torch.Tensor) -> torch.Tensor:
    headers = torch.empty(block_count(q.numel()), dtype=torch.uint8, device=q.device)
    _launch("hpcdl_block_headers", q.numel(), q, np.int64(q.numel()), headers)
    return headers


def pack(q: torch.Tensor, headers: torch.Tensor, offsets: torch.Tensor, words: torch.Tensor) -> None:
    _launch("hpcdl_pack", q.numel(), q, np.int64(q.numel()), headers, offsets, words)


def unpack(headers: torch.Tensor, offsets: torch.Tensor, words: torch.Tensor, numel: int) -> torch.Tensor:
    q = torch.empty(numel, dtype=torch.int32, device=headers.device)
    _launch("hpcdl_unpack", numel, headers, offsets, words, np.int64(numel), q)
    return q


def decode_blocks(headers: torch.Tensor, offsets: torch.Tensor, words: torch.Tensor, numel: int, dtype: torch.dtype,
                  params: SzParams) -> torch.Tensor:
    out = torch.empty(numel, dtype=dtype, device=headers.device)
    _launch(f"hpcdl_sz_decode_{_SUFFIX[dtype]}", numel, headers, offsets, words, np.int64(numel),
            np.int32(params.kernel_mode), np.float64(params.eb), np.float64(params.bound), np.int32(params.shift),
            *_reconstruction(params), out)
    return out


checksum = reference.checksum  # a weighted sum: torch runs it on the device


def sz_encode(x: torch.Tensor, params: SzParams, raw_size: int) -> BlockPayload | None:
    """BlockKernels.sz_encode: sz_headers, the prefix sums (torch on the device), then sz_pack."""
    return twopass.sz_encode(sz_headers, sz_pack, checksum, x, params, raw_size)


def sz_decode(headers: torch.Tensor, n_words: int, words: torch.Tensor, numel: int, dtype: torch.dtype,
              params: SzParams) -> torch.Tensor:
    """BlockKernels.sz_decode: validate the block headers, then decode_blocks."""
    return twopass.sz_decode(decode_blocks, headers, n_words, words, numel, dtype, params)
