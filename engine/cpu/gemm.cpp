// CPU GEMM-based ops: linear forward/backward and the fused, chunked LM head + cross-entropy.
// Row-major throughout; a Linear weight is (OC, C) as in PyTorch, so out = inp W^T.
#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "engine/cpu/cpu_backend.h"

namespace remat::cpu {
namespace {

int blas_int(int64_t v) {
  REMAT_ASSERT(v >= 0 && v <= INT32_MAX, "GEMM dimension {} exceeds the BLAS int range", v);
  return static_cast<int>(v);
}

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

void CpuBackend::linear_forward_impl(const LinearForwardArgs& a) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), OC = a.weight.dim(0);
  float beta = a.accumulate ? 1.0f : 0.0f;
  if (!a.bias.empty()) {
    add_bias_rows(a.out.f32(), a.bias.f32(), N, OC, !a.accumulate);
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(N), blas_int(OC), blas_int(C),
              1.0f, a.inp.f32(), blas_int(C), a.weight.f32(), blas_int(C), beta, a.out.f32(),
              blas_int(OC));
}

void CpuBackend::linear_backward_impl(const LinearBackwardArgs& a) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), OC = a.weight.dim(0);
  const float* dout = a.dout.f32();
  if (!a.dinp.empty()) {  // dinp (N, C) = dout (N, OC) W (OC, C)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(N), blas_int(C), blas_int(OC),
                1.0f, dout, blas_int(OC), a.weight.f32(), blas_int(C), 0.0f, a.dinp.f32(),
                blas_int(C));
  }
  // dW (OC, C) += dout^T (OC, N) inp (N, C)
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_int(OC), blas_int(C), blas_int(N), 1.0f,
              dout, blas_int(OC), a.inp.f32(), blas_int(C), 1.0f, a.dweight.f32(), blas_int(C));
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

// For each chunk of rows: logits = inp W^T; per row, a numerically stable softmax (subtract the
// row max) gives loss = logsumexp - logit[target] and dlogits = (softmax - onehot) * scale,
// written over the logits; then dinp = dlogits W and dW += dlogits^T inp.
void CpuBackend::lm_head_loss_impl(const LmHeadLossArgs& a) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), V = a.weight.dim(0);
  Buffer chunk = allocate_logits_chunk(a);
  const int64_t R = chunk.tensor().dim(0);
  float* logits = chunk.f32();
  const float* W = a.weight.f32();
  const int32_t* targets = a.targets.i32();
  float* losses = a.losses.f32();
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t rows = std::min(R, N - r0);
    const float* x = a.inp.f32() + r0 * C;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(rows), blas_int(V), blas_int(C),
                1.0f, x, blas_int(C), W, blas_int(C), 0.0f, logits, blas_int(V));
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
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(rows), blas_int(C), blas_int(V),
                1.0f, logits, blas_int(V), W, blas_int(C), 0.0f, a.dinp.f32() + r0 * C,
                blas_int(C));
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_int(V), blas_int(C), blas_int(rows),
                1.0f, logits, blas_int(V), x, blas_int(C), 1.0f, a.dweight.f32(), blas_int(C));
  }
}

}  // namespace remat::cpu
