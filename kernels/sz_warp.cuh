// Warp-per-block GPU kernels of the `sz` stream (docs/format.md, docs/gpu.md): the same bytes as the host build and
// the reference, built from the element functions of sz_block.cuh.
//
// Lane i of a warp holds element i of a 32-element block (coalesced loads); a bit plane is one __ballot_sync; a
// CTA of HPCDL_CTA_WARPS warps handles a tile of HPCDL_TILE_BLOCKS consecutive blocks and finds where the tile's
// words and outliers go with a decoupled look-back over the tiles before it (tiles are taken in order from a
// ticket counter, so every tile it waits for is running). The payload checksum is a sum of per-u64-word terms:
// each tile adds the terms of the u64 words whose last element it holds, with the elements before the tile taken
// from the look-back's carried "last elements" windows; the outlier sections' terms are kept relative to their
// section (sum of terms, sum of mixes), because where those sections start depends on the total word count.
//
// Included by kernels/sz_cuda.cu; tests compile the same source for the host under an emulation of the CUDA grid
// and warp primitives (tests/gpu_emulation/).
#pragma once

#include "sz_block.cuh"

#define HPCDL_CTA_WARPS 8
#define HPCDL_CTA_THREADS (32 * HPCDL_CTA_WARPS)
#define HPCDL_WARP_BLOCKS 4                                     // blocks per warp in a tile
#define HPCDL_TILE_BLOCKS (HPCDL_CTA_WARPS * HPCDL_WARP_BLOCKS)  // a multiple of 8: its header bytes are whole u64s
#define HPCDL_TILE_ELEMENTS (HPCDL_TILE_BLOCKS * HPCDL_BLOCK)
#define HPCDL_FULL_MASK 0xffffffffu

// Slots of the u64 summary array every launch sequence shares (zeroed before the first kernel). The host reads
// slots HPCDL_SUM_CHECKSUM .. HPCDL_SUM_BASE_NEGATIVE in one copy.
#define HPCDL_SUM_TICKET 0      // next tile to take
#define HPCDL_SUM_DONE 1        // decode: CTAs finished
#define HPCDL_SUM_RANGE_HIGH 2  // rel: order key of the largest finite element (0: none)
#define HPCDL_SUM_RANGE_LOW 3   // rel: complement of the order key of the smallest finite element (0: none)
#define HPCDL_SUM_CHECKSUM 4    // terms at known positions: block headers and words (decode: the whole payload)
#define HPCDL_SUM_INDEX_TERMS 5 // outlier indices, positions relative to their section
#define HPCDL_SUM_INDEX_MIXES 6
#define HPCDL_SUM_VALUE_TERMS 7 // outlier values, positions relative to their section
#define HPCDL_SUM_VALUE_MIXES 8
#define HPCDL_SUM_WORDS 9       // total words
#define HPCDL_SUM_OUTLIERS 10   // total outliers
#define HPCDL_SUM_STATUS 11     // decode: HPCDL_BAD_* bits
#define HPCDL_SUM_EB 12         // the parameters the encoder used (float64 bits): eb, step, sub[0], sub[1],
#define HPCDL_SUM_STEP 13       // base[0], base[1]
#define HPCDL_SUM_SUB 14
#define HPCDL_SUM_BASE 16
#define HPCDL_SUM_PREPASS_TICKET 18  // next pre-pass unit to take
#define HPCDL_SUM_RANGE_DONE 19      // pre-pass range units finished
#define HPCDL_SUM_SAMPLE_DONE 20     // pre-pass sample units finished
#define HPCDL_SUM_SAMPLE 21          // sz_stats of the sample, 8 sums per slack (HPCDL_SLACK_COUNT slacks)
#define HPCDL_SUM_FULL 77            // sz_stats of the whole tensor with the chosen trial, 8 sums
#define HPCDL_SUMMARY_SLOTS 88

#define HPCDL_PREPASS_UNIT 8192  // elements per range or full unit of the pre-pass
#define HPCDL_SAMPLE_UNIT 2048   // sample elements per sample unit

#define HPCDL_BAD_HEADER 1u    // a block header of more than 32 words
#define HPCDL_BAD_WORDS 2u     // the block headers do not add up to the stream's word count
#define HPCDL_BAD_INDICES 4u   // outlier indices out of range or not strictly increasing
#define HPCDL_BAD_CHECKSUM 8u  // the payload fails its checksum

// Spin-wait hint of the look-back (the emulation yields to the other emulated threads here).
#ifndef HPCDL_SPIN_PAUSE
#define HPCDL_SPIN_PAUSE()
#endif
// Statically sized shared memory; the emulation gives every emulated CTA its own.
#ifndef HPCDL_SHARED
#define HPCDL_SHARED(type, name, count) __shared__ type name[count]
#endif

// ---------------------------------------------------------------- warp helpers

__device__ inline hp_u32 hp_warp_or(hp_u32 v) {
#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800) || defined(HPCDL_HAS_REDUCE_OR_SYNC)
    return __reduce_or_sync(HPCDL_FULL_MASK, v);
#else
    for (int d = 16; d > 0; d >>= 1) v |= __shfl_xor_sync(HPCDL_FULL_MASK, v, d);
    return v;
#endif
}

__device__ inline hp_u64 hp_warp_sum64(hp_u64 v) {
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(HPCDL_FULL_MASK, v, d);
    return v;
}

__device__ inline hp_u64 hp_warp_max64(hp_u64 v) {
    for (int d = 16; d > 0; d >>= 1) {
        hp_u64 other = __shfl_xor_sync(HPCDL_FULL_MASK, v, d);
        v = other > v ? other : v;
    }
    return v;
}

// Inclusive prefix sum over the lanes.
__device__ inline hp_i32 hp_warp_inclusive_sum(hp_i32 v, int lane) {
    for (int d = 1; d < 32; d <<= 1) {
        hp_i32 other = __shfl_up_sync(HPCDL_FULL_MASK, v, d);
        if (lane >= d) v += other;
    }
    return v;
}

// ---------------------------------------------------------------- one element, one block per warp

// The bits of a stored element (float32, float16 or bfloat16 storage, float64).
__device__ inline hp_u64 hp_storage_bits(float s) { return hp_f2u(s); }
__device__ inline hp_u64 hp_storage_bits(hp_u16 s) { return s; }
__device__ inline hp_u64 hp_storage_bits(double s) { return hp_d2u(s); }

// Code and outlier flag of one element: the per-lane body of hp_sz_quantize_lanes (sz_block.cuh), the same
// element functions in the same order.
template <class D, int MODE>
__device__ inline void hp_sz_quantize_element(typename D::S s, const HpSzParams& p, hp_i32* q, hp_u8* outlier) {
    typename D::T x = D::load(s);
    hp_i32 code = hp_sz_code<D, MODE>(x, p);
    typename D::T y = D::load(D::store(hp_sz_value<D, MODE>(code, p)));
    hp_sz_check<MODE>(hp_widen(x), hp_widen(y), code, D::bits(x) == 0, p, q, outlier);
}

// Header byte of the block whose lane `lane` holds code q (lanes >= count hold 0; count 0: no block, header 0).
__device__ inline hp_u8 hp_warp_header(hp_i32 q, int lane, int count) {
    hp_i32 previous = __shfl_up_sync(HPCDL_FULL_MASK, q, 1);
    previous = lane == 0 ? 0 : previous;
    bool present = lane < count;
    hp_u32 nonzero = q != 0;
    hp_u32 any_zigzag = hp_warp_or(hp_zigzag(q));
    hp_u32 any_unsigned = hp_warp_or((hp_u32)q);
    hp_u32 any_lorenzo = hp_warp_or(present ? hp_zigzag((hp_i32)((hp_u32)q - (hp_u32)previous)) : 0u);
    hp_u32 any_sparse = hp_warp_or((hp_u32)q - nonzero);
    hp_u32 mask = __ballot_sync(HPCDL_FULL_MASK, nonzero != 0);
    return count > 0 ? hp_choose_header(any_zigzag, any_unsigned, any_lorenzo, any_sparse, mask) : (hp_u8)0;
}

// The block's words: lane m returns word m (0 for m >= the header's word count). Bit planes are one ballot each;
// a sparse block compacts its nonzero lanes through `scratch` (32 words of this warp's shared memory).
__device__ inline hp_u32 hp_warp_pack(hp_i32 q, int lane, int count, hp_u8 header, hp_u32* scratch) {
    int width = header & 63, predictor = header >> 6;
    hp_u32 word = 0;
    if (predictor == HPCDL_PRED_SPARSE) {
        hp_u32 mask = __ballot_sync(HPCDL_FULL_MASK, q != 0);
        int k = hp_popcount(mask), rank = hp_popcount(mask & ((1u << lane) - 1u));
        scratch[lane] = 0;
        __syncwarp();
        if (q != 0) scratch[rank] = (hp_u32)q - 1u;
        __syncwarp();
        hp_u32 value = scratch[lane];  // the rank-th nonzero lane's q - 1 (0 past k)
        __syncwarp();
        int planes = hp_sparse_planes(width, k);
        hp_u32 plane = 0;
        for (int j = 0; j < planes; ++j) {
            hp_u32 bits = __ballot_sync(HPCDL_FULL_MASK, (value >> j) & 1u);
            if (lane == j) plane = bits;
        }
        // word m >= 1 holds stream bits 32 (m - 1) .. 32 m - 1; plane j sits at stream bits j k .. j k + k - 1
        int base = 32 * (lane - 1), first = k > 0 && lane > 0 ? base / k : 0, reach = k > 0 ? 32 / k + 2 : 0;
        for (int t = 0; t < reach; ++t) {
            int j = first + t;
            hp_u32 source = __shfl_sync(HPCDL_FULL_MASK, plane, j & 31);
            int shift = j * k - base;
            if (lane > 0 && lane < width && j < planes && shift < 32 && shift > -k)
                word |= shift >= 0 ? (hp_u32)((hp_u64)source << shift) : source >> -shift;
        }
        return lane == 0 ? mask : word;
    }
    hp_i32 previous = __shfl_up_sync(HPCDL_FULL_MASK, q, 1);
    previous = lane == 0 ? 0 : previous;
    hp_u32 u = predictor == HPCDL_PRED_UNSIGNED ? (hp_u32)q
               : predictor == HPCDL_PRED_LORENZO ? hp_zigzag((hp_i32)((hp_u32)q - (hp_u32)previous))
                                                 : hp_zigzag(q);
    u = lane < count ? u : 0u;
    for (int j = 0; j < width; ++j) {
        hp_u32 plane = __ballot_sync(HPCDL_FULL_MASK, (u >> j) & 1u);
        if (lane == j) word = plane;
    }
    return word;
}

// Inverse of hp_warp_pack for a header of at most 32 words: lane m passes word m (0 for m >= the word count) and
// gets the code of lane m.
__device__ inline hp_i32 hp_warp_unpack(hp_u32 word, int lane, hp_u8 header) {
    int width = header & 63, predictor = header >> 6;
    if (predictor == HPCDL_PRED_SPARSE) {
        hp_u32 mask = __shfl_sync(HPCDL_FULL_MASK, word, 0);
        int k = hp_popcount(mask), planes = width > 0 ? hp_sparse_planes(width, k) : 0;
        int start = lane * k;  // plane `lane` is stream bits start .. start + k - 1, in words 1 + start / 32 ..
        hp_u32 low = __shfl_sync(HPCDL_FULL_MASK, word, (1 + (start >> 5)) & 31);
        hp_u32 high = __shfl_sync(HPCDL_FULL_MASK, word, (2 + (start >> 5)) & 31);
        hp_u64 keep = k == 32 ? 0xffffffffull : (1ull << k) - 1;
        hp_u32 plane = lane < planes ? (hp_u32)((((hp_u64)high << 32 | low) >> (start & 31)) & keep) : 0u;
        hp_u32 value = 0;  // of the lane-th nonzero lane
        for (int j = 0; j < planes; ++j) value |= ((__shfl_sync(HPCDL_FULL_MASK, plane, j) >> lane) & 1u) << j;
        int rank = hp_popcount(mask & ((1u << lane) - 1u));
        hp_u32 mine = __shfl_sync(HPCDL_FULL_MASK, value, rank & 31);
        return ((mask >> lane) & 1u) ? (hp_i32)(mine + 1u) : 0;
    }
    hp_u32 u = 0;
    for (int j = 0; j < width; ++j) u |= ((__shfl_sync(HPCDL_FULL_MASK, word, j) >> lane) & 1u) << j;
    if (predictor == HPCDL_PRED_UNSIGNED) return (hp_i32)u;
    hp_i32 q = hp_unzigzag(u);
    if (predictor == HPCDL_PRED_LORENZO) {  // wrap-around prefix sum of the differences
        hp_u32 sum = (hp_u32)q;
        for (int d = 1; d < 32; d <<= 1) {
            hp_u32 other = __shfl_up_sync(HPCDL_FULL_MASK, sum, d);
            if (lane >= d) sum += other;
        }
        q = (hp_i32)sum;
    }
    return q;
}

// ---------------------------------------------------------------- decoupled look-back over tiles

// What a tile contributes to the stream, or what all tiles before one contribute: word and outlier counts and
// the last elements of each stream of u64 words (words, outlier indices, outlier values), the newest in the low
// bits, as many as a u64 word can hold minus one: the elements a later tile's first u64 word starts with.
struct HpScanState {
    hp_i64 words, outliers;
    hp_u64 last_word, last_index, last_value;
};

struct HpTileStatus {
    hp_u32 flag;  // 0 nothing yet, 1 aggregate, 2 inclusive
    hp_u32 unused;
    HpScanState aggregate, inclusive;
};
static_assert(sizeof(HpTileStatus) == 88, "hpcdl/compress/blocks/cuda.py allocates 88 bytes per tile");

// The window of the last (64 / bits - 1) elements after `after_count` more elements (window `after`) follow
// those of `before`.
__device__ inline hp_u64 hp_window(hp_u64 before, hp_u64 after, hp_i64 after_count, int bits) {
    int keep = 64 / bits - 1;
    if (keep == 0) return 0;
    hp_u64 mask = (1ull << (keep * bits)) - 1;
    if (after_count >= keep) return after & mask;
    return ((before << (after_count * bits)) | after) & mask;
}

__device__ inline HpScanState hp_combine(const HpScanState& a, const HpScanState& b, int index_bits, int value_bits) {
    HpScanState c;
    c.words = a.words + b.words;
    c.outliers = a.outliers + b.outliers;
    c.last_word = hp_window(a.last_word, b.last_word, b.words, 32);
    c.last_index = hp_window(a.last_index, b.last_index, b.outliers, index_bits);
    c.last_value = hp_window(a.last_value, b.last_value, b.outliers, value_bits);
    return c;
}

__device__ inline void hp_store_state(volatile HpScanState* to, const HpScanState& s) {
    to->words = s.words, to->outliers = s.outliers;
    to->last_word = s.last_word, to->last_index = s.last_index, to->last_value = s.last_value;
}

__device__ inline HpScanState hp_load_state(const volatile HpScanState* from) {
    HpScanState s;
    s.words = from->words, s.outliers = from->outliers;
    s.last_word = from->last_word, s.last_index = from->last_index, s.last_value = from->last_value;
    return s;
}

// One state from lane `source` of the warp (every lane calls it).
__device__ inline HpScanState hp_shfl_state(const HpScanState& s, int source) {
    HpScanState t;
    t.words = __shfl_sync(HPCDL_FULL_MASK, s.words, source);
    t.outliers = __shfl_sync(HPCDL_FULL_MASK, s.outliers, source);
    t.last_word = __shfl_sync(HPCDL_FULL_MASK, s.last_word, source);
    t.last_index = __shfl_sync(HPCDL_FULL_MASK, s.last_index, source);
    t.last_value = __shfl_sync(HPCDL_FULL_MASK, s.last_value, source);
    return t;
}

__device__ inline int hp_lowest_set_bit(hp_u32 v) {
#if defined(__CUDA_ARCH__)
    return __ffs((int)v) - 1;
#else
    return __builtin_ctz(v);
#endif
}

// Run by the 32 lanes of one warp of the tile's CTA: publishes the tile's own state, waits for the tiles before
// it and returns what they contribute (the exclusive prefix), after publishing the inclusive one. The warp reads
// 32 predecessors at a time (lane k the (k+1)-th nearest), as CUB's look-back does: one round of reads combines
// up to 32 aggregates, so the prefix does not wait for every tile before it to publish its inclusive state in
// turn (one thread reading one predecessor at a time ran the first H200 encode at 42 GB/s).
__device__ inline HpScanState hp_lookback(HpTileStatus* status, hp_i64 tile, const HpScanState& own, int index_bits,
                                          int value_bits) {
    const int lane = threadIdx.x & 31;
    volatile HpTileStatus* mine = status + tile;
    const HpScanState none = {0, 0, 0, 0, 0};
    HpScanState before = none;
    if (tile == 0) {
        if (lane == 0) {
            hp_store_state(&mine->inclusive, own);
            __threadfence();
            mine->flag = 2;
        }
        return before;
    }
    if (lane == 0) {
        hp_store_state(&mine->aggregate, own);
        __threadfence();
        mine->flag = 1;
    }
    for (hp_i64 end = tile;; end -= 32) {
        hp_i64 p = end - 1 - lane;
        hp_u32 flag = 2;  // before tile 0: nothing, as an inclusive state
        if (p >= 0) {
            volatile HpTileStatus* other = status + p;
            while ((flag = other->flag) == 0) HPCDL_SPIN_PAUSE();
        }
        __syncwarp();
        __threadfence();
        HpScanState state = p < 0 ? none : flag == 2 ? hp_load_state(&status[p].inclusive) : hp_load_state(&status[p].aggregate);
        hp_u32 inclusive = __ballot_sync(HPCDL_FULL_MASK, flag == 2);
        int nearest = inclusive ? hp_lowest_set_bit(inclusive) : 31;
        state = lane <= nearest ? state : none;
        for (int d = 1; d < 32; d <<= 1) {  // lane 0 gets lanes nearest .. 0 combined, the earliest tile first
            HpScanState earlier = hp_shfl_state(state, lane + d < 32 ? lane + d : lane);
            if (lane + d < 32) state = hp_combine(earlier, state, index_bits, value_bits);
        }
        before = hp_combine(hp_shfl_state(state, 0), before, index_bits, value_bits);
        if (inclusive) break;
    }
    if (lane == 0) {
        hp_store_state(&mine->inclusive, hp_combine(before, own, index_bits, value_bits));
        __threadfence();
        mine->flag = 2;
    }
    return before;
}

// The u64 word of a stream of `bits`-bit elements that ends with element `last` (its rank in the stream; the
// word holds ranks last - last % per .. last): ranks >= first come from `element(rank - first)`, earlier ones
// from the window of the elements before `first`.
template <class Element>
__device__ inline hp_u64 hp_group(hp_i64 last, hp_i64 first, hp_u64 window, int bits, Element element) {
    int per = 64 / bits;
    hp_u64 mask = bits == 64 ? ~0ull : (1ull << bits) - 1, word = 0;
    for (hp_i64 rank = last - last % per; rank <= last; ++rank) {
        hp_u64 value = rank >= first ? element(rank - first) & mask : (window >> ((first - 1 - rank) * bits)) & mask;
        word |= value << ((rank % per) * bits);
    }
    return word;
}

// ---------------------------------------------------------------- the pre-pass: rel's range and sz_stats

// Order key of a float64: unsigned comparison of keys is the order of the values (zeros of both signs are 0.0).
__device__ inline hp_u64 hp_order_key(double d) {
    hp_u64 bits = hp_d2u(d == 0.0 ? 0.0 : d);
    return (bits >> 63) ? ~bits : (bits | 0x8000000000000000ull);
}

__device__ inline double hp_key_value(hp_u64 key) {
    return hp_u2d((key >> 63) ? (key & 0x7fffffffffffffffull) : ~key);
}

// The slacks of hpcdl/compress/blocks/params.py (SLACKS, SLACK_MARGIN), smallest first.
#define HPCDL_SLACK_COUNT 7
#define HPCDL_SLACK_MARGIN 0.75
__device__ inline double hp_slack(int k) {
    const double slacks[HPCDL_SLACK_COUNT] = {1.0 / 32, 1.0 / 16, 1.0 / 8, 3.0 / 16, 1.0 / 4, 3.0 / 8, 1.0 / 2};
    return slacks[k];
}

// What the pre-pass and the encoder know before the data: the mode, abs's eb (rel's comes from the range),
// pw_rel's shift, and the mantissa bits of the compute type (pw_rel's base range).
struct HpSzRequest {
    int mode, rel;
    double bound, eb;
    int shift, mantissa;
};

// Python's max(a, b) and min(a, b) on floats (the first unless the second is strictly larger / smaller).
__device__ inline double hp_py_max(double a, double b) { return b > a ? b : a; }
__device__ inline double hp_py_min(double a, double b) { return b < a ? b : a; }

__device__ inline double hp_inf() { return hp_u2d(0x7ff0000000000000ull); }

// The absolute bound: abs's, or rel's bound * (max - min) over the finite elements from the range slots, 0
// without finite elements (the float64 arithmetic of hpcdl.compress.value_range); 0 when the bin width 2 eb
// overflows (params.usable_eb).
__device__ inline double hp_sz_eb(const volatile hp_u64* summary, const HpSzRequest& r) {
    double eb = r.eb;
    if (r.rel) {
        hp_u64 high = summary[HPCDL_SUM_RANGE_HIGH], low = summary[HPCDL_SUM_RANGE_LOW];
        double range = high ? hp_key_value(high) - hp_key_value(~low) : 0.0;
        eb = r.bound * range;
    }
    return 2.0 * eb < hp_inf() ? eb : 0.0;
}

// SzParams(mode, bound, eb, 0, step=...) of params.py, with its inv.
__device__ inline HpSzParams hp_sz_abs_params(double eb, double bound, double step) {
    HpSzParams p = {eb, step > 0.0 ? 1.0 / step : hp_inf(), bound, 0, step, {0.0, 0.0}, {0.0, 0.0}};
    return p;
}

// params._mean_offsets: the mean offsets from the bin centres of sums[8], x > 0 and x < 0.
__device__ inline void hp_mean_offsets(const volatile hp_u64* sums, double eb, double* offsets) {
    double unit = eb / (double)(1 << HPCDL_STAT_BITS);
    for (int s = 0; s < 2; ++s) {
        hp_i64 n = (hp_i64)sums[4 + 2 * s], total = (hp_i64)sums[5 + 2 * s];
        offsets[s] = n ? (double)total / (double)n * unit : 0.0;
    }
}

// The parameters the statistics of the whole tensor are taken with (SzParams.for_tensor): pw_rel's trial (base
// at the middle), abs/rel without reconstruction when eb is not > 0, else the first slack whose mean offsets on
// the sample (the sample slots) are within HPCDL_SLACK_MARGIN x slack x eb (the last slack when none is).
__device__ inline HpSzParams hp_sz_trial(const volatile hp_u64* summary, const HpSzRequest& r) {
    if (r.mode == HPCDL_MODE_PW_REL) {
        double half = (double)((1ll << r.shift) >> 1);
        HpSzParams p = {0.0, hp_inf(), r.bound, r.shift, 0.0, {0.0, 0.0}, {half, half}};
        return p;
    }
    double eb = hp_sz_eb(summary, r);
    if (!(eb > 0.0)) return hp_sz_abs_params(eb, r.bound, 0.0);
    int k = 0;
    for (; k < HPCDL_SLACK_COUNT - 1; ++k) {
        double offsets[2];
        hp_mean_offsets(summary + HPCDL_SUM_SAMPLE + 8 * k, eb, offsets);
        double largest = hp_py_max(fabs(offsets[0]), fabs(offsets[1]));
        if (largest <= HPCDL_SLACK_MARGIN * hp_slack(k) * eb) break;
    }
    return hp_sz_abs_params(eb, r.bound, 2.0 * eb * (1.0 - hp_slack(k)));
}

// The parameters the encoder uses (SzParams.for_tensor): the trial completed from the whole tensor's sums
// (the full slots) as SzParams.with_means (abs, rel) and params._pw_rel_bases (pw_rel) compute it.
__device__ inline HpSzParams hp_sz_resolve(const volatile hp_u64* summary, const HpSzRequest& r) {
    HpSzParams p = hp_sz_trial(summary, r);
    const volatile hp_u64* sums = summary + HPCDL_SUM_FULL;
    if (r.mode == HPCDL_MODE_PW_REL) {
        if (r.shift == 0) {
            p.base[0] = p.base[1] = 0.0;
            return p;
        }
        int drop = r.shift > HPCDL_STAT_BITS ? r.shift - HPCDL_STAT_BITS : 0;
        hp_i64 all = (1ll << r.shift) - 1;
        double floor_bound = floor(r.bound * ldexp(1.0, r.mantissa));
        hp_i64 largest = floor_bound < (double)all ? (hp_i64)floor_bound : all, smallest = all - largest;
        for (int s = 0; s < 2; ++s) {
            hp_i64 n = (hp_i64)sums[4 + 2 * s], total = (hp_i64)sums[5 + 2 * s];
            if (!n || smallest > largest) continue;  // the trial's middle
            double mean = (double)total / (double)n + 0.5;
            hp_i64 rounded = (hp_i64)floor(drop ? mean * ldexp(1.0, drop) : mean);
            rounded = rounded > smallest ? rounded : smallest;
            p.base[s] = (double)(rounded < largest ? rounded : largest);
        }
        return p;
    }
    if (!(p.eb > 0.0)) return p;
    double eb = p.eb, step = p.step, unit = eb / (double)(1 << HPCDL_STAT_BITS), centre = eb + 0.5 * step;
    double offsets[2];
    hp_mean_offsets(sums, eb, offsets);
    for (int s = 0; s < 2; ++s) {
        hp_i64 n = (hp_i64)sums[2 * s], total = (hp_i64)sums[1 + 2 * s];
        p.sub[s] = n ? hp_py_min(hp_py_max((double)total / (double)n * unit, unit), eb) : 0.5 * eb;
        p.base[s] = hp_py_min(hp_py_max(centre + offsets[s], step), 2.0 * eb);
    }
    return p;
}

// Where the sample of params._sample lies: element e of the sample is x[(e / 32) * stride_blocks * 32 + e % 32]
// (stride 1 and the whole tensor when it is small), `length` elements in all.
struct HpSzSample {
    hp_i64 stride_blocks, length;
};

// The work units of the pre-pass, in ticket order: `range` units of rel's min/max, then `sample` units of
// sz_stats of the sample for every slack, then `full` units of sz_stats of the whole tensor with the chosen
// trial. A unit waits for the kinds before it (through the done counters), which are all running because
// tickets are taken in order, as in the decoupled look-back.
struct HpPrepassUnits {
    hp_i64 range, sample, full;
};

// Adds each thread's values[k], k < COUNT, over the CTA and has one thread per slot add the total to slots[k]:
// one atomic per CTA and slot, not one per warp (atomics on one address serialize in L2, and every CTA adds to
// the same few slots). Every thread of the CTA (HPCDL_CTA_THREADS) calls it; the sums are integers, so the order
// of the additions does not change them.
template <int COUNT>
__device__ inline void hp_cta_add(const hp_u64 (&values)[COUNT], hp_u64* slots) {
    HPCDL_SHARED(hp_u64, partial, COUNT * HPCDL_CTA_WARPS);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int k = 0; k < COUNT; ++k) {
        hp_u64 total = hp_warp_sum64(values[k]);
        if (lane == 0) partial[k * HPCDL_CTA_WARPS + warp] = total;
    }
    __syncthreads();
    if (threadIdx.x < COUNT) {
        hp_u64 total = 0;
        for (int w = 0; w < HPCDL_CTA_WARPS; ++w) total += partial[threadIdx.x * HPCDL_CTA_WARPS + w];
        if (total) atomicAdd((unsigned long long*)&slots[threadIdx.x], (unsigned long long)total);
    }
    __syncthreads();  // `partial` may be written again by the next call
}

// Adds the CTA's 8 sz_stats sums to slots[8].
__device__ inline void hp_add_sums(const hp_i64* sums, hp_u64* slots) {
    const hp_u64 values[8] = {(hp_u64)sums[0], (hp_u64)sums[1], (hp_u64)sums[2], (hp_u64)sums[3],
                              (hp_u64)sums[4], (hp_u64)sums[5], (hp_u64)sums[6], (hp_u64)sums[7]};
    hp_cta_add<8>(values, slots);
}

// Thread 0 waits until the counter reaches `count`; then the CTA goes on.
__device__ inline void hp_wait_count(const hp_u64* counter, hp_i64 count) {
    if (threadIdx.x == 0) {
        while (*(const volatile hp_u64*)counter < (hp_u64)count) HPCDL_SPIN_PAUSE();
        __threadfence();
    }
    __syncthreads();
}

// Marks the CTA's unit done on `counter` once all its threads' atomics are issued.
__device__ inline void hp_mark_done(hp_u64* counter) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd((unsigned long long*)counter, 1ull);
}

// One CTA of the pre-pass (docs/gpu.md): its results stay in the summary for the encoder. Every statistic is
// hp_sz_stat_lanes of sz_block.cuh on one element per thread, so the sums are the host's.
template <class D, int MODE>
__device__ void hp_sz_prepass(const typename D::S* x, hp_i64 n, HpSzRequest r, HpSzSample sample,
                              HpPrepassUnits units, hp_u64* summary) {
    HPCDL_SHARED(hp_i64, unit_slot, 1);
    if (threadIdx.x == 0) unit_slot[0] = (hp_i64)atomicAdd((unsigned long long*)&summary[HPCDL_SUM_PREPASS_TICKET], 1ull);
    __syncthreads();
    hp_i64 unit = unit_slot[0];
    if (unit < units.range) {
        hp_u64 high = 0, low = 0;
        hp_i64 end = (unit + 1) * HPCDL_PREPASS_UNIT < n ? (unit + 1) * HPCDL_PREPASS_UNIT : n;
        for (hp_i64 i = unit * HPCDL_PREPASS_UNIT + threadIdx.x; i < end; i += blockDim.x) {
            double v = hp_widen(D::load(x[i]));
            if ((hp_d2u(v) & 0x7ff0000000000000ull) == 0x7ff0000000000000ull) continue;  // NaN, +-Inf
            hp_u64 key = hp_order_key(v);
            high = key > high ? key : high;
            low = ~key > low ? ~key : low;
        }
        high = hp_warp_max64(high), low = hp_warp_max64(low);
        if ((threadIdx.x & 31) == 0) {
            if (high) atomicMax((unsigned long long*)&summary[HPCDL_SUM_RANGE_HIGH], (unsigned long long)high);
            if (low) atomicMax((unsigned long long*)&summary[HPCDL_SUM_RANGE_LOW], (unsigned long long)low);
        }
        hp_mark_done(&summary[HPCDL_SUM_RANGE_DONE]);
        return;
    }
    hp_wait_count(&summary[HPCDL_SUM_RANGE_DONE], units.range);
    unit -= units.range;
    if (unit < units.sample) {
        double eb = hp_sz_eb(summary, r);
        if (eb > 0.0) {
            hp_i64 end = (unit + 1) * HPCDL_SAMPLE_UNIT < sample.length ? (unit + 1) * HPCDL_SAMPLE_UNIT : sample.length;
            for (int k = 0; k < HPCDL_SLACK_COUNT; ++k) {
                HpSzParams trial = hp_sz_abs_params(eb, r.bound, 2.0 * eb * (1.0 - hp_slack(k)));
                hp_i64 sums[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                for (hp_i64 e = unit * HPCDL_SAMPLE_UNIT + threadIdx.x; e < end; e += blockDim.x)
                    hp_sz_stat_lanes<D, MODE>(x + (e >> 5) * sample.stride_blocks * HPCDL_BLOCK + (e & 31), 1, trial, sums);
                hp_add_sums(sums, summary + HPCDL_SUM_SAMPLE + 8 * k);
            }
        }
        hp_mark_done(&summary[HPCDL_SUM_SAMPLE_DONE]);
        return;
    }
    hp_wait_count(&summary[HPCDL_SUM_SAMPLE_DONE], units.sample);
    unit -= units.sample;
    HPCDL_SHARED(HpSzParams, trial_slot, 1);  // resolved by one thread: every thread reading the summary costs more
    if (threadIdx.x == 0) trial_slot[0] = hp_sz_trial(summary, r);
    __syncthreads();
    const HpSzParams trial = trial_slot[0];
    if (MODE != HPCDL_MODE_PW_REL && !(trial.eb > 0.0)) return;  // no reconstruction to measure
    hp_i64 sums[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    hp_i64 end = (unit + 1) * HPCDL_PREPASS_UNIT < n ? (unit + 1) * HPCDL_PREPASS_UNIT : n;
    for (hp_i64 i = unit * HPCDL_PREPASS_UNIT + threadIdx.x; i < end; i += blockDim.x)
        hp_sz_stat_lanes<D, MODE>(x + i, 1, trial, sums);
    hp_add_sums(sums, summary + HPCDL_SUM_FULL);
}

// sz_stats with given parameters (cuda.sz_stats), grid-stride, into summary[HPCDL_SUM_FULL ..].
template <class D, int MODE>
__device__ void hp_sz_stats(const typename D::S* x, hp_i64 n, HpSzParams p, hp_u64* summary) {
    hp_i64 sums[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    hp_i64 stride = (hp_i64)gridDim.x * blockDim.x;
    for (hp_i64 i = (hp_i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        hp_sz_stat_lanes<D, MODE>(x + i, 1, p, sums);
    hp_add_sums(sums, summary + HPCDL_SUM_FULL);
}

// ---------------------------------------------------------------- encode

// Where the encoder writes (scratch from torch's caching allocator) and the sizes it must stay within.
struct HpEncodeTargets {
    hp_u8* prefix;         // block headers at 0, words at words_at: the payload's first sections
    hp_i64 words_at;       // align8(blocks)
    hp_i64 word_capacity;  // words that fit after words_at
    void* indices;         // outlier indices (int32, or int64 when index64), compact
    void* values;          // outlier values, compact
    hp_i64 outlier_capacity;
    int index64;
};

// One tile of the sz encoder (docs/gpu.md): quantize, choose headers, pack words by ballots, look back for the
// tile's place, write headers, words and outliers, add the tile's checksum terms. The parameters come from the
// pre-pass's results in the summary (hp_sz_resolve, the same in every CTA). summary[HPCDL_SUM_TICKET] and
// `status` start at 0; a stream whose words or outliers pass the capacities is not written (it takes the raw
// fallback: the host sees its size in the summary).
template <class D, int MODE>
__device__ void hp_sz_encode_tile(const typename D::S* x, hp_i64 n, HpSzRequest request, HpEncodeTargets out,
                                  HpTileStatus* status, hp_u64* summary) {
    typedef typename D::S S;
    HPCDL_SHARED(hp_i64, tile_slot, 1);
    HPCDL_SHARED(hp_u8, headers, HPCDL_TILE_BLOCKS);
    HPCDL_SHARED(hp_i32, word_starts, HPCDL_TILE_BLOCKS + 1);
    HPCDL_SHARED(hp_i32, outlier_starts, HPCDL_TILE_BLOCKS + 1);
    HPCDL_SHARED(hp_u32, words, HPCDL_TILE_BLOCKS * HPCDL_BLOCK);
    HPCDL_SHARED(hp_i64, indices, HPCDL_TILE_ELEMENTS);
    HPCDL_SHARED(S, values, HPCDL_TILE_ELEMENTS);
    HPCDL_SHARED(hp_u32, compaction, 32 * HPCDL_CTA_WARPS);  // 32 words per warp for sparse blocks
    HPCDL_SHARED(HpScanState, before_slot, 2);  // the tiles before this one, and with it
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int index_bits = out.index64 ? 64 : 32, value_bits = 8 * (int)sizeof(S);
    HPCDL_SHARED(HpSzParams, params_slot, 1);
    if (threadIdx.x == 0) {  // one thread resolves the parameters: every thread reading the summary costs more
        tile_slot[0] = (hp_i64)atomicAdd((unsigned long long*)&summary[HPCDL_SUM_TICKET], 1ull);
        params_slot[0] = hp_sz_resolve(summary, request);
    }
    __syncthreads();
    const hp_i64 tile = tile_slot[0], n_blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK;
    const hp_i64 n_tiles = (n_blocks + HPCDL_TILE_BLOCKS - 1) / HPCDL_TILE_BLOCKS;
    const HpSzParams params = params_slot[0];

    hp_u32 block_words[HPCDL_WARP_BLOCKS], outlier_masks[HPCDL_WARP_BLOCKS];
    S kept[HPCDL_WARP_BLOCKS];
    for (int k = 0; k < HPCDL_WARP_BLOCKS; ++k) {
        int local = warp * HPCDL_WARP_BLOCKS + k;
        hp_i64 block = tile * HPCDL_TILE_BLOCKS + local, element = block * HPCDL_BLOCK + lane;
        int count = block < n_blocks ? hp_block_count(n, block) : 0;
        S s = element < n ? x[element] : S();
        hp_i32 q = 0;
        hp_u8 outlier = 0;
        if (element < n) hp_sz_quantize_element<D, MODE>(s, params, &q, &outlier);
        hp_u8 header = hp_warp_header(q, lane, count);
        block_words[k] = hp_warp_pack(q, lane, count, header, compaction + 32 * warp);
        outlier_masks[k] = __ballot_sync(HPCDL_FULL_MASK, outlier != 0);
        kept[k] = s;
        if (lane == 0) {
            headers[local] = header;
            word_starts[local] = header & 63;
            outlier_starts[local] = hp_popcount(outlier_masks[k]);
        }
    }
    __syncthreads();
    if (warp == 0) {  // the tile's exclusive prefix sums, one block per lane
        hp_i32 w = word_starts[lane], o = outlier_starts[lane];
        hp_i32 w_end = hp_warp_inclusive_sum(w, lane), o_end = hp_warp_inclusive_sum(o, lane);
        __syncwarp();
        word_starts[lane] = w_end - w, outlier_starts[lane] = o_end - o;
        if (lane == 31) word_starts[HPCDL_TILE_BLOCKS] = w_end, outlier_starts[HPCDL_TILE_BLOCKS] = o_end;
    }
    __syncthreads();
    for (int k = 0; k < HPCDL_WARP_BLOCKS; ++k) {  // stage the tile's words and outliers in order
        int local = warp * HPCDL_WARP_BLOCKS + k;
        if (lane < (headers[local] & 63)) words[word_starts[local] + lane] = block_words[k];
        if ((outlier_masks[k] >> lane) & 1u) {
            int r = outlier_starts[local] + hp_popcount(outlier_masks[k] & ((1u << lane) - 1u));
            indices[r] = (tile * HPCDL_TILE_BLOCKS + local) * HPCDL_BLOCK + lane;
            values[r] = kept[k];
        }
    }
    __syncthreads();
    const hp_i32 tile_words = word_starts[HPCDL_TILE_BLOCKS], tile_outliers = outlier_starts[HPCDL_TILE_BLOCKS];
    auto word_at = [&](hp_i64 i) { return (hp_u64)words[i]; };
    auto index_at = [&](hp_i64 i) { return (hp_u64)indices[i]; };
    auto value_at = [&](hp_i64 i) { return hp_storage_bits(values[i]); };
    if (warp == 0) {
        HpScanState own;
        own.words = tile_words, own.outliers = tile_outliers;
        own.last_word = tile_words > 0 ? words[tile_words - 1] : 0u;
        own.last_index = own.last_value = 0;
        for (hp_i64 r = tile_outliers - 3 > 0 ? tile_outliers - 3 : 0; r < tile_outliers; ++r) {
            own.last_index = hp_window(own.last_index, index_at(r), 1, index_bits);
            own.last_value = hp_window(own.last_value, value_at(r), 1, value_bits);
        }
        const HpScanState tiles_before = hp_lookback(status, tile, own, index_bits, value_bits);
        if (lane == 0) before_slot[0] = tiles_before, before_slot[1] = hp_combine(tiles_before, own, index_bits, value_bits);
        if (lane == 0 && tile == n_tiles - 1) {  // the stream's totals
            const HpScanState& all = before_slot[1];
            summary[HPCDL_SUM_WORDS] = (hp_u64)all.words;
            summary[HPCDL_SUM_OUTLIERS] = (hp_u64)all.outliers;
            summary[HPCDL_SUM_EB] = hp_d2u(params.eb), summary[HPCDL_SUM_STEP] = hp_d2u(params.step);
            for (int s = 0; s < 2; ++s)
                summary[HPCDL_SUM_SUB + s] = hp_d2u(params.sub[s]), summary[HPCDL_SUM_BASE + s] = hp_d2u(params.base[s]);
        }
    }
    __syncthreads();
    const HpScanState before = before_slot[0], last = before_slot[1];
    const bool words_fit = last.words <= out.word_capacity, outliers_fit = last.outliers <= out.outlier_capacity;
    if (threadIdx.x < HPCDL_TILE_BLOCKS) {  // header bytes up to align8(blocks): 0 past the last block
        hp_i64 block = tile * HPCDL_TILE_BLOCKS + threadIdx.x;
        if (block < out.words_at) out.prefix[block] = headers[threadIdx.x];
    }
    hp_u32* word_out = (hp_u32*)(out.prefix + out.words_at);
    for (hp_i64 i = threadIdx.x; i < tile_words && words_fit; i += blockDim.x) word_out[before.words + i] = words[i];
    for (hp_i64 i = threadIdx.x; i < tile_outliers && outliers_fit; i += blockDim.x) {
        hp_i64 r = before.outliers + i;
        if (out.index64) ((hp_i64*)out.indices)[r] = indices[i];
        else ((hp_i32*)out.indices)[r] = (hp_i32)indices[i];
        ((S*)out.values)[r] = values[i];
    }
    // checksum terms of the u64 words that end in this tile
    hp_u64 absolute = 0, index_terms = 0, index_mixes = 0, value_terms = 0, value_mixes = 0;
    if (threadIdx.x < HPCDL_TILE_BLOCKS / 8) {
        hp_u64 word = 0;
        for (int b = 7; b >= 0; --b) word = (word << 8) | headers[8 * threadIdx.x + b];
        absolute += hp_checksum_term((hp_u64)(tile * HPCDL_TILE_BLOCKS / 8 + threadIdx.x), word);
    }
    const hp_u64 words_base = (hp_u64)out.words_at / 8;
    for (hp_i64 i = threadIdx.x; i < tile_words; i += blockDim.x) {
        hp_i64 g = before.words + i;
        if (g % 2 == 1) absolute += hp_checksum_term(words_base + g / 2, hp_group(g, before.words, before.last_word, 32, word_at));
    }
    const int index_per = 64 / index_bits, value_per = 64 / value_bits;
    for (hp_i64 i = threadIdx.x; i < tile_outliers; i += blockDim.x) {
        hp_i64 r = before.outliers + i;
        if (r % index_per == index_per - 1) {
            hp_u64 word = hp_group(r, before.outliers, before.last_index, index_bits, index_at);
            index_terms += hp_checksum_term((hp_u64)(r / index_per), word), index_mixes += hp_checksum_term(0, word);
        }
        if (r % value_per == value_per - 1) {
            hp_u64 word = hp_group(r, before.outliers, before.last_value, value_bits, value_at);
            value_terms += hp_checksum_term((hp_u64)(r / value_per), word), value_mixes += hp_checksum_term(0, word);
        }
    }
    if (tile == n_tiles - 1 && threadIdx.x == 0) {  // the partial u64 words at the ends of the sections
        auto none = [](hp_i64) { return (hp_u64)0; };
        if (last.words % 2)
            absolute += hp_checksum_term(words_base + last.words / 2, hp_group(last.words - 1, last.words, last.last_word, 32, none));
        if (last.outliers % index_per) {
            hp_u64 word = hp_group(last.outliers - 1, last.outliers, last.last_index, index_bits, none);
            index_terms += hp_checksum_term((hp_u64)(last.outliers / index_per), word), index_mixes += hp_checksum_term(0, word);
        }
        if (last.outliers % value_per) {
            hp_u64 word = hp_group(last.outliers - 1, last.outliers, last.last_value, value_bits, none);
            value_terms += hp_checksum_term((hp_u64)(last.outliers / value_per), word), value_mixes += hp_checksum_term(0, word);
        }
    }
    static_assert(HPCDL_SUM_INDEX_TERMS == HPCDL_SUM_CHECKSUM + 1 && HPCDL_SUM_VALUE_MIXES == HPCDL_SUM_CHECKSUM + 4,
                  "the checksum slots are consecutive");
    const hp_u64 terms[5] = {absolute, index_terms, index_mixes, value_terms, value_mixes};
    hp_cta_add<5>(terms, summary + HPCDL_SUM_CHECKSUM);
}

// Copies the encoder's scratch into the exact-size payload: headers and words, zero padding, outlier indices and
// values at their sections; one u64 word of the payload per thread and step.
__device__ inline void hp_sz_assemble(const hp_u8* prefix, hp_i64 words_end, const hp_u8* indices, hp_i64 indices_at,
                                      hp_i64 index_bytes, const hp_u8* values, hp_i64 values_at, hp_i64 value_bytes,
                                      hp_i64 total, hp_u8* payload) {
    hp_i64 stride = (hp_i64)gridDim.x * blockDim.x;
    for (hp_i64 i = (hp_i64)blockIdx.x * blockDim.x + threadIdx.x; i < total / 8; i += stride) {
        hp_i64 at = 8 * i, end = 0;
        const hp_u8* from = 0;
        if (at < words_end) from = prefix + at, end = words_end - at;
        else if (at >= indices_at && at < indices_at + index_bytes) from = indices + (at - indices_at), end = indices_at + index_bytes - at;
        else if (at >= values_at && at < values_at + value_bytes) from = values + (at - values_at), end = values_at + value_bytes - at;
        hp_u64 word = 0;
        if (end >= 8) word = *(const hp_u64*)from;
        else for (hp_i64 b = end - 1; b >= 0; --b) word = (word << 8) | from[b];
        *(hp_u64*)(payload + at) = word;
    }
}

// ---------------------------------------------------------------- decode

// The decoder's view of a stream whose lengths the host checked against its header.
struct HpDecodeSource {
    const hp_u8* payload;  // 8-byte aligned
    hp_i64 total;          // payload bytes
    hp_i64 words;          // the header's word count
    hp_i64 words_at, indices_at, values_at;
    hp_i64 outliers;
    int index64;
    hp_u64 checksum;       // the header's
};

// The number of outlier indices below `first` in the sorted index section, found by the 32 lanes of a warp probing
// 32 positions at a time (a few rounds of dependent reads, where a binary search by one thread takes ~log2 n).
// Indices out of order (a corrupted stream, refused by the checks) still give a count within 0 .. outliers.
__device__ inline hp_i64 hp_warp_search(const HpDecodeSource& in, hp_i64 first) {
    const int lane = threadIdx.x & 31;
    const hp_i32* i32 = (const hp_i32*)(in.payload + in.indices_at);
    const hp_i64* i64 = (const hp_i64*)(in.payload + in.indices_at);
    hp_i64 low = 0, high = in.outliers;  // the count lies in low .. high
    while (high - low > 32) {
        const hp_i64 span = high - low, probe = low + span * (lane + 1) / 33;  // low <= probe < high
        const hp_i64 index = in.index64 ? i64[probe] : (hp_i64)i32[probe];
        const int below = hp_popcount(__ballot_sync(HPCDL_FULL_MASK, index < first));
        const hp_i64 new_low = below ? low + span * below / 33 + 1 : low;
        high = below < 32 ? low + span * (below + 1) / 33 : high;
        low = new_low;
    }
    const hp_i64 probe = low + lane;
    const hp_i64 index = probe < high ? (in.index64 ? i64[probe] : (hp_i64)i32[probe]) : first;
    return low + hp_popcount(__ballot_sync(HPCDL_FULL_MASK, index < first));
}

// One tile of the sz decoder: block word offsets by look-back, the blocks by warps, the tile's outliers (found by
// a warp's 32-way search in the sorted indices), and a share of the checks: block headers, index order, checksum. Every
// read stays inside the payload whatever it holds; summary[HPCDL_SUM_STATUS] collects HPCDL_BAD_* bits.
template <class D, int MODE>
__device__ void hp_sz_decode_tile(HpDecodeSource in, hp_i64 n, HpSzParams params, typename D::S* out,
                                  HpTileStatus* status, hp_u64* summary) {
    typedef typename D::S S;
    HPCDL_SHARED(hp_i64, tile_slot, 1);
    HPCDL_SHARED(hp_u8, headers, HPCDL_TILE_BLOCKS);
    HPCDL_SHARED(hp_i32, word_starts, HPCDL_TILE_BLOCKS + 1);
    HPCDL_SHARED(hp_i64, before_slot, 2);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) tile_slot[0] = (hp_i64)atomicAdd((unsigned long long*)&summary[HPCDL_SUM_TICKET], 1ull);
    __syncthreads();
    const hp_i64 tile = tile_slot[0], n_blocks = (n + HPCDL_BLOCK - 1) / HPCDL_BLOCK;
    const hp_i64 n_tiles = (n_blocks + HPCDL_TILE_BLOCKS - 1) / HPCDL_TILE_BLOCKS;
    hp_u32 bad = 0;
    if (warp == 0) {
        hp_i64 block = tile * HPCDL_TILE_BLOCKS + lane;
        hp_u8 header = block < n_blocks ? in.payload[block] : (hp_u8)0;
        int width = header & 63;
        bad |= width > HPCDL_BLOCK ? HPCDL_BAD_HEADER : 0u;
        hp_i32 end = hp_warp_inclusive_sum(width, lane);
        headers[lane] = header;
        word_starts[lane] = end - width;
        if (lane == 31) word_starts[HPCDL_TILE_BLOCKS] = end;
    }
    __syncthreads();
    if (warp == 0) {
        const HpScanState own = {word_starts[HPCDL_TILE_BLOCKS], 0, 0, 0, 0};
        const hp_i64 words_before = hp_lookback(status, tile, own, 64, 64).words;
        if (lane == 0 && tile == n_tiles - 1 && words_before + own.words != in.words) bad |= HPCDL_BAD_WORDS;
        const hp_i64 outliers_before = hp_warp_search(in, tile * HPCDL_TILE_ELEMENTS);
        if (lane == 0) before_slot[0] = words_before, before_slot[1] = outliers_before;
    }
    __syncthreads();
    const hp_u32* words = (const hp_u32*)(in.payload + in.words_at);
    for (int k = 0; k < HPCDL_WARP_BLOCKS; ++k) {
        int local = warp * HPCDL_WARP_BLOCKS + k;
        hp_i64 block = tile * HPCDL_TILE_BLOCKS + local;
        hp_u8 header = headers[local];
        if ((header & 63) > HPCDL_BLOCK) header = 0;
        hp_i64 at = before_slot[0] + word_starts[local] + lane;
        hp_u32 word = lane < (header & 63) && at < in.words ? words[at] : 0u;
        hp_i32 q = hp_warp_unpack(word, lane, header);
        hp_i64 element = block * HPCDL_BLOCK + lane;
        if (element < n) out[element] = D::store(hp_sz_value<D, MODE>(q, params));
    }
    __syncthreads();  // the tile's outliers over its decoded elements
    const hp_i32* i32 = (const hp_i32*)(in.payload + in.indices_at);
    const hp_i64* i64 = (const hp_i64*)(in.payload + in.indices_at);
    const S* values = (const S*)(in.payload + in.values_at);
    hp_i64 tile_end = (tile + 1) * HPCDL_TILE_ELEMENTS;
    for (hp_i64 r = before_slot[1] + threadIdx.x; r < in.outliers; r += blockDim.x) {
        hp_i64 index = in.index64 ? i64[r] : (hp_i64)i32[r];
        if (index >= tile_end || index < tile * HPCDL_TILE_ELEMENTS) break;
        if (index < n) out[index] = values[r];
    }
    // the checks every tile shares: index order and range, the checksum of its share of the payload
    hp_i64 threads = n_tiles * blockDim.x, me = tile * blockDim.x + threadIdx.x;
    for (hp_i64 r = me; r < in.outliers; r += threads) {
        hp_i64 index = in.index64 ? i64[r] : (hp_i64)i32[r];
        hp_i64 previous = r == 0 ? -1 : (in.index64 ? i64[r - 1] : (hp_i64)i32[r - 1]);
        if (index < 0 || index >= n || index <= previous) bad |= HPCDL_BAD_INDICES;
    }
    hp_u64 sum[1] = {0};
    for (hp_i64 i = me; i < in.total / 8; i += threads) sum[0] += hp_checksum_term((hp_u64)i, ((const hp_u64*)in.payload)[i]);
    hp_cta_add<1>(sum, summary + HPCDL_SUM_CHECKSUM);
    bad = hp_warp_or(bad);
    if (lane == 0 && bad) atomicOr((unsigned long long*)&summary[HPCDL_SUM_STATUS], (unsigned long long)bad);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {  // the last CTA to finish compares the checksum
        hp_u64 done = atomicAdd((unsigned long long*)&summary[HPCDL_SUM_DONE], 1ull);
        if (done == (hp_u64)(n_tiles - 1)) {
            __threadfence();
            hp_u64 total = *(volatile hp_u64*)&summary[HPCDL_SUM_CHECKSUM];
            if (total != in.checksum) atomicOr((unsigned long long*)&summary[HPCDL_SUM_STATUS], (unsigned long long)HPCDL_BAD_CHECKSUM);
        }
    }
}
