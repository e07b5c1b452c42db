// The tile GEMM (and the softmax steps) of the CPU attention kernel on AVX-512, chosen at run time
// when the CPU has it (engine/cpu/attention.cpp; the rest of engine/cpu is compiled for AVX2).
// Internal to engine/cpu.
//
// C (M, N) {=, +=} A (M, K) B (K, N), where A's element (r, k) is a[r * ars + k * aks] (a row-major
// tile, or the transpose of one) and B, C are row-major with leading dimensions ldb, ldc. Each C
// element is one chain of FMAs over k = 0..K-1, in order, as in the AVX2 kernel: an FMA rounds
// once whatever the vector width, so both kernels give the same bits.
#pragma once

#include <cstdint>

namespace remat::cpu {

/// Which tile GEMM the attention kernel runs.
enum class AttentionIsa { Avx2, Avx512 };

/// The fastest this CPU runs (Avx512 when it has AVX-512F), unless REMAT_ATTENTION_ISA (avx2 |
/// avx512) asks for one (a ConfigError when it names one the CPU lacks) or a test forced one.
AttentionIsa attention_isa();
/// "cpuid" or "REMAT_ATTENTION_ISA": who chose attention_isa() (for --version).
const char* attention_isa_chosen_by();
/// Tests only: run `isa` from now on (Avx512 on a CPU without it is an error).
void force_attention_isa(AttentionIsa isa);

// The softmax steps of engine/cpu/attention.cpp (see softmax_update_columns, softmax_grad_row and
// softmax_grad_columns there) on 16 lanes, with the same operations per element in the same
// order; `width` is the tile width (a multiple of 16).
void attention_softmax_update_columns_avx512(float* s, int64_t nk, int64_t width, float* m,
                                             float* l, float* corr);
void attention_softmax_grad_row_avx512(float* s, float* ds, int64_t width, int64_t n_valid,
                                       float lse2, float d, float scale);
void attention_softmax_grad_columns_avx512(float* s, float* ds, int64_t nk, int64_t width,
                                           int64_t key_minus_query, int64_t nq, const float* lse2,
                                           const float* d, float scale);

void attention_gemm_avx512(bool accumulate, int64_t M, int64_t N, int64_t K, const float* a,
                           int64_t ars, int64_t aks, const float* b, int64_t ldb, float* c,
                           int64_t ldc);

}  // namespace remat::cpu
