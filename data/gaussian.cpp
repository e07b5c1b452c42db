// Bulk standard normals (see data/gaussian.h): 8 Box-Muller pairs per AVX2 pass.
#include "data/gaussian.h"

#include <immintrin.h>

#include "engine/core/rng.h"

namespace remat {
namespace {

constexpr float kTwoPow24 = 16777216.0f;

// Uniform in (0, 1) from 24 bits: (k + 1/2) / 2^24, exact in float.
float uniform24(uint64_t bits24) {
  return (static_cast<float>(bits24) + 0.5f) * (1.0f / kTwoPow24);
}

// ln u for u in (0, 1]: u = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s),
// s = (m - 1) / (m + 1), |s| <= 0.172: the odd series to s^9 (next term < 4e-10).
__m256 log_ps(__m256 u) {
  const __m256i bits = _mm256_castps_si256(u);
  // Exponent relative to sqrt(1/2): subtracting the bits of sqrt(1/2) (0x3f3504f3) puts m there.
  const __m256i shifted = _mm256_sub_epi32(bits, _mm256_set1_epi32(0x3f3504f3));
  const __m256i e = _mm256_srai_epi32(shifted, 23);
  const __m256 m = _mm256_castsi256_ps(_mm256_sub_epi32(bits, _mm256_slli_epi32(e, 23)));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 s = _mm256_div_ps(_mm256_sub_ps(m, one), _mm256_add_ps(m, one));
  const __m256 s2 = _mm256_mul_ps(s, s);
  __m256 p = _mm256_set1_ps(2.0f / 9.0f);
  p = _mm256_fmadd_ps(p, s2, _mm256_set1_ps(2.0f / 7.0f));
  p = _mm256_fmadd_ps(p, s2, _mm256_set1_ps(2.0f / 5.0f));
  p = _mm256_fmadd_ps(p, s2, _mm256_set1_ps(2.0f / 3.0f));
  p = _mm256_fmadd_ps(p, s2, _mm256_set1_ps(2.0f));
  const __m256 ln_m = _mm256_mul_ps(p, s);
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(e), _mm256_set1_ps(0.693147180559945309f), ln_m);
}

// cos and sin of 2 pi u for u in (0, 1): u = q/4 + f with q = round(4u), |f| <= 1/8, so
// x = 2 pi f is in [-pi/4, pi/4], where Taylor series to x^10 (cos) and x^11 (sin) are within
// 3e-9; the quarter turns q then swap and negate.
void sincos_2pi_ps(__m256 u, __m256& c, __m256& s) {
  const __m256 q = _mm256_round_ps(_mm256_mul_ps(u, _mm256_set1_ps(4.0f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_fnmadd_ps(q, _mm256_set1_ps(0.25f), u);  // exact: u and q/4 are close
  const __m256 x = _mm256_mul_ps(f, _mm256_set1_ps(6.28318530717958648f));
  const __m256 x2 = _mm256_mul_ps(x, x);
  __m256 pc = _mm256_set1_ps(-1.0f / 3628800.0f);
  pc = _mm256_fmadd_ps(pc, x2, _mm256_set1_ps(1.0f / 40320.0f));
  pc = _mm256_fmadd_ps(pc, x2, _mm256_set1_ps(-1.0f / 720.0f));
  pc = _mm256_fmadd_ps(pc, x2, _mm256_set1_ps(1.0f / 24.0f));
  pc = _mm256_fmadd_ps(pc, x2, _mm256_set1_ps(-0.5f));
  pc = _mm256_fmadd_ps(pc, x2, _mm256_set1_ps(1.0f));
  __m256 ps = _mm256_set1_ps(-1.0f / 39916800.0f);
  ps = _mm256_fmadd_ps(ps, x2, _mm256_set1_ps(1.0f / 362880.0f));
  ps = _mm256_fmadd_ps(ps, x2, _mm256_set1_ps(-1.0f / 5040.0f));
  ps = _mm256_fmadd_ps(ps, x2, _mm256_set1_ps(1.0f / 120.0f));
  ps = _mm256_fmadd_ps(ps, x2, _mm256_set1_ps(-1.0f / 6.0f));
  ps = _mm256_fmadd_ps(ps, x2, _mm256_set1_ps(1.0f));
  ps = _mm256_mul_ps(ps, x);
  // Quarter turn k = q mod 4: (c, s) -> k=1 (-s, c), k=2 (-c, -s), k=3 (s, -c).
  const __m256i k = _mm256_and_si256(_mm256_cvtps_epi32(q), _mm256_set1_epi32(3));
  const __m256 odd = _mm256_castsi256_ps(
      _mm256_cmpeq_epi32(_mm256_and_si256(k, _mm256_set1_epi32(1)), _mm256_set1_epi32(1)));
  const __m256 cs = _mm256_blendv_ps(pc, ps, odd);  // the magnitude of the new cos
  const __m256 sn = _mm256_blendv_ps(ps, pc, odd);  // ... and of the new sin
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  // cos is negated for k = 1, 2; sin for k = 2, 3.
  const __m256i k1or2 = _mm256_or_si256(_mm256_cmpeq_epi32(k, _mm256_set1_epi32(1)),
                                        _mm256_cmpeq_epi32(k, _mm256_set1_epi32(2)));
  const __m256i k2or3 = _mm256_cmpgt_epi32(k, _mm256_set1_epi32(1));
  c = _mm256_xor_ps(cs, _mm256_and_ps(sign_bit, _mm256_castsi256_ps(k1or2)));
  s = _mm256_xor_ps(sn, _mm256_and_ps(sign_bit, _mm256_castsi256_ps(k2or3)));
}

// 8 pairs: out[0..16) interleaved (z0, z1) per pair.
void normal_pairs8(uint64_t seed, uint64_t stream, uint64_t first, float* out) {
  alignas(32) float u1[8], u2[8];
  for (int j = 0; j < 8; ++j) normal_pair_uniforms(seed, stream, first + j, u1[j], u2[j]);
  const __m256 r = _mm256_sqrt_ps(_mm256_mul_ps(_mm256_set1_ps(-2.0f), log_ps(_mm256_load_ps(u1))));
  __m256 c, s;
  sincos_2pi_ps(_mm256_load_ps(u2), c, s);
  const __m256 z0 = _mm256_mul_ps(r, c), z1 = _mm256_mul_ps(r, s);
  // Interleave: lanes (z0[j], z1[j]) in order j = 0..7.
  const __m256 lo = _mm256_unpacklo_ps(z0, z1), hi = _mm256_unpackhi_ps(z0, z1);
  _mm256_storeu_ps(out, _mm256_permute2f128_ps(lo, hi, 0x20));
  _mm256_storeu_ps(out + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
}

}  // namespace

void normal_pair_uniforms(uint64_t seed, uint64_t stream, uint64_t index, float& u1, float& u2) {
  const uint64_t bits = rng_bits(seed, stream, index);
  u1 = uniform24(bits >> 40);
  u2 = uniform24((bits >> 16) & 0xffffff);
}

void fill_normal(std::span<float> out, uint64_t seed, uint64_t stream, uint64_t first_pair) {
  const int64_t n = static_cast<int64_t>(out.size());
  const int64_t n_blocks = (n + 15) / 16;  // 16 numbers = 8 pairs
  // Each block is a function of its pair counters alone, so the thread split changes no bit.
#pragma omp parallel for schedule(static) if (n_blocks > 64)
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint64_t pair = first_pair + 8 * static_cast<uint64_t>(b);
    float* dst = out.data() + 16 * b;
    if (16 * b + 16 <= n) {
      normal_pairs8(seed, stream, pair, dst);
    } else {
      float tail[16];
      normal_pairs8(seed, stream, pair, tail);
      for (int64_t i = 0; i < n - 16 * b; ++i) dst[i] = tail[i];
    }
  }
}

void fill_normal_from(std::span<float> out, uint64_t seed, uint64_t stream, uint64_t first) {
  if (first % 2 == 0 || out.empty()) {
    fill_normal(out, seed, stream, first / 2);
    return;
  }
  float pairs[16];
  normal_pairs8(seed, stream, first / 2, pairs);
  out[0] = pairs[1];  // the sine of pair first / 2
  fill_normal(out.subspan(1), seed, stream, first / 2 + 1);
}

}  // namespace remat
