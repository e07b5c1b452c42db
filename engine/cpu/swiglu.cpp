// CPU SwiGLU gate forward/backward (engine/ops/swiglu.h): out = silu(g) u, silu(g) = g s,
// s = sigmoid(g) = 1 / (1 + e^-g);  d g = dout u s (1 + g (1 - s)),  d u = dout g s.
// OpenMP over elements, static schedule: every element is computed the same way for any thread
// count.
#include <cmath>

#include "engine/cpu/cpu_backend.h"

namespace remat::cpu {

void CpuBackend::swiglu_forward_impl(const SwiGluForwardArgs& a) {
  const int64_t n = a.gate.numel();
  const float* g = a.gate.f32();
  const float* u = a.up.f32();
  float* o = a.out.f32();
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-g[i]));
    o[i] = g[i] * s * u[i];
  }
}

void CpuBackend::swiglu_backward_impl(const SwiGluBackwardArgs& a) {
  const int64_t n = a.gate.numel();
  const float* g = a.gate.f32();
  const float* u = a.up.f32();
  const float* dy = a.dout.f32();
  float* dg = a.dgate.f32();
  float* du = a.dup.f32();
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-g[i]));
    const float d = dy[i];
    dg[i] = d * u[i] * s * (1.0f + g[i] * (1.0f - s));
    du[i] = d * g[i] * s;
  }
}

}  // namespace remat::cpu
