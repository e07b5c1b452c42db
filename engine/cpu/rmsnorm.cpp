// CPU RMSNorm forward/backward and the per-head q/k RMSNorm (engine/core/ops/rmsnorm.h).
// With xhat = x * rstd and g = dout * weight:
//   dx = rstd * (g - xhat * mean(g * xhat)),  dweight += sum_rows dout * xhat.
// Rows in parallel for the input gradient; parameter gradients over channel slices, each summing
// the rows in order, so the bits do not depend on the thread count.
#include <algorithm>
#include <cmath>

#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/lane_sum.h"

namespace remat::cpu {
namespace {

// One row: out = x * rstd * w; returns rstd.
float rms_row_forward(float* y, const float* x, const float* w, int64_t C, float eps) {
  const float ms = lane_sum(C, [x](int64_t c) { return x[c] * x[c]; }) / static_cast<float>(C);
  const float rstd = 1.0f / std::sqrt(ms + eps);
  for (int64_t c = 0; c < C; ++c) y[c] = x[c] * rstd * w[c];
  return rstd;
}

// One row's input gradient, written (accumulate = false) or added into dx.
void rms_row_backward(float* dx, const float* dy, const float* x, const float* w, float rstd,
                      int64_t C, bool accumulate) {
  const float gx_mean =
      lane_sum(C, [dy, w, x, rstd](int64_t c) { return dy[c] * w[c] * x[c] * rstd; }) /
      static_cast<float>(C);
  for (int64_t c = 0; c < C; ++c) {
    const float d = rstd * (dy[c] * w[c] - x[c] * rstd * gx_mean);
    dx[c] = accumulate ? dx[c] + d : d;
  }
}

// dweight[c] += sum over the rows of dy * x * rstd, where row i of `rows` starts at
// base + i * stride and has rstd[i * rstd_stride]: channel slices in parallel, rows in order.
void rms_weight_grad(float* dw, const float* dy, const float* x, const float* rstd, int64_t rows,
                     int64_t C, int64_t stride, int64_t rstd_stride) {
  constexpr int64_t kSlice = 32;
  for_each_column_slice<kSlice>(C, [&](int64_t c0, int64_t c1) {
    float acc[kSlice] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const float rs = rstd[r * rstd_stride];
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += dy[r * stride + c] * x[r * stride + c] * rs;
    }
    for (int64_t c = c0; c < c1; ++c) dw[c] += acc[c - c0];
  });
}

}  // namespace

void CpuBackend::rmsnorm_forward_impl(const RmsNormForwardArgs& a) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1);
  const float* x = a.inp.f32();
  const float* w = a.weight.f32();
  float* y = a.out.f32();
  float* rstd = a.rstd.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) rstd[r] = rms_row_forward(y + r * C, x + r * C, w, C, a.eps);
}

void CpuBackend::rmsnorm_backward_impl(const RmsNormBackwardArgs& a) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1);
  const float* x = a.inp.f32();
  const float* w = a.weight.f32();
  const float* dy = a.dout.f32();
  const float* rstd = a.rstd.f32();
  float* dx = a.dinp.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r)
    rms_row_backward(dx + r * C, dy + r * C, x + r * C, w, rstd[r], C, true);
  if (!a.dweight.empty()) rms_weight_grad(a.dweight.f32(), dy, x, rstd, N, C, C, 1);
}

// A fused qkv row is NH + 2 KVH heads of HS: the first NH + KVH (q, then k) are normalized, the
// last KVH (v) pass through.
void CpuBackend::qk_norm_forward_impl(const QkNormForwardArgs& a) {
  const int64_t N = a.inp.rows(), W = a.inp.dim(-1);
  const int64_t HS = qkv_head_size(W, a.n_head, a.n_kv_head), NQK = a.n_head + a.n_kv_head;
  const float* x = a.inp.f32();
  float* y = a.out.f32();
  float* rstd = a.rstd.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    for (int64_t h = 0; h < NQK; ++h) {
      const float* w = h < a.n_head ? a.q_weight.f32() : a.k_weight.f32();
      rstd[r * NQK + h] = rms_row_forward(y + r * W + h * HS, x + r * W + h * HS, w, HS, a.eps);
    }
    std::copy(x + r * W + NQK * HS, x + (r + 1) * W, y + r * W + NQK * HS);
  }
}

void CpuBackend::qk_norm_backward_impl(const QkNormBackwardArgs& a) {
  const int64_t N = a.inp.rows(), W = a.inp.dim(-1);
  const int64_t NH = a.n_head, HS = qkv_head_size(W, a.n_head, a.n_kv_head),
                NQK = a.n_head + a.n_kv_head;
  const float* x = a.inp.f32();
  const float* dy = a.dout.f32();
  const float* rstd = a.rstd.f32();
  float* dx = a.dinp.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    for (int64_t h = 0; h < NQK; ++h) {
      const float* w = h < NH ? a.q_weight.f32() : a.k_weight.f32();
      const int64_t off = r * W + h * HS;
      rms_row_backward(dx + off, dy + off, x + off, w, rstd[r * NQK + h], HS, false);
    }
    std::copy(dy + r * W + NQK * HS, dy + (r + 1) * W, dx + r * W + NQK * HS);
  }
  // Weight gradients: every (row, head) of the kind is one row of HS, heads inside rows in order.
  // Heads of one row are HS apart, rows W apart, so each kind is summed head by head.
  for (int64_t h = 0; h < NQK; ++h) {
    const Tensor& dw = h < NH ? a.dq_weight : a.dk_weight;
    if (!dw.empty()) rms_weight_grad(dw.f32(), dy + h * HS, x + h * HS, rstd + h, N, HS, W, NQK);
  }
}

}  // namespace remat::cpu
