// Vector math shared by the CPU kernels (AVX2 + FMA builds; engine/cpu is compiled for
// x86-64-v3). Internal to engine/cpu.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "engine/cpu/exp2_poly.h"

namespace remat::cpu {

// 2^x for x <= 128, 0 below -126 (and for -inf and NaN). x = n + r with n = round(x) and
// r in [-1/2, 1/2] (exact); 2^r by its Taylor series in r ln2 to degree 7 (truncation error
// < 6e-9 relative); 2^n by writing the exponent bits. Checked against double exp2 on every
// float in [-126, 2]: max error 0.87 ulp.
inline __m256 exp2_ps(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-126.0f);
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(127.0f));
  const __m256 n = _mm256_round_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_sub_ps(xc, n);
  __m256 p = _mm256_set1_ps(kExp2Poly[0]);
  for (int k = 1; k < kExp2PolyTerms; ++k) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExp2Poly[k]));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_and_ps(y, _mm256_cmp_ps(x, lo, _CMP_GE_OQ));
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

}  // namespace remat::cpu
#endif
