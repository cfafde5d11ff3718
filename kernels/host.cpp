// Host build of the block functions in sz_block.cuh: OpenMP loops over 32-element blocks,
// exported with C linkage for hpcdl/compress/sz/host.py (ctypes). Built by setup.py into
// hpcdl/_kernels_host*.so with -ffp-contract=off. Arguments are validated in Python first.
#include "sz_block.cuh"

template <class D>
static void sz_encode(const void* x, hp_i64 n, const HpSzParams& p, hp_i32* q, hp_u8* outlier, hp_u8* headers) {
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK;
#pragma omp parallel for schedule(static)
    for (hp_i64 b = 0; b < blocks; ++b)
        hp_sz_encode_block<D>((const typename D::S*)x, n, b, p, q, outlier, headers);
}

template <class D>
static void sz_decode(const hp_u8* headers, const hp_i64* offsets, const hp_u32* words, hp_i64 n,
                      const HpSzParams& p, void* out) {
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK;
#pragma omp parallel for schedule(static)
    for (hp_i64 b = 0; b < blocks; ++b)
        hp_sz_decode_block<D>(headers, offsets, words, n, b, p, (typename D::S*)out);
}

extern "C" {

// Quantizes x (dtype code `dtype`) into codes q, outlier flags and block headers. Returns 0, or -1 for an unknown dtype.
int hpcdl_sz_encode(int dtype, const void* x, hp_i64 n, int mode, double eb, double inv, double bound, int shift,
                    hp_i32* q, hp_u8* outlier, hp_u8* headers) {
    HpSzParams p = {mode, eb, inv, bound, shift};
    switch (dtype) {
        case HPCDL_DTYPE_F32: sz_encode<HpF32>(x, n, p, q, outlier, headers); return 0;
        case HPCDL_DTYPE_F16: sz_encode<HpF16>(x, n, p, q, outlier, headers); return 0;
        case HPCDL_DTYPE_BF16: sz_encode<HpBF16>(x, n, p, q, outlier, headers); return 0;
        case HPCDL_DTYPE_F64: sz_encode<HpF64>(x, n, p, q, outlier, headers); return 0;
    }
    return -1;
}

// Unpacks and dequantizes every block into out (dtype code `dtype`). Returns 0, or -1 for an unknown dtype.
int hpcdl_sz_decode(int dtype, const hp_u8* headers, const hp_i64* offsets, const hp_u32* words, hp_i64 n, int mode,
                    double eb, double bound, int shift, void* out) {
    HpSzParams p = {mode, eb, 0.0, bound, shift};
    switch (dtype) {
        case HPCDL_DTYPE_F32: sz_decode<HpF32>(headers, offsets, words, n, p, out); return 0;
        case HPCDL_DTYPE_F16: sz_decode<HpF16>(headers, offsets, words, n, p, out); return 0;
        case HPCDL_DTYPE_BF16: sz_decode<HpBF16>(headers, offsets, words, n, p, out); return 0;
        case HPCDL_DTYPE_F64: sz_decode<HpF64>(headers, offsets, words, n, p, out); return 0;
    }
    return -1;
}

// Block headers of int32 codes (the `int` codec).
void hpcdl_block_headers(const hp_i32* q, hp_i64 n, hp_u8* headers) {
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK;
#pragma omp parallel for schedule(static)
    for (hp_i64 b = 0; b < blocks; ++b) hp_header_block(q, n, b, headers);
}

// Packs codes into words at the blocks' word offsets (exclusive prefix sum of the widths).
void hpcdl_pack(const hp_i32* q, hp_i64 n, const hp_u8* headers, const hp_i64* offsets, hp_u32* words) {
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK;
#pragma omp parallel for schedule(static)
    for (hp_i64 b = 0; b < blocks; ++b) hp_pack_block(q, n, b, headers, offsets, words);
}

// Unpacks int32 codes (the `int` codec).
void hpcdl_unpack(const hp_u8* headers, const hp_i64* offsets, const hp_u32* words, hp_i64 n, hp_i32* q) {
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK;
#pragma omp parallel for schedule(static)
    for (hp_i64 b = 0; b < blocks; ++b) hp_unpack_block(headers, offsets, words, n, b, q);
}

// Stream checksum: sum of (2 i + 1) * word[i] over little-endian u64 words, modulo 2^64.
hp_u64 hpcdl_checksum(const hp_u64* words, hp_i64 n) {
    hp_u64 sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
    for (hp_i64 i = 0; i < n; ++i) sum += (2 * (hp_u64)i + 1) * words[i];
    return sum;
}

}  // extern "C"
