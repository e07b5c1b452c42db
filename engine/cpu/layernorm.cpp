// CPU LayerNorm forward/backward (eps 1e-5, biased variance, as GPT-2 / PyTorch).
// reference: https://pytorch.org/docs/stable/generated/torch.nn.LayerNorm.html
// Backward, with xhat = (x - mean) * rstd and g = dout * weight:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dweight += sum_rows dout * xhat,
//   dbias += sum_rows dout.
#include <algorithm>
#include <cmath>

#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/lane_sum.h"

namespace remat::cpu {

static constexpr float kLayerNormEps = 1e-5f;

void CpuBackend::layernorm_forward_impl(const LayerNormForwardArgs& a) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1);
  const float* x = a.inp.f32();
  const float* w = a.weight.f32();
  const float* b = a.bias.f32();
  float* y = a.out.f32();
  float* stats = a.stats.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const float* xr = x + r * C;
    const float mean = lane_sum(C, [xr](int64_t c) { return xr[c]; }) / static_cast<float>(C);
    const float var =
        lane_sum(C, [xr, mean](int64_t c) { return (xr[c] - mean) * (xr[c] - mean); });
    const float rstd = 1.0f / std::sqrt(var / static_cast<float>(C) + kLayerNormEps);
    float* yr = y + r * C;
    for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - mean) * rstd * w[c] + b[c];
    stats[2 * r] = mean;
    stats[2 * r + 1] = rstd;
  }
}

void CpuBackend::layernorm_backward_impl(const LayerNormBackwardArgs& a) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1);
  const float* x = a.inp.f32();
  const float* w = a.weight.f32();
  const float* dy = a.dout.f32();
  const float* stats = a.stats.f32();
  float* dx = a.dinp.f32();
  // Pass 1, rows in parallel: the input gradient (+= into the residual stream).
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const float mean = stats[2 * r], rstd = stats[2 * r + 1];
    const float* xr = x + r * C;
    const float* dyr = dy + r * C;
    const float g_mean =
        lane_sum(C, [dyr, w](int64_t c) { return dyr[c] * w[c]; }) / static_cast<float>(C);
    const float gx_mean =
        lane_sum(C, [dyr, w, xr, mean,
                     rstd](int64_t c) { return dyr[c] * w[c] * (xr[c] - mean) * rstd; }) /
        static_cast<float>(C);
    float* dxr = dx + r * C;
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (xr[c] - mean) * rstd;
      dxr[c] += rstd * (dyr[c] * w[c] - g_mean - xhat * gx_mean);
    }
  }
  // Pass 2, channel slices in parallel: parameter gradients summed over rows in a fixed order
  // (none for a frozen LayerNorm).
  if (a.dweight.empty()) return;
  float* dw = a.dweight.f32();
  float* db = a.dbias.f32();
  constexpr int64_t kSlice = 32;
  for_each_column_slice<kSlice>(C, [&](int64_t c0, int64_t c1) {
    float acc_w[kSlice] = {}, acc_b[kSlice] = {};
    for (int64_t r = 0; r < N; ++r) {
      const float mean = stats[2 * r], rstd = stats[2 * r + 1];
      for (int64_t c = c0; c < c1; ++c) {
        const float d = dy[r * C + c];
        acc_w[c - c0] += d * (x[r * C + c] - mean) * rstd;
        acc_b[c - c0] += d;
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      dw[c] += acc_w[c - c0];
      db[c] += acc_b[c - c0];
    }
  });
}

}  // namespace remat::cpu
