// LoRA adapters on a linear layer (docs/lora.md): what the linear op (engine/core/ops/linear.h)
// carries when its frozen weight has adapters, their shape checks, FLOPs and bytes. With adapters
// i = 1..k, scale s and A_i (r, C), B_i (n_i, r), the linear's forward is
//   out = [out +] inp W^T + b,  then  out[:, col0_i : col0_i + n_i] += s (drop_i(inp) A_i^T) B_i^T
// Columns, not the whole output, because one of our weights can be several Hugging Face modules
// side by side (Llama's fused q|k|v: q_proj is columns [0, Q) of its output, k_proj the next KV),
// each with an adapter of its own: up to three on one linear.
// The adapters are part of the linear op, not an op after it, so a backend can fold them into the
// base GEMMs: the CPU adds h B^T to each tile of out, and dh A to each tile of dinp, while the
// tile is in cache, instead of passing over the whole output once more per adapter; and the
// adapters of one linear read their shared input once (h for all of them in one GEMM).
// The (N, sum r) product h = s drop(inp) A^T is never stored: the backward recomputes it (2 N C r
// FLOPs per adapter, small beside the base linear's 2 N C n) rather than the block saving an
// activation for each adapter.
// Backward, with g = dout[:, col0_i : col0_i + n_i]:
//   dB_i += g^T h_i      dh_i = s g B_i      dA_i += dh_i^T drop_i(inp)     dinp += drop_i'(dh_i
//   A_i)
// dinp is the base linear's input gradient: base and adapters together, then through the fused
// activation's derivative when the op has one.
// Dropout (peft's lora_dropout) is the dropout op's counter-based mask over the (N, C) input, one
// stream per adapter, redrawn identically in the backward and in any recompute.
// Kernels: engine/cpu/lora.cpp, engine/cuda/lora.cpp (called by each backend's linear.cpp);
// workspaces: engine/core/cpu_workspace.h, engine/core/cuda_workspace.h; tests:
// tests/ops/test_lora.cpp.
#pragma once

#include <algorithm>
#include <array>
#include <span>

#include "engine/core/error.h"
#include "engine/core/ops/op.h"
#include "engine/core/tensor.h"

namespace remat {

/// The adapter input's dropout: element i of the (N, C) input is kept iff
/// rng_uniform(seed, stream, first_index + i) >= p, as DropoutArgs (engine/core/ops/activation.h).
struct LoraDropout {
  float p = 0;
  uint64_t seed = 0;
  uint64_t stream = 0;
  uint64_t first_index = 0;
};

/// One adapter on the linear's output columns [col0, col0 + n).
struct LoraAdapterArgs {
  Tensor a;     // (r, C) f32
  Tensor b;     // (n, r) f32
  Tensor da{};  // (r, C) f32 [+=], the backward's (empty in a forward)
  Tensor db{};  // (n, r) f32 [+=], the backward's (empty in a forward)
  int64_t col0 = 0;
  LoraDropout dropout{};
};

/// The adapters of one linear, all of the same rank r.
struct LinearLora {
  static constexpr int kMaxAdapters = 3;  // Llama's fused q|k|v
  std::array<LoraAdapterArgs, kMaxAdapters> adapters{};
  int count = 0;
  float scale = 1;

  bool empty() const { return count == 0; }
  std::span<const LoraAdapterArgs> list() const {
    return {adapters.data(), static_cast<size_t>(count)};
  }
  void add(const LoraAdapterArgs& ad) {
    REMAT_ASSERT(count < kMaxAdapters, "a linear with more than {} LoRA adapters", kMaxAdapters);
    adapters[static_cast<size_t>(count++)] = ad;
  }
  int64_t rank() const { return empty() ? 0 : adapters[0].a.dim(0); }
  /// The width of h: every adapter's r side by side.
  int64_t total_rank() const { return rank() * count; }
  bool any_dropout() const {
    for (const LoraAdapterArgs& ad : list())
      if (ad.dropout.p > 0) return true;
    return false;
  }
  /// The widest adapter's output columns (sizes per-adapter scratch).
  int64_t max_cols() const {
    int64_t n = 0;
    for (const LoraAdapterArgs& ad : list()) n = std::max(n, ad.b.dim(0));
    return n;
  }
};

/// The adapters against their linear's input (N, C) and output (N, OC).
inline void check_lora(const char* op, const LinearLora& l, const Tensor& inp, const Tensor& out,
                       bool backward) {
  const int64_t C = inp.dim(-1), OC = out.dim(-1), r = l.rank();
  for (const LoraAdapterArgs& ad : l.list()) {
    const int64_t n = ad.b.dim(0);
    REMAT_ASSERT(ad.a.ndim() == 2 && ad.b.ndim() == 2 && ad.a.dim(0) == r && ad.a.dim(1) == C &&
                     ad.b.dim(1) == r && ad.a.dtype == DType::F32 && ad.b.dtype == DType::F32,
                 "{}: LoRA A {} and B {} for an input of width {} and rank {}", op,
                 ad.a.shape_str(), ad.b.shape_str(), C, r);
    REMAT_ASSERT(ad.col0 >= 0 && ad.col0 + n <= OC, "{}: LoRA columns [{}, {}) of {}", op, ad.col0,
                 ad.col0 + n, out.shape_str());
    REMAT_ASSERT(ad.dropout.p >= 0 && ad.dropout.p < 1, "{}: LoRA dropout p = {}", op,
                 ad.dropout.p);
    REMAT_ASSERT(!backward || (ad.da.numel() == ad.a.numel() && ad.db.numel() == ad.b.numel()),
                 "{}: LoRA dA {} dB {} for A {} B {}", op, ad.da.shape_str(), ad.db.shape_str(),
                 ad.a.shape_str(), ad.b.shape_str());
  }
}

// The forward's adapter terms: h for every adapter (2 N C r each), its columns' h B^T (2 N r n),
// and each dropout (3 per input element). Bytes: the input read once, each adapter's columns of out
// read and written, A and B, h written and read.
inline OpCost lora_forward_cost(const LinearLora& l, const Tensor& inp) {
  if (l.empty()) return {};
  const double N = static_cast<double>(inp.rows()), C = static_cast<double>(inp.dim(-1)),
               r = static_cast<double>(l.rank()), act = static_cast<double>(dtype_size(inp.dtype));
  OpCost c{0, act * N * C};
  for (const LoraAdapterArgs& ad : l.list()) {
    const double n = static_cast<double>(ad.b.dim(0));
    c.flops += 2.0 * N * C * r + 2.0 * N * r * n + (ad.dropout.p > 0 ? 3.0 * N * C : 0.0);
    c.bytes += act * 2.0 * N * n + act_bytes(ad.a) + act_bytes(ad.b) + 8.0 * N * r;
  }
  return c;
}
// The backward's: the recomputed h (2 N C r), dB (2 N n r), dh (2 N n r), dA (2 N r C), dinp
// (2 N r C), and with dropout its mask twice (the input's, and the input gradient's) and the add.
inline OpCost lora_backward_cost(const LinearLora& l, const Tensor& inp, bool has_dinp) {
  if (l.empty()) return {};
  const double N = static_cast<double>(inp.rows()), C = static_cast<double>(inp.dim(-1)),
               r = static_cast<double>(l.rank()), act = static_cast<double>(dtype_size(inp.dtype));
  OpCost c{0, act * N * C * (has_dinp ? 3.0 : 1.0)};
  for (const LoraAdapterArgs& ad : l.list()) {
    const double n = static_cast<double>(ad.b.dim(0));
    const double drop =
        ad.dropout.p > 0 ? 3.0 * N * C * (has_dinp ? 2.0 : 1.0) + (has_dinp ? N * C : 0.0) : 0.0;
    c.flops += 2.0 * N * C * r * (has_dinp ? 3.0 : 2.0) + 4.0 * N * n * r + drop;
    c.bytes += act * N * n + 2 * act_bytes(ad.a) + 2 * act_bytes(ad.b) + 16.0 * N * r;
  }
  return c;
}

}  // namespace remat
