// Vector math shared by the CPU kernels (AVX2 + FMA builds; engine/cpu is compiled for
// x86-64-v3). Internal to engine/cpu.
#pragma once

#include <cstdint>

namespace remat::cpu {

/// y[i] = 2^x[i] by exp2_ps below (8 at a time), for the tests, which are not compiled for AVX2.
void exp2_floats(const float* x, float* y, int64_t n);

}  // namespace remat::cpu

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "engine/cpu/exp2_poly.h"

namespace remat::cpu {

// 2^x for x <= 127 (2^127 above), 0 below -126 (and for -inf and NaN). x = n + r with n = round(x)
// and r in [-1/2, 1/2] (exact); 2^r by its Taylor series in r ln2 to degree 7 (truncation error <
// 6e-9 relative); 2^n by adding n to the exponent field of p = 2^r, an integer add where a multiply
// by 2^n would take one of the two FMA pipes that the attention tiles' GEMMs keep busy. The add is
// exact, the same bits as that multiply (the AVX-512 twin adds too): p is in [2^-1/2, 2^1/2], n
// in [-126, 127], and n = -126 only with r >= 0 (x is clamped to -126 first), so p 2^n is a normal
// float. Against double exp2 (tests/test_vector_math.cpp): < 1 ulp.
inline __m256 exp2_ps(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-126.0f);
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(127.0f));
  const __m256 n = _mm256_round_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_sub_ps(xc, n);
  __m256 p = _mm256_set1_ps(kExp2Poly[0]);
  for (int k = 1; k < kExp2PolyTerms; ++k) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExp2Poly[k]));
  const __m256i scaled =
      _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23));
  return _mm256_and_ps(_mm256_castsi256_ps(scaled), _mm256_cmp_ps(x, lo, _CMP_GE_OQ));
}

/// Sum of the 4 doubles of v, in lane order (a fixed order: the same bits on every run).
inline double hsum_pd(__m256d v) {
  alignas(32) double d[4];
  _mm256_store_pd(d, v);
  return ((d[0] + d[1]) + d[2]) + d[3];
}

/// Lanes [0, n) set, for the masked loads and stores of a row's tail (n < 8).
inline __m256i lane_mask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/// Runs `lanes(i, mask)` over [0, n) 8 elements at a time, the tail (n % 8) masked. Every
/// element takes the same instructions wherever it falls in a vector, so any split of a tensor
/// into rows, chunks or GEMM tiles gives the same bits.
template <class Lanes>
void for_each_lanes(int64_t n, Lanes&& lanes) {
  const int64_t full = n / 8;
  const __m256i all = _mm256_set1_epi32(-1);
  for (int64_t v = 0; v < full; ++v) lanes(v * 8, all);
  if (full * 8 < n) lanes(full * 8, lane_mask(n - full * 8));
}

}  // namespace remat::cpu
#endif
