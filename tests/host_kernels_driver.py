"""Round-trips buffers through the host kernel library with ctypes alone: no torch, no hpcdl import.

So it starts in a second even under qemu-user, where tests/test_host_isa.py runs it as an older CPU (no AVX-512,
no AVX2) to prove the library loads there, picks the build that CPU runs, and computes the same bytes.

    python tests/host_kernels_driver.py LIBRARY [ISA]

selects ISA (default: the library's own choice) and prints one line: the active build, and the SHA-256 of every
output of every kernel (sz encode and decode in abs and pw_rel mode for float32, float64, float16 and bfloat16 bit
patterns, with the stats sums; int codes' headers, packing and unpacking; checksum). It exits non-zero if a round trip
breaks: decoded codes differ, or a decoded element is off by more than the bound and not an outlier.
"""

import ctypes
import hashlib
import math
import random
import struct
import sys
from ctypes import byref, c_char_p, c_double, c_int, c_int64, c_uint64, c_void_p

N = 4099  # 129 blocks, the last one partial; one encoder part, so the scratch words are the stream's words
BLOCK = 32
DTYPES = {"float32": (1, "f", 4, 23), "float16": (2, "H", 2, 10), "bfloat16": (3, "H", 2, 7), "float64": (4, "d", 8, 52)}


def load(path: str) -> ctypes.CDLL:
    library = ctypes.CDLL(path)
    library.hpcdl_host_select.argtypes = [c_char_p]
    library.hpcdl_host_isa.restype = c_char_p
    library.hpcdl_sz_encode.argtypes = [c_int, c_void_p, c_int64, c_int, c_double, c_double, c_double, c_int,
                                        c_void_p, c_int, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p]
    library.hpcdl_sz_stats.argtypes = [c_int, c_void_p, c_int64, c_int, c_double, c_double, c_double, c_int, c_void_p,
                                       c_void_p]
    library.hpcdl_sz_decode.argtypes = [c_int, c_void_p, c_int64, c_void_p, c_int64, c_int, c_double, c_double, c_int,
                                        c_void_p, c_void_p, c_void_p]
    library.hpcdl_block_headers.argtypes = [c_void_p, c_int64, c_void_p]
    library.hpcdl_pack.argtypes = [c_void_p, c_int64, c_void_p, c_void_p, c_void_p]
    library.hpcdl_unpack.argtypes = [c_void_p, c_void_p, c_void_p, c_int64, c_void_p]
    library.hpcdl_checksum.argtypes = [c_void_p, c_int64]
    library.hpcdl_checksum.restype = c_uint64
    return library


def float_values(rng: random.Random) -> list[float]:
    """Activation-like values with the special cases every path must treat alike."""
    values = [rng.gauss(0, 1) * 10 ** rng.randint(-3, 3) for _ in range(N)]
    for i in range(0, N, 97):
        values[i] = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e30, 1e-30, 3e38][i % 8]
    for i in range(1, N, 5):
        values[i] = max(values[i], 0.0)  # ReLU-like runs
    return values


def element_bits(name: str, values: list[float]) -> bytes:
    if name == "float32":
        return struct.pack(f"<{N}f", *values)
    if name == "float64":
        return struct.pack(f"<{N}d", *values)
    if name == "bfloat16":  # float32's high half: truncation, which is fine for test input
        return b"".join(struct.pack("<f", v)[2:] for v in values)
    return struct.pack(f"<{N}e", *[v if abs(v) < 65504 or not math.isfinite(v) else math.copysign(65504, v)
                                   for v in values])


def pw_rel_shift(mantissa: int, compute_mantissa: int, bound: float) -> int:
    """hpcdl.compress.blocks.params.pw_rel_shift for a dtype of ``mantissa`` bits computed in ``compute_mantissa``."""
    kept = math.floor(mantissa + 1 + math.log2(bound))
    return (compute_mantissa - mantissa) + min(max(kept, 0), mantissa)


def sz_round_trip(library, digest, name: str, data: bytes, mode: int, bound: float) -> None:
    code, _, size, mantissa = DTYPES[name]
    blocks = (N + BLOCK - 1) // BLOCK
    eb, shift = (bound, 0) if mode == 0 else (0.0, pw_rel_shift(mantissa, 52 if name == "float64" else 23, bound))
    # a valid reconstruction (docs/format.md, section 5): abs bins of 2 eb (1 - 1/8), decoded off their centres
    step = 2.0 * eb * (1 - 1 / 8)
    half = (1 << shift) >> 1
    reconstruction = (c_double * 5)(*((step, eb / 2, eb / 3, eb + step / 2 + eb / 10, eb + step / 2 - eb / 10)
                                      if mode == 0 else (0.0, 0.0, 0.0, half, max(half - 1, 0))))
    inv = 1.0 / step if eb > 0 else math.inf
    x = ctypes.create_string_buffer(data, len(data))
    headers = (ctypes.c_uint8 * blocks)()
    words = (ctypes.c_uint32 * (BLOCK * blocks))()
    indices = (ctypes.c_int32 * N)()
    values = ctypes.create_string_buffer(size * N)
    part_words, part_outliers = c_int64(), c_int64()
    sums = (c_int64 * 8)()
    assert library.hpcdl_sz_stats(code, x, N, mode, eb, inv, bound, shift, reconstruction, sums) == 0
    digest.update(bytes(sums))
    assert library.hpcdl_sz_encode(code, x, N, mode, eb, inv, bound, shift, reconstruction, 0, headers, words, indices, values,
                                   byref(part_words), byref(part_outliers)) == 0
    n_words, n_outliers = part_words.value, part_outliers.value
    for part in (bytes(headers), bytes(words)[: 4 * n_words], bytes(indices)[: 4 * n_outliers],
                 values.raw[: size * n_outliers]):
        digest.update(part)
    out = ctypes.create_string_buffer(size * N)
    part_first_words = c_int64()
    assert library.hpcdl_sz_decode(code, headers, n_words, words, N, mode, eb, bound, shift, reconstruction,
                                   byref(part_first_words), out) == 0
    digest.update(out.raw)
    if name in ("float32", "float64"):  # the bound holds on every element that is not an outlier
        fmt = f"<{N}{DTYPES[name][1]}"
        original, decoded = struct.unpack(fmt, data), struct.unpack(fmt, out.raw)
        outliers = set(indices[:n_outliers])
        for i, (a, b) in enumerate(zip(original, decoded)):
            tolerance = eb if mode == 0 else bound * abs(a)
            if i not in outliers and not abs(a - b) <= tolerance:
                sys.exit(f"{name} mode {mode}: element {i} decoded to {b}, from {a}, beyond the bound")


def int_round_trip(library, digest, rng: random.Random) -> None:
    blocks = (N + BLOCK - 1) // BLOCK
    codes = [rng.choice([0, 1, rng.randint(0, 300), rng.randint(-2**31, 2**31 - 1)]) for _ in range(N)]
    q = (ctypes.c_int32 * N)(*codes)
    headers = (ctypes.c_uint8 * blocks)()
    library.hpcdl_block_headers(q, N, headers)
    offsets, total = (ctypes.c_int64 * blocks)(), 0
    for b in range(blocks):
        offsets[b], total = total, total + (headers[b] & 63)
    words = (ctypes.c_uint32 * max(total, 1))()
    library.hpcdl_pack(q, N, headers, offsets, words)
    restored = (ctypes.c_int32 * N)()
    library.hpcdl_unpack(headers, offsets, words, N, restored)
    if list(restored) != codes:
        sys.exit("int codes did not round-trip")
    digest.update(bytes(headers))
    digest.update(bytes(words))
    digest.update(struct.pack("<Q", library.hpcdl_checksum(words, total // 2)))


def main() -> None:
    library = load(sys.argv[1])
    if len(sys.argv) > 2 and (status := library.hpcdl_host_select(sys.argv[2].encode())) != 0:
        sys.exit(f"cannot select {sys.argv[2]!r}: status {status}")
    rng = random.Random(0)
    values = float_values(rng)
    digest = hashlib.sha256()
    for name in DTYPES:
        data = element_bits(name, values)
        for mode, bound in ((0, 1e-2), (0, 1e-4), (2, 1e-2), (2, 1e-3)):
            sz_round_trip(library, digest, name, data, mode, bound)
    int_round_trip(library, digest, rng)
    print(library.hpcdl_host_isa().decode(), digest.hexdigest())


if __name__ == "__main__":
    main()
