// CPU linear layer, forward and backward (engine/ops/linear.h): GEMMs on the tile grid of
// gemm.h, then the bias. Row-major; a weight is (OC, C) as in PyTorch, so out = inp W^T.

#include <algorithm>

#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/gemm.h"

namespace remat::cpu {

namespace {

// out (rows, OC) {=, +=} bias broadcast over rows.
void add_bias_rows(float* out, const float* bias, int64_t rows, int64_t OC, bool overwrite) {
#pragma omp parallel for schedule(static) if (rows * OC > (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out + r * OC;
    if (overwrite)
      for (int64_t j = 0; j < OC; ++j) o[j] = bias[j];
    else
      for (int64_t j = 0; j < OC; ++j) o[j] += bias[j];
  }
}

}  // namespace

void CpuBackend::linear_forward_impl(const LinearForwardArgs& a, const OpWorkspace&) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), OC = a.weight.dim(0);
  float beta = a.accumulate ? 1.0f : 0.0f;
  if (!a.bias.empty()) {
    add_bias_rows(a.out.f32(), a.bias.f32(), N, OC, !a.accumulate);
    beta = 1.0f;
  }
  sgemm(CblasNoTrans, CblasTrans, N, OC, C, a.inp.f32(), C, a.weight.f32(), C, beta, a.out.f32(),
        OC);
}

void CpuBackend::linear_backward_impl(const LinearBackwardArgs& a, const OpWorkspace&) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), OC = a.weight.dim(0);
  const float* dout = a.dout.f32();
  if (!a.dinp.empty()) {  // dinp (N, C) = dout (N, OC) W (OC, C)
    sgemm(CblasNoTrans, CblasNoTrans, N, C, OC, dout, OC, a.weight.f32(), C, 0.0f, a.dinp.f32(), C);
  }
  // dW (OC, C) += dout^T (OC, N) inp (N, C)
  sgemm(CblasTrans, CblasNoTrans, OC, C, N, dout, OC, a.inp.f32(), C, 1.0f, a.dweight.f32(), C);
  if (!a.dbias.empty()) {
    // Column sums; each thread owns a slice of columns, so the row order is fixed.
    float* db = a.dbias.f32();
    constexpr int64_t kSlice = 64;
    const int64_t n_slices = (OC + kSlice - 1) / kSlice;
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < n_slices; ++s) {
      const int64_t j0 = s * kSlice, j1 = std::min(OC, j0 + kSlice);
      float acc[kSlice] = {};
      for (int64_t r = 0; r < N; ++r)
        for (int64_t j = j0; j < j1; ++j) acc[j - j0] += dout[r * OC + j];
      for (int64_t j = j0; j < j1; ++j) db[j] += acc[j - j0];
    }
  }
}

}  // namespace remat::cpu
