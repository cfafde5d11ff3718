// Block functions of the hpcdl `sz` and `int` stream formats (docs/format.md).
//
// One source for both machines: under nvcc / NVRTC every function is
// __host__ __device__ and kernels/sz_cuda.cu wraps them in thin __global__
// kernels (one thread per 32-element block); the host compiler builds the same
// functions into hpcdl/_kernels_host*.so through kernels/host.cpp (OpenMP over
// blocks). Every operation is a single IEEE operation (no FMA contraction:
// nvcc --fmad=false, gcc -ffp-contract=off) and float conversions are written
// out bit by bit, so the reference (hpcdl/compress/blocks/reference.py), the host
// build and the CUDA build produce identical bytes.
#pragma once

#if defined(__CUDACC__)
#define HPCDL_HD __host__ __device__
#else
#define HPCDL_HD
#include <math.h>
#endif

// Block steps the host's per-block loops must inline (their loops only vectorize once the count is a constant).
#if defined(__CUDACC__)
#define HPCDL_HD_INLINE __host__ __device__ __forceinline__
#else
#define HPCDL_HD_INLINE inline __attribute__((always_inline))
#endif

// x86 vector paths of the host build (kernels/host.cpp, built with -march=native): same results as the portable
// loops, which nvcc and other hosts compile.
#if !defined(__CUDACC__) && defined(__AVX512F__)
#define HPCDL_HOST_AVX512 1
#define HPCDL_HOST_AVX2 1
#include <immintrin.h>
// GCC 12 warns about the deliberately undefined vectors inside its own AVX-512 intrinsics (a false positive)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#elif !defined(__CUDACC__) && defined(__AVX2__)
#define HPCDL_HOST_AVX512 0
#define HPCDL_HOST_AVX2 1
#include <immintrin.h>
#else
#define HPCDL_HOST_AVX512 0
#define HPCDL_HOST_AVX2 0
#endif

typedef unsigned char hp_u8;
typedef unsigned short hp_u16;
typedef int hp_i32;
typedef unsigned int hp_u32;
typedef long long hp_i64;
typedef unsigned long long hp_u64;

#define HPCDL_BLOCK 32
// |q| <= 2^29 (exact in float32), so a Lorenzo difference fits an int32 and its zigzag a uint32.
#define HPCDL_MAX_Q 536870912
// Block header byte: bits 0..5 the block's number of 32-bit words (0..32), bits 6..7 the predictor.
#define HPCDL_PRED_ZIGZAG 0    // u = zigzag(q)
#define HPCDL_PRED_UNSIGNED 1  // u = q, every q >= 0 (ReLU outputs, indices)
#define HPCDL_PRED_LORENZO 2   // u = zigzag(q[i] - q[i-1]), q[-1] = 0
#define HPCDL_PRED_SPARSE 3    // every q >= 0: a mask word of the nonzero lanes, then their q - 1 densely packed
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
    union { float f; hp_u32 u; } pun;  // GCC and Clang define union type punning; memcpy would block vectorizing
    pun.f = f;
    return pun.u;
#endif
}
HPCDL_HD inline float hp_u2f(hp_u32 u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    union { hp_u32 u; float f; } pun;
    pun.u = u;
    return pun.f;
#endif
}
HPCDL_HD inline hp_u64 hp_d2u(double d) {
#if defined(__CUDA_ARCH__)
    return (hp_u64)__double_as_longlong(d);
#else
    union { double d; hp_u64 u; } pun;
    pun.d = d;
    return pun.u;
#endif
}
HPCDL_HD inline double hp_u2d(hp_u64 u) {
#if defined(__CUDA_ARCH__)
    return __longlong_as_double((long long)u);
#else
    union { hp_u64 u; double d; } pun;
    pun.u = u;
    return pun.d;
#endif
}

// ---------------------------------------------------------------- IEEE arithmetic whatever the flush-to-zero mode

// The element functions' arithmetic in the compute type T (float or double), with subnormals kept on every
// machine. cupy compiles every kernel with -ftz=true (cupy/cuda/compiler.py appends it), which makes float32
// +, -, *, comparisons, fabsf and the float <-> double conversions flush subnormal inputs and results to zero,
// while the host keeps them: the first run on an H200 gave other bytes than the host for every tensor with a
// float32 or bfloat16 subnormal. On the device the float versions are PTX instructions without .ftz, which keep
// subnormals whatever the flag; on the host, and for double (never flushed), the plain operators.
HPCDL_HD inline float hp_abs(float x) { return hp_u2f(hp_f2u(x) & 0x7fffffffu); }
HPCDL_HD inline double hp_abs(double x) { return fabs(x); }

HPCDL_HD inline double hp_add(double a, double b) { return a + b; }
HPCDL_HD inline double hp_sub(double a, double b) { return a - b; }
HPCDL_HD inline double hp_mul(double a, double b) { return a * b; }
HPCDL_HD inline bool hp_lt(double a, double b) { return a < b; }
HPCDL_HD inline bool hp_le(double a, double b) { return a <= b; }
HPCDL_HD inline hp_i32 hp_trunc(double a) { return (hp_i32)a; }
HPCDL_HD inline double hp_widen(double a) { return a; }
#if defined(__CUDA_ARCH__)
__device__ inline float hp_add(float a, float b) {
    float r;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ inline float hp_sub(float a, float b) {
    float r;
    asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ inline float hp_mul(float a, float b) {
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ inline bool hp_lt(float a, float b) {
    hp_u32 r;
    asm("{\n\t.reg .pred p;\n\tsetp.lt.f32 p, %1, %2;\n\tselp.u32 %0, 1, 0, p;\n\t}" : "=r"(r) : "f"(a), "f"(b));
    return r != 0u;
}
__device__ inline bool hp_le(float a, float b) {
    hp_u32 r;
    asm("{\n\t.reg .pred p;\n\tsetp.le.f32 p, %1, %2;\n\tselp.u32 %0, 1, 0, p;\n\t}" : "=r"(r) : "f"(a), "f"(b));
    return r != 0u;
}
__device__ inline hp_i32 hp_trunc(float a) {
    hp_i32 r;
    asm("cvt.rzi.s32.f32 %0, %1;" : "=r"(r) : "f"(a));
    return r;
}
__device__ inline double hp_widen(float a) {
    double r;
    asm("cvt.f64.f32 %0, %1;" : "=d"(r) : "f"(a));
    return r;
}
__device__ inline float hp_narrow_f32(double a) {
    float r;
    asm("cvt.rn.f32.f64 %0, %1;" : "=f"(r) : "d"(a));
    return r;
}
#else
inline float hp_add(float a, float b) { return a + b; }
inline float hp_sub(float a, float b) { return a - b; }
inline float hp_mul(float a, float b) { return a * b; }
inline bool hp_lt(float a, float b) { return a < b; }
inline bool hp_le(float a, float b) { return a <= b; }
inline hp_i32 hp_trunc(float a) { return (hp_i32)a; }
inline double hp_widen(float a) { return (double)a; }
inline float hp_narrow_f32(double a) { return (float)a; }
#endif

// A float64 parameter in the compute type T, rounded to nearest.
template <class T>
HPCDL_HD inline T hp_narrow(double a);
template <>
HPCDL_HD inline float hp_narrow<float>(double a) { return hp_narrow_f32(a); }
template <>
HPCDL_HD inline double hp_narrow<double>(double a) { return a; }

HPCDL_HD inline float hp_half_to_float(hp_u16 h) {
    hp_u32 sign = (hp_u32)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    if (exponent == 0x1f) return hp_u2f(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) {
        float magnitude = hp_mul((float)mantissa, 5.9604644775390625e-8f);  // mantissa * 2^-24, exact
        return hp_u2f(hp_f2u(magnitude) | sign);
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
    static const hp_u32 INF_BITS = 0x7f800000u;
    typedef float S; typedef float T; typedef hp_u32 UT;
    HPCDL_HD static T load(S s) { return s; }
    HPCDL_HD static S store(T t) { return t; }
    HPCDL_HD static UT bits(T t) { return hp_f2u(t); }
    HPCDL_HD static T from_bits(UT u) { return hp_u2f(u); }
};
struct HpF16 {
    static const hp_u32 INF_BITS = 0x7f800000u;
    typedef hp_u16 S; typedef float T; typedef hp_u32 UT;
    HPCDL_HD static T load(S s) { return hp_half_to_float(s); }
    HPCDL_HD static S store(T t) { return hp_float_to_half(t); }
    HPCDL_HD static UT bits(T t) { return hp_f2u(t); }
    HPCDL_HD static T from_bits(UT u) { return hp_u2f(u); }
};
struct HpBF16 {
    static const hp_u32 INF_BITS = 0x7f800000u;
    typedef hp_u16 S; typedef float T; typedef hp_u32 UT;
    HPCDL_HD static T load(S s) { return hp_bf16_to_float(s); }
    HPCDL_HD static S store(T t) { return hp_float_to_bf16(t); }
    HPCDL_HD static UT bits(T t) { return hp_f2u(t); }
    HPCDL_HD static T from_bits(UT u) { return hp_u2f(u); }
};
struct HpF64 {
    static const hp_u64 INF_BITS = 0x7ff0000000000000ull;
    typedef double S; typedef double T; typedef hp_u64 UT;
    HPCDL_HD static T load(S s) { return s; }
    HPCDL_HD static S store(T t) { return t; }
    HPCDL_HD static UT bits(T t) { return hp_d2u(t); }
    HPCDL_HD static T from_bits(UT u) { return hp_u2d(u); }
};

// ---------------------------------------------------------------- quantizer

// Encoder and decoder parameters; the float64 values are cast to T where they are used (round to nearest).
// The mode (HPCDL_MODE_ABS or HPCDL_MODE_PW_REL) is a template argument so that the element loops vectorize.
// Index 0 of sub and base is for x > 0, index 1 for x < 0 (docs/format.md, section 5).
struct HpSzParams {
    double eb;       // absolute bound (abs, rel)
    double inv;      // 1 / step (encoder only)
    double bound;    // pw_rel bound
    int shift;       // pw_rel: low bits of |x| dropped
    double step;     // abs: width of the bins of levels >= 2
    double sub[2];   // abs: decoded magnitude of level 1, the elements with 0 < |x| <= eb
    double base[2];  // abs: decoded magnitude of level 2; pw_rel: the value of the dropped low bits (an integer)
};

// Fixed-point unit of the sz_stats sums of abs mode: eb / 2^HPCDL_STAT_BITS.
#define HPCDL_STAT_BITS 20


// Decoded value of code q, in compute type T. Branch-free, and in unsigned arithmetic so that any q,
// even one from a corrupted stream, is defined.
template <class D, int MODE>
HPCDL_HD inline typename D::T hp_sz_value(hp_i32 q, const HpSzParams& p) {
    typedef typename D::T T;
    typedef typename D::UT UT;
    hp_u32 negative = (hp_u32)q >> 31, magnitude = ((hp_u32)q ^ (0u - negative)) + negative;
    T value;
    if (MODE == HPCDL_MODE_PW_REL) {
        UT low = negative ? (UT)p.base[1] : (UT)p.base[0];
        value = D::from_bits((((UT)magnitude - 1) << p.shift) | low);
    } else {
        T sub = hp_narrow<T>(negative ? p.sub[1] : p.sub[0]), base = hp_narrow<T>(negative ? p.base[1] : p.base[0]);
        T binned = hp_add(hp_mul((T)(hp_i32)(magnitude - 2u), hp_narrow<T>(p.step)), base);
        value = magnitude == 1u ? sub : binned;
    }
    // sign and zero as bit operations (a negation is a sign-bit flip)
    UT sign = (UT)negative << (sizeof(UT) * 8 - 1), keep = magnitude ? ~(UT)0 : (UT)0;
    return D::from_bits((D::bits(value) ^ sign) & keep);
}

// Code of one element before verification: sign(x) * level, or 0 for zero, NaN, +-Inf and levels past HPCDL_MAX_Q.
// abs: level 1 for 0 < |x| <= eb, else 1 + ceil((|x| - eb) / step).
template <class D, int MODE>
HPCDL_HD inline hp_i32 hp_sz_code(typename D::T x, const HpSzParams& p) {
    typedef typename D::T T;
    typedef typename D::UT UT;
    T magnitude = hp_abs(x);
    hp_i32 usable, level;
    if (MODE == HPCDL_MODE_PW_REL) {
        UT bits = D::bits(magnitude);
        UT bits_level = (bits >> p.shift) + 1;
        usable = -(hp_i32)((bits != 0) & (bits < D::INF_BITS) & (bits_level <= (UT)HPCDL_MAX_Q));
        level = (hp_i32)bits_level;
    } else {
        // 1 + ceil(scaled) lies in 1..MAX_Q exactly when |x| > 0 and scaled <= MAX_Q - 1 (false for NaN, Inf)
        T above = hp_sub(magnitude, hp_narrow<T>(p.eb));
        T scaled = hp_mul(hp_lt((T)0, above) ? above : (T)0, hp_narrow<T>(p.inv));
        usable = -(hp_i32)(hp_lt((T)0, magnitude) & hp_le(scaled, (T)(HPCDL_MAX_Q - 1)));
        T in_range = usable ? scaled : (T)0;
        hp_i32 truncated = hp_trunc(in_range);
        level = 1 + truncated + (hp_lt((T)truncated, in_range) ? 1 : 0);
    }
    hp_i32 negative = hp_lt(x, (T)0) ? -1 : 0;
    return ((level ^ negative) - negative) & usable;
}

// sz_stats of `count` (1..32) elements at xb (docs/format.md, section 5), added to sums[8]: for x > 0 then x < 0,
// abs: the count and the sum of |x| / unit of level 1 (sums[0..3]), the count and the sum of (|x| - bin centre) /
// unit of the levels >= 2 (sums[4..7]), unit = eb / 2^HPCDL_STAT_BITS; pw_rel: sums[4..7] only, the count and the
// sum of the dropped low bits (their top HPCDL_STAT_BITS bits when more are dropped). Elements with code 0 add
// nothing. Eight fixed int32 accumulators (|units| < 2^21, 32 lanes) and selects, so the host loop vectorizes.
template <class D, int MODE>
HPCDL_HD_INLINE void hp_sz_stat_lanes(const typename D::S* xb, int count, const HpSzParams& p, hp_i64* sums) {
    typedef typename D::T T;
    typedef typename D::UT UT;
    const HpSzParams local = p;
    const int drop = local.shift > HPCDL_STAT_BITS ? local.shift - HPCDL_STAT_BITS : 0;
    const UT low_mask = ((UT)1 << local.shift) - 1;
    const T scale = hp_narrow<T>((double)(1 << HPCDL_STAT_BITS) / local.eb), step = hp_narrow<T>(local.step);
    const T centre_2 = hp_narrow<T>(local.eb + 0.5 * local.step), limit = (T)(2 << HPCDL_STAT_BITS);
    const T low_limit = (T)(-(2 << HPCDL_STAT_BITS));
    hp_i32 n1p = 0, s1p = 0, n1n = 0, s1n = 0, n2p = 0, s2p = 0, n2n = 0, s2n = 0;
    for (int i = 0; i < count; ++i) {
        T x = D::load(xb[i]);
        hp_i32 code = hp_sz_code<D, MODE>(x, local);
        hp_u32 negative = (hp_u32)code >> 31, magnitude = ((hp_u32)code ^ (0u - negative)) + negative;
        hp_i32 units;
        if (MODE == HPCDL_MODE_PW_REL) {
            units = (hp_i32)((D::bits(hp_abs(x)) & low_mask) >> drop);
        } else {
            T centre = hp_add(hp_mul((T)(hp_i32)(magnitude - 2u), step), centre_2);
            T offset = hp_mul(magnitude == 1u ? hp_abs(x) : hp_sub(hp_abs(x), centre), scale);
            offset = hp_lt(offset, limit) ? offset : limit;  // never reached by a coded element; keeps the cast defined
            offset = hp_lt(low_limit, offset) ? offset : low_limit;
            units = hp_trunc(offset);
        }
        hp_i32 level1 = MODE == HPCDL_MODE_PW_REL ? 0 : magnitude == 1u, binned = level1 ? 0 : magnitude != 0u;
        hp_i32 positive = code > 0, below = code < 0;
        n1p += level1 & positive, s1p += level1 & positive ? units : 0;
        n1n += level1 & below, s1n += level1 & below ? units : 0;
        n2p += binned & positive, s2p += binned & positive ? units : 0;
        n2n += binned & below, s2n += binned & below ? units : 0;
    }
    sums[0] += n1p, sums[1] += s1p, sums[2] += n1n, sums[3] += s1n;
    sums[4] += n2p, sums[5] += s2p, sums[6] += n2n, sums[7] += s2n;
}

#if HPCDL_HOST_AVX512
// hp_sz_stat_lanes of `blocks` whole blocks of float32 elements in abs mode, as 16-lane AVX-512 operations: the
// same IEEE operations per element (code, bin centre, offset, clamp, truncation), with the lanes' int32 sums kept
// in vectors for up to 64 blocks (|units| <= 2^21 per element, so at most 2^28 per lane) and then added to sums.
// Integer sums do not depend on the order of addition, so the sums are those of the portable loop.
// The quantizer's level of 16 float32 magnitudes, as the portable code computes it: 1 + ceil((|x| - eb) * inv),
// so 1 for 0 < |x| <= eb; `usable` gets the lanes that have a level (nonzero, at most HPCDL_MAX_Q). One definition
// for the statistics pass and the quantizer, which must agree lane for lane.
inline __m512i hp_level16_f32(__m512 magnitude, __m512 eb, __m512 inv, __m512 max_scaled, __mmask16* usable) {
    const __m512 zero = _mm512_setzero_ps();
    const __m512i one = _mm512_set1_epi32(1);
    // max(NaN, 0) is 0, as the portable `above > 0 ? above : 0`
    __m512 scaled = _mm512_mul_ps(_mm512_max_ps(_mm512_sub_ps(magnitude, eb), zero), inv);
    *usable = _mm512_cmp_ps_mask(magnitude, zero, _CMP_GT_OQ) & _mm512_cmp_ps_mask(scaled, max_scaled, _CMP_LE_OQ);
    __m512 in_range = _mm512_maskz_mov_ps(*usable, scaled);
    __m512i truncated = _mm512_cvttps_epi32(in_range);
    __mmask16 round_up = _mm512_cmp_ps_mask(_mm512_cvtepi32_ps(truncated), in_range, _CMP_LT_OQ);
    return _mm512_add_epi32(_mm512_mask_add_epi32(truncated, round_up, truncated, one), one);
}
// The sum of 16 int32 lanes, in int64 (16 lanes of up to 2^28 overflow int32).
inline hp_i64 hp_sum16_i64(__m512i lanes) {
    return (hp_i64)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(lanes)),
                                                            _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(lanes, 1))));
}
inline void hp_sz_stats32_f32_abs(const float* x, hp_i64 blocks, const HpSzParams& p, hp_i64* sums) {
    const __m512 inv = _mm512_set1_ps((float)p.inv), eb = _mm512_set1_ps((float)p.eb), zero = _mm512_setzero_ps();
    const __m512 max_scaled = _mm512_set1_ps((float)(HPCDL_MAX_Q - 1)), step = _mm512_set1_ps((float)p.step);
    const __m512 scale = _mm512_set1_ps((float)((double)(1 << HPCDL_STAT_BITS) / p.eb));
    const __m512 centre_2 = _mm512_set1_ps((float)(p.eb + 0.5 * p.step));
    const __m512 limit = _mm512_set1_ps((float)(2 << HPCDL_STAT_BITS)), minus_limit = _mm512_set1_ps(-(float)(2 << HPCDL_STAT_BITS));
    const __m512i one = _mm512_set1_epi32(1), two = _mm512_set1_epi32(2);
    for (hp_i64 first = 0; first < blocks; first += 64) {
        hp_i64 last = first + 64 < blocks ? first + 64 : blocks;
        __m512i s1p = _mm512_setzero_si512(), s1n = s1p, s2p = s1p, s2n = s1p;
        hp_i64 n1p = 0, n1n = 0, n2p = 0, n2n = 0;
        for (hp_i64 v = 2 * first; v < 2 * last; ++v) {
            __m512 xv = _mm512_loadu_ps(x + 16 * v);
            __m512 magnitude = _mm512_abs_ps(xv);
            __mmask16 usable;
            __m512i level = hp_level16_f32(magnitude, eb, inv, max_scaled, &usable);
            __mmask16 negative = _mm512_cmp_ps_mask(xv, zero, _CMP_LT_OQ);
            __mmask16 level1 = usable & _mm512_cmpeq_epi32_mask(level, one), binned = usable & ~level1;
            __m512 centre = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(level, two)), step), centre_2);
            __m512 offset = _mm512_mul_ps(_mm512_mask_blend_ps(level1, _mm512_sub_ps(magnitude, centre), magnitude), scale);
            offset = _mm512_max_ps(_mm512_min_ps(offset, limit), minus_limit);  // min/max: a < b ? a : b, as the portable selects
            __m512i units = _mm512_cvttps_epi32(offset);
            __mmask16 l1p = level1 & ~negative, l1n = level1 & negative, b2p = binned & ~negative, b2n = binned & negative;
            s1p = _mm512_mask_add_epi32(s1p, l1p, s1p, units), s1n = _mm512_mask_add_epi32(s1n, l1n, s1n, units);
            s2p = _mm512_mask_add_epi32(s2p, b2p, s2p, units), s2n = _mm512_mask_add_epi32(s2n, b2n, s2n, units);
            n1p += __builtin_popcount(l1p), n1n += __builtin_popcount(l1n);
            n2p += __builtin_popcount(b2p), n2n += __builtin_popcount(b2n);
        }
        sums[0] += n1p, sums[1] += hp_sum16_i64(s1p), sums[2] += n1n, sums[3] += hp_sum16_i64(s1n);
        sums[4] += n2p, sums[5] += hp_sum16_i64(s2p), sums[6] += n2n, sums[7] += hp_sum16_i64(s2n);
    }
}
#elif HPCDL_HOST_AVX2
// The AVX2 version of hp_sz_stats32_f32_abs above: 8 lanes, vector compare masks (all ones or zero) for the lanes'
// selections, the counts accumulated as the masks' -1s.
inline hp_i64 hp_sum8_i64(__m256i lanes) {
    __m256i wide = _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(lanes)),
                                    _mm256_cvtepi32_epi64(_mm256_extracti128_si256(lanes, 1)));
    hp_i64 parts[4];
    _mm256_storeu_si256((__m256i*)parts, wide);
    return parts[0] + parts[1] + parts[2] + parts[3];
}
// The AVX2 version of hp_level16_f32: the quantizer's level of 8 float32 magnitudes, `usable` all ones in the
// lanes that have one. One definition for the statistics pass and the quantizer, which must agree lane for lane.
inline __m256i hp_level8_f32(__m256 magnitude, __m256 eb, __m256 inv, __m256 max_scaled, __m256* usable) {
    const __m256 zero = _mm256_setzero_ps();
    // max(NaN, 0) is 0, as the portable `above > 0 ? above : 0`
    __m256 scaled = _mm256_mul_ps(_mm256_max_ps(_mm256_sub_ps(magnitude, eb), zero), inv);
    *usable = _mm256_and_ps(_mm256_cmp_ps(magnitude, zero, _CMP_GT_OQ), _mm256_cmp_ps(scaled, max_scaled, _CMP_LE_OQ));
    __m256 in_range = _mm256_and_ps(*usable, scaled);
    __m256i truncated = _mm256_cvttps_epi32(in_range);
    __m256i round_up = _mm256_castps_si256(_mm256_cmp_ps(_mm256_cvtepi32_ps(truncated), in_range, _CMP_LT_OQ));
    return _mm256_add_epi32(_mm256_sub_epi32(truncated, round_up), _mm256_set1_epi32(1));  // round_up is -1 or 0
}
inline void hp_sz_stats32_f32_abs(const float* x, hp_i64 blocks, const HpSzParams& p, hp_i64* sums) {
    const __m256 inv = _mm256_set1_ps((float)p.inv), eb = _mm256_set1_ps((float)p.eb), zero = _mm256_setzero_ps();
    const __m256 max_scaled = _mm256_set1_ps((float)(HPCDL_MAX_Q - 1)), step = _mm256_set1_ps((float)p.step);
    const __m256 scale = _mm256_set1_ps((float)((double)(1 << HPCDL_STAT_BITS) / p.eb));
    const __m256 centre_2 = _mm256_set1_ps((float)(p.eb + 0.5 * p.step));
    const __m256 limit = _mm256_set1_ps((float)(2 << HPCDL_STAT_BITS)), minus_limit = _mm256_set1_ps(-(float)(2 << HPCDL_STAT_BITS));
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i one = _mm256_set1_epi32(1), two = _mm256_set1_epi32(2);
    for (hp_i64 first = 0; first < blocks; first += 64) {
        hp_i64 last = first + 64 < blocks ? first + 64 : blocks;
        __m256i s1p = _mm256_setzero_si256(), s1n = s1p, s2p = s1p, s2n = s1p, n1p = s1p, n1n = s1p, n2p = s1p, n2n = s1p;
        for (hp_i64 v = 4 * first; v < 4 * last; ++v) {
            __m256 xv = _mm256_loadu_ps(x + 8 * v);
            __m256 magnitude = _mm256_and_ps(xv, abs_mask);
            __m256 usable;
            __m256i level = hp_level8_f32(magnitude, eb, inv, max_scaled, &usable);
            __m256 negative = _mm256_cmp_ps(xv, zero, _CMP_LT_OQ);
            __m256 is_one = _mm256_castsi256_ps(_mm256_cmpeq_epi32(level, one));
            __m256 level1 = _mm256_and_ps(usable, is_one), binned = _mm256_andnot_ps(is_one, usable);
            __m256 centre = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(level, two)), step), centre_2);
            __m256 offset = _mm256_mul_ps(_mm256_blendv_ps(_mm256_sub_ps(magnitude, centre), magnitude, level1), scale);
            offset = _mm256_max_ps(_mm256_min_ps(offset, limit), minus_limit);  // min/max: a < b ? a : b, as the portable selects
            __m256i units = _mm256_cvttps_epi32(offset);
            __m256i l1p = _mm256_castps_si256(_mm256_andnot_ps(negative, level1));
            __m256i l1n = _mm256_castps_si256(_mm256_and_ps(negative, level1));
            __m256i b2p = _mm256_castps_si256(_mm256_andnot_ps(negative, binned));
            __m256i b2n = _mm256_castps_si256(_mm256_and_ps(negative, binned));
            s1p = _mm256_add_epi32(s1p, _mm256_and_si256(l1p, units)), n1p = _mm256_sub_epi32(n1p, l1p);
            s1n = _mm256_add_epi32(s1n, _mm256_and_si256(l1n, units)), n1n = _mm256_sub_epi32(n1n, l1n);
            s2p = _mm256_add_epi32(s2p, _mm256_and_si256(b2p, units)), n2p = _mm256_sub_epi32(n2p, b2p);
            s2n = _mm256_add_epi32(s2n, _mm256_and_si256(b2n, units)), n2n = _mm256_sub_epi32(n2n, b2n);
        }
        sums[0] += hp_sum8_i64(n1p), sums[1] += hp_sum8_i64(s1p), sums[2] += hp_sum8_i64(n1n), sums[3] += hp_sum8_i64(s1n);
        sums[4] += hp_sum8_i64(n2p), sums[5] += hp_sum8_i64(s2p), sums[6] += hp_sum8_i64(n2n), sums[7] += hp_sum8_i64(s2n);
    }
}
#endif

// Verification in float64, as hpcdl.compress.check_bound judges: the decoded value y (already rounded to the
// input dtype) is within the bound of x and has x's sign. Sets *q to the code or 0, and *outlier when x must be
// stored exactly: NaN, +-Inf, -0.0, levels past HPCDL_MAX_Q, and values whose decoding breaks the bound, zero or
// sign (rounding at bin edges, underflow, overflow, float16/bfloat16 rounding).
template <int MODE>
HPCDL_HD inline void hp_sz_check(double xd, double yd, hp_i32 code, bool plus_zero, const HpSzParams& p, hp_i32* q,
                                 hp_u8* outlier) {
    double tolerance = MODE == HPCDL_MODE_PW_REL ? p.bound * hp_abs(xd) : p.eb;
    bool good = (code != 0) & (hp_abs(xd - yd) <= tolerance) & ((xd > 0.0) == (yd > 0.0)) & ((xd < 0.0) == (yd < 0.0));
    *q = good ? code : 0;
    *outlier = (hp_u8)(!good & !plus_zero);
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

// Bit i of a word is lane i of a block. A table (not a variable shift) so the lane loops vectorize.
#define HPCDL_LANE_BITS                                                                                             \
    {1u << 0,  1u << 1,  1u << 2,  1u << 3,  1u << 4,  1u << 5,  1u << 6,  1u << 7,  1u << 8,  1u << 9,  1u << 10, \
     1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15, 1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20, 1u << 21, \
     1u << 22, 1u << 23, 1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31}

HPCDL_HD inline int hp_popcount(hp_u32 v) {
#if defined(__CUDA_ARCH__)
    return __popc(v);
#else
    return __builtin_popcount(v);
#endif
}

// Bit planes a sparse block of `words` words with k nonzero lanes holds: as many as fit, at most 32.
HPCDL_HD inline int hp_sparse_planes(int words, int k) {
    if (k == 0) return 0;
    int planes = 32 * (words - 1) / k;
    return planes < 32 ? planes : 32;
}

// Header byte of one block of `count` (1..32) codes: the predictor that needs the fewest words
// (ties: zigzag, unsigned, Lorenzo, sparse; so an all-zero block has header 0).
#if HPCDL_HOST_AVX512
HPCDL_HD_INLINE __m512i hp_zigzag16(__m512i d) { return _mm512_xor_si512(_mm512_slli_epi32(d, 1), _mm512_srai_epi32(d, 31)); }
// Lane i of the result is lane i - 1 of the 32 lanes (low, high), 0 for lane 0: q[i - 1] with q[-1] = 0.
HPCDL_HD_INLINE __m512i hp_previous16(__m512i lanes, __m512i before) { return _mm512_alignr_epi32(lanes, before, 15); }
// The OR of the 16 lanes of each of a, b, c, d, as one folding tree (four separate reductions cost twice as much).
HPCDL_HD_INLINE void hp_or_reduce4(__m512i a, __m512i b, __m512i c, __m512i d, hp_u32* out) {
    __m512i ab = _mm512_or_si512(_mm512_shuffle_i32x4(a, b, 0x44), _mm512_shuffle_i32x4(a, b, 0xee));  // a0|a2 a1|a3 b0|b2 b1|b3
    __m512i cd = _mm512_or_si512(_mm512_shuffle_i32x4(c, d, 0x44), _mm512_shuffle_i32x4(c, d, 0xee));
    __m512i r = _mm512_or_si512(_mm512_shuffle_i32x4(ab, cd, 0x88), _mm512_shuffle_i32x4(ab, cd, 0xdd));  // a b c d
    r = _mm512_or_si512(r, _mm512_shuffle_epi32(r, (_MM_PERM_ENUM)0x4e));  // within each 128-bit lane
    r = _mm512_or_si512(r, _mm512_shuffle_epi32(r, (_MM_PERM_ENUM)0xb1));
    hp_u32 lanes[16];
    _mm512_storeu_si512((void*)lanes, r);
    out[0] = lanes[0], out[1] = lanes[4], out[2] = lanes[8], out[3] = lanes[12];
}
#elif HPCDL_HOST_AVX2
HPCDL_HD_INLINE __m256i hp_zigzag8(__m256i d) { return _mm256_xor_si256(_mm256_slli_epi32(d, 1), _mm256_srai_epi32(d, 31)); }
// Lane i of the result is lane i - 1 of the 16 lanes (before, lanes): q[i - 1], with before = 0 for q[-1] = 0.
HPCDL_HD_INLINE __m256i hp_previous8(__m256i lanes, __m256i before) {
    const __m256i up = _mm256_setr_epi32(7, 0, 1, 2, 3, 4, 5, 6);
    return _mm256_blend_epi32(_mm256_permutevar8x32_epi32(lanes, up), _mm256_permutevar8x32_epi32(before, up), 1);
}
// The OR of the 8 lanes of v.
HPCDL_HD_INLINE hp_u32 hp_or_reduce8(__m256i v) {
    __m128i r = _mm_or_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    r = _mm_or_si128(r, _mm_shuffle_epi32(r, 0x4e));
    r = _mm_or_si128(r, _mm_shuffle_epi32(r, 0xb1));
    return (hp_u32)_mm_cvtsi128_si32(r);
}
// The 8-bit mask of the nonzero lanes of v (bit i = lane i).
HPCDL_HD_INLINE hp_u32 hp_nonzero8(__m256i v) {
    return (hp_u32)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(v, _mm256_setzero_si256()))) ^ 0xffu;
}
// For each 8-bit lane mask m: the lanes of m in increasing order (then zeros), which packs them to the front with
// _mm256_permutevar8x32_epi32, and for each lane i the number of lanes of m below i, which unpacks them back.
struct HpLaneOrders {
    hp_u8 packed[256][8], unpacked[256][8];
    constexpr HpLaneOrders() : packed(), unpacked() {
        for (int m = 0; m < 256; ++m)
            for (int i = 0, r = 0; i < 8; ++i) {
                unpacked[m][i] = (hp_u8)r;
                if ((m >> i) & 1) packed[m][r++] = (hp_u8)i;
            }
    }
};
static constexpr HpLaneOrders hp_lane_orders{};
HPCDL_HD_INLINE __m256i hp_lane_order(const hp_u8* order) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)order));
}
// All-ones in lane i where bit i of the 8-bit mask m is set, zero in the other lanes.
HPCDL_HD_INLINE __m256i hp_lanes_in(hp_u32 m) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)m), bit), bit);
}
#endif

// The header byte from the OR over a block's lanes of each predictor's values (zigzag(q), q, zigzag of the Lorenzo
// difference, q - 1 for nonzero q) and the mask of nonzero lanes: the one definition of the choice, for the
// per-thread blocks below and the warp-per-block GPU kernels (kernels/sz_warp.cuh).
HPCDL_HD_INLINE hp_u8 hp_choose_header(hp_u32 any_zigzag, hp_u32 any_unsigned, hp_u32 any_lorenzo, hp_u32 any_sparse,
                                       hp_u32 mask) {
    int w_zigzag = hp_bit_width(any_zigzag), w_lorenzo = hp_bit_width(any_lorenzo);
    int w_unsigned = (any_unsigned >> 31) ? 64 : hp_bit_width(any_unsigned);  // bit 31 set: some q < 0
    int best = w_zigzag, predictor = HPCDL_PRED_ZIGZAG;
    if (w_unsigned < best) best = w_unsigned, predictor = HPCDL_PRED_UNSIGNED;
    if (w_lorenzo < best) best = w_lorenzo, predictor = HPCDL_PRED_LORENZO;
    if (w_unsigned <= 32) {
        int w_sparse = 1 + (hp_popcount(mask) * hp_bit_width(any_sparse) + 31) / 32;
        if (w_sparse < best) best = w_sparse, predictor = HPCDL_PRED_SPARSE;
    }
    return (hp_u8)(best | (predictor << 6));
}

HPCDL_HD_INLINE hp_u8 hp_block_header(const hp_i32* q, int count) {
    const hp_u32 lane_bit[HPCDL_BLOCK] = HPCDL_LANE_BITS;
    hp_u32 any_zigzag, any_lorenzo, any_unsigned, any_sparse, mask;
#if HPCDL_HOST_AVX512
    if (count == HPCDL_BLOCK) {  // the same OR reductions, 16 lanes at a time
        __m512i low = _mm512_loadu_si512((const void*)q), high = _mm512_loadu_si512((const void*)(q + 16));
        __m512i one = _mm512_set1_epi32(1);
        __mmask16 low_nonzero = _mm512_test_epi32_mask(low, low), high_nonzero = _mm512_test_epi32_mask(high, high);
        hp_u32 any[4];
        hp_or_reduce4(_mm512_or_si512(hp_zigzag16(low), hp_zigzag16(high)),
                      _mm512_or_si512(hp_zigzag16(_mm512_sub_epi32(low, hp_previous16(low, _mm512_setzero_si512()))),
                                      hp_zigzag16(_mm512_sub_epi32(high, hp_previous16(high, low)))),
                      _mm512_or_si512(low, high),
                      _mm512_or_si512(_mm512_mask_sub_epi32(low, low_nonzero, low, one),
                                      _mm512_mask_sub_epi32(high, high_nonzero, high, one)),
                      any);
        any_zigzag = any[0], any_lorenzo = any[1], any_unsigned = any[2], any_sparse = any[3];
        mask = (hp_u32)low_nonzero | ((hp_u32)high_nonzero << 16);
    } else
#elif HPCDL_HOST_AVX2
    if (count == HPCDL_BLOCK) {  // the same OR reductions, 8 lanes at a time
        const __m256i zero = _mm256_setzero_si256(), minus_one = _mm256_set1_epi32(-1);
        __m256i zigzag = zero, lorenzo = zero, unsigned_ = zero, sparse = zero, before = zero;
        mask = 0;
        for (int v = 0; v < 4; ++v) {
            __m256i lanes = _mm256_loadu_si256((const __m256i*)(q + 8 * v));
            zigzag = _mm256_or_si256(zigzag, hp_zigzag8(lanes));
            lorenzo = _mm256_or_si256(lorenzo, hp_zigzag8(_mm256_sub_epi32(lanes, hp_previous8(lanes, before))));
            unsigned_ = _mm256_or_si256(unsigned_, lanes);
            // q - 1 for nonzero q, 0 for q = 0 (the compare is -1 there)
            sparse = _mm256_or_si256(sparse, _mm256_sub_epi32(_mm256_add_epi32(lanes, minus_one), _mm256_cmpeq_epi32(lanes, zero)));
            mask |= hp_nonzero8(lanes) << (8 * v);
            before = lanes;
        }
        any_zigzag = hp_or_reduce8(zigzag), any_lorenzo = hp_or_reduce8(lorenzo);
        any_unsigned = hp_or_reduce8(unsigned_), any_sparse = hp_or_reduce8(sparse);
    } else
#endif
    {
        hp_u32 nonzero = q[0] != 0;
        any_zigzag = hp_zigzag(q[0]), any_lorenzo = any_zigzag, any_unsigned = (hp_u32)q[0];
        any_sparse = (hp_u32)q[0] - nonzero, mask = nonzero;
        for (int i = 1; i < count; ++i) {  // arithmetic, not selects: the loop must stay vectorizable when inlined
            nonzero = q[i] != 0;
            any_zigzag |= hp_zigzag(q[i]);
            any_lorenzo |= hp_zigzag((hp_i32)((hp_u32)q[i] - (hp_u32)q[i - 1]));
            any_unsigned |= (hp_u32)q[i];
            any_sparse |= (hp_u32)q[i] - nonzero;
            mask |= lane_bit[i] & (0u - nonzero);
        }
    }
    return hp_choose_header(any_zigzag, any_unsigned, any_lorenzo, any_sparse, mask);
}

// Bit planes of 32 lane values: plane j holds bit j of lane i at bit i.
// On an x86 host with AVX-512 or AVX2 a plane is a vector test or sign-bit movemask of the lanes (the compilers
// turn the portable loop into a branchy scalar loop); the portable loop is the definition and the GPU's code.
HPCDL_HD_INLINE void hp_planes_of(const hp_u32* u, int width, hp_u32* planes) {
#if HPCDL_HOST_AVX512
    __m512i low = _mm512_loadu_si512((const void*)u), high = _mm512_loadu_si512((const void*)(u + 16));
    for (int j = 0; j < width; ++j) {
        __m512i bit = _mm512_set1_epi32((int)(1u << j));
        planes[j] = (hp_u32)_mm512_test_epi32_mask(low, bit) | ((hp_u32)_mm512_test_epi32_mask(high, bit) << 16);
    }
#elif HPCDL_HOST_AVX2
    __m256i v0 = _mm256_loadu_si256((const __m256i*)u), v1 = _mm256_loadu_si256((const __m256i*)(u + 8));
    __m256i v2 = _mm256_loadu_si256((const __m256i*)(u + 16)), v3 = _mm256_loadu_si256((const __m256i*)(u + 24));
    for (int j = 0; j < width; ++j) {
        __m128i up = _mm_cvtsi32_si128(31 - j);  // bit j to the sign bit
        hp_u32 m0 = (hp_u32)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_sll_epi32(v0, up)));
        hp_u32 m1 = (hp_u32)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_sll_epi32(v1, up)));
        hp_u32 m2 = (hp_u32)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_sll_epi32(v2, up)));
        hp_u32 m3 = (hp_u32)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_sll_epi32(v3, up)));
        planes[j] = m0 | (m1 << 8) | (m2 << 16) | (m3 << 24);
    }
#else
    const hp_u32 lane_bit[HPCDL_BLOCK] = HPCDL_LANE_BITS;
    for (int j = 0; j < width; ++j) {
        hp_u32 plane = 0;
        for (int i = 0; i < HPCDL_BLOCK; ++i) plane |= ((u[i] >> j) & 1u) ? lane_bit[i] : 0u;
        planes[j] = plane;
    }
#endif
}

// Inverse of hp_planes_of: 32 lane values from `width` bit planes.
HPCDL_HD_INLINE void hp_lanes_of(const hp_u32* planes, int width, hp_u32* u) {
#if HPCDL_HOST_AVX512
    __m512i low = _mm512_setzero_si512(), high = _mm512_setzero_si512();
    for (int j = 0; j < width; ++j) {
        __m512i bit = _mm512_set1_epi32((int)(1u << j));
        low = _mm512_mask_or_epi32(low, (__mmask16)planes[j], low, bit);
        high = _mm512_mask_or_epi32(high, (__mmask16)(planes[j] >> 16), high, bit);
    }
    _mm512_storeu_si512((void*)u, low);
    _mm512_storeu_si512((void*)(u + 16), high);
#elif HPCDL_HOST_AVX2
    __m256i lanes[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int j = 0; j < width; ++j) {
        __m256i bit = _mm256_set1_epi32((int)(1u << j));
        for (int v = 0; v < 4; ++v)
            lanes[v] = _mm256_or_si256(lanes[v], _mm256_and_si256(hp_lanes_in((planes[j] >> (8 * v)) & 0xffu), bit));
    }
    for (int v = 0; v < 4; ++v) _mm256_storeu_si256((__m256i*)(u + 8 * v), lanes[v]);
#else
    const hp_u32 lane_bit[HPCDL_BLOCK] = HPCDL_LANE_BITS;
    for (int i = 0; i < HPCDL_BLOCK; ++i) u[i] = 0;
    for (int j = 0; j < width; ++j) {
        hp_u32 plane = planes[j], plane_bit = 1u << j;
        for (int i = 0; i < HPCDL_BLOCK; ++i) u[i] |= (plane & lane_bit[i]) ? plane_bit : 0u;
    }
#endif
}

// Sparse block: word 0 = mask of nonzero lanes; then, for plane j and the r-th nonzero lane, bit j of
// (q - 1) at stream bit j * k + r (k = nonzero lanes), packed from the low bit of word 1 up; zero tail.
HPCDL_HD inline void hp_sparse_pack(const hp_i32* q, int count, int words_total, hp_u32* words) {
    hp_u32 values[HPCDL_BLOCK + 1], planes[HPCDL_BLOCK], mask = 0;
    int k = 0;
#if HPCDL_HOST_AVX512
    if (count == HPCDL_BLOCK) {  // vector compaction of the nonzero lanes' q - 1 (lanes past k stay 0)
        __m512i low = _mm512_loadu_si512((const void*)q), high = _mm512_loadu_si512((const void*)(q + 16));
        __m512i one = _mm512_set1_epi32(1);
        __mmask16 low_mask = _mm512_test_epi32_mask(low, low), high_mask = _mm512_test_epi32_mask(high, high);
        int low_k = hp_popcount(low_mask);
        _mm512_storeu_si512((void*)(values + 16), _mm512_setzero_si512());
        _mm512_storeu_si512((void*)values, _mm512_maskz_compress_epi32(low_mask, _mm512_sub_epi32(low, one)));
        _mm512_storeu_si512((void*)(values + low_k), _mm512_maskz_compress_epi32(high_mask, _mm512_sub_epi32(high, one)));
        mask = (hp_u32)low_mask | ((hp_u32)high_mask << 16);
        k = hp_popcount(mask);
    } else
#elif HPCDL_HOST_AVX2
    if (count == HPCDL_BLOCK) {  // compaction 8 lanes at a time by a permutation, then the lanes past k zeroed
        const __m256i one = _mm256_set1_epi32(1);
        for (int v = 0; v < 4; ++v) {  // k <= 8 v before lane group v, so its 8 stores stay inside values[0..31]
            __m256i lanes = _mm256_loadu_si256((const __m256i*)(q + 8 * v));
            hp_u32 nonzero = hp_nonzero8(lanes);
            __m256i order = hp_lane_order(hp_lane_orders.packed[nonzero]);
            _mm256_storeu_si256((__m256i*)(values + k), _mm256_permutevar8x32_epi32(_mm256_sub_epi32(lanes, one), order));
            mask |= nonzero << (8 * v);
            k += hp_popcount(nonzero);
        }
        const __m256i rank = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), first_past = _mm256_set1_epi32(k);
        for (int v = 0; v < 4; ++v) {
            __m256i below_k = _mm256_cmpgt_epi32(first_past, _mm256_add_epi32(rank, _mm256_set1_epi32(8 * v)));
            __m256i kept = _mm256_and_si256(below_k, _mm256_loadu_si256((const __m256i*)(values + 8 * v)));
            _mm256_storeu_si256((__m256i*)(values + 8 * v), kept);
        }
    } else
#endif
    {
        for (int i = 0; i < count; ++i) {  // branch-free compaction: always write, advance on nonzero
            hp_u32 nonzero = q[i] != 0;
            values[k] = (hp_u32)q[i] - 1u;
            mask |= nonzero << i;
            k += (int)nonzero;
        }
        for (int r = 0; r < HPCDL_BLOCK; ++r) values[r] = r < k ? values[r] : 0u;
    }
    int n_planes = hp_sparse_planes(words_total, k), out = 1, fill = 0;
    hp_planes_of(values, n_planes, planes);
    words[0] = mask;
    hp_u64 pending = 0;
    for (int j = 0; j < n_planes; ++j) {
        pending |= (hp_u64)planes[j] << fill;
        fill += k;
        if (fill >= 32) words[out++] = (hp_u32)pending, pending >>= 32, fill -= 32;
    }
    if (fill > 0) words[out++] = (hp_u32)pending;
    while (out < words_total) words[out++] = 0;
}

// Inverse of hp_sparse_pack; reads only words[0 .. words_total - 1], whatever the mask says.
HPCDL_HD inline void hp_sparse_unpack(const hp_u32* words, int words_total, hp_i32* q) {
    hp_u32 values[HPCDL_BLOCK], planes[HPCDL_BLOCK], mask = words[0];
    int k = hp_popcount(mask), n_planes = hp_sparse_planes(words_total, k), in = 1, fill = 0;
    hp_u64 pending = 0, keep = k == 32 ? 0xffffffffull : (1ull << k) - 1;
    for (int j = 0; j < n_planes; ++j) {
        if (fill < k) pending |= (hp_u64)words[in++] << fill, fill += 32;
        planes[j] = (hp_u32)(pending & keep);
        pending >>= k;
        fill -= k;
    }
    hp_lanes_of(planes, n_planes, values);
#if HPCDL_HOST_AVX512
    {  // vector expansion: the r-th nonzero lane gets values[r] + 1, the others 0
        __mmask16 low_mask = (__mmask16)mask, high_mask = (__mmask16)(mask >> 16);
        __m512i one = _mm512_set1_epi32(1);
        __m512i low = _mm512_maskz_expand_epi32(low_mask, _mm512_loadu_si512((const void*)values));
        __m512i high = _mm512_maskz_expand_epi32(high_mask, _mm512_loadu_si512((const void*)(values + hp_popcount(low_mask))));
        _mm512_storeu_si512((void*)q, _mm512_maskz_add_epi32(low_mask, low, one));
        _mm512_storeu_si512((void*)(q + 16), _mm512_maskz_add_epi32(high_mask, high, one));
    }
#elif HPCDL_HOST_AVX2
    {  // expansion 8 lanes at a time by a permutation: lane i of a group takes the value of its rank among the set lanes
        const __m256i one = _mm256_set1_epi32(1);
        for (int v = 0, r = 0; v < 4; ++v) {  // r <= 8 v, so the 8 loads stay inside values[0..31]
            hp_u32 on = (mask >> (8 * v)) & 0xffu;
            __m256i order = hp_lane_order(hp_lane_orders.unpacked[on]);
            __m256i spread = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i*)(values + r)), order);
            _mm256_storeu_si256((__m256i*)(q + 8 * v), _mm256_and_si256(_mm256_add_epi32(spread, one), hp_lanes_in(on)));
            r += hp_popcount(on);
        }
    }
#else
    for (int i = 0, r = 0; i < HPCDL_BLOCK; ++i) {  // branch-free expansion
        hp_u32 on = (mask >> i) & 1u;
        q[i] = (hp_i32)((values[r & 31] + 1u) & (0u - on));
        r += (int)on;
    }
#endif
}

// Writes the block's words; for zigzag, unsigned and Lorenzo, word j holds bit j of the 32 lane values
// (lanes >= count are 0).
HPCDL_HD_INLINE void hp_block_pack(const hp_i32* q, int count, hp_u8 header, hp_u32* words) {
    int width = header & 63, predictor = header >> 6;
    if (predictor == HPCDL_PRED_SPARSE) {
        hp_sparse_pack(q, count, width, words);
        return;
    }
    hp_u32 u[HPCDL_BLOCK];
#if HPCDL_HOST_AVX512
    if (count == HPCDL_BLOCK) {  // the lanes' u in two vectors
        __m512i low = _mm512_loadu_si512((const void*)q), high = _mm512_loadu_si512((const void*)(q + 16));
        if (predictor == HPCDL_PRED_LORENZO) {
            __m512i low_previous = hp_previous16(low, _mm512_setzero_si512()), high_previous = hp_previous16(high, low);
            low = _mm512_sub_epi32(low, low_previous), high = _mm512_sub_epi32(high, high_previous);
        }
        if (predictor != HPCDL_PRED_UNSIGNED) low = hp_zigzag16(low), high = hp_zigzag16(high);
        _mm512_storeu_si512((void*)u, low);
        _mm512_storeu_si512((void*)(u + 16), high);
        hp_planes_of(u, width, words);
        return;
    }
#elif HPCDL_HOST_AVX2
    if (count == HPCDL_BLOCK) {  // the lanes' u, 8 at a time
        __m256i before = _mm256_setzero_si256();
        for (int v = 0; v < 4; ++v) {
            __m256i lanes = _mm256_loadu_si256((const __m256i*)(q + 8 * v)), value = lanes;
            if (predictor == HPCDL_PRED_LORENZO) value = _mm256_sub_epi32(lanes, hp_previous8(lanes, before));
            if (predictor != HPCDL_PRED_UNSIGNED) value = hp_zigzag8(value);
            _mm256_storeu_si256((__m256i*)(u + 8 * v), value);
            before = lanes;
        }
        hp_planes_of(u, width, words);
        return;
    }
#endif
    for (int i = 0; i < HPCDL_BLOCK; ++i) {
        hp_i32 v = i < count ? q[i] : 0, previous = (i > 0) & (i <= count) ? q[i - 1] : 0;
        hp_u32 lorenzo = hp_zigzag((hp_i32)((hp_u32)v - (hp_u32)previous));
        u[i] = predictor == HPCDL_PRED_UNSIGNED ? (hp_u32)v : predictor == HPCDL_PRED_LORENZO ? lorenzo : hp_zigzag(v);
        u[i] = i < count ? u[i] : 0u;
    }
    hp_planes_of(u, width, words);
}

// Inverse of hp_block_pack for a validated header (at most 32 words); writes 32 codes.
HPCDL_HD_INLINE void hp_block_unpack(hp_u8 header, const hp_u32* words, hp_i32* q) {
    int width = header & 63, predictor = header >> 6;
    if (predictor == HPCDL_PRED_SPARSE) {
        if (width > 0) hp_sparse_unpack(words, width, q);
        else for (int i = 0; i < HPCDL_BLOCK; ++i) q[i] = 0;
        return;
    }
    hp_u32 u[HPCDL_BLOCK];
    hp_lanes_of(words, width, u);
    if (predictor == HPCDL_PRED_UNSIGNED) {
        for (int i = 0; i < HPCDL_BLOCK; ++i) q[i] = (hp_i32)u[i];
    } else if (predictor == HPCDL_PRED_ZIGZAG) {
        for (int i = 0; i < HPCDL_BLOCK; ++i) q[i] = hp_unzigzag(u[i]);
    } else {
        hp_u32 sum = 0;
        for (int i = 0; i < HPCDL_BLOCK; ++i) q[i] = (hp_i32)(sum += (hp_u32)hp_unzigzag(u[i]));
    }
}

// ---------------------------------------------------------------- payload checksum (docs/format.md, section 3)

// The term of little-endian u64 word w at position i: (2 i + 1) * splitmix64's finalizer of w, modulo 2^64.
HPCDL_HD inline hp_u64 hp_checksum_term(hp_u64 i, hp_u64 w) {
    w = (w ^ (w >> 30)) * 0xBF58476D1CE4E5B9ull;
    w = (w ^ (w >> 27)) * 0x94D049BB133111EBull;
    return (2 * i + 1) * (w ^ (w >> 31));
}

// ---------------------------------------------------------------- whole-block steps (one thread per block)

HPCDL_HD inline int hp_block_count(hp_i64 n, hp_i64 block) {
    hp_i64 left = n - block * HPCDL_BLOCK;
    return left < HPCDL_BLOCK ? (int)left : HPCDL_BLOCK;
}

// Quantizes one block of `count` (1..32) elements at xb into codes q[0..31] (lanes >= count are 0) and returns the
// mask of its outlier lanes.
// Codes and decoded values in the compute type, then the float64 check: two uniform-width passes, so the host
// compiler vectorizes both. Encoding runs this twice per block (headers, then packing) instead of keeping a
// 4-byte code per element in memory between the passes.
#if HPCDL_HOST_AVX512
// hp_sz_quantize_lanes of 32 float32 elements in abs mode, as 16-lane AVX-512 operations with the outlier
// lanes as vector compare masks (the compiler's version of the portable loops reduces them lane by lane).
// Every operation is the IEEE operation the portable code performs, so codes and outliers are identical.
inline hp_u32 hp_sz_quantize32_f32_abs(const float* xb, const HpSzParams& p, hp_i32* q) {
    const __m512 inv = _mm512_set1_ps((float)p.inv), eb = _mm512_set1_ps((float)p.eb), zero = _mm512_setzero_ps();
    const __m512 step = _mm512_set1_ps((float)p.step), max_scaled = _mm512_set1_ps((float)(HPCDL_MAX_Q - 1));
    const __m512 sub_positive = _mm512_set1_ps((float)p.sub[0]), sub_negative = _mm512_set1_ps((float)p.sub[1]);
    const __m512 base_positive = _mm512_set1_ps((float)p.base[0]), base_negative = _mm512_set1_ps((float)p.base[1]);
    const __m512d tolerance = _mm512_set1_pd(p.eb);
    const __m512i one = _mm512_set1_epi32(1), two = _mm512_set1_epi32(2), sign_bit = _mm512_set1_epi32((int)0x80000000u);
    hp_u32 outliers = 0;
    for (int half = 0; half < 2; ++half) {
        __m512 x = _mm512_loadu_ps(xb + 16 * half);
        __m512 magnitude_x = _mm512_abs_ps(x);
        __mmask16 usable;
        __m512i level = hp_level16_f32(magnitude_x, eb, inv, max_scaled, &usable);
        __mmask16 negative = _mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ);
        __m512i code = _mm512_maskz_mov_epi32(usable, _mm512_mask_sub_epi32(level, negative, _mm512_setzero_si512(), level));
        // decoded value: level 1 -> sub, else (level - 2) * step + base, of x's sign; 0 where the code is 0
        __m512 sub = _mm512_mask_blend_ps(negative, sub_positive, sub_negative);
        __m512 base = _mm512_mask_blend_ps(negative, base_positive, base_negative);
        __m512 binned = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(level, two)), step), base);
        __m512 magnitude = _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(level, one), binned, sub);
        __m512i y_bits = _mm512_mask_xor_epi32(_mm512_castps_si512(magnitude), negative, _mm512_castps_si512(magnitude), sign_bit);
        __mmask16 nonzero = _mm512_test_epi32_mask(code, code);
        __m512 y = _mm512_castsi512_ps(_mm512_maskz_mov_epi32(nonzero, y_bits));
        // the float64 bound check, 8 lanes at a time
        __m512d x_low = _mm512_cvtps_pd(_mm512_castps512_ps256(x)), y_low = _mm512_cvtps_pd(_mm512_castps512_ps256(y));
        __m512d x_high = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(x), 1)));
        __m512d y_high = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(y), 1)));
        __mmask16 within = (__mmask16)(
            (hp_u32)_mm512_cmp_pd_mask(_mm512_abs_pd(_mm512_sub_pd(x_low, y_low)), tolerance, _CMP_LE_OQ) |
            ((hp_u32)_mm512_cmp_pd_mask(_mm512_abs_pd(_mm512_sub_pd(x_high, y_high)), tolerance, _CMP_LE_OQ) << 8));
        // signs compared in float32: widening to float64 keeps sign, zero and NaN
        hp_u32 same_positive = ~((hp_u32)_mm512_cmp_ps_mask(x, zero, _CMP_GT_OQ) ^ (hp_u32)_mm512_cmp_ps_mask(y, zero, _CMP_GT_OQ));
        hp_u32 same_negative = ~((hp_u32)negative ^ (hp_u32)_mm512_cmp_ps_mask(y, zero, _CMP_LT_OQ));
        hp_u32 good = (hp_u32)nonzero & (hp_u32)within & same_positive & same_negative & 0xffffu;
        hp_u32 plus_zero = (hp_u32)_mm512_cmpeq_epi32_mask(_mm512_castps_si512(x), _mm512_setzero_si512());
        _mm512_storeu_si512((void*)(q + 16 * half), _mm512_maskz_mov_epi32((__mmask16)good, code));
        outliers |= (~good & ~plus_zero & 0xffffu) << (16 * half);
    }
    return outliers;
}
#elif HPCDL_HOST_AVX2
// The AVX2 version of hp_sz_quantize32_f32_abs above: 8 lanes at a time, vector compare masks (all ones or zero),
// the float64 check 4 lanes at a time, the lanes' selections combined as 8-bit movemasks.
inline hp_u32 hp_sz_quantize32_f32_abs(const float* xb, const HpSzParams& p, hp_i32* q) {
    const __m256 inv = _mm256_set1_ps((float)p.inv), eb = _mm256_set1_ps((float)p.eb), zero = _mm256_setzero_ps();
    const __m256 step = _mm256_set1_ps((float)p.step), max_scaled = _mm256_set1_ps((float)(HPCDL_MAX_Q - 1));
    const __m256 sub_positive = _mm256_set1_ps((float)p.sub[0]), sub_negative = _mm256_set1_ps((float)p.sub[1]);
    const __m256 base_positive = _mm256_set1_ps((float)p.base[0]), base_negative = _mm256_set1_ps((float)p.base[1]);
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 sign_bit = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    const __m256d tolerance = _mm256_set1_pd(p.eb);
    const __m256d abs_mask_d = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
    const __m256i one = _mm256_set1_epi32(1), two = _mm256_set1_epi32(2), zero_i = _mm256_setzero_si256();
    hp_u32 outliers = 0;
    for (int v = 0; v < 4; ++v) {
        __m256 x = _mm256_loadu_ps(xb + 8 * v);
        __m256 usable;
        __m256i level = hp_level8_f32(_mm256_and_ps(x, abs_mask), eb, inv, max_scaled, &usable);
        __m256 negative = _mm256_cmp_ps(x, zero, _CMP_LT_OQ);
        __m256i negative_i = _mm256_castps_si256(negative);
        __m256i code = _mm256_and_si256(_mm256_castps_si256(usable),
                                        _mm256_sub_epi32(_mm256_xor_si256(level, negative_i), negative_i));
        // decoded value: level 1 -> sub, else (level - 2) * step + base, of x's sign; 0 where the code is 0
        __m256 sub = _mm256_blendv_ps(sub_positive, sub_negative, negative);
        __m256 base = _mm256_blendv_ps(base_positive, base_negative, negative);
        __m256 binned = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(level, two)), step), base);
        __m256 magnitude = _mm256_blendv_ps(binned, sub, _mm256_castsi256_ps(_mm256_cmpeq_epi32(level, one)));
        __m256 code_zero = _mm256_castsi256_ps(_mm256_cmpeq_epi32(code, zero_i));
        __m256 y = _mm256_andnot_ps(code_zero, _mm256_xor_ps(magnitude, _mm256_and_ps(negative, sign_bit)));
        // the float64 bound check, 4 lanes at a time
        __m256d x_low = _mm256_cvtps_pd(_mm256_castps256_ps128(x)), x_high = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
        __m256d y_low = _mm256_cvtps_pd(_mm256_castps256_ps128(y)), y_high = _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1));
        hp_u32 within =
            (hp_u32)_mm256_movemask_pd(_mm256_cmp_pd(_mm256_and_pd(_mm256_sub_pd(x_low, y_low), abs_mask_d), tolerance, _CMP_LE_OQ)) |
            ((hp_u32)_mm256_movemask_pd(_mm256_cmp_pd(_mm256_and_pd(_mm256_sub_pd(x_high, y_high), abs_mask_d), tolerance, _CMP_LE_OQ)) << 4);
        // signs compared in float32: widening to float64 keeps sign, zero and NaN
        hp_u32 same_positive = ~((hp_u32)_mm256_movemask_ps(_mm256_cmp_ps(x, zero, _CMP_GT_OQ)) ^
                                 (hp_u32)_mm256_movemask_ps(_mm256_cmp_ps(y, zero, _CMP_GT_OQ)));
        hp_u32 same_negative = ~((hp_u32)_mm256_movemask_ps(negative) ^ (hp_u32)_mm256_movemask_ps(_mm256_cmp_ps(y, zero, _CMP_LT_OQ)));
        hp_u32 nonzero = (hp_u32)_mm256_movemask_ps(code_zero) ^ 0xffu;
        hp_u32 good = nonzero & within & same_positive & same_negative & 0xffu;
        hp_u32 plus_zero = (hp_u32)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_castps_si256(x), zero_i)));
        _mm256_storeu_si256((__m256i*)(q + 8 * v), _mm256_and_si256(code, hp_lanes_in(good)));
        outliers |= (~good & ~plus_zero & 0xffu) << (8 * v);
    }
    return outliers;
}
#endif

template <class D, int MODE>
HPCDL_HD_INLINE hp_u32 hp_sz_quantize_lanes(const typename D::S* xb, int count, const HpSzParams& p, hp_i32* q) {
#if HPCDL_HOST_AVX2
    if (MODE == HPCDL_MODE_ABS && sizeof(typename D::S) == 4 && count == HPCDL_BLOCK)  // float32 (HpF32)
        return hp_sz_quantize32_f32_abs((const float*)xb, p, q);
#endif
    typedef typename D::T T;
    const hp_u32 lane_bit[HPCDL_BLOCK] = HPCDL_LANE_BITS;
    T xs[HPCDL_BLOCK], ys[HPCDL_BLOCK];
    hp_i32 codes[HPCDL_BLOCK], plus_zero[HPCDL_BLOCK];
    hp_u8 outlier[HPCDL_BLOCK];
    const HpSzParams local = p;  // stores through q may alias p; a local copy may not
    for (int i = 0; i < count; ++i) {
        xs[i] = D::load(xb[i]);
        plus_zero[i] = D::bits(xs[i]) == 0;
        codes[i] = hp_sz_code<D, MODE>(xs[i], local);
        ys[i] = D::load(D::store(hp_sz_value<D, MODE>(codes[i], local)));
    }
    for (int i = 0; i < count; ++i)
        hp_sz_check<MODE>(hp_widen(xs[i]), hp_widen(ys[i]), codes[i], plus_zero[i] != 0, local, &q[i], &outlier[i]);
    hp_u32 mask = 0;
    for (int i = 0; i < count; ++i) mask |= outlier[i] ? lane_bit[i] : 0u;
    for (int i = count; i < HPCDL_BLOCK; ++i) q[i] = 0;
    return mask;
}

template <class D, int MODE>
HPCDL_HD inline hp_u32 hp_sz_quantize_block(const typename D::S* x, hp_i64 n, hp_i64 block, const HpSzParams& p,
                                            hp_i32* q) {
    return hp_sz_quantize_lanes<D, MODE>(x + block * HPCDL_BLOCK, hp_block_count(n, block), p, q);
}

// Encoding pass 1: the block's header byte and its number of outliers.
template <class D, int MODE>
HPCDL_HD inline void hp_sz_header_block(const typename D::S* x, hp_i64 n, hp_i64 block, const HpSzParams& p,
                                        hp_u8* headers, hp_i32* outlier_counts) {
    hp_i32 q[HPCDL_BLOCK];
    hp_u32 outliers = hp_sz_quantize_block<D, MODE>(x, n, block, p, q);
    headers[block] = hp_block_header(q, hp_block_count(n, block));
    outlier_counts[block] = hp_popcount(outliers);
}

// Encoding pass 2, after the prefix sums of words and outlier counts: the block's words, and its outliers'
// flat indices (int64 if index64, else int32) and exact values.
template <class D, int MODE>
HPCDL_HD inline void hp_sz_pack_block(const typename D::S* x, hp_i64 n, hp_i64 block, const HpSzParams& p,
                                      const hp_u8* headers, const hp_i64* offsets, const hp_i64* outlier_offsets,
                                      hp_u32* words, void* indices, int index64, typename D::S* values) {
    hp_i32 q[HPCDL_BLOCK];
    hp_u32 outliers = hp_sz_quantize_block<D, MODE>(x, n, block, p, q);
    hp_i64 start = block * HPCDL_BLOCK, slot = outlier_offsets[block];
    hp_block_pack(q, hp_block_count(n, block), headers[block], words + offsets[block]);
    for (int i = 0; outliers != 0; ++i, outliers >>= 1) {
        if (!(outliers & 1u)) continue;
        if (index64) ((hp_i64*)indices)[slot] = start + i;
        else ((hp_i32*)indices)[slot] = (hp_i32)(start + i);
        values[slot++] = x[start + i];
    }
}

// Decodes one block of `count` (1..32) elements from its header and words into out[0 .. count - 1].
template <class D, int MODE>
HPCDL_HD_INLINE void hp_sz_decode_lanes(hp_u8 header, const hp_u32* words, int count, const HpSzParams& p,
                                        typename D::S* out) {
    hp_i32 q[HPCDL_BLOCK];
    hp_block_unpack(header, words, q);
    for (int i = 0; i < count; ++i) out[i] = D::store(hp_sz_value<D, MODE>(q[i], p));
}

template <class D, int MODE>
HPCDL_HD inline void hp_sz_decode_block(const hp_u8* headers, const hp_i64* offsets, const hp_u32* words, hp_i64 n,
                                        hp_i64 block, const HpSzParams& p, typename D::S* out) {
    hp_sz_decode_lanes<D, MODE>(headers[block], words + offsets[block], hp_block_count(n, block), p,
                                out + block * HPCDL_BLOCK);
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
