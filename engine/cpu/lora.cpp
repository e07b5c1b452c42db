// CPU LoRA adapters of a linear (engine/core/ops/lora.h), the parts linear.cpp calls around its
// base GEMMs. The adapters of one linear share its input, so h = s x A^T is one GEMM for all of
// them against their A's side by side (R = the sum of their ranks); their output terms h_i B_i^T
// and their input gradient dh A are K = r products added to each tile of the base GEMM's output
// while that tile is in cache (a tile epilogue, gemm.h): no pass of their own over out or dinp.
// An adapter's columns of a wider output are a strided view, never a copy. With dropout each
// adapter has its own mask over the input, so h, dA and dinp's term go adapter by adapter through
// the dropped copy ("lora.dropped"), drawn by the dropout op's own kernel.

#include <cstring>

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

// The adapters' A side by side, (R, C): the one adapter's own A, or their rows copied into
// "lora.a_stack" (R C floats: a few hundred KiB where the base weight is tens of MiB).
const float* stacked_a(const LinearLora& l, const OpWorkspace& ws) {
  if (l.count == 1) return l.adapters[0].a.f32();
  float* stack = ws.at("lora.a_stack").f32();
  int64_t at = 0;
  for (const LoraAdapterArgs& ad : l.list()) {
    std::memcpy(stack + at, ad.a.f32(), ad.a.bytes());
    at += ad.a.numel();
  }
  return stack;
}

}  // namespace

const float* CpuBackend::lora_dropped_input(const Tensor& inp, const LoraDropout& d,
                                            const OpWorkspace& ws) {
  if (d.p == 0) return inp.f32();
  const Tensor& dropped = ws.at("lora.dropped").tensor();
  dropout_impl({dropped, inp, d.p, d.seed, d.stream, d.first_index});
  return dropped.f32();
}

void CpuBackend::lora_h(const LinearLora& l, const Tensor& inp, const OpWorkspace& ws) {
  const int64_t N = inp.rows(), C = inp.dim(-1), r = l.rank(), R = l.total_rank();
  float* h = ws.at("lora.h").f32();
  if (!l.any_dropout()) {  // one GEMM for every adapter: the input is read once
    sgemm(CblasNoTrans, CblasTrans, N, R, C, inp.f32(), C, stacked_a(l, ws), C, 0.0f, h, R,
          scale_tiles(h, R, l.scale));
    return;
  }
  for (int i = 0; i < l.count; ++i) {
    const LoraAdapterArgs& ad = l.adapters[static_cast<size_t>(i)];
    const float* x = lora_dropped_input(inp, ad.dropout, ws);
    sgemm(CblasNoTrans, CblasTrans, N, r, C, x, C, ad.a.f32(), C, 0.0f, h + i * r, R,
          scale_tiles(h + i * r, R, l.scale));
  }
}

LoraTileAdd CpuBackend::lora_out_tiles(const LinearLora& l, const OpWorkspace& ws, float* out,
                                       int64_t OC) const {
  const int64_t r = l.rank(), R = l.total_rank();
  const float* h = ws.at("lora.h").f32();
  return [&l, h, out, OC, r, R](int64_t r0, int64_t c0, int64_t m, int64_t n) {
    int status = 0;
    for (int i = 0; i < l.count; ++i) {  // tile[:, cols of adapter i] += h_i B_i^T
      const LoraAdapterArgs& ad = l.adapters[static_cast<size_t>(i)];
      const int64_t j0 = std::max(c0, ad.col0), j1 = std::min(c0 + n, ad.col0 + ad.b.dim(0));
      if (j0 >= j1) continue;
      const int s =
          sgemm_on_this_thread(CblasNoTrans, CblasTrans, m, j1 - j0, r, h + r0 * R + i * r, R,
                               ad.b.f32() + (j0 - ad.col0) * r, r, 1.0f, out + r0 * OC + j0, OC);
      if (s) status = s;
    }
    return status;
  };
}

void CpuBackend::lora_parameter_grads(const LinearBackwardArgs& a, const OpWorkspace& ws) {
  const LinearLora& l = a.lora;
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), OC = a.dout.dim(-1), r = l.rank(),
                R = l.total_rank();
  const float* g = a.dout.f32();
  float* h = ws.at("lora.h").f32();
  float* dh = ws.at("lora.dh").f32();
  lora_h(l, a.inp, ws);  // recomputed: never saved
  // dB_i += g_i^T h_i; dh_i = s g_i B_i (g_i: adapter i's columns of dout, leading dimension OC)
  for (int i = 0; i < l.count; ++i) {
    const LoraAdapterArgs& ad = l.adapters[static_cast<size_t>(i)];
    const int64_t n = ad.b.dim(0);
    sgemm(CblasTrans, CblasNoTrans, n, r, N, g + ad.col0, OC, h + i * r, R, 1.0f, ad.db.f32(), r);
    sgemm(CblasNoTrans, CblasNoTrans, N, r, n, g + ad.col0, OC, ad.b.f32(), r, 0.0f, dh + i * r, R,
          scale_tiles(dh + i * r, R, l.scale));
  }
  // dA_i += dh_i^T drop_i(x): without dropout every adapter's at once, the input read once.
  if (l.any_dropout()) {
    for (int i = 0; i < l.count; ++i) {
      const LoraAdapterArgs& ad = l.adapters[static_cast<size_t>(i)];
      const float* x = lora_dropped_input(a.inp, ad.dropout, ws);
      sgemm(CblasTrans, CblasNoTrans, r, C, N, dh + i * r, R, x, C, 1.0f, ad.da.f32(), C);
    }
  } else if (l.count == 1) {
    sgemm(CblasTrans, CblasNoTrans, r, C, N, dh, R, a.inp.f32(), C, 1.0f, l.adapters[0].da.f32(),
          C);
  } else {
    float* da = ws.at("lora.da_stack").f32();
    sgemm(CblasTrans, CblasNoTrans, R, C, N, dh, R, a.inp.f32(), C, 0.0f, da, C);
    for (int i = 0; i < l.count; ++i) {
      float* dst = l.adapters[static_cast<size_t>(i)].da.f32();
      const float* src = da + i * r * C;
      for (int64_t e = 0; e < r * C; ++e) dst[e] += src[e];
    }
  }
}

LoraTileAdd CpuBackend::lora_dinp_tiles(const LinearLora& l, const OpWorkspace& ws, float* dinp,
                                        int64_t C) const {
  const int64_t R = l.total_rank();
  const float* dh = ws.at("lora.dh").f32();
  const float* a_stack = stacked_a(l, ws);  // before the GEMM's parallel region
  return [dh, a_stack, dinp, C, R](int64_t r0, int64_t c0, int64_t m, int64_t n) {
    // tile += dh A: every adapter's share at once, K = R
    return sgemm_on_this_thread(CblasNoTrans, CblasNoTrans, m, n, R, dh + r0 * R, R, a_stack + c0,
                                C, 1.0f, dinp + r0 * C + c0, C);
  };
}

void CpuBackend::lora_dinp_through_dropout(const LinearBackwardArgs& a, const OpWorkspace& ws) {
  const LinearLora& l = a.lora;
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), r = l.rank(), R = l.total_rank();
  const float* dh = ws.at("lora.dh").f32();
  const Tensor& t = ws.at("lora.dropped").tensor();
  for (int i = 0; i < l.count; ++i) {  // dh_i A_i, masked as adapter i's input was, then added
    const LoraAdapterArgs& ad = l.adapters[static_cast<size_t>(i)];
    sgemm(CblasNoTrans, CblasNoTrans, N, C, r, dh + i * r, R, ad.a.f32(), C, 0.0f, t.f32(), C);
    if (ad.dropout.p > 0) {
      const LoraDropout& d = ad.dropout;
      dropout_impl({t, t, d.p, d.seed, d.stream, d.first_index});
    }
    add_impl(a.dinp, a.dinp, t);
  }
}

}  // namespace remat::cpu
