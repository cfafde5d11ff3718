// CUDA build of the block functions in sz_block.cuh: one thread per 32-element block.
// Compiled at run time by hpcdl/compress/blocks/cuda.py (cupy RawModule, --fmad=false) and
// at CI time by tests/test_kernels_nvcc.py (nvcc for sm_80 and sm_90).
#include "sz_block.cuh"

#define HPCDL_BLOCK_INDEX ((hp_i64)blockIdx.x * blockDim.x + threadIdx.x)
#define HPCDL_BLOCKS(n) (((n) + HPCDL_BLOCK - 1) / HPCDL_BLOCK)

// The reconstruction parameters of HpSzParams, as kernel arguments and as the tail of its initializer.
#define RECONSTRUCTION double step, double sub_positive, double sub_negative, double base_positive, double base_negative
#define PARAMS_TAIL step, {sub_positive, sub_negative}, {base_positive, base_negative}

#define HPCDL_SZ_KERNELS(SUFFIX, TYPE)                                                                              \
    extern "C" __global__ void hpcdl_sz_headers_##SUFFIX(const TYPE::S* x, hp_i64 n, int mode, double eb,           \
                                                         double inv, double bound, int shift, RECONSTRUCTION,      \
                                                         hp_u8* headers, hp_i32* outlier_counts) {                                   \
        hp_i64 b = HPCDL_BLOCK_INDEX;                                                                                \
        if (b >= HPCDL_BLOCKS(n)) return;                                                                            \
        HpSzParams p = {eb, inv, bound, shift, PARAMS_TAIL};                                                                  \
        if (mode == HPCDL_MODE_PW_REL) hp_sz_header_block<TYPE, HPCDL_MODE_PW_REL>(x, n, b, p, headers, outlier_counts); \
        else hp_sz_header_block<TYPE, HPCDL_MODE_ABS>(x, n, b, p, headers, outlier_counts);                          \
    }                                                                                                                \
    extern "C" __global__ void hpcdl_sz_pack_##SUFFIX(const TYPE::S* x, hp_i64 n, int mode, double eb, double inv,  \
                                                      double bound, int shift, RECONSTRUCTION, const hp_u8* headers, \
                                                      const hp_i64* offsets, const hp_i64* outlier_offsets,          \
                                                      hp_u32* words, void* indices, int index64, TYPE::S* values) {  \
        hp_i64 b = HPCDL_BLOCK_INDEX;                                                                                \
        if (b >= HPCDL_BLOCKS(n)) return;                                                                            \
        HpSzParams p = {eb, inv, bound, shift, PARAMS_TAIL};                                                                  \
        if (mode == HPCDL_MODE_PW_REL)                                                                               \
            hp_sz_pack_block<TYPE, HPCDL_MODE_PW_REL>(x, n, b, p, headers, offsets, outlier_offsets, words, indices, \
                                                      index64, values);                                              \
        else                                                                                                         \
            hp_sz_pack_block<TYPE, HPCDL_MODE_ABS>(x, n, b, p, headers, offsets, outlier_offsets, words, indices,    \
                                                   index64, values);                                                 \
    }                                                                                                                \
    extern "C" __global__ void hpcdl_sz_decode_##SUFFIX(const hp_u8* headers, const hp_i64* offsets,                 \
                                                        const hp_u32* words, hp_i64 n, int mode, double eb,          \
                                                        double bound, int shift, RECONSTRUCTION, TYPE::S* out) {     \
        hp_i64 b = HPCDL_BLOCK_INDEX;                                                                                \
        if (b >= HPCDL_BLOCKS(n)) return;                                                                            \
        HpSzParams p = {eb, 0.0, bound, shift, PARAMS_TAIL};                                                                  \
        if (mode == HPCDL_MODE_PW_REL) hp_sz_decode_block<TYPE, HPCDL_MODE_PW_REL>(headers, offsets, words, n, b, p, out); \
        else hp_sz_decode_block<TYPE, HPCDL_MODE_ABS>(headers, offsets, words, n, b, p, out);                        \
    }

HPCDL_SZ_KERNELS(f32, HpF32)
HPCDL_SZ_KERNELS(f16, HpF16)
HPCDL_SZ_KERNELS(bf16, HpBF16)
HPCDL_SZ_KERNELS(f64, HpF64)

extern "C" __global__ void hpcdl_block_headers(const hp_i32* q, hp_i64 n, hp_u8* headers) {
    hp_i64 b = HPCDL_BLOCK_INDEX;
    if (b < HPCDL_BLOCKS(n)) hp_header_block(q, n, b, headers);
}

extern "C" __global__ void hpcdl_pack(const hp_i32* q, hp_i64 n, const hp_u8* headers, const hp_i64* offsets,
                                      hp_u32* words) {
    hp_i64 b = HPCDL_BLOCK_INDEX;
    if (b < HPCDL_BLOCKS(n)) hp_pack_block(q, n, b, headers, offsets, words);
}

extern "C" __global__ void hpcdl_unpack(const hp_u8* headers, const hp_i64* offsets, const hp_u32* words, hp_i64 n,
                                        hp_i32* q) {
    hp_i64 b = HPCDL_BLOCK_INDEX;
    if (b < HPCDL_BLOCKS(n)) hp_unpack_block(headers, offsets, words, n, b, q);
}
