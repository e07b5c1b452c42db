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

// Every GEMM goes through here. OpenBLAS's own threading splits the work by the thread count,
// and its results then differ in the last bits between 1 and 2 threads (measured: dW-shaped
// products with a long K, and every shape with the Haswell kernel). So the output is cut into a
// grid of tiles that depends on the shape only, each tile is one single-threaded cblas_sgemm
// (OpenBLAS runs single-threaded inside an OpenMP region), and the threads share the tiles:
// every thread count computes every element by the same call, bit for bit. Measured on 2 threads
// (SkylakeX kernel) the tiles are as fast as OpenBLAS's own split, or faster, on the model's
// shapes. Tiles shrink (to 64) until there are 8 of them, so a small output with a long K
// (a weight gradient) still keeps every thread busy.
void sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  int64_t tile = 256;
  auto tiles = [&](int64_t t) { return ((M + t - 1) / t) * ((N + t - 1) / t); };
  while (tile > 64 && tiles(tile) < 8) tile /= 2;
  const int64_t n_cols = (N + tile - 1) / tile;
  const int64_t n_tiles = tiles(tile);
  // Always a parallel region, even for one tile: inside an active region OpenBLAS runs
  // single-threaded, which is what makes the result independent of the thread count.
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < n_tiles; ++t) {
    const int64_t i0 = (t / n_cols) * tile, j0 = (t % n_cols) * tile;
    const int64_t m = std::min(tile, M - i0), n = std::min(tile, N - j0);
    const float* a = ta == CblasNoTrans ? A + i0 * lda : A + i0;
    const float* b = tb == CblasNoTrans ? B + j0 : B + j0 * ldb;
    cblas_sgemm(CblasRowMajor, ta, tb, blas_int(m), blas_int(n), blas_int(K), 1.0f, a,
                blas_int(lda), b, blas_int(ldb), beta, C + i0 * ldc + j0, blas_int(ldc));
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

}  // namespace remat::cpu
