// The exported C interface of the host kernel library (hpcdl/_kernels_host*.so, loaded by
// hpcdl/compress/blocks/host.py), declared in kernels/host_api.h: picks, when the library loads, the best build of kernels/host.cpp that this CPU
// runs, and forwards every call to that build's table (kernels/host_api.h). Compiled for the baseline
// instruction set, like everything that runs before the choice is made, so loading the library never executes
// an instruction the CPU lacks, whatever machine built it.
#include <string.h>

#include "host_api.h"

extern "C" {
extern const HpHostKernels hpcdl_host_kernels_baseline;
#if defined(__x86_64__)
extern const HpHostKernels hpcdl_host_kernels_avx2;
extern const HpHostKernels hpcdl_host_kernels_avx512;
#endif
}

namespace {

struct Build {
    const char* isa;
    const HpHostKernels* kernels;
    bool (*runs)();
};

bool runs_anywhere() { return true; }

#if defined(__x86_64__)
// The features the -m flags of setup.py's avx2 and avx512 builds let the compiler use. __builtin_cpu_supports
// also requires the operating system to save the wider registers (gcc checks XGETBV), so a CPU whose OS leaves
// AVX-512 off runs the avx2 build.
bool runs_avx2() {
    __builtin_cpu_init();  // may run before libgcc's own constructor does
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
           __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt");
}

bool runs_avx512() {
    return runs_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl");
}
#endif

// Best first: the first one the CPU runs is the default.
const Build BUILDS[] = {
#if defined(__x86_64__)
    {"avx512", &hpcdl_host_kernels_avx512, runs_avx512},
    {"avx2", &hpcdl_host_kernels_avx2, runs_avx2},
#endif
    {"baseline", &hpcdl_host_kernels_baseline, runs_anywhere},
};
const int N_BUILDS = sizeof(BUILDS) / sizeof(BUILDS[0]);

const Build* find(const char* isa) {
    for (const Build& build : BUILDS)
        if (strcmp(build.isa, isa) == 0) return &build;
    return nullptr;
}

const Build* best() {
    for (const Build& build : BUILDS)
        if (build.runs()) return &build;
    return &BUILDS[N_BUILDS - 1];
}

// Set when the library loads; changed only by hpcdl_host_select, which callers use before any kernel runs.
const Build* active = best();

}  // namespace

extern "C" {

int hpcdl_host_abi_version(void) { return HPCDL_HOST_ABI_VERSION; }

long long hpcdl_host_part_blocks(void) { return HPCDL_PART_BLOCKS; }

const char* hpcdl_host_build(int i) { return i >= 0 && i < N_BUILDS ? BUILDS[i].isa : nullptr; }

int hpcdl_host_runs(const char* isa) {
    const Build* build = find(isa);
    return build == nullptr ? -1 : build->runs() ? 1 : 0;
}

int hpcdl_host_select(const char* isa) {
    const Build* build = find(isa);
    if (build == nullptr) return -1;
    if (!build->runs()) return -2;
    active = build;
    return 0;
}

const char* hpcdl_host_isa(void) { return active->isa; }

int hpcdl_sz_decode(int dtype, const unsigned char* headers, long long n_words, const unsigned int* words,
                    long long n, int mode, double eb, double bound, int shift, const double* reconstruction,
                    long long* part_first_words, void* out) {
    return active->kernels->sz_decode(dtype, headers, n_words, words, n, mode, eb, bound, shift, reconstruction,
                                      part_first_words, out);
}

int hpcdl_sz_stats(int dtype, const void* x, long long n, int mode, double eb, double inv, double bound, int shift,
                   const double* reconstruction, long long* sums) {
    return active->kernels->sz_stats(dtype, x, n, mode, eb, inv, bound, shift, reconstruction, sums);
}

int hpcdl_sz_encode(int dtype, const void* x, long long n, int mode, double eb, double inv, double bound, int shift,
                    const double* reconstruction, int index64, unsigned char* headers, unsigned int* words,
                    void* indices, void* values, long long* part_words, long long* part_outliers) {
    return active->kernels->sz_encode(dtype, x, n, mode, eb, inv, bound, shift, reconstruction, index64, headers,
                                      words, indices, values, part_words, part_outliers);
}

unsigned long long hpcdl_sz_assemble(long long n, const unsigned char* headers, const unsigned int* words,
                                     const unsigned char* indices, int index_size, const unsigned char* values,
                                     int value_size, const long long* part_words, const long long* part_outliers,
                                     unsigned char* data, long long words_at, long long indices_at,
                                     long long values_at, long long total) {
    return active->kernels->sz_assemble(n, headers, words, indices, index_size, values, value_size, part_words,
                                        part_outliers, data, words_at, indices_at, values_at, total);
}

void hpcdl_block_headers(const int* q, long long n, unsigned char* headers) {
    active->kernels->block_headers(q, n, headers);
}

void hpcdl_pack(const int* q, long long n, const unsigned char* headers, const long long* offsets,
                unsigned int* words) {
    active->kernels->pack(q, n, headers, offsets, words);
}

void hpcdl_unpack(const unsigned char* headers, const long long* offsets, const unsigned int* words, long long n,
                  int* q) {
    active->kernels->unpack(headers, offsets, words, n, q);
}

unsigned long long hpcdl_checksum(const unsigned long long* words, long long n) {
    return active->kernels->checksum(words, n);
}

long long hpcdl_codes_encode(const unsigned char* headers, const long long* offsets, const unsigned int* words,
                             long long n, int bits, unsigned char* out, int* escapes) {
    return active->kernels->codes_encode(headers, offsets, words, n, bits, out, escapes);
}

void hpcdl_codes_escapes(const unsigned char* headers, const long long* offsets, const unsigned int* words,
                         long long n, long long* counts) {
    active->kernels->codes_escapes(headers, offsets, words, n, counts);
}

int hpcdl_codes_decode(const unsigned char* in, long long n, int bits, const int* escapes, long long n_escapes,
                       int max_zigzag, unsigned char* headers, unsigned int* words, long long n_words) {
    return active->kernels->codes_decode(in, n, bits, escapes, n_escapes, max_zigzag, headers, words, n_words);
}

}  // extern "C"
