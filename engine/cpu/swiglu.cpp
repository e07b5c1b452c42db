// CPU SwiGLU gate forward/backward (engine/core/ops/swiglu.h): out = silu(g) u, silu(g) = g s,
// s = sigmoid(g) = 1 / (1 + e^-g);  d g = dout u s (1 + g (1 - s)),  d u = dout g s.
// e^-g is exp2_ps of -g log2(e) (engine/cpu/vector_math.h), 8 lanes at a time, as GELU's
// (activation.cpp): a scalar std::exp per element was most of the op's time. Measured on a
// 1024 x 5632 gate, 2 threads (remat_tests "[swiglu-bench]", best of 10, old and new binaries
// alternated on a shared 2-core VM at load 7-9): forward 44 -> 19 ms, backward 57 -> 24 ms.
// 1 - s is e s, free of the cancellation of 1 - s as s nears 1; exp2_ps clamps its argument at
// 127, so e stays finite and e s = 1 where s underflows. Every element takes the same
// instructions wherever it falls in a vector (the tail of a chunk masked), and the chunks are
// fixed: the same bits for any thread count.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/vector_math.h"

namespace remat::cpu {
namespace {

// Splits [0, n) into fixed chunks shared by the threads: `run(begin, count)` per chunk.
template <class Run>
void for_each_chunk(int64_t n, Run&& run) {
  constexpr int64_t kChunk = 1 << 13;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t c = 0; c < chunks; ++c) run(c * kChunk, std::min(kChunk, n - c * kChunk));
}

#if defined(__AVX2__) && defined(__FMA__)
struct SiluLanes {
  __m256 s;            // sigmoid(g)
  __m256 one_minus_s;  // e^-g s
};

inline SiluLanes silu_lanes(__m256 g) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = exp2_ps(_mm256_mul_ps(g, _mm256_set1_ps(-std::numbers::log2e_v<float>)));
  const __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, e));
  return {s, _mm256_mul_ps(e, s)};
}

#endif

void swiglu_forward_run(float* o, const float* g, const float* u, int64_t n) {
#if defined(__AVX2__) && defined(__FMA__)
  for_each_lanes(n, [&](int64_t i, __m256i mask) {
    const __m256 gv = _mm256_maskload_ps(g + i, mask);
    const __m256 gs = _mm256_mul_ps(gv, silu_lanes(gv).s);
    _mm256_maskstore_ps(o + i, mask, _mm256_mul_ps(gs, _mm256_maskload_ps(u + i, mask)));
  });
#else  // portable fallback: the same formula, one element at a time
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-g[i]));
    o[i] = g[i] * s * u[i];
  }
#endif
}

// Reads every input of a vector before writing its gradients, so a gradient may alias an input.
void swiglu_backward_run(float* dg, float* du, const float* dy, const float* g, const float* u,
                         int64_t n) {
#if defined(__AVX2__) && defined(__FMA__)
  for_each_lanes(n, [&](int64_t i, __m256i mask) {
    const __m256 gv = _mm256_maskload_ps(g + i, mask);
    const __m256 uv = _mm256_maskload_ps(u + i, mask);
    const __m256 d = _mm256_maskload_ps(dy + i, mask);
    const SiluLanes sl = silu_lanes(gv);
    const __m256 slope = _mm256_fmadd_ps(gv, sl.one_minus_s, _mm256_set1_ps(1.0f));
    _mm256_maskstore_ps(dg + i, mask,
                        _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(d, uv), sl.s), slope));
    _mm256_maskstore_ps(du + i, mask, _mm256_mul_ps(_mm256_mul_ps(d, gv), sl.s));
  });
#else  // portable fallback: the same formula, one element at a time
  for (int64_t i = 0; i < n; ++i) {
    // std::exp is not clamped: e^-g overflows past g ~ -88, where 1 - s (>= 1/2) is exact enough.
    const float e = std::exp(-g[i]), s = 1.0f / (1.0f + e), d = dy[i];
    const float one_minus_s = g[i] >= 0.0f ? e * s : 1.0f - s;
    dg[i] = d * u[i] * s * (1.0f + g[i] * one_minus_s);
    du[i] = d * g[i] * s;
  }
#endif
}

}  // namespace

void CpuBackend::swiglu_forward_impl(const SwiGluForwardArgs& a) {
  const float* g = a.gate.f32();
  const float* u = a.up.f32();
  float* o = a.out.f32();
  for_each_chunk(a.gate.numel(),
                 [&](int64_t i, int64_t n) { swiglu_forward_run(o + i, g + i, u + i, n); });
}

void CpuBackend::swiglu_backward_impl(const SwiGluBackwardArgs& a) {
  const float* g = a.gate.f32();
  const float* u = a.up.f32();
  const float* dy = a.dout.f32();
  float* dg = a.dgate.f32();
  float* du = a.dup.f32();
  for_each_chunk(a.gate.numel(), [&](int64_t i, int64_t n) {
    swiglu_backward_run(dg + i, du + i, dy + i, g + i, u + i, n);
  });
}

}  // namespace remat::cpu
