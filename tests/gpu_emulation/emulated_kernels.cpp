// kernels/sz_cuda.cu built for the host under cuda_emulation.h, with a C entry point that launches a kernel by
// name (hpcdl_emu_launch), for tests/gpu_emulation/cupy_standin.py. Build: see tests/gpu_emulation/build.py.
#include "cuda_emulation.h"

#include "sz_cuda.cu"

namespace emu {

Builtins builtins;
Thread* current = nullptr;

namespace {

const size_t STACK_BYTES = 256 * 1024;
const size_t SHARED_BYTES = 64 * 1024;
#ifndef HPCDL_EMU_RESIDENT_CTAS
#define HPCDL_EMU_RESIDENT_CTAS 3  // CTAs in flight at once (a build for the look-back's windows takes 40)
#endif
const int RESIDENT_CTAS = HPCDL_EMU_RESIDENT_CTAS;

#if !defined(HPCDL_EMU_UCONTEXT)
void* scheduler_stack_pointer = nullptr;
#else
}  // namespace
}  // namespace emu
#include <ucontext.h>
namespace emu {
namespace {
ucontext_t scheduler_context;
#endif

void (*kernel_body)(void*) = nullptr;
void* kernel_closure = nullptr;
dim3 grid_dim, block_dim;

void fail(const char* what) {
    fprintf(stderr, "cuda emulation: %s\n", what);
    abort();
}

[[noreturn]] void thread_entry();

}  // namespace
}  // namespace emu

#if !defined(HPCDL_EMU_UCONTEXT)
// Saves the callee-saved registers of the x86-64 System V ABI on the current stack, stores the stack pointer in
// *save and continues on the stack `next` saved the same way.
extern "C" void emu_switch(void** save, void* next);
asm(R"(
    .text
    .globl emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");
#endif

namespace emu {
namespace {

#if defined(HPCDL_EMU_UCONTEXT)
void entry_trampoline() { thread_entry(); }
#endif

void start_thread(Thread* t) {
    t->done = false, t->runnable = true, t->shared_used = 0;
#if defined(HPCDL_EMU_UCONTEXT)
    ucontext_t* context = (ucontext_t*)t->stack;  // the context lives at the bottom of its own stack
    getcontext(context);
    context->uc_stack.ss_sp = t->stack + sizeof(ucontext_t);
    context->uc_stack.ss_size = STACK_BYTES - sizeof(ucontext_t);
    context->uc_link = nullptr;
    makecontext(context, entry_trampoline, 0);
#else
    uintptr_t top = ((uintptr_t)(t->stack + STACK_BYTES)) & ~(uintptr_t)15;
    void** sp = (void**)top;
    *--sp = nullptr;                    // alignment: thread_entry starts as if called
    *--sp = (void*)&thread_entry;       // emu_switch's ret goes there
    for (int i = 0; i < 6; ++i) *--sp = nullptr;  // rbp rbx r12 r13 r14 r15
    t->stack_pointer = sp;
#endif
}

void switch_to(Thread* t) {
    current = t;
    builtins.thread_idx = t->thread_index;
    builtins.block_idx = t->cta->block_index;
#if defined(HPCDL_EMU_UCONTEXT)
    swapcontext(&scheduler_context, (ucontext_t*)t->stack);
#else
    emu_switch(&scheduler_stack_pointer, t->stack_pointer);
#endif
    current = nullptr;
}

void to_scheduler() {
    Thread* t = current;
#if defined(HPCDL_EMU_UCONTEXT)
    swapcontext((ucontext_t*)t->stack, &scheduler_context);
#else
    emu_switch(&t->stack_pointer, scheduler_stack_pointer);
#endif
    current = t;
    builtins.thread_idx = t->thread_index;
    builtins.block_idx = t->cta->block_index;
}

[[noreturn]] void thread_entry() {
    kernel_body(kernel_closure);
    Thread* t = current;
    t->done = true, t->runnable = false;
    t->cta->live--;
    // a warp primitive or barrier waiting for this thread can never complete: caught by the scheduler
    to_scheduler();
    fail("an exited thread was resumed");
    abort();
}

unsigned long long next_random(unsigned long long* state) {
    *state += 0x9E3779B97F4A7C15ull;
    unsigned long long z = *state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

}  // namespace

void yield() { to_scheduler(); }

unsigned long long warp_op(Op op, unsigned long long value, int argument) {
    Thread* t = current;
    Cta* cta = t->cta;
    int lane = t->thread_index.x & 31, warp_index = t->thread_index.x >> 5;
    Warp& warp = cta->warps[warp_index];
    Thread* lanes = cta->threads + 32 * warp_index;
    for (int i = 0; i < 32; ++i)
        if (lanes[i].done) fail("a warp primitive with a full mask while a lane of the warp has exited");
    if (warp.arrived == 0) warp.op = op;
    else if (warp.op != op) fail("lanes of one warp at different warp primitives");
    warp.values[lane] = value, warp.arguments[lane] = argument;
    unsigned long long generation = warp.generation;
    if (++warp.arrived < 32) {
        t->runnable = false, t->waiting_for = generation + 1;
        while (warp.generation == generation) to_scheduler();
        return warp.results[lane];
    }
    unsigned long long all = 0;
    if (op == OP_BALLOT)
        for (int i = 0; i < 32; ++i) all |= (warp.values[i] ? 1ull : 0ull) << i;
    if (op == OP_REDUCE_OR)
        for (int i = 0; i < 32; ++i) all |= warp.values[i];
    for (int i = 0; i < 32; ++i) {
        int a = warp.arguments[i];
        switch (op) {
            case OP_BALLOT: case OP_REDUCE_OR: warp.results[i] = all; break;
            case OP_SHFL: warp.results[i] = warp.values[a & 31]; break;
            case OP_SHFL_UP: warp.results[i] = i - a >= 0 ? warp.values[i - a] : warp.values[i]; break;
            case OP_SHFL_XOR: warp.results[i] = warp.values[(i ^ a) & 31]; break;
            default: warp.results[i] = 0;
        }
    }
    warp.arrived = 0, warp.op = OP_NONE;
    warp.generation++;
    for (int i = 0; i < 32; ++i) lanes[i].runnable = !lanes[i].done;
    to_scheduler();  // let the other lanes take their results before this lane runs ahead
    return warp.results[lane];
}

void syncthreads() {
    Thread* t = current;
    Cta* cta = t->cta;
    if (cta->live != (int)block_dim.x) fail("__syncthreads while a thread of the CTA has exited");
    unsigned long long generation = cta->barrier_generation;
    if (++cta->at_barrier < (int)block_dim.x) {
        t->runnable = false;
        while (cta->barrier_generation == generation) to_scheduler();
        return;
    }
    cta->at_barrier = 0;
    cta->barrier_generation++;
    for (unsigned i = 0; i < block_dim.x; ++i) cta->threads[i].runnable = !cta->threads[i].done;
    to_scheduler();
}

void* shared_alloc(size_t bytes, size_t alignment) {
    Thread* t = current;
    size_t at = (t->shared_used + alignment - 1) / alignment * alignment;
    if (at + bytes > SHARED_BYTES) fail("more static shared memory than the emulation holds");
    t->shared_used = at + bytes;
    return t->cta->shared + at;
}

int launch(void (*body)(void*), void* closure, unsigned grid, unsigned block, unsigned long long seed) {
    if (block == 0 || block % 32 != 0 || block > 1024) fail("CTAs of a multiple of 32 threads, at most 1024");
    if (grid == 0) return 0;
    kernel_body = body, kernel_closure = closure;
    grid_dim = {grid, 1, 1}, block_dim = {block, 1, 1};
    builtins.grid_dim = grid_dim, builtins.block_dim = block_dim;
    // CTAs start in a shuffled order (the hardware promises none)
    unsigned* order = (unsigned*)malloc(sizeof(unsigned) * grid);
    for (unsigned i = 0; i < grid; ++i) order[i] = i;
    unsigned long long state = seed;
    for (unsigned i = grid - 1; i > 0 && seed != 0; --i) {
        unsigned j = (unsigned)(next_random(&state) % (i + 1));
        unsigned swap = order[i];
        order[i] = order[j], order[j] = swap;
    }
    Cta ctas[RESIDENT_CTAS];
    for (int s = 0; s < RESIDENT_CTAS; ++s) {
        ctas[s].shared = (unsigned char*)malloc(SHARED_BYTES);
        ctas[s].warps = new Warp[block / 32];
        ctas[s].threads = new Thread[block];
        for (unsigned i = 0; i < block; ++i) {
            ctas[s].threads[i].stack = (unsigned char*)malloc(STACK_BYTES);
            ctas[s].threads[i].cta = &ctas[s];
        }
    }
    unsigned started = 0;
    long idle_rounds = 0;
    for (;;) {
        bool any_live = false, progressed = false;
        for (int s = 0; s < RESIDENT_CTAS; ++s) {
            Cta& cta = ctas[s];
            if (cta.live == 0 && started < grid) {  // start the next CTA in this slot
                cta.block_index = {order[started++], 0, 0};
                cta.live = (int)block, cta.at_barrier = 0;
                memset(cta.shared, 0xA5, SHARED_BYTES);  // shared memory starts undefined
                for (unsigned w = 0; w < block / 32; ++w) cta.warps[w] = Warp();
                for (unsigned i = 0; i < block; ++i) {
                    cta.threads[i].thread_index = {i, 0, 0};
                    start_thread(&cta.threads[i]);
                }
            }
            if (cta.live == 0) continue;
            any_live = true;
            // resume the runnable threads; start at a pseudo-random thread so CTAs interleave differently
            unsigned first = seed ? (unsigned)(next_random(&state) % block) : 0;
            for (unsigned k = 0; k < block; ++k) {
                Thread* t = &cta.threads[(first + k) % block];
                if (t->done || !t->runnable) continue;
                switch_to(t);
                progressed = true;
            }
            if (cta.live > 0) {
                bool blocked = true;
                for (unsigned i = 0; i < block; ++i) blocked &= cta.threads[i].done || !cta.threads[i].runnable;
                if (blocked) fail("every live thread of a CTA waits at a warp primitive or barrier that cannot complete");
            }
        }
        if (!any_live && started >= grid) break;
        idle_rounds = progressed ? 0 : idle_rounds + 1;
        if (idle_rounds > 1000000) fail("no progress (a look-back waiting for a tile no CTA will publish?)");
    }
    for (int s = 0; s < RESIDENT_CTAS; ++s) {
        for (unsigned i = 0; i < block; ++i) free(ctas[s].threads[i].stack);
        delete[] ctas[s].threads;
        delete[] ctas[s].warps;
        free(ctas[s].shared);
    }
    free(order);
    return 0;
}

}  // namespace emu

namespace {
struct Entry {
    const char* name;
    int (*launch)(void** args, unsigned grid, unsigned block, unsigned long long seed);
};

#define HPCDL_EMU_ENTRY(NAME)                                                                              \
    {#NAME, [](void** args, unsigned grid, unsigned block, unsigned long long seed) {                      \
         return emu_launch(&NAME, args, grid, block, seed);                                                \
     }},
const Entry KERNEL_TABLE[] = {HPCDL_KERNELS(HPCDL_EMU_ENTRY)};
}  // namespace

// Launches the kernel `name` on `grid` CTAs of `block` threads with cuLaunchKernel-style arguments; CTAs start in
// an order shuffled by `seed` (0: in order). Returns -1 for an unknown name.
extern "C" int hpcdl_emu_launch(const char* name, unsigned grid, unsigned block, void** args,
                                unsigned long long seed) {
    for (const Entry& entry : KERNEL_TABLE)
        if (strcmp(entry.name, name) == 0) return entry.launch(args, grid, block, seed);
    return -1;
}

extern "C" const char* hpcdl_emu_kernel(int i) {
    return i >= 0 && i < (int)(sizeof(KERNEL_TABLE) / sizeof(KERNEL_TABLE[0])) ? KERNEL_TABLE[i].name : nullptr;
}
