// CPU pointwise ops: the residual add, GELU (tanh) / ReLU forward and backward, and inverted
// dropout with counter-based masks (engine/ops/activation.h). OpenMP over elements, static
// schedule: every element is computed the same way for any thread count.

#include <cmath>

#include "engine/cpu/cpu_backend.h"
#include "engine/rng.h"

namespace remat::cpu {

void CpuBackend::add_impl(const Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t n = out.numel();
  float* o = out.f32();
  const float* x = a.f32();
  const float* y = b.f32();
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

// GELU, tanh approximation (GPT-2).
// reference: https://pytorch.org/docs/stable/generated/torch.nn.GELU.html
static constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

void CpuBackend::activation_forward_impl(const ActivationForwardArgs& a) {
  const int64_t n = a.inp.numel();
  const float* x = a.inp.f32();
  float* y = a.out.f32();
  if (a.kind == Activation::Relu) {
#pragma omp parallel for schedule(static) if (n > kGrain)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0 ? x[i] : 0.0f;
    return;
  }
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    float u = kGeluScale * (v + 0.044715f * v * v * v);
    y[i] = 0.5f * v * (1.0f + std::tanh(u));
  }
}

void CpuBackend::activation_backward_impl(const ActivationBackwardArgs& a) {
  const int64_t n = a.inp.numel();
  const float* x = a.inp.f32();
  const float* dy = a.dout.f32();
  float* dx = a.dinp.f32();  // may alias dy: each element reads dy[i] before writing dx[i]
  if (a.kind == Activation::Relu) {
#pragma omp parallel for schedule(static) if (n > kGrain)
    for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0 ? dy[i] : 0.0f;
    return;
  }
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    float u = kGeluScale * (v + 0.044715f * v * v * v);
    float th = std::tanh(u);
    float sech2 = 1.0f - th * th;
    float du = kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + th) + 0.5f * v * sech2 * du);
  }
}

void CpuBackend::dropout_impl(const DropoutArgs& a) {
  const int64_t n = a.inp.numel();
  const float* x = a.inp.f32();
  float* y = a.out.f32();
  const float scale = 1.0f / (1.0f - a.p);
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i)
    y[i] = rng_uniform(a.seed, a.stream, static_cast<uint64_t>(i)) >= a.p ? x[i] * scale : 0.0f;
}

}  // namespace remat::cpu
