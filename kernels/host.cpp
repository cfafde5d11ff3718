// Host build of the block functions in sz_block.cuh: OpenMP loops over 32-element blocks,
// exported with C linkage for hpcdl/compress/sz/host.py (ctypes). Built by setup.py into
// hpcdl/_kernels_host*.so with -ffp-contract=off. Arguments are validated in Python first.
//
// OpenMP, because torch's CPU build loads libgomp.so.1 first and this library then shares its runtime:
// one thread team for torch and these loops, sized by torch.set_num_threads. (A separate pool of
// std::threads was measured slower: torch's idle OpenMP threads spin and compete with it.)
#include <string.h>

#include "sz_block.cuh"

// Below these sizes a loop runs on the calling thread: waking a thread team costs more than it saves
// (milliseconds on a busy machine), and activations come in every size.
#define HPCDL_PARALLEL_MIN_BLOCKS 8192  // 262144 elements
#define HPCDL_PARALLEL_MIN_ELEMENTS (1 << 18)  // for the cheap one-pass loops: finite range, checksum

template <class D, int MODE>
static hp_i64 sz_headers(const void* x, hp_i64 n, const HpSzParams& p, hp_u8* headers, hp_i32* outlier_counts) {
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK, outliers = 0;
#pragma omp parallel for schedule(static) reduction(+ : outliers) if (blocks >= HPCDL_PARALLEL_MIN_BLOCKS)
    for (hp_i64 b = 0; b < blocks; ++b) {
        hp_sz_header_block<D, MODE>((const typename D::S*)x, n, b, p, headers, outlier_counts);
        outliers += outlier_counts[b];
    }
    return outliers;
}

template <class D, int MODE>
static void sz_pack(const void* x, hp_i64 n, const HpSzParams& p, const hp_u8* headers, const hp_i64* offsets,
                    const hp_i64* outlier_offsets, hp_u32* words, void* indices, int index64, void* values) {
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK;
#pragma omp parallel for schedule(static) if (blocks >= HPCDL_PARALLEL_MIN_BLOCKS)
    for (hp_i64 b = 0; b < blocks; ++b)
        hp_sz_pack_block<D, MODE>((const typename D::S*)x, n, b, p, headers, offsets, outlier_offsets, words, indices,
                                  index64, (typename D::S*)values);
}

template <class D, int MODE>
static void sz_decode(const hp_u8* headers, const hp_i64* offsets, const hp_u32* words, hp_i64 n,
                      const HpSzParams& p, void* out) {
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK;
#pragma omp parallel for schedule(static) if (blocks >= HPCDL_PARALLEL_MIN_BLOCKS)
    for (hp_i64 b = 0; b < blocks; ++b)
        hp_sz_decode_block<D, MODE>(headers, offsets, words, n, b, p, (typename D::S*)out);
}

// Fused encoder: blocks are cut into parts of HPCDL_PART_BLOCKS; each part is one pass over its input that
// quantizes a block, chooses its header and writes its words and outliers at once (while the block's codes are
// in registers), into scratch at the part's worst-case position (part start * 32 words, part start elements of
// outliers). hpcdl_sz_assemble then moves the parts' words and outliers into the stream. Both steps depend only
// on the part size, not on the thread count, so the bytes are those of the two-pass kernels.
#define HPCDL_PART_BLOCKS 8192

template <class D, int MODE, class I>
static void sz_encode_part(const typename D::S* x, hp_i64 n, hp_i64 part, const HpSzParams& p, hp_u8* headers,
                           hp_u32* words, I* indices, typename D::S* values, hp_i64* part_words,
                           hp_i64* part_outliers) {
    hp_i64 first = part * HPCDL_PART_BLOCKS, blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK;
    hp_i64 last = first + HPCDL_PART_BLOCKS < blocks ? first + HPCDL_PART_BLOCKS : blocks;
    hp_u32* out = words + first * HPCDL_BLOCK;
    I* out_index = indices + first * HPCDL_BLOCK;
    typename D::S* out_value = values + first * HPCDL_BLOCK;
    hp_i64 written = 0, outliers = 0;
    const HpSzParams local = p;  // stores through q may alias p; a local copy may not
    for (hp_i64 b = first; b < last; ++b) {
        hp_i32 q[HPCDL_BLOCK];
        int count = hp_block_count(n, b);
        hp_u32 mask;
        hp_u8 header;
        if (count == HPCDL_BLOCK) {  // the constant count lets the compiler unroll and vectorize whole blocks
            mask = hp_sz_quantize_lanes<D, MODE>(x + b * HPCDL_BLOCK, HPCDL_BLOCK, local, q);
            header = hp_block_header(q, HPCDL_BLOCK);
            hp_block_pack(q, HPCDL_BLOCK, header, out + written);
        } else {
            mask = hp_sz_quantize_lanes<D, MODE>(x + b * HPCDL_BLOCK, count, local, q);
            header = hp_block_header(q, count);
            hp_block_pack(q, count, header, out + written);
        }
        headers[b] = header;
        written += header & 63;
        for (; mask != 0; mask &= mask - 1) {
            hp_i64 i = b * HPCDL_BLOCK + __builtin_ctz(mask);
            out_index[outliers] = (I)i;
            out_value[outliers++] = x[i];
        }
    }
    part_words[part] = written;
    part_outliers[part] = outliers;
}

template <class D, int MODE, class I>
static void sz_encode(const void* x, hp_i64 n, const HpSzParams& p, hp_u8* headers, hp_u32* words, void* indices,
                      void* values, hp_i64* part_words, hp_i64* part_outliers) {
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK, parts = (blocks + HPCDL_PART_BLOCKS - 1) / HPCDL_PART_BLOCKS;
#pragma omp parallel for schedule(dynamic, 1) if (parts > 1)
    for (hp_i64 part = 0; part < parts; ++part)
        sz_encode_part<D, MODE, I>((const typename D::S*)x, n, part, p, headers, words, (I*)indices,
                                   (typename D::S*)values, part_words, part_outliers);
}

template <class D>
static void sz_encode_mode(int mode, int index64, const void* x, hp_i64 n, const HpSzParams& p, hp_u8* headers,
                           hp_u32* words, void* indices, void* values, hp_i64* part_words, hp_i64* part_outliers) {
    if (mode == HPCDL_MODE_PW_REL) {
        if (index64) sz_encode<D, HPCDL_MODE_PW_REL, hp_i64>(x, n, p, headers, words, indices, values, part_words, part_outliers);
        else sz_encode<D, HPCDL_MODE_PW_REL, hp_i32>(x, n, p, headers, words, indices, values, part_words, part_outliers);
    } else {
        if (index64) sz_encode<D, HPCDL_MODE_ABS, hp_i64>(x, n, p, headers, words, indices, values, part_words, part_outliers);
        else sz_encode<D, HPCDL_MODE_ABS, hp_i32>(x, n, p, headers, words, indices, values, part_words, part_outliers);
    }
}

template <class D>
static hp_i64 sz_headers_mode(int mode, const void* x, hp_i64 n, const HpSzParams& p, hp_u8* headers,
                              hp_i32* outlier_counts) {
    if (mode == HPCDL_MODE_PW_REL) return sz_headers<D, HPCDL_MODE_PW_REL>(x, n, p, headers, outlier_counts);
    return sz_headers<D, HPCDL_MODE_ABS>(x, n, p, headers, outlier_counts);
}

template <class D>
static void sz_pack_mode(int mode, const void* x, hp_i64 n, const HpSzParams& p, const hp_u8* headers,
                         const hp_i64* offsets, const hp_i64* outlier_offsets, hp_u32* words, void* indices,
                         int index64, void* values) {
    if (mode == HPCDL_MODE_PW_REL)
        sz_pack<D, HPCDL_MODE_PW_REL>(x, n, p, headers, offsets, outlier_offsets, words, indices, index64, values);
    else
        sz_pack<D, HPCDL_MODE_ABS>(x, n, p, headers, offsets, outlier_offsets, words, indices, index64, values);
}

template <class D>
static void sz_decode_mode(int mode, const hp_u8* headers, const hp_i64* offsets, const hp_u32* words, hp_i64 n,
                           const HpSzParams& p, void* out) {
    if (mode == HPCDL_MODE_PW_REL) sz_decode<D, HPCDL_MODE_PW_REL>(headers, offsets, words, n, p, out);
    else sz_decode<D, HPCDL_MODE_ABS>(headers, offsets, words, n, p, out);
}

// Smallest and largest finite element, in float64 (the range that `rel` scales its bound by).
template <class D>
static hp_i64 finite_range(const void* data, hp_i64 n, double* lowest, double* highest) {
    const typename D::S* x = (const typename D::S*)data;
    double lo = 1.0 / 0.0, hi = -1.0 / 0.0;
    hp_i64 finite = 0;
#pragma omp parallel for simd schedule(static) reduction(min : lo) reduction(max : hi) reduction(+ : finite) \
    if (n >= HPCDL_PARALLEL_MIN_ELEMENTS)
    for (hp_i64 i = 0; i < n; ++i) {
        double v = (double)D::load(x[i]);
        bool is_finite = v - v == 0.0;
        double low_candidate = is_finite ? v : 1.0 / 0.0, high_candidate = is_finite ? v : -1.0 / 0.0;
        lo = low_candidate < lo ? low_candidate : lo;
        hi = high_candidate > hi ? high_candidate : hi;
        finite += is_finite;
    }
    *lowest = lo;
    *highest = hi;
    return finite;
}

extern "C" {

// Writes the smallest and largest finite element of x; returns how many elements are finite, or -1 for an unknown dtype.
hp_i64 hpcdl_finite_range(int dtype, const void* x, hp_i64 n, double* lowest, double* highest) {
    switch (dtype) {
        case HPCDL_DTYPE_F32: return finite_range<HpF32>(x, n, lowest, highest);
        case HPCDL_DTYPE_F16: return finite_range<HpF16>(x, n, lowest, highest);
        case HPCDL_DTYPE_BF16: return finite_range<HpBF16>(x, n, lowest, highest);
        case HPCDL_DTYPE_F64: return finite_range<HpF64>(x, n, lowest, highest);
    }
    return -1;
}


// Encoding pass 1: block headers and per-block outlier counts of x (dtype code `dtype`).
// Returns the number of outliers, or -1 for an unknown dtype.
hp_i64 hpcdl_sz_headers(int dtype, const void* x, hp_i64 n, int mode, double eb, double inv, double bound, int shift,
                        hp_u8* headers, hp_i32* outlier_counts) {
    HpSzParams p = {eb, inv, bound, shift};
    switch (dtype) {
        case HPCDL_DTYPE_F32: return sz_headers_mode<HpF32>(mode, x, n, p, headers, outlier_counts);
        case HPCDL_DTYPE_F16: return sz_headers_mode<HpF16>(mode, x, n, p, headers, outlier_counts);
        case HPCDL_DTYPE_BF16: return sz_headers_mode<HpBF16>(mode, x, n, p, headers, outlier_counts);
        case HPCDL_DTYPE_F64: return sz_headers_mode<HpF64>(mode, x, n, p, headers, outlier_counts);
    }
    return -1;
}

// Encoding pass 2: every block's words at `offsets`, its outliers at `outlier_offsets` (exclusive prefix sums).
// Returns 0, or -1 for an unknown dtype.
int hpcdl_sz_pack(int dtype, const void* x, hp_i64 n, int mode, double eb, double inv, double bound, int shift,
                  const hp_u8* headers, const hp_i64* offsets, const hp_i64* outlier_offsets, hp_u32* words,
                  void* indices, int index64, void* values) {
    HpSzParams p = {eb, inv, bound, shift};
    switch (dtype) {
        case HPCDL_DTYPE_F32:
            sz_pack_mode<HpF32>(mode, x, n, p, headers, offsets, outlier_offsets, words, indices, index64, values);
            return 0;
        case HPCDL_DTYPE_F16:
            sz_pack_mode<HpF16>(mode, x, n, p, headers, offsets, outlier_offsets, words, indices, index64, values);
            return 0;
        case HPCDL_DTYPE_BF16:
            sz_pack_mode<HpBF16>(mode, x, n, p, headers, offsets, outlier_offsets, words, indices, index64, values);
            return 0;
        case HPCDL_DTYPE_F64:
            sz_pack_mode<HpF64>(mode, x, n, p, headers, offsets, outlier_offsets, words, indices, index64, values);
            return 0;
    }
    return -1;
}

// Unpacks and dequantizes every block into out (dtype code `dtype`). Returns 0, or -1 for an unknown dtype.
int hpcdl_sz_decode(int dtype, const hp_u8* headers, const hp_i64* offsets, const hp_u32* words, hp_i64 n, int mode,
                    double eb, double bound, int shift, void* out) {
    HpSzParams p = {eb, 0.0, bound, shift};
    switch (dtype) {
        case HPCDL_DTYPE_F32: sz_decode_mode<HpF32>(mode, headers, offsets, words, n, p, out); return 0;
        case HPCDL_DTYPE_F16: sz_decode_mode<HpF16>(mode, headers, offsets, words, n, p, out); return 0;
        case HPCDL_DTYPE_BF16: sz_decode_mode<HpBF16>(mode, headers, offsets, words, n, p, out); return 0;
        case HPCDL_DTYPE_F64: sz_decode_mode<HpF64>(mode, headers, offsets, words, n, p, out); return 0;
    }
    return -1;
}

hp_u64 hpcdl_checksum(const hp_u64* words, hp_i64 n);

// Fused encoding, step 1: headers of every block into `headers`, and each part's words and outliers into
// scratch (words: 32 per block; indices (int64 if index64, else int32) and values: one per element), with each
// part's word and outlier counts. Returns 0, or -1 for an unknown dtype.
int hpcdl_sz_encode(int dtype, const void* x, hp_i64 n, int mode, double eb, double inv, double bound, int shift,
                    int index64, hp_u8* headers, hp_u32* words, void* indices, void* values, hp_i64* part_words,
                    hp_i64* part_outliers) {
    HpSzParams p = {eb, inv, bound, shift};
    switch (dtype) {
        case HPCDL_DTYPE_F32:
            sz_encode_mode<HpF32>(mode, index64, x, n, p, headers, words, indices, values, part_words, part_outliers);
            return 0;
        case HPCDL_DTYPE_F16:
            sz_encode_mode<HpF16>(mode, index64, x, n, p, headers, words, indices, values, part_words, part_outliers);
            return 0;
        case HPCDL_DTYPE_BF16:
            sz_encode_mode<HpBF16>(mode, index64, x, n, p, headers, words, indices, values, part_words, part_outliers);
            return 0;
        case HPCDL_DTYPE_F64:
            sz_encode_mode<HpF64>(mode, index64, x, n, p, headers, words, indices, values, part_words, part_outliers);
            return 0;
    }
    return -1;
}

// Fused encoding, step 2: the stream payload `data` (`total` bytes; sections at words_at, indices_at, values_at,
// docs/format.md) from the headers and the parts' scratch of hpcdl_sz_encode, zero padding included.
// Returns the payload checksum.
hp_u64 hpcdl_sz_assemble(hp_i64 n, const hp_u8* headers, const hp_u32* words, const hp_u8* indices, int index_size,
                         const hp_u8* values, int value_size, const hp_i64* part_words, const hp_i64* part_outliers,
                         hp_u8* data, hp_i64 words_at, hp_i64 indices_at, hp_i64 values_at, hp_i64 total) {
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK, parts = (blocks + HPCDL_PART_BLOCKS - 1) / HPCDL_PART_BLOCKS;
    memset(data, 0, (size_t)total);
    memcpy(data, headers, (size_t)blocks);
    hp_i64 word_at = words_at, index_at = indices_at, value_at = values_at;
    for (hp_i64 part = 0; part < parts; ++part) {
        hp_i64 start = part * HPCDL_PART_BLOCKS * HPCDL_BLOCK;  // the part's first element, and first scratch word
        memcpy(data + word_at, words + start, (size_t)(4 * part_words[part]));
        memcpy(data + index_at, indices + start * index_size, (size_t)(index_size * part_outliers[part]));
        memcpy(data + value_at, values + start * value_size, (size_t)(value_size * part_outliers[part]));
        word_at += 4 * part_words[part];
        index_at += index_size * part_outliers[part];
        value_at += value_size * part_outliers[part];
    }
    return hpcdl_checksum((const hp_u64*)data, total / 8);
}

// Block headers of int32 codes (the `int` codec).
void hpcdl_block_headers(const hp_i32* q, hp_i64 n, hp_u8* headers) {
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK;
#pragma omp parallel for schedule(static) if (blocks >= HPCDL_PARALLEL_MIN_BLOCKS)
    for (hp_i64 b = 0; b < blocks; ++b) hp_header_block(q, n, b, headers);
}

// Packs codes into words at the blocks' word offsets (exclusive prefix sum of the widths).
void hpcdl_pack(const hp_i32* q, hp_i64 n, const hp_u8* headers, const hp_i64* offsets, hp_u32* words) {
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK;
#pragma omp parallel for schedule(static) if (blocks >= HPCDL_PARALLEL_MIN_BLOCKS)
    for (hp_i64 b = 0; b < blocks; ++b) hp_pack_block(q, n, b, headers, offsets, words);
}

// Unpacks int32 codes (the `int` codec).
void hpcdl_unpack(const hp_u8* headers, const hp_i64* offsets, const hp_u32* words, hp_i64 n, hp_i32* q) {
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK;
#pragma omp parallel for schedule(static) if (blocks >= HPCDL_PARALLEL_MIN_BLOCKS)
    for (hp_i64 b = 0; b < blocks; ++b) hp_unpack_block(headers, offsets, words, n, b, q);
}

// Stream checksum: sum of (2 i + 1) * word[i] over little-endian u64 words, modulo 2^64.
hp_u64 hpcdl_checksum(const hp_u64* words, hp_i64 n) {
    hp_u64 sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum) if (n >= HPCDL_PARALLEL_MIN_ELEMENTS)
    for (hp_i64 i = 0; i < n; ++i) sum += (2 * (hp_u64)i + 1) * words[i];
    return sum;
}

}  // extern "C"
