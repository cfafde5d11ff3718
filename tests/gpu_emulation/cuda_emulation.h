// A small emulation of the CUDA execution model on the host, so that kernels/sz_cuda.cu compiles with g++ and its
// kernels run (slowly, on one OS thread) under tests: every CUDA thread is a coroutine; the threads of a few
// resident CTAs are interleaved at every warp primitive, __syncthreads and look-back spin, in a shuffled CTA order.
//
// Lanes of a warp meet at each warp primitive (__ballot_sync, __shfl_*_sync, __reduce_or_sync, __syncwarp): the
// last lane to arrive computes every lane's result, as the hardware's lock-step warp does; a primitive reached
// while a lane of the warp has exited, or with lanes at different primitives, aborts (undefined on a GPU).
// Memory is sequentially consistent (one OS thread), so fences are no-ops. Only the features the kernels use:
// 1-D grids and CTAs of a multiple of 32 threads, full-warp masks, static shared memory through HPCDL_SHARED.
#pragma once

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utility>

struct dim3 {
    unsigned x, y, z;
};

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(threads)

namespace emu {

enum Op { OP_NONE, OP_BALLOT, OP_SHFL, OP_SHFL_UP, OP_SHFL_XOR, OP_REDUCE_OR, OP_SYNCWARP };

struct Warp {
    int arrived = 0;
    Op op = OP_NONE;
    unsigned long long values[32], results[32];
    int arguments[32];
    unsigned long long generation = 0;
};

struct Thread;

struct Cta {
    dim3 block_index;
    int live = 0;        // threads not yet exited
    int at_barrier = 0;  // threads waiting in __syncthreads
    unsigned long long barrier_generation = 0;
    unsigned char* shared = nullptr;
    Warp* warps = nullptr;
    Thread* threads = nullptr;
};

struct Thread {
    void* stack_pointer = nullptr;
    unsigned char* stack = nullptr;
    Cta* cta = nullptr;
    dim3 thread_index;
    bool done = true, runnable = false;
    size_t shared_used = 0;
    unsigned long long waiting_for = 0;  // generation awaited at a warp primitive
};

// The current thread's CUDA built-in variables.
struct Builtins {
    dim3 thread_idx, block_idx, block_dim, grid_dim;
};
extern Builtins builtins;
extern Thread* current;

void yield();
unsigned long long warp_op(Op op, unsigned long long value, int argument);
void syncthreads();
void* shared_alloc(size_t bytes, size_t alignment);
int launch(void (*body)(void*), void* closure, unsigned grid, unsigned block, unsigned long long seed);

}  // namespace emu

#define threadIdx (emu::builtins.thread_idx)
#define blockIdx (emu::builtins.block_idx)
#define blockDim (emu::builtins.block_dim)
#define gridDim (emu::builtins.grid_dim)

#define HPCDL_SPIN_PAUSE() emu::yield()
#define HPCDL_SHARED(type, name, count) type* name = (type*)emu::shared_alloc(sizeof(type) * (count), alignof(type))

inline void emu_check_mask(unsigned mask) {
    if (mask != 0xffffffffu) {
        fprintf(stderr, "cuda emulation: only full-warp masks are emulated, got %#x\n", mask);
        abort();
    }
}

template <class T>
inline unsigned long long emu_bits(T v) {
    unsigned long long bits = 0;
    memcpy(&bits, &v, sizeof(T));
    return bits;
}

template <class T>
inline T emu_from_bits(unsigned long long bits) {
    T v;
    memcpy(&v, &bits, sizeof(T));
    return v;
}

inline unsigned __ballot_sync(unsigned mask, int predicate) {
    emu_check_mask(mask);
    return (unsigned)emu::warp_op(emu::OP_BALLOT, predicate != 0, 0);
}
template <class T>
inline T __shfl_sync(unsigned mask, T v, int source) {
    emu_check_mask(mask);
    return emu_from_bits<T>(emu::warp_op(emu::OP_SHFL, emu_bits(v), source));
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta) {
    emu_check_mask(mask);
    return emu_from_bits<T>(emu::warp_op(emu::OP_SHFL_UP, emu_bits(v), (int)delta));
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
    emu_check_mask(mask);
    return emu_from_bits<T>(emu::warp_op(emu::OP_SHFL_XOR, emu_bits(v), lane_mask));
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    emu_check_mask(mask);
    emu::warp_op(emu::OP_SYNCWARP, 0, 0);
}
inline void __syncthreads() { emu::syncthreads(); }
inline void __threadfence() {}

inline unsigned long long atomicAdd(unsigned long long* at, unsigned long long v) {
    unsigned long long old = *at;
    *at = old + v;
    return old;
}
inline unsigned long long atomicMax(unsigned long long* at, unsigned long long v) {
    unsigned long long old = *at;
    *at = old > v ? old : v;
    return old;
}
inline unsigned long long atomicOr(unsigned long long* at, unsigned long long v) {
    unsigned long long old = *at;
    *at = old | v;
    return old;
}

// Runs `kernel(args...)` on a grid, the arguments given as cuLaunchKernel takes them: one pointer per argument.
template <class... A>
struct EmuLaunch {
    void (*kernel)(A...);
    void** args;
    template <size_t... I>
    void call(std::index_sequence<I...>) {
        kernel(*(typename std::remove_cv<typename std::remove_reference<A>::type>::type*)args[I]...);
    }
    static void run(void* self) { ((EmuLaunch*)self)->call(std::index_sequence_for<A...>()); }
};

template <class... A>
int emu_launch(void (*kernel)(A...), void** args, unsigned grid, unsigned block, unsigned long long seed) {
    EmuLaunch<A...> closure = {kernel, args};
    return emu::launch(&EmuLaunch<A...>::run, &closure, grid, block, seed);
}

#define HPCDL_HAS_REDUCE_OR_SYNC 1
inline unsigned __reduce_or_sync(unsigned mask, unsigned v) {
    emu_check_mask(mask);
    return (unsigned)emu::warp_op(emu::OP_REDUCE_OR, v, 0);
}
