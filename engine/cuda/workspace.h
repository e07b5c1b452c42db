// The CUDA backend's op workspaces (see engine/workspace.h): pure functions of an op's
// arguments, no device code, so the planner evaluates them on any machine (the count backend
// allocates these lists when it stands in for a GPU). Activation tensors carry the activation
// dtype, so bf16-vs-f32 decisions read the arguments' dtypes.
#pragma once

#include "engine/ops/attention.h"
#include "engine/ops/embedding.h"
#include "engine/ops/linear.h"
#include "engine/ops/loss.h"
#include "engine/workspace.h"

namespace remat::cuda {

/// cuBLASLt workspace, held around every GEMM-based op (32 MiB: the size cuBLAS documents for
/// Hopper; "gemm.workspace").
constexpr uint64_t kGemmWorkspaceBytes = uint64_t{32} << 20;

/// cuDNN's plan workspace for the attention graphs, as a fixed reserve. Its real size is known
/// only once a plan is built on a GPU (the planner has none), and it is tiny for these graphs
/// (llm.c reports ~16 bytes on H100; the dQ accumulator and sum(dO * O) are our own tensors
/// below, not part of it). So the CUDA backend always reserves exactly this much and accepts
/// only engine configs whose plan needs at most this much (engine/cuda/cudnn_attention.cpp skips
/// the others and names them if none is left): planned and measured peaks then agree to the byte,
/// whatever the plan needs. 32 MiB (the cuBLASLt workspace's size) is orders of magnitude of
/// headroom at a negligible cost next to a GPU's memory; tests/gpu prints the real sizes for the
/// GPT-2 shapes and checks them against it.
constexpr uint64_t kCudnnPlanWorkspaceBytes = uint64_t{32} << 20;

/// The attention workspace: one pool allocation "attn.workspace" that engine/cuda/cuda_backend.cpp
/// carves into these parts, in this order, each rounded to MemoryPool::kAlignment. cuDNN's fused
/// flash attention takes bf16 q/k/v only and RoPE must rotate q and k before it, hence the bf16
/// staging copies; its backward needs an fp32 dQ accumulator and the per-row sum(dO * O). The
/// last part is cuDNN's own plan workspace, the fixed reserve above.
/// W = (NH + 2 KVH) HS is qkv's width, C = NH HS out's (engine/ops/attention.h).
struct AttentionWorkspaceLayout {
  uint64_t qkv_bf16 = 0;     // (B, T, W) bf16: cast from f32 acts, or q, k rotated (RoPE) in
                             // the forward; the bf16 backward rotates qkv itself in place
  uint64_t out_bf16 = 0;     // (B, T, C) bf16: f32 activations only
  uint64_t dout_bf16 = 0;    // (B, T, C) bf16: backward, f32 activations only
  uint64_t dqkv_bf16 = 0;    // (B, T, W) bf16: backward, f32 activations only
  uint64_t dq_accum = 0;     // (B, NH, T, HS) f32: backward
  uint64_t softmax_sum = 0;  // (B, NH, T) f32: backward
  uint64_t cudnn_plan = 0;   // kCudnnPlanWorkspaceBytes: the plan's own workspace
  uint64_t total() const {
    return qkv_bf16 + out_bf16 + dout_bf16 + dqkv_bf16 + dq_accum + softmax_sum + cudnn_plan;
  }
};

inline AttentionWorkspaceLayout attention_workspace_layout(const Tensor& qkv, int n_head,
                                                           int n_kv_head, bool use_rope,
                                                           bool backward) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), W = qkv.dim(2);
  const int64_t C = W / (n_head + 2 * kv_heads(n_head, n_kv_head)) * n_head;
  auto bytes = [](int64_t n, size_t elem) {
    return MemoryPool::accounted_bytes(static_cast<size_t>(n) * elem);
  };
  const bool f32_acts = qkv.dtype == DType::F32;
  AttentionWorkspaceLayout w;
  // The backward is qkv's last reader, so with bf16 activations it rotates qkv in place: at the
  // block's peak that saves W bf16 per token (6 B/token/channel with the rest of the peak ~30).
  if (f32_acts || (use_rope && !backward)) w.qkv_bf16 = bytes(B * T * W, 2);
  if (f32_acts) w.out_bf16 = bytes(B * T * C, 2);
  if (backward) {
    if (f32_acts) {
      w.dout_bf16 = bytes(B * T * C, 2);
      w.dqkv_bf16 = bytes(B * T * W, 2);
    }
    w.dq_accum = bytes(B * T * C, 4);
    w.softmax_sum = bytes(B * n_head * T, 4);
  }
  w.cudnn_plan = kCudnnPlanWorkspaceBytes;
  return w;
}

/// A bf16 GEMM reads a bf16 copy of its f32 weight, made for the duration of the op
/// ("gemm.weight_bf16", (OC, C)); an f32 GEMM reads the weight itself.
inline WorkspaceList gemm_workspace(const Tensor& weight, bool bf16_gemm) {
  WorkspaceList w;
  if (bf16_gemm)
    w.push_back({"gemm.weight_bf16", DType::BF16, {weight.dim(0), weight.numel() / weight.dim(0)}});
  w.push_back({"gemm.workspace", DType::BF16, {static_cast<int64_t>(kGemmWorkspaceBytes / 2)}});
  return w;
}

inline WorkspaceList attention_workspace(const Tensor& qkv, int n_head, int n_kv_head,
                                         float rope_theta, bool backward) {
  const uint64_t bytes =
      attention_workspace_layout(qkv, n_head, n_kv_head, rope_theta > 0, backward).total();
  return {{"attn.workspace", DType::BF16, {static_cast<int64_t>(bytes / 2)}}};
}

// ---- the rules, one per op that has a workspace on any backend ----
inline WorkspaceList workspace(const LinearForwardArgs& a, const WorkspaceTarget&) {
  return gemm_workspace(a.weight, a.inp.dtype == DType::BF16);
}
inline WorkspaceList workspace(const LinearBackwardArgs& a, const WorkspaceTarget&) {
  // Only dinp = dout W reads the weight in bf16; dW accumulates in f32 from bf16 operands.
  return gemm_workspace(a.weight, a.dout.dtype == DType::BF16 && !a.dinp.empty());
}
inline WorkspaceList workspace(const AttentionForwardArgs& a, const WorkspaceTarget&) {
  return attention_workspace(a.qkv, a.n_head, a.n_kv_head, a.rope_theta, false);
}
inline WorkspaceList workspace(const AttentionBackwardArgs& a, const WorkspaceTarget&) {
  return attention_workspace(a.qkv, a.n_head, a.n_kv_head, a.rope_theta, true);
}
/// Tokens bucketed by id (positions (N) i32 + bucket starts (N+1) i32), so the scatter-add is
/// deterministic without atomics ("embedding.buckets").
inline WorkspaceList workspace(const EmbeddingBackwardArgs& a, const WorkspaceTarget&) {
  return {{"embedding.buckets", DType::I32, {2 * a.tokens.numel() + 1}}};
}
/// The tied weight's bf16 copy and the GEMM workspace, then the logits chunk.
inline WorkspaceList workspace(const LmHeadLossArgs& a, const WorkspaceTarget&) {
  WorkspaceList w = gemm_workspace(a.weight, a.inp.dtype == DType::BF16);
  w.push_back(logits_chunk_part(a));
  return w;
}

}  // namespace remat::cuda
