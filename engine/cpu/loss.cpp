// CPU losses (engine/ops/loss.h): the fused, chunked LM head + softmax cross-entropy and the
// tutorial MLP's mean-squared error.

#include <algorithm>
#include <cmath>

#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/gemm.h"

namespace remat::cpu {

// For each chunk of rows: logits = inp W^T; per row, a numerically stable softmax (subtract the
// row max) gives loss = logsumexp - logit[target] and dlogits = (softmax - onehot) * scale,
// written over the logits; then dinp = dlogits W and dW += dlogits^T inp.
void CpuBackend::lm_head_loss_impl(const LmHeadLossArgs& a, const OpWorkspace& ws) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), V = a.weight.dim(0);
  const Buffer& chunk = ws.at("lm_head.logits_chunk");
  const int64_t R = chunk.tensor().dim(0);
  float* logits = chunk.f32();
  const float* W = a.weight.f32();
  const int32_t* targets = a.targets.i32();
  float* losses = a.losses.f32();
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t rows = std::min(R, N - r0);
    const float* x = a.inp.f32() + r0 * C;
    sgemm(CblasNoTrans, CblasTrans, rows, V, C, x, C, W, C, 0.0f, logits, V);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* l = logits + r * V;
      const int32_t t = targets[r0 + r];
      REMAT_ASSERT(t >= 0 && t < V, "lm_head_loss: target {} outside vocabulary {}", t, V);
      float mx = l[0];
      for (int64_t j = 1; j < V; ++j) mx = std::max(mx, l[j]);
      double sum = 0;
      for (int64_t j = 0; j < V; ++j) sum += std::exp(static_cast<double>(l[j] - mx));
      const double lse = static_cast<double>(mx) + std::log(sum);
      losses[r0 + r] = static_cast<float>(lse - l[t]);
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j < V; ++j) l[j] = std::exp(l[j] - mx) * inv * a.loss_scale;
      l[t] -= a.loss_scale;
    }
    sgemm(CblasNoTrans, CblasNoTrans, rows, C, V, logits, V, W, C, 0.0f, a.dinp.f32() + r0 * C, C);
    sgemm(CblasTrans, CblasNoTrans, V, C, rows, logits, V, x, C, 1.0f, a.dweight.f32(), C);
  }
}

void CpuBackend::mse_loss_impl(const MseLossArgs& a) {
  const int64_t N = a.inp.rows(), D = a.inp.dim(-1);
  const float* x = a.inp.f32();
  const float* y = a.target.f32();
  float* dx = a.dinp.f32();
  float* loss = a.losses.f32();
  const float g = 2.0f * a.loss_scale / static_cast<float>(D);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    double acc = 0;
    for (int64_t j = 0; j < D; ++j) {
      const float diff = x[i * D + j] - y[i * D + j];
      acc += static_cast<double>(diff) * diff;
      dx[i * D + j] = g * diff;
    }
    loss[i] = static_cast<float>(acc / static_cast<double>(D));
  }
}

}  // namespace remat::cpu
