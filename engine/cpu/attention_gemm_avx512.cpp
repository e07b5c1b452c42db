// The AVX-512 tile GEMM of the CPU attention kernel (see engine/cpu/attention_gemm.h). This file
// alone is compiled with -mavx512f, and its code runs only after attention_isa() found the
// instructions: it includes no standard header and defines no inline function outside this file,
// so no AVX-512 instruction can reach another translation unit through a shared inline symbol.
#include <immintrin.h>

#include "engine/cpu/attention_gemm.h"

namespace remat::cpu {
namespace {

// One MR x (16 NV) block of C; the lanes outside `mask` of the last vector are neither read nor
// written (mask all ones: a full block).
template <int MR, int NV, bool kAccumulate>
inline void gemm_block(int64_t K, const float* a, int64_t ars, int64_t aks, const float* b,
                       int64_t ldb, float* c, int64_t ldc, __mmask16 mask) {
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? mask : static_cast<__mmask16>(0xffff);
      acc[r][v] =
          kAccumulate ? _mm512_maskz_loadu_ps(m, c + r * ldc + 16 * v) : _mm512_setzero_ps();
    }
  for (int64_t k = 0; k < K; ++k) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? mask : static_cast<__mmask16>(0xffff);
      bv[v] = _mm512_maskz_loadu_ps(m, b + k * ldb + 16 * v);
    }
    const float* ak = a + k * aks;
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 ar = _mm512_set1_ps(ak[r * ars]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(ar, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? mask : static_cast<__mmask16>(0xffff);
      _mm512_mask_storeu_ps(c + r * ldc + 16 * v, m, acc[r][v]);
    }
}

// Rows per block: 8 x 2 vectors = 16 accumulators, 2 of B and 1 of A, of 32 registers; the
// attention tiles have 64 rows, so full tiles need no remainder block.
constexpr int kMr = 8;

template <int NV, bool kAccumulate>
void gemm_panel(int64_t M, int64_t K, const float* a, int64_t ars, int64_t aks, const float* b,
                int64_t ldb, float* c, int64_t ldc, __mmask16 mask) {
  int64_t i = 0;
  for (; i + kMr <= M; i += kMr)
    gemm_block<kMr, NV, kAccumulate>(K, a + i * ars, ars, aks, b, ldb, c + i * ldc, ldc, mask);
  a += i * ars;
  c += i * ldc;
  switch (M - i) {
    case 7:
      gemm_block<7, NV, kAccumulate>(K, a, ars, aks, b, ldb, c, ldc, mask);
      break;
    case 6:
      gemm_block<6, NV, kAccumulate>(K, a, ars, aks, b, ldb, c, ldc, mask);
      break;
    case 5:
      gemm_block<5, NV, kAccumulate>(K, a, ars, aks, b, ldb, c, ldc, mask);
      break;
    case 4:
      gemm_block<4, NV, kAccumulate>(K, a, ars, aks, b, ldb, c, ldc, mask);
      break;
    case 3:
      gemm_block<3, NV, kAccumulate>(K, a, ars, aks, b, ldb, c, ldc, mask);
      break;
    case 2:
      gemm_block<2, NV, kAccumulate>(K, a, ars, aks, b, ldb, c, ldc, mask);
      break;
    case 1:
      gemm_block<1, NV, kAccumulate>(K, a, ars, aks, b, ldb, c, ldc, mask);
      break;
    default:
      break;
  }
}

template <bool kAccumulate>
void gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t ars, int64_t aks, const float* b,
          int64_t ldb, float* c, int64_t ldc) {
  const __mmask16 all = 0xffff;
  int64_t j = 0;
  for (; j + 32 <= N; j += 32)
    gemm_panel<2, kAccumulate>(M, K, a, ars, aks, b + j, ldb, c + j, ldc, all);
  if (j + 16 < N) {  // 17..31 columns left: one full vector and a masked one
    const __mmask16 tail = static_cast<__mmask16>((1u << (N - j - 16)) - 1);
    gemm_panel<2, kAccumulate>(M, K, a, ars, aks, b + j, ldb, c + j, ldc, tail);
  } else if (j < N) {  // 1..16 columns left
    const __mmask16 tail = static_cast<__mmask16>(N - j == 16 ? 0xffffu : (1u << (N - j)) - 1);
    gemm_panel<1, kAccumulate>(M, K, a, ars, aks, b + j, ldb, c + j, ldc, tail);
  }
}

}  // namespace

void attention_gemm_avx512(bool accumulate, int64_t M, int64_t N, int64_t K, const float* a,
                           int64_t ars, int64_t aks, const float* b, int64_t ldb, float* c,
                           int64_t ldc) {
  if (accumulate)
    gemm<true>(M, N, K, a, ars, aks, b, ldb, c, ldc);
  else
    gemm<false>(M, N, K, a, ars, aks, b, ldb, c, ldc);
}

}  // namespace remat::cpu
