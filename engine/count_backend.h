// The count backend: computes nothing. Its pool hands out fake addresses, and each op only
// allocates what the target backend's op would allocate (its workspaces) and counts FLOPs and
// bytes (engine/backend.cpp). Running the executor on it is a dry run of a training step: the
// planner's peak-memory and FLOP figures come from exactly the code path a real run takes.
#pragma once

#include <memory>
#include <string>

#include "engine/backend.h"

namespace remat {

/// The device a dry run stands in for.
struct CountTarget {
  std::string device = "cpu";  // "cpu" or "cuda"
  DType act_dtype = DType::F32;
  int threads = 1;  // cpu: OpenMP threads (sizes the per-thread attention workspace)
};

class CountBackend : public Backend {
 public:
  CountBackend(CountTarget target, uint64_t budget_bytes);
  std::string name() const override { return "count"; }
  std::string describe() const override;
  DType act_dtype() const override { return target_.act_dtype; }
  bool computes() const override { return false; }
  bool device_is_host() const override { return target_.device == "cpu"; }
  const CountTarget& target() const { return target_; }

  void upload(const Tensor&, const void*) override {}
  void download(void* host, const Tensor& src) override;

 protected:
  void fill_impl(const Tensor&, float) override {}
  void copy_impl(const Tensor&, const Tensor&) override {}
  void linear_forward_impl(const LinearForwardArgs& a) override;
  void linear_backward_impl(const LinearBackwardArgs& a) override;
  void layernorm_forward_impl(const LayerNormForwardArgs&) override {}
  void layernorm_backward_impl(const LayerNormBackwardArgs&) override {}
  void attention_forward_impl(const AttentionForwardArgs& a) override;
  void attention_backward_impl(const AttentionBackwardArgs& a) override;
  void activation_forward_impl(const ActivationForwardArgs&) override {}
  void activation_backward_impl(const ActivationBackwardArgs&) override {}
  void add_impl(const Tensor&, const Tensor&, const Tensor&) override {}
  void embedding_forward_impl(const EmbeddingForwardArgs&) override {}
  void embedding_backward_impl(const EmbeddingBackwardArgs& a) override;
  void lm_head_loss_impl(const LmHeadLossArgs& a) override;
  void mse_loss_impl(const MseLossArgs&) override {}
  void dropout_impl(const DropoutArgs&) override {}
  double sum_squares_impl(std::span<const Tensor>) override { return 0.0; }
  void adamw_update_impl(const AdamWArgs&) override {}

 private:
  void allocate_attention_workspace(const Tensor& qkv, int n_head, float rope_theta, bool backward);
  /// What a CUDA GEMM op allocates around its GEMMs (nothing on the CPU): see above.
  void allocate_gemm_workspace(int64_t OC, int64_t C, bool needs_weight_copy);
  bool is_cuda() const { return target_.device == "cuda"; }
  CountTarget target_;
};

// ---- the CUDA backend's op workspaces, shared with engine/cuda so that plan and run agree ----

/// The CUDA attention workspace: one pool allocation "attn.workspace" (category workspace) that
/// engine/cuda/cuda_backend.cpp carves into these parts, each rounded to MemoryPool::kAlignment.
/// cuDNN's fused flash attention takes bf16 q/k/v only and RoPE must rotate q and k before it,
/// hence the bf16 staging copies; its backward needs an fp32 dQ accumulator and the per-row
/// sum(dO * O). The last part is cuDNN's own plan workspace, a fixed reserve (see below).
struct CudaAttentionWorkspace {
  uint64_t qkv_bf16 = 0;     // (B, T, 3C) bf16: q, k rotated (RoPE) and/or cast from f32 acts
  uint64_t out_bf16 = 0;     // (B, T, C) bf16: f32 activations only
  uint64_t dout_bf16 = 0;    // (B, T, C) bf16: backward, f32 activations only
  uint64_t dqkv_bf16 = 0;    // (B, T, 3C) bf16: backward, f32 activations only
  uint64_t dq_accum = 0;     // (B, NH, T, HS) f32: backward
  uint64_t softmax_sum = 0;  // (B, NH, T) f32: backward
  uint64_t cudnn_plan = 0;   // kCudnnPlanWorkspaceBytes: the plan's own workspace
  uint64_t total() const {
    return qkv_bf16 + out_bf16 + dout_bf16 + dqkv_bf16 + dq_accum + softmax_sum + cudnn_plan;
  }
};

/// cuDNN's plan workspace for the attention graphs, as a fixed reserve. Its real size is known
/// only once a plan is built on a GPU (the count backend has none), and it is tiny for these
/// graphs (llm.c reports ~16 bytes on H100; the dQ accumulator and sum(dO * O) are our own
/// tensors above, not part of it). So the CUDA backend always reserves exactly this much and
/// accepts only engine configs whose plan needs at most this much (engine/cuda/attention.cpp
/// skips the others and names them if none is left): planned and measured peaks then agree to
/// the byte, whatever the plan needs. 32 MiB (the cuBLASLt workspace's size) is orders of
/// magnitude of headroom at a negligible cost next to a GPU's memory; tests/gpu prints the real
/// sizes for the GPT-2 shapes and checks them against it.
constexpr uint64_t kCudnnPlanWorkspaceBytes = uint64_t{32} << 20;
// The models are inline: engine/cuda compiles the same declaration the count backend uses.
inline CudaAttentionWorkspace cuda_attention_workspace(int64_t B, int64_t T, int64_t C,
                                                       int64_t n_head, DType act_dtype,
                                                       bool use_rope, bool backward) {
  auto bytes = [](int64_t n, size_t elem) {
    return MemoryPool::accounted_bytes(static_cast<size_t>(n) * elem);
  };
  const bool f32_acts = act_dtype == DType::F32;
  CudaAttentionWorkspace w;
  if (use_rope || f32_acts) w.qkv_bf16 = bytes(B * T * 3 * C, 2);
  if (f32_acts) w.out_bf16 = bytes(B * T * C, 2);
  if (backward) {
    if (f32_acts) {
      w.dout_bf16 = bytes(B * T * C, 2);
      w.dqkv_bf16 = bytes(B * T * 3 * C, 2);
    }
    w.dq_accum = bytes(B * T * C, 4);
    w.softmax_sum = bytes(B * n_head * T, 4);
  }
  w.cudnn_plan = kCudnnPlanWorkspaceBytes;
  return w;
}
inline uint64_t cuda_attention_workspace_bytes(int64_t B, int64_t T, int64_t C, int64_t n_head,
                                               DType act_dtype, bool use_rope, bool backward) {
  return cuda_attention_workspace(B, T, C, n_head, act_dtype, use_rope, backward).total();
}

/// cuBLASLt workspace, allocated through the pool around every GEMM-based op (32 MiB: the size
/// cuBLAS documents for Hopper; "gemm.workspace").
constexpr uint64_t kCudaGemmWorkspaceBytes = uint64_t{32} << 20;
/// bf16 copy of an (OC, C) f32 weight made for the duration of one op when activations are bf16
/// ("<op>.weight_bf16"); 0 with f32 activations.
inline uint64_t cuda_weight_copy_bytes(int64_t OC, int64_t C, DType act_dtype) {
  return act_dtype == DType::BF16 ? MemoryPool::accounted_bytes(static_cast<size_t>(OC * C) * 2)
                                  : 0;
}
/// Embedding backward: tokens bucketed by id (positions (N) i32 + bucket starts (N+1) i32), so
/// the scatter-add is deterministic without atomics ("embedding.buckets").
inline uint64_t cuda_embedding_backward_workspace_bytes(int64_t N) {
  return MemoryPool::accounted_bytes(static_cast<size_t>(2 * N + 1) * 4);
}

}  // namespace remat
