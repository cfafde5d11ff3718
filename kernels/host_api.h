// The C interface of the host kernel library (hpcdl/_kernels_host*.so), declared once.
//
// kernels/host.cpp is compiled once per instruction set (baseline x86-64 or the target's generic build, AVX2,
// AVX-512; setup.py lists them) into the same library; each build exports only its table of these functions,
// hpcdl_host_kernels_<isa>. kernels/host_dispatch.cpp, compiled for the baseline, exports the hpcdl_* functions
// that hpcdl/compress/sz/host.py calls and forwards them to the table of the best instruction set the CPU (and
// the operating system) runs. Every table computes the same bytes.
#pragma once

// The functions of one build, in the order of kernels/host.cpp, which documents each of them.
struct HpHostKernels {
    int (*sz_decode)(int dtype, const unsigned char* headers, long long n_words, const unsigned int* words,
                     long long n, int mode, double eb, double bound, int shift, long long* part_first_words,
                     void* out);
    int (*sz_encode)(int dtype, const void* x, long long n, int mode, double eb, double inv, double bound, int shift,
                     int index64, unsigned char* headers, unsigned int* words, void* indices, void* values,
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
};
