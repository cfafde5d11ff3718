// Host build of the block functions in sz_block.cuh: OpenMP loops over 32-element blocks, gathered in one table
// of the C interface of kernels/host_api.h. setup.py compiles this file once per instruction set (HPCDL_HOST_ISA:
// baseline, avx2, avx512; with -ffp-contract=off and that set's -m flags) into hpcdl/_kernels_host*.so, where
// kernels/host_dispatch.cpp picks the table the CPU runs. Lengths are validated in Python first; sz_decode checks
// the block headers itself before it reads any word.
//
// Everything but the table is in an anonymous namespace: each build's functions, the inline ones of sz_block.cuh
// included, stay internal to it. (With external linkage the linker would keep one copy of an inline function for
// all builds, maybe the AVX-512 one, and the baseline path would run AVX-512 instructions.)
//
// OpenMP, because torch's CPU build loads libgomp.so.1 first and this library then shares its runtime:
// one thread team for torch and these loops, sized by torch.set_num_threads. (A separate pool of
// std::threads was measured slower: torch's idle OpenMP threads spin and compete with it.)
#include <math.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "host_api.h"

#if !defined(HPCDL_HOST_ISA)
#error "define HPCDL_HOST_ISA (baseline, avx2 or avx512): setup.py builds this file once per instruction set"
#endif
// Each ISA's build must have that ISA's vector paths of sz_block.cuh on (checked below), so the flags setup.py
// passes and the CPU test of kernels/host_dispatch.cpp cannot drift apart silently.
#define HPCDL_ISA_baseline 1
#define HPCDL_ISA_avx2 2
#define HPCDL_ISA_avx512 3
#define HPCDL_ISA_CODE(isa) HPCDL_ISA_CODE_(isa)
#define HPCDL_ISA_CODE_(isa) HPCDL_ISA_##isa
#define HPCDL_TABLE(isa) HPCDL_TABLE_(isa)
#define HPCDL_TABLE_(isa) hpcdl_host_kernels_##isa

namespace {

#include "sz_block.cuh"

#if HPCDL_ISA_CODE(HPCDL_HOST_ISA) == HPCDL_ISA_avx512
static_assert(HPCDL_HOST_AVX512, "the avx512 build needs -mavx512f -mavx512bw -mavx512cd -mavx512dq -mavx512vl");
#elif HPCDL_ISA_CODE(HPCDL_HOST_ISA) == HPCDL_ISA_avx2
static_assert(HPCDL_HOST_AVX2 && !HPCDL_HOST_AVX512, "the avx2 build needs -mavx2 and no AVX-512 flag");
#elif HPCDL_ISA_CODE(HPCDL_HOST_ISA) == HPCDL_ISA_baseline
static_assert(!HPCDL_HOST_AVX2, "the baseline build takes no -mavx2 or AVX-512 flag");
#else
#error "HPCDL_HOST_ISA must be baseline, avx2 or avx512"
#endif

// Below these sizes a loop runs on the calling thread: waking a thread team costs more than it saves
// (milliseconds on a busy machine), and activations come in every size.
#define HPCDL_PARALLEL_MIN_BLOCKS 8192  // 262144 elements
#define HPCDL_PARALLEL_MIN_ELEMENTS (1 << 18)  // for the cheap one-pass loops: checksum

// Fused encoder: blocks are cut into parts of HPCDL_PART_BLOCKS (kernels/host_api.h); each part is one pass over its input that
// quantizes a block, chooses its header and writes its words and outliers at once (while the block's codes are
// in registers), into scratch at the part's worst-case position (part start * 32 words, part start elements of
// outliers). sz_assemble then moves the parts' words and outliers into the stream. Both steps depend only
// on the part size, not on the thread count, so the bytes are those of the two-pass kernels.

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

// The quantizer parameters from the C interface's arguments (reconstruction: step, sub[0], sub[1], base[0], base[1]).
static HpSzParams sz_params(double eb, double inv, double bound, int shift, const double* reconstruction) {
    const double* r = reconstruction;
    return HpSzParams{eb, inv, bound, shift, r[0], {r[1], r[2]}, {r[3], r[4]}};
}

// sz_stats (hp_sz_stat_lanes) of the blocks of one part, into part_sums[8].
template <class D, int MODE>
static void sz_stats_part(const typename D::S* x, hp_i64 n, hp_i64 part, const HpSzParams& p, hp_i64* part_sums) {
    hp_i64 first = part * HPCDL_PART_BLOCKS, blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK;
    hp_i64 last = first + HPCDL_PART_BLOCKS < blocks ? first + HPCDL_PART_BLOCKS : blocks;
    hp_i64 sums[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const HpSzParams local = p;
#if HPCDL_HOST_AVX2
    if (MODE == HPCDL_MODE_ABS && sizeof(typename D::S) == 4) {  // float32 (HpF32): the whole blocks as vectors
        hp_i64 whole = last < n / HPCDL_BLOCK ? last : n / HPCDL_BLOCK;
        if (whole > first) hp_sz_stats32_f32_abs((const float*)x + first * HPCDL_BLOCK, whole - first, local, sums);
        first = whole > first ? whole : first;
    }
#endif
    for (hp_i64 b = first; b < last; ++b) {
        int count = hp_block_count(n, b);
        if (count == HPCDL_BLOCK)  // the constant count lets the compiler unroll and vectorize whole blocks
            hp_sz_stat_lanes<D, MODE>(x + b * HPCDL_BLOCK, HPCDL_BLOCK, local, sums);
        else
            hp_sz_stat_lanes<D, MODE>(x + b * HPCDL_BLOCK, count, local, sums);
    }
    for (int k = 0; k < 8; ++k) part_sums[k] = sums[k];
}

// Sums of sz_stats over the parts, added in part order (integers: the order does not change them anyway).
template <class D, int MODE>
static void sz_stats(const void* x, hp_i64 n, const HpSzParams& p, hp_i64* sums) {
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK, parts = (blocks + HPCDL_PART_BLOCKS - 1) / HPCDL_PART_BLOCKS;
    for (int k = 0; k < 8; ++k) sums[k] = 0;
    if (parts == 0) return;
    hp_i64* part_sums = new hp_i64[8 * parts];
#pragma omp parallel for schedule(dynamic, 1) if (parts > 1)
    for (hp_i64 part = 0; part < parts; ++part)
        sz_stats_part<D, MODE>((const typename D::S*)x, n, part, p, part_sums + 8 * part);
    for (hp_i64 part = 0; part < parts; ++part)
        for (int k = 0; k < 8; ++k) sums[k] += part_sums[8 * part + k];
    delete[] part_sums;
}

template <class D>
static void sz_stats_mode(int mode, const void* x, hp_i64 n, const HpSzParams& p, hp_i64* sums) {
    if (mode == HPCDL_MODE_PW_REL) sz_stats<D, HPCDL_MODE_PW_REL>(x, n, p, sums);
    else sz_stats<D, HPCDL_MODE_ABS>(x, n, p, sums);
}

// Decoding: words of the blocks of each part (HPCDL_PART_BLOCKS) start at the sum of the earlier parts' words.
template <class D, int MODE>
static void sz_decode_part(const hp_u8* headers, hp_i64 first_word, const hp_u32* words, hp_i64 n, hp_i64 part,
                           const HpSzParams& p, typename D::S* out) {
    hp_i64 first = part * HPCDL_PART_BLOCKS, blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK;
    hp_i64 last = first + HPCDL_PART_BLOCKS < blocks ? first + HPCDL_PART_BLOCKS : blocks, at = first_word;
    const HpSzParams local = p;  // stores through out may alias p; a local copy may not
    for (hp_i64 b = first; b < last; ++b) {
        int count = hp_block_count(n, b);
        if (count == HPCDL_BLOCK)  // the constant count lets the compiler unroll and vectorize whole blocks
            hp_sz_decode_lanes<D, MODE>(headers[b], words + at, HPCDL_BLOCK, local, out + b * HPCDL_BLOCK);
        else
            hp_sz_decode_lanes<D, MODE>(headers[b], words + at, count, local, out + b * HPCDL_BLOCK);
        at += headers[b] & 63;
    }
}

template <class D, int MODE>
static void sz_decode(const hp_u8* headers, const hp_i64* part_first_words, const hp_u32* words, hp_i64 n,
                      const HpSzParams& p, void* out) {
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK, parts = (blocks + HPCDL_PART_BLOCKS - 1) / HPCDL_PART_BLOCKS;
#pragma omp parallel for schedule(dynamic, 1) if (parts > 1)
    for (hp_i64 part = 0; part < parts; ++part)
        sz_decode_part<D, MODE>(headers, part_first_words[part], words, n, part, p, (typename D::S*)out);
}

template <class D>
static void sz_decode_mode(int mode, const hp_u8* headers, const hp_i64* part_first_words, const hp_u32* words,
                           hp_i64 n, const HpSzParams& p, void* out) {
    if (mode == HPCDL_MODE_PW_REL) sz_decode<D, HPCDL_MODE_PW_REL>(headers, part_first_words, words, n, p, out);
    else sz_decode<D, HPCDL_MODE_ABS>(headers, part_first_words, words, n, p, out);
}

// Checks the block headers (at most 32 words each, n_words in all) and writes each part's first word into
// part_first_words; returns 0, or -2 when the headers are corrupted.
static int part_word_offsets(const hp_u8* headers, hp_i64 blocks, hp_i64 n_words, hp_i64* part_first_words) {
    hp_i64 total = 0;
    int widest = 0;
    for (hp_i64 first = 0; first < blocks; first += HPCDL_PART_BLOCKS) {
        hp_i64 last = first + HPCDL_PART_BLOCKS < blocks ? first + HPCDL_PART_BLOCKS : blocks, sum = 0;
        for (hp_i64 b = first; b < last; ++b) {
            int width = headers[b] & 63;
            sum += width;
            widest = width > widest ? width : widest;
        }
        part_first_words[first / HPCDL_PART_BLOCKS] = total;
        total += sum;
    }
    return widest <= 32 && total == n_words ? 0 : -2;
}


// Validates the block headers against n_words (returns -2 if they are corrupted), then unpacks and dequantizes
// every block into out (dtype code `dtype`); part_first_words is scratch of one int64 per part of
// HPCDL_PART_BLOCKS blocks. Returns 0, or -1 for an unknown dtype.
int sz_decode_dtype(int dtype, const hp_u8* headers, hp_i64 n_words, const hp_u32* words, hp_i64 n, int mode,
                    double eb, double bound, int shift, const double* reconstruction, hp_i64* part_first_words,
                    void* out) {
    if (part_word_offsets(headers, (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK, n_words, part_first_words) != 0) return -2;
    HpSzParams p = sz_params(eb, 0.0, bound, shift, reconstruction);
    switch (dtype) {
        case HPCDL_DTYPE_F32: sz_decode_mode<HpF32>(mode, headers, part_first_words, words, n, p, out); return 0;
        case HPCDL_DTYPE_F16: sz_decode_mode<HpF16>(mode, headers, part_first_words, words, n, p, out); return 0;
        case HPCDL_DTYPE_BF16: sz_decode_mode<HpBF16>(mode, headers, part_first_words, words, n, p, out); return 0;
        case HPCDL_DTYPE_F64: sz_decode_mode<HpF64>(mode, headers, part_first_words, words, n, p, out); return 0;
    }
    return -1;
}

hp_u64 checksum(const hp_u64* words, hp_i64 n);

// The 8 sums of sz_stats (hp_sz_stat_lanes in kernels/sz_block.cuh) over the n elements of x, into sums.
// Returns 0, or -1 for an unknown dtype.
int sz_stats_dtype(int dtype, const void* x, hp_i64 n, int mode, double eb, double inv, double bound, int shift,
                   const double* reconstruction, hp_i64* sums) {
    HpSzParams p = sz_params(eb, inv, bound, shift, reconstruction);
    switch (dtype) {
        case HPCDL_DTYPE_F32: sz_stats_mode<HpF32>(mode, x, n, p, sums); return 0;
        case HPCDL_DTYPE_F16: sz_stats_mode<HpF16>(mode, x, n, p, sums); return 0;
        case HPCDL_DTYPE_BF16: sz_stats_mode<HpBF16>(mode, x, n, p, sums); return 0;
        case HPCDL_DTYPE_F64: sz_stats_mode<HpF64>(mode, x, n, p, sums); return 0;
    }
    return -1;
}

// Fused encoding, step 1: headers of every block into `headers`, and each part's words and outliers into
// scratch (words: 32 per block; indices (int64 if index64, else int32) and values: one per element), with each
// part's word and outlier counts. Returns 0, or -1 for an unknown dtype.
int sz_encode_dtype(int dtype, const void* x, hp_i64 n, int mode, double eb, double inv, double bound, int shift,
                    const double* reconstruction, int index64, hp_u8* headers, hp_u32* words, void* indices,
                    void* values, hp_i64* part_words, hp_i64* part_outliers) {
    HpSzParams p = sz_params(eb, inv, bound, shift, reconstruction);
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
// docs/format.md) from the headers and the parts' scratch of sz_encode_dtype, zero padding included.
// Returns the payload checksum.
hp_u64 sz_assemble(hp_i64 n, const hp_u8* headers, const hp_u32* words, const hp_u8* indices, int index_size,
                   const hp_u8* values, int value_size, const hp_i64* part_words, const hp_i64* part_outliers,
                   hp_u8* data, hp_i64 words_at, hp_i64 indices_at, hp_i64 values_at, hp_i64 total) {
    if (total == 0) return 0;  // an empty tensor: `data` may be NULL, which memset and memcpy must never get
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
    return checksum((const hp_u64*)data, total / 8);
}

// Block headers of int32 codes (the `int` codec).
void block_headers(const hp_i32* q, hp_i64 n, hp_u8* headers) {
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK;
#pragma omp parallel for schedule(static) if (blocks >= HPCDL_PARALLEL_MIN_BLOCKS)
    for (hp_i64 b = 0; b < blocks; ++b) hp_header_block(q, n, b, headers);
}

// Packs codes into words at the blocks' word offsets (exclusive prefix sum of the widths).
void pack(const hp_i32* q, hp_i64 n, const hp_u8* headers, const hp_i64* offsets, hp_u32* words) {
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK;
#pragma omp parallel for schedule(static) if (blocks >= HPCDL_PARALLEL_MIN_BLOCKS)
    for (hp_i64 b = 0; b < blocks; ++b) hp_pack_block(q, n, b, headers, offsets, words);
}

// Unpacks int32 codes (the `int` codec).
void unpack(const hp_u8* headers, const hp_i64* offsets, const hp_u32* words, hp_i64 n, hp_i32* q) {
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK;
#pragma omp parallel for schedule(static) if (blocks >= HPCDL_PARALLEL_MIN_BLOCKS)
    for (hp_i64 b = 0; b < blocks; ++b) hp_unpack_block(headers, offsets, words, n, b, q);
}

// Stream checksum: sum of (2 i + 1) * mix(word[i]) over little-endian u64 words, modulo 2^64, where mix is
// the bijective splitmix64 finalizer (docs/format.md; hpcdl/compress/blocks/reference.py is the specification).
hp_u64 checksum(const hp_u64* words, hp_i64 n) {
    hp_u64 sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum) if (n >= HPCDL_PARALLEL_MIN_ELEMENTS)
    for (hp_i64 i = 0; i < n; ++i) sum += hp_checksum_term((hp_u64)i, words[i]);
    return sum;
}

// The entropy stage's codes layout (hpcdl/compress/codes.py, whose reference functions in
// hpcdl/compress/blocks/reference.py these match byte for byte): a stream's codes, zigzagged, `bits` bits each (2, 4
// or 8), code i in bits (i mod 8/bits) * bits of byte i / (8/bits); a zigzag value of 2^bits - 1 or more is written
// as 2^bits - 1 and the rest of it goes to the next escape. One pass in code order (the escapes are sequential).
//
// codes_encode: from a stream's headers, their word offsets and its words (n codes, from the sz encoder: zigzag
// values below 2^31); writes ceil(n / (8/bits)) bytes to `out` and the escapes to `escapes` (room for n), and
// returns how many escapes it wrote.
template <int BITS>
static long long codes_encode_bits(const hp_u8* headers, const hp_i64* offsets, const hp_u32* words, hp_i64 n,
                                   hp_u8* out, hp_i32* escapes) {
    constexpr hp_u32 escape = (1u << BITS) - 1u;
    constexpr int per_byte = 8 / BITS, block_bytes = HPCDL_BLOCK / per_byte;
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK, written = 0;
    for (hp_i64 b = 0; b < blocks; ++b) {
        hp_i32 q[HPCDL_BLOCK];
        hp_block_unpack(headers[b], words + offsets[b], q);
        int count = hp_block_count(n, b);
        for (int i = count; i < HPCDL_BLOCK; ++i) q[i] = 0;
        hp_u32 u[HPCDL_BLOCK], over = 0;
        for (int i = 0; i < HPCDL_BLOCK; ++i) u[i] = hp_zigzag(q[i]), over |= (hp_u32)(u[i] >= escape);
        if (over) {
            for (int i = 0; i < count; ++i)
                if (u[i] >= escape) escapes[written++] = (hp_i32)(u[i] - escape), u[i] = escape;
        }
        hp_u8 bytes[block_bytes];
        for (int j = 0; j < block_bytes; ++j) {
            hp_u32 byte = 0;
            for (int lane = 0; lane < per_byte; ++lane) byte |= u[j * per_byte + lane] << (lane * BITS);
            bytes[j] = (hp_u8)byte;
        }
        memcpy(out + b * block_bytes, bytes, (size_t)((count + per_byte - 1) / per_byte));
    }
    return written;
}

long long codes_encode(const hp_u8* headers, const hp_i64* offsets, const hp_u32* words, hp_i64 n, int bits,
                       hp_u8* out, hp_i32* escapes) {
    switch (bits) {
        case 2: return codes_encode_bits<2>(headers, offsets, words, n, out, escapes);
        case 4: return codes_encode_bits<4>(headers, offsets, words, n, out, escapes);
        case 8: return codes_encode_bits<8>(headers, offsets, words, n, out, escapes);
        default: return -1;
    }
}

// codes_escapes: how many of the n codes of a stream's blocks (headers, their word offsets, its words) codes_encode
// would write as escapes at 2, 4 and 8 bits (zigzag values of 3, 15, 255 or more), into counts[0..2]: the width
// choice of hpcdl/compress/codes.py in one pass of the calling thread, without materialising the codes.
void codes_escapes(const hp_u8* headers, const hp_i64* offsets, const hp_u32* words, hp_i64 n, hp_i64* counts) {
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK, over2 = 0, over4 = 0, over8 = 0;
    for (hp_i64 b = 0; b < blocks; ++b) {
        hp_i32 q[HPCDL_BLOCK];
        hp_block_unpack(headers[b], words + offsets[b], q);
        int count = hp_block_count(n, b);
        for (int i = 0; i < count; ++i) {
            hp_u32 u = hp_zigzag(q[i]);
            over2 += u >= 3u, over4 += u >= 15u, over8 += u >= 255u;
        }
    }
    counts[0] = over2, counts[1] = over4, counts[2] = over8;
}

// The 32 BITS-bit values of a whole block's bytes (lane i in bits BITS (i mod 8/BITS) .. of byte i / (8/BITS)),
// as the portable loop of codes_decode_bits unpacks them; with AVX2 a few shuffles instead of a loop the
// compilers turn into byte inserts.
template <int BITS>
static void codes_lanes(const hp_u8* bytes, hp_u32* u) {
#if HPCDL_HOST_AVX2
    if (BITS == 8) {
        for (int v = 0; v < 4; ++v)
            _mm256_storeu_si256((__m256i*)(u + 8 * v), _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(bytes + 8 * v))));
    } else if (BITS == 4) {  // low nibbles are the even lanes, high nibbles the odd ones
        const __m128i low_nibble = _mm_set1_epi8(0x0f);
        __m128i in = _mm_loadu_si128((const __m128i*)bytes);
        __m128i low = _mm_and_si128(in, low_nibble), high = _mm_and_si128(_mm_srli_epi16(in, 4), low_nibble);
        __m128i first = _mm_unpacklo_epi8(low, high), second = _mm_unpackhi_epi8(low, high);  // lanes 0-15, 16-31
        _mm256_storeu_si256((__m256i*)u, _mm256_cvtepu8_epi32(first));
        _mm256_storeu_si256((__m256i*)(u + 8), _mm256_cvtepu8_epi32(_mm_srli_si128(first, 8)));
        _mm256_storeu_si256((__m256i*)(u + 16), _mm256_cvtepu8_epi32(second));
        _mm256_storeu_si256((__m256i*)(u + 24), _mm256_cvtepu8_epi32(_mm_srli_si128(second, 8)));
    } else {  // BITS == 2: each byte to four lanes, shifted by 0, 2, 4, 6
        const __m256i shifts = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6), mask = _mm256_set1_epi32(3);
        __m256i in = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)bytes));  // byte j in lane j
        for (int v = 0; v < 4; ++v) {
            __m256i spread = _mm256_permutevar8x32_epi32(in, _mm256_setr_epi32(2 * v, 2 * v, 2 * v, 2 * v, 2 * v + 1,
                                                                                2 * v + 1, 2 * v + 1, 2 * v + 1));
            _mm256_storeu_si256((__m256i*)(u + 8 * v), _mm256_and_si256(_mm256_srlv_epi32(spread, shifts), mask));
        }
    }
#else
    constexpr int per_byte = 8 / BITS;
    for (int j = 0; j < HPCDL_BLOCK / per_byte; ++j)
        for (int lane = 0; lane < per_byte; ++lane)
            u[j * per_byte + lane] = (bytes[j] >> (lane * BITS)) & ((1u << BITS) - 1u);
#endif
}

// codes_decode: the inverse, from untrusted bytes: rebuilds the block headers (one per 32 codes) and the words of
// n codes from `in` (ceil(n / (8/bits)) bytes) and n_escapes escapes, each escape in [0, max_zigzag - 2^bits + 1].
// Returns 0; -1 if an escape is missing, out of range or left over; -2 if a bit past the last code is set; -3 if
// the codes take other than n_words words (nothing is written past words[n_words - 1]); -4 for bits not 2, 4, 8.
template <int BITS>
static int codes_decode_bits(const hp_u8* in, hp_i64 n, const hp_i32* escapes, hp_i64 n_escapes, int max_zigzag,
                             hp_u8* headers, hp_u32* words, hp_i64 n_words) {
    constexpr hp_u32 escape = (1u << BITS) - 1u;
    constexpr int per_byte = 8 / BITS, block_bytes = HPCDL_BLOCK / per_byte;
    hp_i64 blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK, used = 0, written = 0;
    for (hp_i64 b = 0; b < blocks; ++b) {
        int count = hp_block_count(n, b), used_bytes = (count + per_byte - 1) / per_byte;
        hp_u8 bytes[block_bytes] = {0};
        memcpy(bytes, in + b * block_bytes, (size_t)used_bytes);
        if (count % per_byte && (bytes[count / per_byte] >> ((count % per_byte) * BITS)) != 0) return -2;
        hp_u32 u[HPCDL_BLOCK], escaped = 0;
        codes_lanes<BITS>(bytes, u);
        for (int i = 0; i < HPCDL_BLOCK; ++i) escaped |= (hp_u32)(u[i] == escape);
        if (escaped) {
            for (int i = 0; i < count; ++i) {
                if (u[i] != escape) continue;
                if (used == n_escapes) return -1;
                hp_i32 extra = escapes[used++];
                if (extra < 0 || extra > max_zigzag - (hp_i32)escape) return -1;
                u[i] += (hp_u32)extra;
            }
        }
        hp_i32 q[HPCDL_BLOCK];
        for (int i = 0; i < HPCDL_BLOCK; ++i) q[i] = i < count ? hp_unzigzag(u[i]) : 0;
        hp_u8 header = hp_block_header(q, count);
        int width = header & 63;
        if (width > n_words - written) return -3;
        hp_block_pack(q, count, header, words + written);
        headers[b] = header;
        written += width;
    }
    if (used != n_escapes) return -1;
    return written == n_words ? 0 : -3;
}

int codes_decode(const hp_u8* in, hp_i64 n, int bits, const hp_i32* escapes, hp_i64 n_escapes, int max_zigzag,
                 hp_u8* headers, hp_u32* words, hp_i64 n_words) {
    switch (bits) {
        case 2: return codes_decode_bits<2>(in, n, escapes, n_escapes, max_zigzag, headers, words, n_words);
        case 4: return codes_decode_bits<4>(in, n, escapes, n_escapes, max_zigzag, headers, words, n_words);
        case 8: return codes_decode_bits<8>(in, n, escapes, n_escapes, max_zigzag, headers, words, n_words);
        default: return -4;
    }
}

}  // namespace

extern "C" const HpHostKernels HPCDL_TABLE(HPCDL_HOST_ISA) = {
    sz_decode_dtype, sz_stats_dtype, sz_encode_dtype, sz_assemble, block_headers, pack, unpack, checksum,
    codes_encode, codes_escapes, codes_decode,
};
