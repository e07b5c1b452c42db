// CPU token (+ position) embedding forward and backward (engine/core/ops/embedding.h).

#include "engine/core/nf4.h"
#include "engine/cpu/cpu_backend.h"

namespace remat::cpu {
namespace {

// The learned position of token bt of (B, T): t, or t - doc_start with documents.
inline int64_t position(int64_t bt, int64_t T, const int32_t* doc_start) {
  return bt % T - (doc_start ? doc_start[bt] : 0);
}

}  // namespace

void CpuBackend::embedding_forward_impl(const EmbeddingForwardArgs& a) {
  const int64_t B = a.tokens.dim(0), T = a.tokens.dim(1), C = a.wte.dim(1), V = a.wte.dim(0);
  const int32_t* tok = a.tokens.i32();
  const float* wpe = a.wpe.empty() ? nullptr : a.wpe.f32();
  const int32_t* doc_start = a.doc_start.empty() ? nullptr : a.doc_start.i32();
  float* out = a.out.f32();
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int32_t id = tok[bt];
    REMAT_ASSERT(id >= 0 && id < V, "embedding_forward: token {} outside vocabulary {}", id, V);
    float* o = out + bt * C;
    // The row as f32: copied, or decoded from a frozen LoRA base's bf16 table (engine/model.h).
    decode_weight(a.wte.dtype, a.wte.data, V * C, id * C, C, o);
    if (wpe) {
      const float* p = wpe + position(bt, T, doc_start) * C;
      for (int64_t c = 0; c < C; ++c) o[c] += p[c];
    }
  }
}

// Scatter-add without atomics: each thread owns a slice of channels for every row, so rows with
// the same token never race and the summation order is fixed (deterministic).
void CpuBackend::embedding_backward_impl(const EmbeddingBackwardArgs& a, const OpWorkspace&) {
  const int64_t B = a.tokens.dim(0), T = a.tokens.dim(1), C = a.dout.dim(-1);
  const int32_t* tok = a.tokens.i32();
  const float* dout = a.dout.f32();
  float* dwte = a.dwte.empty() ? nullptr : a.dwte.f32();  // null: a frozen token table
  float* dwpe = a.dwpe.empty() ? nullptr : a.dwpe.f32();
  const int32_t* doc_start = a.doc_start.empty() ? nullptr : a.doc_start.i32();
  constexpr int64_t kSlice = 16;
  const int64_t n_slices = (C + kSlice - 1) / kSlice;
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < n_slices; ++s) {
    const int64_t c0 = s * kSlice, c1 = std::min(C, c0 + kSlice);
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const float* d = dout + bt * C;
      if (dwte) {
        float* w = dwte + static_cast<int64_t>(tok[bt]) * C;
        for (int64_t c = c0; c < c1; ++c) w[c] += d[c];
      }
      if (dwpe) {
        float* p = dwpe + position(bt, T, doc_start) * C;
        for (int64_t c = c0; c < c1; ++c) p[c] += d[c];
      }
    }
  }
}

}  // namespace remat::cpu
