"""The host build of the block kernels (hpcdl/_kernels_host*.so, built by setup.py), through ctypes.

Implements hpcdl.compress.blocks.protocol.BlockKernels, fused where the host gains by it:
``sz_encode`` is the whole sz payload in one pass over the input (the
reference's sz_headers, prefix sums and sz_pack), and ``sz_decode`` validates
the block headers and computes the word offsets itself. Callers pass contiguous CPU
tensors whose lengths were validated and whose payloads are 8-byte aligned
(checksum.aligned_payload); the C code trusts them. HPCDL_HOST_LIBRARY=path loads another build of
kernels/host.cpp instead (the sanitizer test uses it). The C interface is declared once, in
kernels/host_api.h; PROTOTYPES here is checked against it by a test, and a library built from sources
of another ABI version or part size is refused when it loads (ImportError: rebuild it). ctypes releases
the GIL during each call, and the library runs its block loops on OpenMP threads.

The library holds one build of the kernels per instruction set (baseline, avx2,
avx512 on x86-64; setup.py) and runs the best one the CPU supports, all with
identical bytes. ``HPCDL_HOST_ISA=baseline|avx2|avx512`` forces one (an error if
this CPU cannot run it); :func:`active_isa` names the build in use.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import c_char_p, c_double, c_int, c_longlong, c_ulonglong, c_void_p
from pathlib import Path

import torch

from hpcdl.compress.blocks import twopass
from hpcdl.compress.blocks.params import SzParams
from hpcdl.compress.blocks.protocol import BlockPayload
from hpcdl.compress.blocks.stream import BLOCK, Layout, block_count, index_dtype
from hpcdl.compress.errors import CodecError
from hpcdl.compress.header import DTYPE_CODES

ABI_VERSION = 4  # HPCDL_HOST_ABI_VERSION of kernels/host_api.h: raise both together
PART_BLOCKS = 8192  # blocks per part of the fused encoder and the decoder: HPCDL_PART_BLOCKS of kernels/host_api.h
ISA_VARIABLE = "HPCDL_HOST_ISA"
LIBRARY_VARIABLE = "HPCDL_HOST_LIBRARY"
REBUILD = "rebuild it: pip install -e . (or python setup.py build_ext --inplace)"

# The exported functions of kernels/host_api.h, name -> (restype, argtypes); tests/test_block_backends.py checks
# this table against the header's declarations, so a changed argument list fails a test, not a call.
PROTOTYPES: dict[str, tuple[type | None, list[type]]] = {
    "hpcdl_host_abi_version": (c_int, []),
    "hpcdl_host_part_blocks": (c_longlong, []),
    "hpcdl_host_build": (c_char_p, [c_int]),
    "hpcdl_host_runs": (c_int, [c_char_p]),
    "hpcdl_host_select": (c_int, [c_char_p]),
    "hpcdl_host_isa": (c_char_p, []),
    "hpcdl_sz_decode": (c_int, [c_int, c_void_p, c_longlong, c_void_p, c_longlong, c_int, c_double, c_double, c_int,
                                c_void_p, c_void_p, c_void_p]),
    "hpcdl_sz_stats": (c_int, [c_int, c_void_p, c_longlong, c_int, c_double, c_double, c_double, c_int, c_void_p,
                               c_void_p]),
    "hpcdl_sz_encode": (c_int, [c_int, c_void_p, c_longlong, c_int, c_double, c_double, c_double, c_int, c_void_p,
                                c_int, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p]),
    "hpcdl_sz_assemble": (c_ulonglong, [c_longlong, c_void_p, c_void_p, c_void_p, c_int, c_void_p, c_int, c_void_p,
                                        c_void_p, c_void_p, c_longlong, c_longlong, c_longlong, c_longlong]),
    "hpcdl_block_headers": (None, [c_void_p, c_longlong, c_void_p]),
    "hpcdl_pack": (None, [c_void_p, c_longlong, c_void_p, c_void_p, c_void_p]),
    "hpcdl_unpack": (None, [c_void_p, c_void_p, c_void_p, c_longlong, c_void_p]),
    "hpcdl_checksum": (c_ulonglong, [c_void_p, c_longlong]),
    "hpcdl_codes_encode": (c_longlong, [c_void_p, c_void_p, c_void_p, c_longlong, c_int, c_void_p, c_void_p]),
    "hpcdl_codes_escapes": (None, [c_void_p, c_void_p, c_void_p, c_longlong, c_void_p]),
    "hpcdl_codes_decode": (c_int, [c_void_p, c_longlong, c_int, c_void_p, c_longlong, c_int, c_void_p, c_void_p,
                                   c_longlong]),
}


def _candidates() -> list[Path]:
    """The library to load: the file HPCDL_HOST_LIBRARY names (e.g. a sanitizer build), else the built one."""
    chosen = os.environ.get(LIBRARY_VARIABLE)
    if chosen:
        if not Path(chosen).is_file():
            raise ImportError(f"{LIBRARY_VARIABLE}={chosen!r} is not a file; unset it to use the built host library")
        return [Path(chosen)]
    return sorted(Path(__file__).resolve().parents[2].glob("_kernels_host*.so"))


def _bind(library: ctypes.CDLL, path: Path) -> None:
    """Set the prototypes of PROTOTYPES on ``library``, then refuse it (ImportError) unless it was built from
    sources with this ABI version and part size: a stale build would read its arguments wrongly."""
    where = f"the host kernel library {path}" + (f" ({LIBRARY_VARIABLE})" if os.environ.get(LIBRARY_VARIABLE) else "")
    for name, (restype, argtypes) in PROTOTYPES.items():
        try:
            function = getattr(library, name)
        except AttributeError:
            raise ImportError(f"{where} has no function {name}: it was built from older sources; {REBUILD}") from None
        function.restype, function.argtypes = restype, argtypes
    version, part_blocks = library.hpcdl_host_abi_version(), library.hpcdl_host_part_blocks()
    if version != ABI_VERSION:
        raise ImportError(f"{where} has ABI version {version}, this hpcdl needs {ABI_VERSION}: it was built from "
                          f"other sources; {REBUILD}")
    if part_blocks != PART_BLOCKS:
        raise ImportError(f"{where} cuts streams into parts of {part_blocks} blocks, this hpcdl expects "
                          f"{PART_BLOCKS}: it was built from other sources; {REBUILD}")


def _load() -> ctypes.CDLL | None:
    for candidate in _candidates():
        library = ctypes.CDLL(str(candidate))
        _bind(library, candidate)
        return library
    return None


LIBRARY = _load()
AVAILABLE = LIBRARY is not None


def built_isas() -> list[str]:
    """The instruction sets the library has a build for, best first ([] when it is not built)."""
    if LIBRARY is None:
        return []
    names, i = [], 0
    while (name := LIBRARY.hpcdl_host_build(i)) is not None:
        names.append(name.decode())
        i += 1
    return names


def runnable_isas() -> list[str]:
    """The builds this CPU (and its operating system) can run, best first: the first is the default."""
    return [isa for isa in built_isas() if LIBRARY.hpcdl_host_runs(isa.encode()) == 1]


def active_isa() -> str | None:
    """The build every host kernel call runs ("avx512", "avx2" or "baseline"), or None when the library is not built."""
    return LIBRARY.hpcdl_host_isa().decode() if LIBRARY is not None else None


def select_isa(isa: str) -> None:
    """Run the build for ``isa`` from now on; ValueError if the library has none, RuntimeError if this CPU cannot
    run it (nothing changes then). Call it before kernels run on other threads: the choice is process-wide."""
    if LIBRARY is None:
        raise RuntimeError(f"cannot select the {isa!r} host kernels: the host kernel library is not built "
                           "(pip install -e . builds it)")
    status = LIBRARY.hpcdl_host_select(isa.encode())
    if status == -1:
        raise ValueError(f"the host kernel library has no {isa!r} build; use one of {built_isas()}")
    if status == -2:
        raise RuntimeError(f"this CPU cannot run the {isa!r} host kernels (it lacks the instructions they use); "
                           f"it runs {runnable_isas()}")


if os.environ.get(ISA_VARIABLE):
    try:
        select_isa(os.environ[ISA_VARIABLE])
    except (ValueError, RuntimeError) as err:
        raise type(err)(f"{ISA_VARIABLE}={os.environ[ISA_VARIABLE]}: {err}") from None


def _openmp_thread_controls() -> tuple | None:
    """(omp_get_max_threads, omp_set_num_threads) of the OpenMP runtime the library runs on, or None without one."""
    try:
        get_threads, set_threads = LIBRARY.omp_get_max_threads, LIBRARY.omp_set_num_threads
    except AttributeError:
        return None
    get_threads.restype, get_threads.argtypes = c_int, []
    set_threads.restype, set_threads.argtypes = None, [c_int]
    return get_threads, set_threads


_OPENMP = _openmp_thread_controls() if LIBRARY is not None else None


def _use_torch_threads() -> None:
    """Run the next kernel call on as many threads as torch's intra-op pool has (``torch.set_num_threads``).

    The library shares torch's OpenMP runtime, but OpenMP's thread count is per calling thread: torch sets it
    on the thread that called ``set_num_threads`` and on threads that run torch's own parallel loops, while a
    fresh thread (a data loader's, a background encoder's) starts from OMP_NUM_THREADS or every core. Checked
    on every call, so a later ``torch.set_num_threads`` applies too.
    """
    if _OPENMP is None:
        return
    get_threads, set_threads = _OPENMP
    wanted = torch.get_num_threads()
    if get_threads() != wanted:
        set_threads(wanted)


def _ptr(tensor: torch.Tensor) -> int:
    return tensor.data_ptr()


def _check(status: int) -> int:
    if status < 0:
        raise TypeError("the host kernels got a dtype they do not handle; sz takes float32, float16, bfloat16, float64")
    return status


RESOLVES_PARAMS = False  # the codec computes SzParams.for_tensor with sz_stats below


def sz_encode(x: torch.Tensor, params: SzParams, raw_size: int) -> tuple[SzParams, BlockPayload | None]:
    """BlockKernels.sz_encode: :func:`encode_payload` with the params it was given."""
    return params, encode_payload(x, params, raw_size)


def encode_payload(x: torch.Tensor, params: SzParams, raw_size: int) -> BlockPayload | None:
    """The whole sz payload of flat ``x`` in one pass over it: (data, words, outliers, checksum), or None when the
    stream would be larger than ``raw_size`` bytes. The same bytes as the two passes of the reference and the GPU
    (block headers and outlier counts, prefix sums, then words and outliers)."""
    _use_torch_threads()
    n, value_size = x.numel(), x.element_size()
    blocks = block_count(n)
    parts = (blocks + PART_BLOCKS - 1) // PART_BLOCKS
    index_size = index_dtype(n).itemsize
    # One scratch buffer, worst case for every section (only the pages the parts write are ever touched):
    # per-part word and outlier counts, block headers, 32 words per block, an index and a value per element.
    sections = [16 * parts, blocks, 4 * BLOCK * blocks, index_size * n, value_size * n]
    starts = [0]
    for size in sections[:-1]:
        starts.append(starts[-1] + _align64(size))
    scratch = torch.empty(starts[-1] + sections[-1], dtype=torch.uint8)
    counts, headers, words, indices, values = (scratch.data_ptr() + start for start in starts)
    _check(LIBRARY.hpcdl_sz_encode(DTYPE_CODES[x.dtype], _ptr(x), n, params.kernel_mode, params.eb, params.inv,
                                   params.bound, params.shift, _reconstruction(params), int(index_size == 8), headers, words, indices, values,
                                   counts, counts + 8 * parts))
    per_part = scratch[: 16 * parts].view(torch.int64).tolist()
    n_words, n_outliers = sum(per_part[:parts]), sum(per_part[parts:])
    layout = Layout(n, n_words, n_outliers, value_size)
    if layout.total > raw_size:
        return None
    data = torch.empty(layout.total, dtype=torch.uint8)
    checksum = LIBRARY.hpcdl_sz_assemble(n, headers, words, indices, index_size, values, value_size, counts,
                                         counts + 8 * parts, _ptr(data), layout.words_at, layout.indices_at,
                                         layout.values_at, layout.total)
    return BlockPayload(data, n_words, n_outliers, int(checksum))


def sz_stats(x: torch.Tensor, params: SzParams) -> tuple[int, ...]:
    sums = (c_longlong * 8)()
    _check(LIBRARY.hpcdl_sz_stats(DTYPE_CODES[x.dtype], _ptr(x), x.numel(), params.kernel_mode, params.eb,
                                  params.inv, params.bound, params.shift, _reconstruction(params), sums))
    return tuple(sums)


def _reconstruction(params: SzParams) -> ctypes.Array:
    """SzParams.reconstruction as the kernels' array of 5 doubles."""
    return (c_double * 5)(*params.reconstruction)


def _align64(nbytes: int) -> int:
    return (nbytes + 63) // 64 * 64


def block_headers(q: torch.Tensor) -> torch.Tensor:
    _use_torch_threads()
    headers = torch.empty(block_count(q.numel()), dtype=torch.uint8)
    LIBRARY.hpcdl_block_headers(_ptr(q), q.numel(), _ptr(headers))
    return headers


def pack(q: torch.Tensor, headers: torch.Tensor, offsets: torch.Tensor, words: torch.Tensor) -> None:
    _use_torch_threads()
    LIBRARY.hpcdl_pack(_ptr(q), q.numel(), _ptr(headers), _ptr(offsets), _ptr(words))


def unpack(headers: torch.Tensor, offsets: torch.Tensor, words: torch.Tensor, numel: int) -> torch.Tensor:
    _use_torch_threads()
    q = torch.empty(numel, dtype=torch.int32)
    LIBRARY.hpcdl_unpack(_ptr(headers), _ptr(offsets), _ptr(words), numel, _ptr(q))
    return q


def codes_encode(headers: torch.Tensor, offsets: torch.Tensor, words: torch.Tensor, numel: int,
                 bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """reference.codes_encode, in one pass of the calling thread."""
    packed = torch.empty(-(-numel // (8 // bits)), dtype=torch.uint8)
    escapes = torch.empty(numel, dtype=torch.int32)  # pages no escape reaches are never touched
    count = LIBRARY.hpcdl_codes_encode(_ptr(headers), _ptr(offsets), _ptr(words), numel, bits, _ptr(packed),
                                       _ptr(escapes))
    return packed, escapes[:count].clone()


def codes_escapes(headers: torch.Tensor, offsets: torch.Tensor, words: torch.Tensor, numel: int) -> torch.Tensor:
    """reference.codes_escapes, in one pass of the calling thread."""
    counts = torch.zeros(3, dtype=torch.int64)
    LIBRARY.hpcdl_codes_escapes(_ptr(headers), _ptr(offsets), _ptr(words), numel, _ptr(counts))
    return counts


def codes_decode(packed: torch.Tensor, numel: int, bits: int, escapes: torch.Tensor, max_zigzag: int,
                 headers: torch.Tensor, words: torch.Tensor) -> int:
    """reference.codes_decode, in one pass of the calling thread."""
    return LIBRARY.hpcdl_codes_decode(_ptr(packed), numel, bits, _ptr(escapes), escapes.numel(), max_zigzag,
                                      _ptr(headers), _ptr(words), words.numel())


def sz_decode(data: torch.Tensor, layout: Layout, expected_checksum: int, dtype: torch.dtype,
              params: SzParams) -> torch.Tensor:
    """BlockKernels.sz_decode: the checksum and outlier index checks, :func:`decode_blocks`, the outliers."""
    return twopass.sz_decode_checked(checksum, decode_blocks, data, layout, expected_checksum, dtype, params)


def decode_blocks(headers: torch.Tensor, n_words: int, words: torch.Tensor, numel: int, dtype: torch.dtype,
                  params: SzParams) -> torch.Tensor:
    """Decoded flat tensor (outliers still 0), after checking that the block headers have at most 32 words each
    and ``n_words`` in all (CodecError if not): the validation, prefix sum and unpacking in one call."""
    _use_torch_threads()
    out = torch.empty(numel, dtype=dtype)
    part_first_words = torch.empty(max(1, (block_count(numel) + PART_BLOCKS - 1) // PART_BLOCKS), dtype=torch.int64)
    status = LIBRARY.hpcdl_sz_decode(DTYPE_CODES[dtype], _ptr(headers), n_words, _ptr(words), numel,
                                     params.kernel_mode, params.eb, params.bound, params.shift,
                                     _reconstruction(params), _ptr(part_first_words), _ptr(out))
    if status == -2:
        raise CodecError(f"sz block headers are corrupted: a block of more than 32 words, or not {n_words} words in all")
    _check(status)
    return out


def checksum(data: torch.Tensor) -> int:
    _use_torch_threads()
    return int(LIBRARY.hpcdl_checksum(_ptr(data), data.numel() // 8))
