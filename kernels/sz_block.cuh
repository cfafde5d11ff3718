// Block functions of the hpcdl `sz` and `int` stream formats (docs/format.md).
//
// One source for both machines: under nvcc / NVRTC every function is
// __host__ __device__ and kernels/sz_cuda.cu wraps them in thin __global__
// kernels (one thread per 32-element block); the host compiler builds the same
// functions into hpcdl/_kernels_host*.so through kernels/host.cpp (OpenMP over
// blocks). Every operation is a single IEEE operation (no FMA contraction:
// nvcc --fmad=false, gcc -ffp-contract=off) and float conversions are written
// out bit by bit, so the reference (hpcdl/compress/sz/reference.py), the host
// build and the CUDA build produce identical bytes.
#pragma once

#if defined(__CUDACC__)
#define HPCDL_HD __host__ __device__
#else
#define HPCDL_HD
#include <math.h>
#endif

typedef unsigned char hp_u8;
typedef unsigned short hp_u16;
typedef int hp_i32;
typedef unsigned int hp_u32;
typedef long long hp_i64;
typedef unsigned long long hp_u64;

#define HPCDL_BLOCK 32
// |q| stays below 2^30 so that a Lorenzo difference fits an int32 and its zigzag a uint32.
#define HPCDL_MAX_Q 1073741823
// Block header byte: bits 0..5 width (0..32), bits 6..7 predictor.
#define HPCDL_PRED_ZIGZAG 0    // u = zigzag(q)
#define HPCDL_PRED_UNSIGNED 1  // u = q, every q >= 0 (ReLU outputs, indices)
#define HPCDL_PRED_LORENZO 2   // u = zigzag(q[i] - q[i-1]), q[-1] = 0
#define HPCDL_MODE_ABS 0       // abs and rel: quantize x by the absolute bound eb
#define HPCDL_MODE_PW_REL 2    // pw_rel: quantize the bits of |x| (piecewise log2)
#define HPCDL_DTYPE_F32 1      // dtype codes of hpcdl/compress/header.py
#define HPCDL_DTYPE_F16 2
#define HPCDL_DTYPE_BF16 3
#define HPCDL_DTYPE_F64 4

// ---------------------------------------------------------------- bit casts and conversions

HPCDL_HD inline hp_u32 hp_f2u(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    hp_u32 u;
    __builtin_memcpy(&u, &f, 4);
    return u;
#endif
}
HPCDL_HD inline float hp_u2f(hp_u32 u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
#endif
}
HPCDL_HD inline hp_u64 hp_d2u(double d) {
#if defined(__CUDA_ARCH__)
    return (hp_u64)__double_as_longlong(d);
#else
    hp_u64 u;
    __builtin_memcpy(&u, &d, 8);
    return u;
#endif
}
HPCDL_HD inline double hp_u2d(hp_u64 u) {
#if defined(__CUDA_ARCH__)
    return __longlong_as_double((long long)u);
#else
    double d;
    __builtin_memcpy(&d, &u, 8);
    return d;
#endif
}
HPCDL_HD inline float hp_ceil(float x) { return ceilf(x); }
HPCDL_HD inline double hp_ceil(double x) { return ceil(x); }

HPCDL_HD inline float hp_half_to_float(hp_u16 h) {
    hp_u32 sign = (hp_u32)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    if (exponent == 0x1f) return hp_u2f(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) {
        float magnitude = (float)mantissa * 5.9604644775390625e-8f;  // mantissa * 2^-24, exact
        return sign ? -magnitude : magnitude;
    }
    return hp_u2f(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// Round to nearest even, as torch's float -> float16 cast.
HPCDL_HD inline hp_u16 hp_float_to_half(float f) {
    hp_u32 x = hp_f2u(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (hp_u16)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) return (hp_u16)(sign | 0x7c00u);  // >= 65520 rounds to infinity
    if (ax < 0x38800000u) {                                   // below 2^-14: subnormal half or zero
        if (ax < 0x33000000u) return (hp_u16)sign;            // <= 2^-25 rounds to zero
        hp_u32 e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, shift = 126 - e;
        hp_u32 r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (hp_u16)(sign | r);
    }
    hp_u32 r = (ax >> 13) - (112u << 10), rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (hp_u16)(sign | r);
}

HPCDL_HD inline float hp_bf16_to_float(hp_u16 h) { return hp_u2f((hp_u32)h << 16); }

// Round to nearest even, as torch's float -> bfloat16 cast.
HPCDL_HD inline hp_u16 hp_float_to_bf16(float f) {
    hp_u32 u = hp_f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (hp_u16)0x7fc0u;
    return (hp_u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// ---------------------------------------------------------------- element types
// S: storage type, T: compute type, UT: unsigned integer of T's width, MANTISSA: T's mantissa bits.

struct HpF32 {
    typedef float S; typedef float T; typedef hp_u32 UT;
    HPCDL_HD static T load(S s) { return s; }
    HPCDL_HD static S store(T t) { return t; }
    HPCDL_HD static UT bits(T t) { return hp_f2u(t); }
    HPCDL_HD static T from_bits(UT u) { return hp_u2f(u); }
};
struct HpF16 {
    typedef hp_u16 S; typedef float T; typedef hp_u32 UT;
    HPCDL_HD static T load(S s) { return hp_half_to_float(s); }
    HPCDL_HD static S store(T t) { return hp_float_to_half(t); }
    HPCDL_HD static UT bits(T t) { return hp_f2u(t); }
    HPCDL_HD static T from_bits(UT u) { return hp_u2f(u); }
};
struct HpBF16 {
    typedef hp_u16 S; typedef float T; typedef hp_u32 UT;
    HPCDL_HD static T load(S s) { return hp_bf16_to_float(s); }
    HPCDL_HD static S store(T t) { return hp_float_to_bf16(t); }
    HPCDL_HD static UT bits(T t) { return hp_f2u(t); }
    HPCDL_HD static T from_bits(UT u) { return hp_u2f(u); }
};
struct HpF64 {
    typedef double S; typedef double T; typedef hp_u64 UT;
    HPCDL_HD static T load(S s) { return s; }
    HPCDL_HD static S store(T t) { return t; }
    HPCDL_HD static UT bits(T t) { return hp_d2u(t); }
    HPCDL_HD static T from_bits(UT u) { return hp_u2d(u); }
};

// ---------------------------------------------------------------- quantizer

// Encoder parameters; `inv` and `eb_t` are float64 values the caller computed, cast to T here (round to nearest).
struct HpSzParams {
    int mode;      // HPCDL_MODE_ABS or HPCDL_MODE_PW_REL
    double eb;     // absolute bound (abs, rel)
    double inv;    // 1 / (2 eb)
    double bound;  // pw_rel bound
    int shift;     // pw_rel: low bits of |x| dropped
};

// Decoded value of code q, in compute type T. Unsigned arithmetic so that any q (even from a corrupted stream) is defined.
template <class D>
HPCDL_HD inline typename D::T hp_sz_value(hp_i32 q, const HpSzParams& p) {
    typedef typename D::T T;
    typedef typename D::UT UT;
    if (q == 0) return (T)0;
    hp_u32 magnitude = q < 0 ? 0u - (hp_u32)q : (hp_u32)q;
    T value;
    if (p.mode == HPCDL_MODE_PW_REL) {
        UT half = p.shift > 0 ? ((UT)1 << (p.shift - 1)) : (UT)0;
        value = D::from_bits((((UT)magnitude - 1) << p.shift) | half);
    } else {
        value = (T)(2u * magnitude - 1u) * (T)p.eb;
    }
    return q < 0 ? -value : value;
}

// Code of one element; sets *outlier when the element must be stored exactly instead:
// NaN, +-Inf, -0.0, |q| past HPCDL_MAX_Q, or a decoded value (in the input dtype) that breaks
// the bound, zero or sign. Outliers get code 0.
template <class D>
HPCDL_HD inline hp_i32 hp_sz_quantize(typename D::S stored, const HpSzParams& p, hp_u8* outlier) {
    typedef typename D::T T;
    typedef typename D::UT UT;
    T x = D::load(stored);
    double xd = (double)x;
    *outlier = 1;
    if (!(xd >= -1.79769313486231570e308 && xd <= 1.79769313486231570e308)) return 0;  // NaN, +-Inf
    if (xd == 0.0) {
        *outlier = (D::bits(x) >> (sizeof(UT) * 8 - 1)) ? 1 : 0;  // -0.0 is kept exactly
        return 0;
    }
    T magnitude = x < (T)0 ? -x : x;
    hp_i32 code;
    double tolerance;
    if (p.mode == HPCDL_MODE_PW_REL) {
        UT level = (D::bits(magnitude) >> p.shift) + 1;
        if (level > (UT)HPCDL_MAX_Q) return 0;
        code = (hp_i32)level;
        tolerance = p.bound * (xd < 0 ? -xd : xd);
    } else {
        T level = hp_ceil(magnitude * (T)p.inv);
        if (!(level <= (T)HPCDL_MAX_Q) || level < (T)1) return 0;
        code = (hp_i32)level;
        tolerance = p.eb;
    }
    if (x < (T)0) code = -code;
    double yd = (double)D::load(D::store(hp_sz_value<D>(code, p)));
    double error = xd - yd;
    if (error < 0) error = -error;
    if (!(error <= tolerance) || (xd > 0) != (yd > 0) || (xd < 0) != (yd < 0)) return 0;
    *outlier = 0;
    return code;
}

// ---------------------------------------------------------------- block bit packing

HPCDL_HD inline hp_u32 hp_zigzag(hp_i32 d) { return ((hp_u32)d << 1) ^ (hp_u32)(d >> 31); }
HPCDL_HD inline hp_i32 hp_unzigzag(hp_u32 u) { return (hp_i32)((u >> 1) ^ (0u - (u & 1u))); }
HPCDL_HD inline int hp_bit_width(hp_u32 v) {
#if defined(__CUDA_ARCH__)
    return 32 - __clz((int)v);
#else
    return v ? 32 - __builtin_clz(v) : 0;
#endif
}

// Header byte of one block of `count` (1..32) codes: the predictor with the smallest width (ties: zigzag, unsigned, Lorenzo,
// so an all-zero block has header 0).
HPCDL_HD inline hp_u8 hp_block_header(const hp_i32* q, int count) {
    hp_u32 any_zigzag = 0, any_lorenzo = 0, any_unsigned = 0;
    bool non_negative = true;
    hp_i32 previous = 0;
    for (int i = 0; i < count; ++i) {
        hp_i32 v = q[i];
        any_zigzag |= hp_zigzag(v);
        any_lorenzo |= hp_zigzag((hp_i32)((hp_u32)v - (hp_u32)previous));
        any_unsigned |= (hp_u32)v;
        non_negative = non_negative && v >= 0;
        previous = v;
    }
    int w_zigzag = hp_bit_width(any_zigzag), w_lorenzo = hp_bit_width(any_lorenzo);
    int w_unsigned = non_negative ? hp_bit_width(any_unsigned) : 64;
    if (w_zigzag <= w_unsigned && w_zigzag <= w_lorenzo) return (hp_u8)(w_zigzag | (HPCDL_PRED_ZIGZAG << 6));
    if (w_unsigned <= w_lorenzo) return (hp_u8)(w_unsigned | (HPCDL_PRED_UNSIGNED << 6));
    return (hp_u8)(w_lorenzo | (HPCDL_PRED_LORENZO << 6));
}

// Writes the block's width words: word j holds bit j of the 32 lane values (lanes >= count are 0).
HPCDL_HD inline void hp_block_pack(const hp_i32* q, int count, hp_u8 header, hp_u32* words) {
    int width = header & 63, predictor = header >> 6;
    hp_u32 u[HPCDL_BLOCK];
    hp_i32 previous = 0;
    for (int i = 0; i < HPCDL_BLOCK; ++i) {
        hp_i32 v = i < count ? q[i] : 0;
        if (i >= count) u[i] = 0;
        else if (predictor == HPCDL_PRED_UNSIGNED) u[i] = (hp_u32)v;
        else if (predictor == HPCDL_PRED_LORENZO) u[i] = hp_zigzag((hp_i32)((hp_u32)v - (hp_u32)previous));
        else u[i] = hp_zigzag(v);
        previous = v;
    }
    for (int j = 0; j < width; ++j) {
        hp_u32 word = 0;
        for (int i = 0; i < HPCDL_BLOCK; ++i) word |= ((u[i] >> j) & 1u) << i;
        words[j] = word;
    }
}

// Inverse of hp_block_pack for a validated header (width <= 32, predictor 0..2); writes 32 codes.
HPCDL_HD inline void hp_block_unpack(hp_u8 header, const hp_u32* words, hp_i32* q) {
    int width = header & 63, predictor = header >> 6;
    hp_u32 u[HPCDL_BLOCK];
    for (int i = 0; i < HPCDL_BLOCK; ++i) u[i] = 0;
    for (int j = 0; j < width; ++j) {
        hp_u32 word = words[j];
        for (int i = 0; i < HPCDL_BLOCK; ++i) u[i] |= ((word >> i) & 1u) << j;
    }
    hp_u32 previous = 0;
    for (int i = 0; i < HPCDL_BLOCK; ++i) {
        if (predictor == HPCDL_PRED_UNSIGNED) q[i] = (hp_i32)u[i];
        else if (predictor == HPCDL_PRED_LORENZO) q[i] = (hp_i32)(previous += (hp_u32)hp_unzigzag(u[i]));
        else q[i] = hp_unzigzag(u[i]);
    }
}

// ---------------------------------------------------------------- whole-block steps (one thread per block)

HPCDL_HD inline int hp_block_count(hp_i64 n, hp_i64 block) {
    hp_i64 left = n - block * HPCDL_BLOCK;
    return left < HPCDL_BLOCK ? (int)left : HPCDL_BLOCK;
}

template <class D>
HPCDL_HD inline void hp_sz_encode_block(const typename D::S* x, hp_i64 n, hp_i64 block, const HpSzParams& p,
                                        hp_i32* q, hp_u8* outlier, hp_u8* headers) {
    hp_i64 start = block * HPCDL_BLOCK;
    int count = hp_block_count(n, block);
    for (int i = 0; i < count; ++i) q[start + i] = hp_sz_quantize<D>(x[start + i], p, &outlier[start + i]);
    headers[block] = hp_block_header(q + start, count);
}

template <class D>
HPCDL_HD inline void hp_sz_decode_block(const hp_u8* headers, const hp_i64* offsets, const hp_u32* words, hp_i64 n,
                                        hp_i64 block, const HpSzParams& p, typename D::S* out) {
    hp_i32 q[HPCDL_BLOCK];
    hp_block_unpack(headers[block], words + offsets[block], q);
    hp_i64 start = block * HPCDL_BLOCK;
    int count = hp_block_count(n, block);
    for (int i = 0; i < count; ++i) out[start + i] = D::store(hp_sz_value<D>(q[i], p));
}

HPCDL_HD inline void hp_header_block(const hp_i32* q, hp_i64 n, hp_i64 block, hp_u8* headers) {
    headers[block] = hp_block_header(q + block * HPCDL_BLOCK, hp_block_count(n, block));
}

HPCDL_HD inline void hp_pack_block(const hp_i32* q, hp_i64 n, hp_i64 block, const hp_u8* headers,
                                   const hp_i64* offsets, hp_u32* words) {
    hp_block_pack(q + block * HPCDL_BLOCK, hp_block_count(n, block), headers[block], words + offsets[block]);
}

HPCDL_HD inline void hp_unpack_block(const hp_u8* headers, const hp_i64* offsets, const hp_u32* words, hp_i64 n,
                                     hp_i64 block, hp_i32* q) {
    hp_i32 lanes[HPCDL_BLOCK];
    hp_block_unpack(headers[block], words + offsets[block], lanes);
    hp_i64 start = block * HPCDL_BLOCK;
    int count = hp_block_count(n, block);
    for (int i = 0; i < count; ++i) q[start + i] = lanes[i];
}
