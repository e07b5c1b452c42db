// The losses: the fused, chunked LM head + softmax cross-entropy of the GPT and the MSE of the
// tutorial MLP: arguments, shape checks, FLOPs and bytes. Kernels: engine/cpu/loss.cpp,
// engine/cuda/loss.cpp (+ elementwise.cu); workspaces: engine/{cpu,cuda}/workspace.h; tests:
// tests/ops/test_loss.cpp.
#pragma once

#include "engine/core/error.h"
#include "engine/core/ops/op.h"
#include "engine/core/tensor.h"

namespace remat {

/// A target that is not trained (a loss mask's 0, a document's last input, padding): its row's
/// loss is 0 and it adds nothing to any gradient. llm.c marks such targets the same way.
inline constexpr int32_t kIgnoredTarget = -1;

/// Fused, chunked LM head + softmax cross-entropy: for chunks of `chunk_rows` rows it forms the
/// logits inp W^T, the loss and the gradients, so no (N, V) tensor ever exists. Runs in the
/// forward pass; the gradients are scaled by loss_scale (1 / the trained targets of the step, for
/// a mean loss). Rows whose target is kIgnoredTarget get loss 0 and zero gradients.
struct LmHeadLossArgs {
  Tensor losses;   // (N) f32 [=] per-row loss (unscaled)
  Tensor dinp;     // (N, C) act [=]
  Tensor dweight;  // (V, C) f32 [+=], optional (empty: a frozen head, no weight-gradient GEMM)
  Tensor inp;      // (N, C) act: the final hidden states
  Tensor weight;   // (V, C) f32, or bf16 when frozen (lora.base): the (tied) output embedding
  Tensor targets;  // (N) i32, in [0, V) or kIgnoredTarget
  float loss_scale = 1.0f;
  int64_t chunk_rows = 0;  // rows per chunk; <= 0 means all rows at once
  // (N) i32 [=]: each row's greedy prediction, the first index of its largest logit (what
  // argmax-decoding picks); empty: not computed. Evaluation asks for it (eval --passkey).
  Tensor argmax{};
};

/// Mean-squared error for the tutorial MLP: loss_row = sum_j (inp - target)^2 / D.
struct MseLossArgs {
  Tensor losses;  // (N) f32 [=]
  Tensor dinp;    // (N, D) act [=]
  Tensor inp;     // (N, D) act
  Tensor target;  // (N, D) f32
  float loss_scale = 1.0f;
};

inline void check(const LmHeadLossArgs& a) {
  REMAT_ASSERT(a.weight.dtype == DType::F32 || a.weight.dtype == DType::BF16,
               "lm_head_loss: a {} head (f32 or bf16)", dtype_name(a.weight.dtype));
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), V = a.weight.dim(0);
  REMAT_ASSERT(a.weight.dim(1) == C && (a.dweight.empty() || a.dweight.numel() == V * C),
               "lm_head_loss: weight {} dweight {} inp {}", a.weight.shape_str(),
               a.dweight.shape_str(), a.inp.shape_str());
  REMAT_ASSERT(a.targets.numel() == N && a.losses.numel() == N && a.dinp.numel() == N * C,
               "lm_head_loss: targets {} losses {} dinp {} for N={}", a.targets.shape_str(),
               a.losses.shape_str(), a.dinp.shape_str(), N);
  REMAT_ASSERT(a.argmax.empty() || (a.argmax.dtype == DType::I32 && a.argmax.numel() == N),
               "lm_head_loss: argmax {} for N={}", a.argmax.shape_str(), N);
}
// logits (2NCV), d inp (2NCV), d weight (2NCV, not for a frozen head), softmax (~5NV)
inline OpCost cost(const LmHeadLossArgs& a) {
  const double N = static_cast<double>(a.inp.rows()), C = static_cast<double>(a.inp.dim(-1)),
               V = static_cast<double>(a.weight.dim(0));
  OpCost c{6.0 * N * C * V + 5.0 * N * V,
           act_bytes(a.inp) * 2 + act_bytes(a.weight) * 3 + 8.0 * N * V};
  if (a.dweight.empty()) {
    c.flops -= 2.0 * N * C * V;
    c.skipped_flops = 2.0 * N * C * V;
    c.bytes -= act_bytes(a.weight) * 2;
  }
  return c;
}

inline void check(const MseLossArgs& a) {
  REMAT_ASSERT(a.inp.numel() == a.target.numel() && a.dinp.numel() == a.inp.numel() &&
                   a.losses.numel() == a.inp.rows(),
               "mse_loss: inp {} target {} dinp {} losses {}", a.inp.shape_str(),
               a.target.shape_str(), a.dinp.shape_str(), a.losses.shape_str());
}
inline OpCost cost(const MseLossArgs& a) {
  return {4.0 * static_cast<double>(a.inp.numel()), 3 * act_bytes(a.inp)};
}

}  // namespace remat
