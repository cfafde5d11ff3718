"""The CUDA build of the block kernels: kernels/sz_cuda.cu compiled at run time by cupy (NVRTC).

Implements hpcdl.compress.blocks.protocol.BlockKernels. sz runs the warp-per-block kernels of
kernels/sz_warp.cuh (docs/gpu.md):

- encode: one pre-pass kernel (rel's range, then sz_stats of the sample for every slack, then of the whole
  tensor with the chosen slack: docs/format.md, section 5), then one encode kernel that resolves the parameters
  from the pre-pass's sums, quantizes, packs, scans the tiles by a decoupled look-back and adds the checksum
  terms; ONE device-to-host read (the summary: sizes, the parameters used, checksum sums); then an assemble
  kernel copies the scratch into the exact-size payload. Raw fallback: one more read (the raw payload's
  checksum).
- decode: one kernel that scans, decodes, scatters the outliers and checks the payload (checksum, block
  headers, outlier indices); ONE device-to-host read of its verdict, so that a corrupted stream raises
  CodecError like every other backend.

Scratch comes from torch's caching allocator on the tensor's device (torch.empty; only the summary and the
tile status words are zeroed), kernels launch on that device's current torch stream, and tensors are passed
to cupy as raw device pointers (no cupy arrays). ``int`` keeps one thread per block (block_headers, pack,
unpack) with torch's prefix sums. cupy is imported on first use only (extras ``[cuda12]``, ``[cuda13]``).

A CPU tensor here means the host emulation of tests/gpu_emulation/ (a stand-in ``cupy`` that runs the same
source compiled for the host); stream handle 0 then.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import numpy as np
import torch

from hpcdl.compress.blocks.params import MANTISSA_BITS, SzParams, compute_dtype, sample_layout
from hpcdl.compress.blocks.protocol import BlockPayload
from hpcdl.compress.blocks.stream import Layout, block_count, index_dtype
from hpcdl.compress.errors import CodecError

RESOLVES_PARAMS = True  # the pre-pass and encode kernels compute SzParams on the device
THREADS = 256  # HPCDL_CTA_THREADS of kernels/sz_warp.cuh
TILE_ELEMENTS = 1024  # HPCDL_TILE_ELEMENTS
INT_THREADS = 128  # the one-thread-per-block kernels of ``int``
REDUCTION_CTAS = 1024  # grid of the grid-stride kernels (range, checksum, assemble)
PREPASS_UNIT, SAMPLE_UNIT = 8192, 2048  # HPCDL_PREPASS_UNIT, HPCDL_SAMPLE_UNIT
SUMMARY_SLOTS = 88  # HPCDL_SUMMARY_SLOTS; the slot numbers below are HPCDL_SUM_*
_CHECKSUM, _INDEX_TERMS, _INDEX_MIXES, _VALUE_TERMS, _VALUE_MIXES, _WORDS, _OUTLIERS, _STATUS = range(4, 12)
_PARAMS = slice(12, 18)  # eb, step, sub[0], sub[1], base[0], base[1] as float64 bits
_READ = slice(4, 18)  # the slots the host reads after encoding, in one copy
_FULL = slice(77, 85)  # sz_stats' sums
_TILE_STATUS_BYTES = 88  # sizeof(HpTileStatus), asserted in kernels/sz_warp.cuh
_BAD = {1: "a block header of more than 32 words", 2: "block headers that do not add up to the stream's words",
        4: "outlier indices out of range or not strictly increasing", 8: "a payload that fails its checksum"}
_MASK64 = 2**64 - 1
_SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64"}


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
        raise ImportError("the sz codec on CUDA tensors needs cupy: pip install 'hpcdl[cuda12]' or 'hpcdl[cuda13]' "
                          "(matching torch.version.cuda)") from err
    directory = kernel_dir()
    source = (directory / "sz_cuda.cu").read_text()
    return cupy, cupy.RawModule(code=source, options=("--fmad=false", "--std=c++14", f"-I{directory}"))


def _argument(value):
    """A kernel argument: a tensor as its device pointer, anything else as it is (numpy scalars)."""
    return np.uint64(value.data_ptr()) if isinstance(value, torch.Tensor) else value


@functools.lru_cache(maxsize=64)
def _external_stream(cupy, handle: int, device_index: int):
    """cupy's handle on torch's stream ``handle`` of device ``device_index``, made once per stream.

    cupy 14 deprecates ``ExternalStream`` (for ``Stream.from_external``, which cupy 13 lacks); its warning is
    ignored here alone, since under warnings-as-errors it would fail every launch."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "ExternalStream is deprecated", DeprecationWarning)
        return cupy.cuda.ExternalStream(handle, device_index)


def _launch(name: str, grid: int, threads: int, device: torch.device, *args) -> None:
    """Launch kernel ``name`` on ``device`` and its current torch stream."""
    if grid == 0:
        return
    cupy, module = _module()
    index = device.index or 0
    handle = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    with cupy.cuda.Device(index), _external_stream(cupy, handle, index):
        module.get_function(name)((grid,), (threads,), tuple(_argument(a) for a in args))


def read_to_host(tensor: torch.Tensor) -> list[int]:
    """The one synchronising read of an encode or decode: a small int64 device tensor's values."""
    return tensor.tolist()


def _zeroed_summary(device: torch.device, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The summary slots and the tiles' look-back status, zeroed in one fill."""
    state = torch.zeros(SUMMARY_SLOTS * 8 + tiles * _TILE_STATUS_BYTES, dtype=torch.uint8, device=device)
    return state[: SUMMARY_SLOTS * 8].view(torch.int64), state[SUMMARY_SLOTS * 8 :]


def _u64(value: int) -> int:
    return value & _MASK64


def _request(params: SzParams, dtype: torch.dtype) -> tuple:
    """HpSzRequest's kernel arguments: mode, rel, bound, abs's eb, shift, the compute type's mantissa bits."""
    eb = params.eb if params.mode == "abs" else 0.0
    return (np.int32(params.kernel_mode), np.int32(params.mode == "rel"), np.float64(params.bound), np.float64(eb),
            np.int32(params.shift), np.int32(MANTISSA_BITS[compute_dtype(dtype)]))


def _prepass(x: torch.Tensor, params: SzParams, summary: torch.Tensor) -> None:
    """The pre-pass kernel: its range, sample and full units, in that ticket order (kernels/sz_warp.cuh)."""
    n = x.numel()
    units = -(-n // PREPASS_UNIT)
    stride, length = sample_layout(n)
    range_units = units if params.mode == "rel" else 0
    sample_units = -(-length // SAMPLE_UNIT) if params.mode != "pw_rel" else 0
    _launch(f"hpcdl_sz_prepass_{_SUFFIX[x.dtype]}", range_units + sample_units + units, THREADS, x.device, x,
            np.int64(n), *_request(params, x.dtype), np.int64(stride), np.int64(length), np.int64(range_units),
            np.int64(sample_units), np.int64(units), summary)


def sz_encode(x: torch.Tensor, params: SzParams, raw_size: int) -> tuple[SzParams, BlockPayload | None]:
    """BlockKernels.sz_encode from SzParams.unresolved: pre-pass, encode, one read of the summary, assemble."""
    n, device, suffix = x.numel(), x.device, _SUFFIX[x.dtype]
    if n == 0:
        data = torch.empty(0, dtype=torch.uint8, device=device)
        return SzParams.for_tensor(params.mode, params.bound, x, sz_stats), BlockPayload(data, 0, 0, 0)
    blocks = block_count(n)
    tiles = (n + TILE_ELEMENTS - 1) // TILE_ELEMENTS
    index_size, value_size = index_dtype(n).itemsize, x.element_size()
    words_at = (blocks + 7) // 8 * 8
    # scratch: headers and words as in the payload, then outlier indices and values, each capped by what a
    # payload no larger than raw_size can hold (a larger stream takes the raw fallback and is never written)
    word_capacity = raw_size // 4
    outlier_capacity = raw_size // (index_size + value_size)
    values_at = _align(words_at + 4 * word_capacity)
    indices_at = _align(values_at + value_size * outlier_capacity)
    scratch = torch.empty(indices_at + index_size * outlier_capacity, dtype=torch.uint8, device=device)
    summary, status = _zeroed_summary(device, tiles)
    _prepass(x, params, summary)
    _launch(f"hpcdl_sz_encode_{suffix}", tiles, THREADS, device, x, np.int64(n), *_request(params, x.dtype),
            scratch, np.int64(words_at), np.int64(word_capacity), scratch[indices_at:], scratch[values_at:],
            np.int64(outlier_capacity), np.int32(index_size == 8), status, summary)
    (checksum, index_terms, index_mixes, value_terms, value_mixes, n_words, n_outliers, _,
     *used) = read_to_host(summary[_READ])
    eb, step, *rest = (_float(bits) for bits in used)
    resolved = SzParams(params.mode, params.bound, eb, params.shift, step, (rest[0], rest[1]), (rest[2], rest[3]))
    layout = Layout(n, n_words, n_outliers, value_size)
    if layout.total > raw_size:
        return resolved, None
    # the outlier sections' terms were summed relative to each section: shift them to where the sections start
    checksum += index_terms + 2 * (layout.indices_at // 8) * index_mixes
    checksum += value_terms + 2 * (layout.values_at // 8) * value_mixes
    data = torch.empty(layout.total, dtype=torch.uint8, device=device)
    _launch("hpcdl_sz_assemble", min(REDUCTION_CTAS, (layout.total // 8 + THREADS - 1) // THREADS), THREADS, device,
            scratch, np.int64(words_at + 4 * n_words), scratch[indices_at:], np.int64(layout.indices_at),
            np.int64(index_size * n_outliers), scratch[values_at:], np.int64(layout.values_at),
            np.int64(value_size * n_outliers), np.int64(layout.total), data)
    return resolved, BlockPayload(data, n_words, n_outliers, _u64(checksum))


def sz_stats(x: torch.Tensor, params: SzParams) -> tuple[int, ...]:
    """BlockKernels.sz_stats: one kernel and one read (the encoder's own statistics are in its pre-pass)."""
    n = x.numel()
    if n == 0:
        return (0,) * 8
    summary, _ = _zeroed_summary(x.device, 0)
    _launch(f"hpcdl_sz_stats_{_SUFFIX[x.dtype]}", min(REDUCTION_CTAS, (n + THREADS - 1) // THREADS), THREADS,
            x.device, x, np.int64(n), np.int32(params.kernel_mode), np.float64(params.eb), np.float64(params.inv),
            np.float64(params.bound), np.int32(params.shift), *_reconstruction(params), summary)
    return tuple(_signed(value) for value in read_to_host(summary[_FULL]))


def _reconstruction(params: SzParams) -> list[np.float64]:
    """SzParams.reconstruction as the kernels' float64 arguments."""
    return [np.float64(value) for value in params.reconstruction]


def _signed(value: int) -> int:
    return value - 2**64 if value >= 2**63 else value


def _align(nbytes: int) -> int:
    return (nbytes + 7) // 8 * 8


def _float(bits: int) -> float:
    return float(np.array([bits], dtype=np.int64).view(np.float64)[0])


def sz_decode(data: torch.Tensor, layout: Layout, expected_checksum: int, dtype: torch.dtype,
              params: SzParams) -> torch.Tensor:
    """BlockKernels.sz_decode: one kernel decodes and checks; one read of its verdict."""
    n, device = layout.numel, data.device
    out = torch.empty(n, dtype=dtype, device=device)
    if n == 0:
        if expected_checksum != 0:
            raise CodecError("sz payload fails its checksum: the packed data is corrupted")
        return out
    tiles = (n + TILE_ELEMENTS - 1) // TILE_ELEMENTS
    summary, status = _zeroed_summary(device, tiles)
    _launch(f"hpcdl_sz_decode_{_SUFFIX[dtype]}", tiles, THREADS, device, data, np.int64(layout.total),
            np.int64(layout.n_words), np.int64(layout.words_at), np.int64(layout.indices_at),
            np.int64(layout.values_at), np.int64(layout.n_outliers), np.int32(index_dtype(n) == torch.int64),
            np.uint64(expected_checksum), np.int64(n), np.int32(params.kernel_mode), np.float64(params.eb),
            np.float64(params.bound), np.int32(params.shift), *_reconstruction(params), out, status, summary)
    bad = read_to_host(summary[_STATUS : _STATUS + 1])[0]
    if bad:
        problems = "; ".join(text for bit, text in _BAD.items() if bad & bit)
        raise CodecError(f"sz stream is corrupted: {problems}")
    return out


def checksum(data: torch.Tensor) -> int:
    """BlockKernels.checksum: one kernel and one read (the raw fallback and ``int`` streams)."""
    count = data.numel() // 8
    if count == 0:
        return 0
    summary, _ = _zeroed_summary(data.device, 0)
    _launch("hpcdl_checksum", min(REDUCTION_CTAS, (count + THREADS - 1) // THREADS), THREADS, data.device,
            data, np.int64(count), summary)
    return _u64(read_to_host(summary[_CHECKSUM : _CHECKSUM + 1])[0])


def _launch_per_block(name: str, numel: int, device: torch.device, *args) -> None:
    blocks = block_count(numel)
    _launch(name, (blocks + INT_THREADS - 1) // INT_THREADS, INT_THREADS, device, *args)


def block_headers(q: torch.Tensor) -> torch.Tensor:
    headers = torch.empty(block_count(q.numel()), dtype=torch.uint8, device=q.device)
    _launch_per_block("hpcdl_block_headers", q.numel(), q.device, q, np.int64(q.numel()), headers)
    return headers


def pack(q: torch.Tensor, headers: torch.Tensor, offsets: torch.Tensor, words: torch.Tensor) -> None:
    _launch_per_block("hpcdl_pack", q.numel(), q.device, q, np.int64(q.numel()), headers, offsets, words)


def unpack(headers: torch.Tensor, offsets: torch.Tensor, words: torch.Tensor, numel: int) -> torch.Tensor:
    q = torch.empty(numel, dtype=torch.int32, device=headers.device)
    _launch_per_block("hpcdl_unpack", numel, headers.device, headers, offsets, words, np.int64(numel), q)
    return q
