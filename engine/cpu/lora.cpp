// CPU LoRA adapter op, forward and backward (engine/core/ops/lora.h): five small GEMMs on the tile
// grid of gemm.h, each product over the output columns of the base linear addressed with its
// leading dimension (the adapter's columns of a wider output are a strided view, never a copy).
// The scale s rides in the epilogue of the GEMM that makes h (forward) or dh (backward); the
// dropout is the dropout op's own kernel, so its mask is the one any other call draws.

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
  // out[:, col0 : col0 + n] += h B^T
  sgemm(CblasNoTrans, CblasTrans, N, n, r, ws.at("lora.h").f32(), r, a.b.f32(), r, 1.0f,
        a.out.f32() + a.col0, OC);
}

void CpuBackend::lora_backward_impl(const LoraBackwardArgs& a, const OpWorkspace& ws) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), OC = a.dout.dim(-1), r = a.a.dim(0),
                n = a.b.dim(0);
  const float* g = a.dout.f32() + a.col0;  // (N, n), leading dimension OC
  const float* x = lora_input(a.inp, a.a, a.scale, a.dropout, ws);
  const float* h = ws.at("lora.h").f32();
  float* dh = ws.at("lora.dh").f32();
  // dB += g^T h; dh = s g B; dA += dh^T drop(x)
  sgemm(CblasTrans, CblasNoTrans, n, r, N, g, OC, h, r, 1.0f, a.db.f32(), r);
  sgemm(CblasNoTrans, CblasNoTrans, N, r, n, g, OC, a.b.f32(), r, 0.0f, dh, r,
        scale_tiles(dh, r, a.scale));
  sgemm(CblasTrans, CblasNoTrans, r, C, N, dh, r, x, C, 1.0f, a.da.f32(), C);
  if (a.dinp.empty()) return;
  if (a.dropout.p == 0) {  // dinp += dh A
    sgemm(CblasNoTrans, CblasNoTrans, N, C, r, dh, r, a.a.f32(), C, 1.0f, a.dinp.f32(), C);
    return;
  }
  // Through the dropout: dh A into the dropped input's buffer (read for the last time above),
  // masked as the input was, then added.
  const Tensor& t = ws.at("lora.dropped").tensor();
  sgemm(CblasNoTrans, CblasNoTrans, N, C, r, dh, r, a.a.f32(), C, 0.0f, t.f32(), C);
  const LoraDropout& d = a.dropout;
  dropout_impl({t, t, d.p, d.seed, d.stream, d.first_index});
  add_impl(a.dinp, a.dinp, t);
}

}  // namespace remat::cpu
