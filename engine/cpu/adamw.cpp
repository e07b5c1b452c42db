// CPU optimizer ops: the global sum of squares (for gradient clipping) and the AdamW update
// (engine/ops/adamw.h).

#include <cmath>
#include <vector>

#include "engine/cpu/cpu_backend.h"

namespace remat::cpu {

// Fixed chunking (independent of the thread count) and an in-order final sum: the result is
// the same bits on every run and every thread count.
double CpuBackend::sum_squares_impl(std::span<const Tensor> tensors) {
  constexpr int64_t kChunk = 1 << 16;
  double total = 0;
  for (const Tensor& t : tensors) {
    const float* p = t.f32();
    const int64_t n = t.numel();
    const int64_t n_chunks = (n + kChunk - 1) / kChunk;
    std::vector<double> partial(static_cast<size_t>(n_chunks));
#pragma omp parallel for schedule(static) if (n_chunks > 1)
    for (int64_t c = 0; c < n_chunks; ++c) {
      double acc = 0;
      const int64_t e = std::min(n, (c + 1) * kChunk);
      for (int64_t i = c * kChunk; i < e; ++i) acc += static_cast<double>(p[i]) * p[i];
      partial[static_cast<size_t>(c)] = acc;
    }
    for (double v : partial) total += v;
  }
  return total;
}

// AdamW with decoupled weight decay (Loshchilov & Hutter).
// reference: https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html
void CpuBackend::adamw_update_impl(const AdamWArgs& a) {
  const int64_t n = a.param.numel();
  float* p = a.param.f32();
  const float* g = a.grad.f32();
  float* m = a.m.f32();
  float* v = a.v.f32();
  const float bc1 = 1.0f - std::pow(a.beta1, static_cast<float>(a.step));
  const float bc2 = 1.0f - std::pow(a.beta2, static_cast<float>(a.step));
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * a.grad_scale;
    m[i] = a.beta1 * m[i] + (1.0f - a.beta1) * gi;
    v[i] = a.beta2 * v[i] + (1.0f - a.beta2) * gi * gi;
    const float mhat = m[i] / bc1;
    const float vhat = v[i] / bc2;
    p[i] -= a.lr * (mhat / (std::sqrt(vhat) + a.eps) + a.weight_decay * p[i]);
  }
}

}  // namespace remat::cpu
