// CPU pointwise ops: the residual add, GELU (tanh) / ReLU forward and backward, and inverted
// dropout with counter-based masks (engine/core/ops/activation.h). OpenMP over elements, static
// schedule: every element is computed the same way for any thread count.

#include <algorithm>
#include <cmath>
#include <numbers>

#include "engine/core/rng.h"
#include "engine/cpu/activation_rows.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/vector_math.h"

namespace remat::cpu {

void CpuBackend::add_impl(const Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t n = out.numel();
  float* o = out.f32();
  const float* x = a.f32();
  const float* y = b.f32();
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

// GELU, tanh approximation (GPT-2): gelu(x) = 0.5 x (1 + tanh u), u = k (x + 0.044715 x^3),
// k = sqrt(2/pi) (reference: https://pytorch.org/docs/stable/generated/torch.nn.GELU.html).
// With tanh u = 2 s - 1, s = sigmoid(2u) = 1 / (1 + e^(-2u)):
//   gelu(x) = x s,   gelu'(x) = s + 2 x s (1 - s) u',   u' = k (1 + 3 * 0.044715 x^2),
// and s and 1 - s = e^(-2u) s are both free of cancellation. e^(-2u) is exp2_ps, 8 lanes at a
// time: a scalar std::tanh per element made GELU half of a small GPT's step (remat-train bench).
static constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
static constexpr float kGeluCubic = 0.044715f;

namespace {

#if defined(__AVX2__) && defined(__FMA__)
struct GeluLanes {
  __m256 u_prime_part;  // 1 + 3 * 0.044715 x^2 (u' / k)
  __m256 s;             // sigmoid(2u)
  __m256 one_minus_s;
};

inline GeluLanes gelu_lanes(__m256 x) {
  const __m256 x2 = _mm256_mul_ps(x, x);
  const __m256 one = _mm256_set1_ps(1.0f);
  // u = k (x + c x^3) = k x (1 + c x^2)
  const __m256 u =
      _mm256_mul_ps(_mm256_set1_ps(kGeluScale),
                    _mm256_mul_ps(x, _mm256_fmadd_ps(_mm256_set1_ps(kGeluCubic), x2, one)));
  const __m256 e = exp2_ps(_mm256_mul_ps(u, _mm256_set1_ps(-2.0f * std::numbers::log2e_v<float>)));
  const __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, e));
  return {_mm256_fmadd_ps(_mm256_set1_ps(3.0f * kGeluCubic), x2, one), s, _mm256_mul_ps(e, s)};
}

#endif

// Splits [0, n) into fixed chunks shared by the threads: `row(begin, count)` per chunk.
template <class Row>
void for_each_chunk(int64_t n, Row&& row) {
  constexpr int64_t kChunk = 1 << 13;  // a multiple of 8, so only the last chunk has a tail
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t c = 0; c < chunks; ++c) row(c * kChunk, std::min(kChunk, n - c * kChunk));
}

}  // namespace

void activation_forward_row(Activation kind, const float* x, float* y, int64_t n) {
  if (kind == Activation::Relu) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0 ? x[i] : 0.0f;
    return;
  }
#if defined(__AVX2__) && defined(__FMA__)
  for_each_lanes(n, [&](int64_t i, __m256i mask) {
    const __m256 v = _mm256_maskload_ps(x + i, mask);
    _mm256_maskstore_ps(y + i, mask, _mm256_mul_ps(v, gelu_lanes(v).s));
  });
#else  // portable fallback: the same formula, one element at a time
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kGeluScale * v * (1.0f + kGeluCubic * v * v);
    y[i] = v / (1.0f + std::exp(-2.0f * u));
  }
#endif
}

void activation_backward_row(Activation kind, const float* x, const float* dy, float* dx,
                             int64_t n) {
  if (kind == Activation::Relu) {
    for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0 ? dy[i] : 0.0f;
    return;
  }
#if defined(__AVX2__) && defined(__FMA__)
  for_each_lanes(n, [&](int64_t i, __m256i mask) {
    const __m256 v = _mm256_maskload_ps(x + i, mask);
    const GeluLanes g = gelu_lanes(v);
    // s + 2 x s (1 - s) k (1 + 3 c x^2)
    const __m256 two_k_x = _mm256_mul_ps(_mm256_set1_ps(2.0f * kGeluScale), v);
    const __m256 slope =
        _mm256_mul_ps(_mm256_mul_ps(two_k_x, g.u_prime_part), _mm256_mul_ps(g.s, g.one_minus_s));
    const __m256 grad = _mm256_add_ps(g.s, slope);
    _mm256_maskstore_ps(dx + i, mask, _mm256_mul_ps(_mm256_maskload_ps(dy + i, mask), grad));
  });
#else  // portable fallback: the same formula, one element at a time
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kGeluScale * v * (1.0f + kGeluCubic * v * v);
    const float e = std::exp(-2.0f * u), s = 1.0f / (1.0f + e);
    const float slope = 2.0f * kGeluScale * v * (1.0f + 3.0f * kGeluCubic * v * v) * s * (e * s);
    dx[i] = dy[i] * (s + slope);
  }
#endif
}

void CpuBackend::activation_forward_impl(const ActivationForwardArgs& a) {
  const float* x = a.inp.f32();
  float* y = a.out.f32();
  for_each_chunk(a.inp.numel(),
                 [&](int64_t i, int64_t n) { activation_forward_row(a.kind, x + i, y + i, n); });
}

void CpuBackend::activation_backward_impl(const ActivationBackwardArgs& a) {
  const float* x = a.inp.f32();
  const float* dy = a.dout.f32();
  float* dx = a.dinp.f32();  // may alias dy: each element reads dy[i] before writing dx[i]
  for_each_chunk(a.inp.numel(), [&](int64_t i, int64_t n) {
    activation_backward_row(a.kind, x + i, dy + i, dx + i, n);
  });
}

void CpuBackend::dropout_impl(const DropoutArgs& a) {
  const int64_t n = a.inp.numel();
  const float* x = a.inp.f32();
  float* y = a.out.f32();
  const float scale = 1.0f / (1.0f - a.p);
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i)
    y[i] = rng_uniform(a.seed, a.stream, a.first_index + static_cast<uint64_t>(i)) >= a.p
               ? x[i] * scale
               : 0.0f;
}

}  // namespace remat::cpu
