// The AVX-512 tile GEMM and softmax steps of the CPU attention kernel (see
// engine/cpu/attention_gemm.h). This file alone is compiled with -mavx512f, and its code runs only
// after attention_isa() found the instructions: it includes only headers without inline functions
// (<cstdint>, the coefficient table) and defines none outside this file, so no AVX-512 instruction
// can reach another translation unit through a shared inline symbol. GCC 12's AVX-512 intrinsics
// (max, min, roundscale, cvtps_epi32, slli) start from _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports once inlined (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "engine/cpu/attention_gemm.h"
#include "engine/cpu/exp2_poly.h"

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

// Rows per block: 12 x 2 vectors = 24 accumulators, 2 of B and 1 of A, of 32 registers (a 64-row
// tile is 5 blocks and one of 4). Against 8 rows (16 accumulators, no remainder) it loads B once
// per 24 FMAs instead of 16: `remat_bench_attention` 2-5% faster on the Intel VM (2026-12-02,
// alternated twice). The rows' count changes no element's FMA chain, so no bit.
constexpr int kMr = 12;

template <int NV, bool kAccumulate>
void gemm_panel(int64_t M, int64_t K, const float* a, int64_t ars, int64_t aks, const float* b,
                int64_t ldb, float* c, int64_t ldc, __mmask16 mask) {
  int64_t i = 0;
  for (; i + kMr <= M; i += kMr)
    gemm_block<kMr, NV, kAccumulate>(K, a + i * ars, ars, aks, b, ldb, c + i * ldc, ldc, mask);
  a += i * ars;
  c += i * ldc;
  switch (M - i) {
    case 11:
      gemm_block<11, NV, kAccumulate>(K, a, ars, aks, b, ldb, c, ldc, mask);
      break;
    case 10:
      gemm_block<10, NV, kAccumulate>(K, a, ars, aks, b, ldb, c, ldc, mask);
      break;
    case 9:
      gemm_block<9, NV, kAccumulate>(K, a, ars, aks, b, ldb, c, ldc, mask);
      break;
    case 8:
      gemm_block<8, NV, kAccumulate>(K, a, ars, aks, b, ldb, c, ldc, mask);
      break;
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

// 2^x as exp2_ps of engine/cpu/vector_math.h, 16 lanes: the same operations in the same order
// (min/max, round to nearest, the polynomial of engine/cpu/exp2_poly.h by FMAs, n added to the
// exponent field of p = 2^r by an integer add, the mask below -126), so every lane gets the bits
// the AVX2 version gives. The add keeps the FMA pipes for the tiles' GEMMs (see exp2_ps).
inline __m512 exp2_ps512(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-126.0f);
  const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(127.0f));
  const __m512 n = _mm512_roundscale_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(xc, n);
  __m512 p = _mm512_set1_ps(kExp2Poly[0]);
  for (int k = 1; k < kExp2PolyTerms; ++k) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExp2Poly[k]));
  const __m512i scaled =
      _mm512_add_epi32(_mm512_castps_si512(p), _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23));
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), _mm512_castsi512_ps(scaled));
}

}  // namespace

void attention_softmax_update_columns_avx512(float* s, int64_t nk, int64_t width, float* m,
                                             float* l, float* corr) {
  for (int64_t i = 0; i < width; i += 16) {
    const __m512 m_old = _mm512_loadu_ps(m + i);
    __m512 mx = m_old;
    for (int64_t j = 0; j < nk; ++j) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + j * width + i));
    // A column of masked keys only keeps mx = -inf and shifts by 0 (see the AVX2 version).
    const __m512 shift = _mm512_mask_mov_ps(
        mx, _mm512_cmp_ps_mask(mx, _mm512_set1_ps(-__builtin_inff()), _CMP_EQ_OQ),
        _mm512_setzero_ps());
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < nk; ++j) {
      const __m512 p = exp2_ps512(_mm512_sub_ps(_mm512_loadu_ps(s + j * width + i), shift));
      _mm512_storeu_ps(s + j * width + i, p);
      sum = _mm512_add_ps(sum, p);
    }
    const __m512 c = exp2_ps512(_mm512_sub_ps(m_old, shift));
    _mm512_storeu_ps(corr + i, c);
    _mm512_storeu_ps(l + i, _mm512_fmadd_ps(_mm512_loadu_ps(l + i), c, sum));
    _mm512_storeu_ps(m + i, mx);
  }
}

void attention_softmax_grad_row_avx512(float* s, float* ds, int64_t width, int64_t n_valid,
                                       float lse2, float d, float scale) {
  const __m512 vl = _mm512_set1_ps(lse2), vd = _mm512_set1_ps(d), vs = _mm512_set1_ps(scale);
  const __m512 nv = _mm512_set1_ps(static_cast<float>(n_valid));
  __m512 idx = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t j = 0; j < width; j += 16) {
    __m512 p = exp2_ps512(_mm512_sub_ps(_mm512_loadu_ps(s + j), vl));
    p = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(idx, nv, _CMP_LT_OQ), p);
    _mm512_storeu_ps(s + j, p);
    const __m512 dp = _mm512_sub_ps(_mm512_loadu_ps(ds + j), vd);
    _mm512_storeu_ps(ds + j, _mm512_mul_ps(_mm512_mul_ps(p, dp), vs));
    idx = _mm512_add_ps(idx, _mm512_set1_ps(16.0f));
  }
}

void attention_softmax_grad_columns_avx512(float* s, float* ds, int64_t nk, int64_t width,
                                           int64_t key_minus_query, int64_t nq, const float* lse2,
                                           const float* d, float scale) {
  const __m512 vs = _mm512_set1_ps(scale);
  const __m512 n_queries = _mm512_set1_ps(static_cast<float>(nq));
  for (int64_t j = 0; j < nk; ++j) {
    const __m512 first = _mm512_set1_ps(static_cast<float>(j + key_minus_query));
    __m512 idx = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int64_t i = 0; i < width; i += 16) {
      float* sj = s + j * width + i;
      float* dsj = ds + j * width + i;
      __m512 p = exp2_ps512(_mm512_sub_ps(_mm512_loadu_ps(sj), _mm512_loadu_ps(lse2 + i)));
      const __mmask16 valid = _mm512_cmp_ps_mask(idx, first, _CMP_GE_OQ) &
                              _mm512_cmp_ps_mask(idx, n_queries, _CMP_LT_OQ);
      p = _mm512_maskz_mov_ps(valid, p);
      _mm512_storeu_ps(sj, p);
      const __m512 dp = _mm512_sub_ps(_mm512_loadu_ps(dsj), _mm512_loadu_ps(d + i));
      _mm512_storeu_ps(dsj, _mm512_mul_ps(_mm512_mul_ps(p, dp), vs));
      idx = _mm512_add_ps(idx, _mm512_set1_ps(16.0f));
    }
  }
}

void attention_gemm_avx512(bool accumulate, int64_t M, int64_t N, int64_t K, const float* a,
                           int64_t ars, int64_t aks, const float* b, int64_t ldb, float* c,
                           int64_t ldc) {
  if (accumulate)
    gemm<true>(M, N, K, a, ars, aks, b, ldb, c, ldc);
  else
    gemm<false>(M, N, K, a, ars, aks, b, ldb, c, ldc);
}

}  // namespace remat::cpu
