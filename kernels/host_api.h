// The C interface of the host kernel library (hpcdl/_kernels_host*.so), declared once.
//
// kernels/host.cpp is compiled once per instruction set (baseline x86-64 or the target's generic build, AVX2,
// AVX-512; setup.py lists them) into the same library; each build exports only its table of these functions,
// hpcdl_host_kernels_<isa>. kernels/host_dispatch.cpp, compiled for the baseline, exports the hpcdl_* functions
// declared below, which hpcdl/compress/blocks/host.py calls through ctypes, and forwards them to the table of the
// best instruction set the CPU (and the operating system) runs. Every table computes the same bytes.
//
// Declared once: host_dispatch.cpp includes this file, so the compiler refuses a definition whose types differ
// from its declaration here (extern "C" functions cannot overload), and tests/test_block_backends.py parses the
// declarations of the extern "C" block below and compares them with the ctypes prototypes of host.py
// (PROTOTYPES). When the library loads, host.py checks hpcdl_host_abi_version() and hpcdl_host_part_blocks()
// against its own ABI_VERSION and PART_BLOCKS and refuses a library built from other sources.
#pragma once

// Raise it whenever an exported function, its arguments or the meaning of a result changes (with ABI_VERSION in
// hpcdl/compress/blocks/host.py). Overridable (-DHPCDL_HOST_ABI_VERSION=...) only to test the refusal.
#ifndef HPCDL_HOST_ABI_VERSION
#define HPCDL_HOST_ABI_VERSION 4
#endif

// Blocks per part of the fused encoder and of the parallel decoder (kernels/host.cpp): the caller sizes its
// per-part scratch (part word and outlier counts, part first words) by it. Overridable only to test the refusal.
#ifndef HPCDL_PART_BLOCKS
#define HPCDL_PART_BLOCKS 8192
#endif

// The functions of one build, in the order of kernels/host.cpp, which documents each of them. `reconstruction`
// is the 5 doubles step, sub[0], sub[1], base[0], base[1] of HpSzParams (kernels/sz_block.cuh).
struct HpHostKernels {
    int (*sz_decode)(int dtype, const unsigned char* headers, long long n_words, const unsigned int* words,
                     long long n, int mode, double eb, double bound, int shift, const double* reconstruction,
                     long long* part_first_words, void* out);
    int (*sz_stats)(int dtype, const void* x, long long n, int mode, double eb, double inv, double bound, int shift,
                    const double* reconstruction, long long* sums);
    int (*sz_encode)(int dtype, const void* x, long long n, int mode, double eb, double inv, double bound, int shift,
                     const double* reconstruction, int index64, unsigned char* headers, unsigned int* words, void* indices, void* values,
                     long long* part_words, long long* part_outliers);
    unsigned long long (*sz_assemble)(long long n, const unsigned char* headers, const unsigned int* words,
                                      const unsigned char* indices, int index_size, const unsigned char* values,
                                      int value_size, const long long* part_words, const long long* part_outliers,
                                      unsigned char* data, long long words_at, long long indices_at,
                                      long long values_at, long long total);
    void (*block_headers)(const int* q, long long n, unsigned char* headers);
    void (*pack)(const int* q, long long n, const unsigned char* headers, const long long* offsets,
                 unsigned int* words);
    void (*unpack)(const unsigned char* headers, const long long* offsets, const unsigned int* words, long long n,
                   int* q);
    unsigned long long (*checksum)(const unsigned long long* words, long long n);
    long long (*codes_encode)(const unsigned char* headers, const long long* offsets, const unsigned int* words,
                              long long n, int bits, unsigned char* out, int* escapes);
    void (*codes_escapes)(const unsigned char* headers, const long long* offsets, const unsigned int* words,
                          long long n, long long* counts);
    int (*codes_decode)(const unsigned char* in, long long n, int bits, const int* escapes, long long n_escapes,
                        int max_zigzag, unsigned char* headers, unsigned int* words, long long n_words);
};

// The exported functions (kernels/host_dispatch.cpp defines them). One declaration per function, each ending in
// ";" on its own: tests/test_block_backends.py reads them.
extern "C" {

// HPCDL_HOST_ABI_VERSION of the sources this library was built from.
int hpcdl_host_abi_version(void);
// HPCDL_PART_BLOCKS of the sources this library was built from.
long long hpcdl_host_part_blocks(void);
// Name of the i-th instruction set built into this library, best first; NULL past the last.
const char* hpcdl_host_build(int i);
// 1 if this CPU runs the build `isa`, 0 if it cannot, -1 if the library has no such build.
int hpcdl_host_runs(const char* isa);
// Makes `isa` the build every call runs: 0, or -1 if the library has no such build, -2 if this CPU cannot run
// it (the active build is then unchanged).
int hpcdl_host_select(const char* isa);
// Name of the build every call runs.
const char* hpcdl_host_isa(void);

// The kernels, forwarded to the active build's table (HpHostKernels above; kernels/host.cpp documents them).
int hpcdl_sz_decode(int dtype, const unsigned char* headers, long long n_words, const unsigned int* words,
                    long long n, int mode, double eb, double bound, int shift, const double* reconstruction,
                    long long* part_first_words, void* out);
int hpcdl_sz_stats(int dtype, const void* x, long long n, int mode, double eb, double inv, double bound, int shift,
                   const double* reconstruction, long long* sums);
int hpcdl_sz_encode(int dtype, const void* x, long long n, int mode, double eb, double inv, double bound, int shift,
                    const double* reconstruction, int index64, unsigned char* headers, unsigned int* words, void* indices, void* values,
                    long long* part_words, long long* part_outliers);
unsigned long long hpcdl_sz_assemble(long long n, const unsigned char* headers, const unsigned int* words,
                                     const unsigned char* indices, int index_size, const unsigned char* values,
                                     int value_size, const long long* part_words, const long long* part_outliers,
                                     unsigned char* data, long long words_at, long long indices_at,
                                     long long values_at, long long total);
void hpcdl_block_headers(const int* q, long long n, unsigned char* headers);
void hpcdl_pack(const int* q, long long n, const unsigned char* headers, const long long* offsets,
                unsigned int* words);
void hpcdl_unpack(const unsigned char* headers, const long long* offsets, const unsigned int* words, long long n,
                  int* q);
unsigned long long hpcdl_checksum(const unsigned long long* words, long long n);
long long hpcdl_codes_encode(const unsigned char* headers, const long long* offsets, const unsigned int* words,
                             long long n, int bits, unsigned char* out, int* escapes);
void hpcdl_codes_escapes(const unsigned char* headers, const long long* offsets, const unsigned int* words,
                         long long n, long long* counts);
int hpcdl_codes_decode(const unsigned char* in, long long n, int bits, const int* escapes, long long n_escapes,
                       int max_zigzag, unsigned char* headers, unsigned int* words, long long n_words);

}  // extern "C"
