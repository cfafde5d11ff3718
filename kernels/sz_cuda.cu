// CUDA kernels of the block codecs. sz: the warp-per-block kernels of sz_warp.cuh (a CTA per tile of
// HPCDL_TILE_BLOCKS blocks, HPCDL_CTA_THREADS threads); int: one thread per block with the block functions of
// sz_block.cuh. Compiled at run time by hpcdl/compress/blocks/cuda.py (cupy RawModule, --fmad=false), at CI time
// by tests/test_kernels_nvcc.py (nvcc for sm_80 and sm_90), and for the host under tests/gpu_emulation/.
#include "sz_warp.cuh"

#define HPCDL_BLOCK_INDEX ((hp_i64)blockIdx.x * blockDim.x + threadIdx.x)
#define HPCDL_BLOCKS(n) (((n) + HPCDL_BLOCK - 1) / HPCDL_BLOCK)

// The reconstruction parameters of HpSzParams, as kernel arguments and as the tail of its initializer.
#define RECONSTRUCTION double step, double sub_positive, double sub_negative, double base_positive, double base_negative
#define PARAMS_TAIL step, {sub_positive, sub_negative}, {base_positive, base_negative}
// What the encoder knows before the data (HpSzRequest), as kernel arguments.
#define REQUEST int mode, int rel, double bound, double eb, int shift, int mantissa

#define HPCDL_SZ_KERNELS(SUFFIX, TYPE)                                                                              \
    extern "C" __global__ void __launch_bounds__(HPCDL_CTA_THREADS) hpcdl_sz_prepass_##SUFFIX(                       \
        const TYPE::S* x, hp_i64 n, REQUEST, hp_i64 sample_stride, hp_i64 sample_length, hp_i64 range_units,        \
        hp_i64 sample_units, hp_i64 full_units, hp_u64* summary) {                                                   \
        HpSzRequest r = {mode, rel, bound, eb, shift, mantissa};                                                     \
        HpSzSample sample = {sample_stride, sample_length};                                                          \
        HpPrepassUnits units = {range_units, sample_units, full_units};                                              \
        if (mode == HPCDL_MODE_PW_REL) hp_sz_prepass<TYPE, HPCDL_MODE_PW_REL>(x, n, r, sample, units, summary);      \
        else hp_sz_prepass<TYPE, HPCDL_MODE_ABS>(x, n, r, sample, units, summary);                                   \
    }                                                                                                                \
    extern "C" __global__ void hpcdl_sz_stats_##SUFFIX(const TYPE::S* x, hp_i64 n, int mode, double eb, double inv, \
                                                       double bound, int shift, RECONSTRUCTION, hp_u64* summary) {   \
        HpSzParams p = {eb, inv, bound, shift, PARAMS_TAIL};                                                         \
        if (mode == HPCDL_MODE_PW_REL) hp_sz_stats<TYPE, HPCDL_MODE_PW_REL>(x, n, p, summary);                       \
        else hp_sz_stats<TYPE, HPCDL_MODE_ABS>(x, n, p, summary);                                                    \
    }                                                                                                                \
    extern "C" __global__ void __launch_bounds__(HPCDL_CTA_THREADS) hpcdl_sz_encode_##SUFFIX(                        \
        const TYPE::S* x, hp_i64 n, REQUEST, hp_u8* prefix, hp_i64 words_at, hp_i64 word_capacity, void* indices,   \
        void* values, hp_i64 outlier_capacity, int index64, HpTileStatus* status, hp_u64* summary) {                 \
        HpSzRequest r = {mode, rel, bound, eb, shift, mantissa};                                                     \
        HpEncodeTargets out = {prefix, words_at, word_capacity, indices, values, outlier_capacity, index64};         \
        if (mode == HPCDL_MODE_PW_REL) hp_sz_encode_tile<TYPE, HPCDL_MODE_PW_REL>(x, n, r, out, status, summary);    \
        else hp_sz_encode_tile<TYPE, HPCDL_MODE_ABS>(x, n, r, out, status, summary);                                 \
    }                                                                                                                \
    extern "C" __global__ void __launch_bounds__(HPCDL_CTA_THREADS) hpcdl_sz_decode_##SUFFIX(                        \
        const hp_u8* payload, hp_i64 total, hp_i64 words, hp_i64 words_at, hp_i64 indices_at, hp_i64 values_at,     \
        hp_i64 outliers, int index64, hp_u64 checksum, hp_i64 n, int mode, double eb, double bound, int shift,      \
        RECONSTRUCTION, TYPE::S* out, HpTileStatus* status, hp_u64* summary) {                                       \
        HpDecodeSource in = {payload, total, words, words_at, indices_at, values_at, outliers, index64, checksum};   \
        HpSzParams p = {eb, 0.0, bound, shift, PARAMS_TAIL};                                                         \
        if (mode == HPCDL_MODE_PW_REL) hp_sz_decode_tile<TYPE, HPCDL_MODE_PW_REL>(in, n, p, out, status, summary);   \
        else hp_sz_decode_tile<TYPE, HPCDL_MODE_ABS>(in, n, p, out, status, summary);                                \
    }

HPCDL_SZ_KERNELS(f32, HpF32)
HPCDL_SZ_KERNELS(f16, HpF16)
HPCDL_SZ_KERNELS(bf16, HpBF16)
HPCDL_SZ_KERNELS(f64, HpF64)

extern "C" __global__ void hpcdl_sz_assemble(const hp_u8* prefix, hp_i64 words_end, const hp_u8* indices,
                                             hp_i64 indices_at, hp_i64 index_bytes, const hp_u8* values,
                                             hp_i64 values_at, hp_i64 value_bytes, hp_i64 total, hp_u8* payload) {
    hp_sz_assemble(prefix, words_end, indices, indices_at, index_bytes, values, values_at, value_bytes, total, payload);
}

// The payload checksum of `count` u64 words, added into summary[HPCDL_SUM_CHECKSUM].
extern "C" __global__ void hpcdl_checksum(const hp_u64* words, hp_i64 count, hp_u64* summary) {
    hp_u64 sum = 0;
    hp_i64 stride = (hp_i64)gridDim.x * blockDim.x;
    for (hp_i64 i = HPCDL_BLOCK_INDEX; i < count; i += stride) sum += hp_checksum_term((hp_u64)i, words[i]);
    sum = hp_warp_sum64(sum);
    if ((threadIdx.x & 31) == 0 && sum) atomicAdd((unsigned long long*)&summary[HPCDL_SUM_CHECKSUM], (unsigned long long)sum);
}

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

// Every kernel above, for the host emulation's table of launchable names (tests/gpu_emulation/).
#define HPCDL_KERNELS(X)                                                                                            \
    X(hpcdl_sz_prepass_f32) X(hpcdl_sz_prepass_f16) X(hpcdl_sz_prepass_bf16) X(hpcdl_sz_prepass_f64)              \
    X(hpcdl_sz_stats_f32) X(hpcdl_sz_stats_f16) X(hpcdl_sz_stats_bf16) X(hpcdl_sz_stats_f64)                        \
    X(hpcdl_sz_encode_f32) X(hpcdl_sz_encode_f16) X(hpcdl_sz_encode_bf16) X(hpcdl_sz_encode_f64)                    \
    X(hpcdl_sz_decode_f32) X(hpcdl_sz_decode_f16) X(hpcdl_sz_decode_bf16) X(hpcdl_sz_decode_f64)                    \
    X(hpcdl_sz_assemble) X(hpcdl_checksum) X(hpcdl_block_headers) X(hpcdl_pack) X(hpcdl_unpack)
