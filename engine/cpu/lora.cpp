// CPU LoRA adapter op, forward and backward (engine/core/ops/lora.h). Every product but the first
// has a side of r (the rank, 16 or so): h = s drop(x) A^T runs on the tile grid of gemm.h, the five
// thin ones on the attention kernel's tile GEMM (tile_gemm, engine/cpu/attention_gemm.h), split
// between threads by blocks of the output. A library call per tile of such a product packs its
// operands for a few FMAs per element; tile_gemm reads them in place. On SmolLM2-135M at 512
// tokens, rank 16, `bench`'s adapter row ran at 0.28 of the base linears' GFLOP/s on library calls
// and at 0.40 on tile_gemm (same-run ratios, 2026-12-07). The adapter's columns of a wider base
// output are a strided view, never a copy. The dropout is the dropout op's own kernel, so its mask
// is the one any other call draws.

#include <algorithm>

#include "engine/cpu/attention_gemm.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/gemm.h"

namespace remat::cpu {
namespace {

// Multiplies every element of a finished tile of `c` (leading dimension ldc) by `s`.
TileEpilogue scale_tiles(float* c, int64_t ldc, float s) {
  return [c, ldc, s](int64_t r0, int64_t c0, int64_t m, int64_t n) {
    for (int64_t r = r0; r < r0 + m; ++r)
      for (int64_t j = c0; j < c0 + n; ++j) c[r * ldc + j] *= s;
  };
}

// C (M, N) {=, +=} A (M, K) B (K, N), A's element (i, k) at a[i * ars + k * aks], with the threads
// taking blocks of C's rows, or of its columns (`by_columns`, for a C of r rows). Each element is
// one FMA chain over k in order whichever thread makes it: the same bits for any thread count.
void thin_gemm(bool accumulate, int64_t M, int64_t N, int64_t K, const float* a, int64_t ars,
               int64_t aks, const float* b, int64_t ldb, float* c, int64_t ldc, bool by_columns) {
  constexpr int64_t kRows = 24, kCols = 64;  // whole blocks of both ISAs' register tiles
  const int64_t blocks = by_columns ? (N + kCols - 1) / kCols : (M + kRows - 1) / kRows;
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < blocks; ++t) {
    if (by_columns) {
      const int64_t j0 = t * kCols;
      tile_gemm(accumulate, M, std::min(kCols, N - j0), K, a, ars, aks, b + j0, ldb, c + j0, ldc);
    } else {
      const int64_t i0 = t * kRows;
      tile_gemm(accumulate, std::min(kRows, M - i0), N, K, a + i0 * ars, ars, aks, b, ldb,
                c + i0 * ldc, ldc);
    }
  }
}

}  // namespace

// h = s drop(x) A^T into ws "lora.h" (N, r); returns the adapter's input as the GEMMs read it.
const float* CpuBackend::lora_input(const Tensor& inp, const Tensor& a, float scale,
                                    const LoraDropout& d, const OpWorkspace& ws) {
  const int64_t N = inp.rows(), C = inp.dim(-1), r = a.dim(0);
  const float* x = inp.f32();
  if (d.p > 0) {
    const Tensor& dropped = ws.at("lora.dropped").tensor();
    dropout_impl({dropped, inp, d.p, d.seed, d.stream, d.first_index});
    x = dropped.f32();
  }
  float* h = ws.at("lora.h").f32();
  sgemm(CblasNoTrans, CblasTrans, N, r, C, x, C, a.f32(), C, 0.0f, h, r, scale_tiles(h, r, scale));
  return x;
}

void CpuBackend::lora_forward_impl(const LoraForwardArgs& a, const OpWorkspace& ws) {
  const int64_t N = a.inp.rows(), OC = a.out.dim(-1), r = a.a.dim(0), n = a.b.dim(0);
  lora_input(a.inp, a.a, a.scale, a.dropout, ws);
  // out[:, col0 : col0 + n] += h B^T, with B^T (r, n) made row-major in the workspace.
  float* bt = ws.at("lora.b_t").f32();
  const float* bv = a.b.f32();
  for (int64_t j = 0; j < n; ++j)
    for (int64_t k = 0; k < r; ++k) bt[k * n + j] = bv[j * r + k];
  thin_gemm(true, N, n, r, ws.at("lora.h").f32(), r, 1, bt, n, a.out.f32() + a.col0, OC, false);
}

void CpuBackend::lora_backward_impl(const LoraBackwardArgs& a, const OpWorkspace& ws) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), OC = a.dout.dim(-1), r = a.a.dim(0),
                n = a.b.dim(0);
  const float* g = a.dout.f32() + a.col0;  // (N, n), leading dimension OC
  const float* x = lora_input(a.inp, a.a, a.scale, a.dropout, ws);
  const float* h = ws.at("lora.h").f32();
  float* dh = ws.at("lora.dh").f32();
  // dB += g^T h; dh = s g B; dA += dh^T drop(x)
  thin_gemm(true, n, r, N, g, 1, OC, h, r, a.db.f32(), r, false);
  thin_gemm(false, N, r, n, g, OC, 1, a.b.f32(), r, dh, r, false);
  for (int64_t i = 0; i < N * r; ++i) dh[i] *= a.scale;
  thin_gemm(true, r, C, N, dh, 1, r, x, C, a.da.f32(), C, true);
  if (a.dinp.empty()) return;
  if (a.dropout.p == 0) {  // dinp += dh A
    thin_gemm(true, N, C, r, dh, r, 1, a.a.f32(), C, a.dinp.f32(), C, false);
    return;
  }
  // Through the dropout: dh A into the dropped input's buffer (read for the last time above),
  // masked as the input was, then added.
  const Tensor& t = ws.at("lora.dropped").tensor();
  thin_gemm(false, N, C, r, dh, r, 1, a.a.f32(), C, t.f32(), C, false);
  const LoraDropout& d = a.dropout;
  dropout_impl({t, t, d.p, d.seed, d.stream, d.first_index});
  add_impl(a.dinp, a.dinp, t);
}

}  // namespace remat::cpu
