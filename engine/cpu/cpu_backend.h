// The CPU backend: fp32 everywhere, the reference every other backend is checked against.
// GEMMs go to OpenBLAS (its OpenMP build, so BLAS and our kernels share one thread pool);
// everything else is OpenMP loops that the compiler vectorizes (-march=x86-64-v3).
// Deterministic: every reduction has a fixed order that does not depend on scheduling, so a
// recomputed tensor is bitwise equal to the original (what remat equivalence relies on).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "engine/core/backend.h"
#include "engine/core/cpu_workspace.h"

namespace remat::cpu {

/// BLAS build and the kernel it dispatches to on this CPU.
struct BlasInfo {
  std::string library;    // "OpenBLAS 0.3.21"
  std::string core;       // the kernel in use: "Haswell", "Zen", "SkylakeX", ...
  std::string chosen_by;  // who chose it (engine/cpu/blas_kernel.h)
  std::string warning;    // non-empty when the kernel is below what this CPU supports
  std::string gemm;       // the library the GEMMs' tiles run on: "oneDNN 2.6.3" or "OpenBLAS"
  std::string gemm_chosen_by;
  std::string gemm_warning;  // non-empty when oneDNN runs below what this CPU supports
};
BlasInfo blas_info();

/// Elementwise loops of the CPU kernels split rows across threads with a static schedule; 0.5 MiB
/// per chunk keeps tiny tensors on one thread.
constexpr int64_t kGrain = 1 << 17;

/// Threads a CpuBackend uses when device.threads = 0 (OpenMP's default: all cores).
int default_threads();

/// A weight as the GEMMs read it, f32: itself, or (a frozen LoRA base stored as bf16 or NF4,
/// lora.base) its decoded copy in the op's workspace ("gemm.weight_f32",
/// engine/core/cpu_workspace.h).
const float* f32_weight(const Tensor& weight, const OpWorkspace& ws);

/// What a LoRA adapter adds to a finished tile of a base GEMM's output, rows [row0, row0 + m) and
/// columns [col0, col0 + n) (engine/cpu/lora.cpp); returns the tile product's status (0: done).
using LoraTileAdd = std::function<int(int64_t row0, int64_t col0, int64_t m, int64_t n)>;

/// Host memory, 256-byte aligned, with freed blocks kept for reuse (host_allocator.h).
std::unique_ptr<DeviceAllocator> make_host_allocator();

class CpuBackend : public Backend {
 public:
  /// threads <= 0: all cores (OpenMP's default). The host pool (remat.offload) is a second pool
  /// of plain host memory with its own budget.
  CpuBackend(uint64_t budget_bytes, int threads, uint64_t host_budget_bytes = UINT64_MAX);
  std::string name() const override { return "cpu"; }
  std::string describe() const override;
  std::string describe_brief() const override;
  DType act_dtype() const override { return DType::F32; }
  bool device_is_host() const override { return true; }
  WorkspaceTarget workspace_target() const override { return {DeviceKind::Cpu, threads_}; }
  int threads() const { return threads_; }
  bool attention_backward_needs_out() const override { return false; }

  void upload(const Tensor& dst, const void* host) override;
  void download(void* host, const Tensor& src) override;

 protected:
  void fill_impl(const Tensor& t, float value) override;
  void copy_impl(const Tensor& dst, const Tensor& src) override;
  void linear_forward_impl(const LinearForwardArgs& a, const OpWorkspace& ws) override;
  void linear_backward_impl(const LinearBackwardArgs& a, const OpWorkspace& ws) override;
  void layernorm_forward_impl(const LayerNormForwardArgs& a) override;
  void layernorm_backward_impl(const LayerNormBackwardArgs& a) override;
  void rmsnorm_forward_impl(const RmsNormForwardArgs& a) override;
  void rmsnorm_backward_impl(const RmsNormBackwardArgs& a) override;
  void qk_norm_forward_impl(const QkNormForwardArgs& a) override;
  void qk_norm_backward_impl(const QkNormBackwardArgs& a) override;
  void attention_forward_impl(const AttentionForwardArgs& a, const OpWorkspace& ws) override;
  void attention_backward_impl(const AttentionBackwardArgs& a, const OpWorkspace& ws) override;
  void attention_delta_impl(const AttentionDeltaArgs& a) override;
  void activation_forward_impl(const ActivationForwardArgs& a) override;
  void activation_backward_impl(const ActivationBackwardArgs& a) override;
  void swiglu_forward_impl(const SwiGluForwardArgs& a) override;
  void swiglu_backward_impl(const SwiGluBackwardArgs& a) override;
  void add_impl(const Tensor& out, const Tensor& a, const Tensor& b) override;
  void embedding_forward_impl(const EmbeddingForwardArgs& a) override;
  void embedding_backward_impl(const EmbeddingBackwardArgs& a, const OpWorkspace& ws) override;
  void lm_head_loss_impl(const LmHeadLossArgs& a, const OpWorkspace& ws) override;
  void mse_loss_impl(const MseLossArgs& a) override;
  void ring_split_impl(const RingSplitArgs& a) override;
  void ring_merge_grad_impl(const RingMergeGradArgs& a) override;
  void ring_block_forward_impl(const RingBlockForwardArgs& a) override;
  void ring_finish_impl(const RingFinishArgs& a) override;
  void ring_block_backward_impl(const RingBlockBackwardArgs& a) override;
  void dropout_impl(const DropoutArgs& a) override;
  double sum_squares_impl(std::span<const Tensor> tensors) override;
  void adamw_update_impl(const AdamWArgs& a) override;

 private:
  // Chunked attention (engine/cpu/attention_chunks.cpp): the pairs of engine/core/ops/attention.h's
  // chunk schedule on the ring's kernels.
  void attention_forward_chunked(const AttentionForwardArgs& a, const OpWorkspace& ws,
                                 const AttentionChunks& ch);
  void attention_backward_chunked(const AttentionBackwardArgs& a, const OpWorkspace& ws,
                                  const AttentionChunks& ch);
  // linear_backward's dinp = dout W (+ LoRA's dh A), through act' (linear.cpp).
  void input_gradient(const LinearBackwardArgs& a, const OpWorkspace& ws);
  // A linear's LoRA adapters (engine/cpu/lora.cpp), around linear.cpp's base GEMMs.
  /// The adapter's input as its GEMMs read it: x, or its dropped copy in "lora.dropped".
  const float* lora_dropped_input(const Tensor& inp, const LoraDropout& d, const OpWorkspace& ws);
  /// h = s drop_i(x) A_i^T for every adapter, side by side in "lora.h" (N, R).
  void lora_h(const LinearLora& l, const Tensor& inp, const OpWorkspace& ws);
  /// For the forward GEMM's tiles of out (N, OC): each adapter's h_i B_i^T on its columns.
  LoraTileAdd lora_out_tiles(const LinearLora& l, const OpWorkspace& ws, float* out,
                             int64_t OC) const;
  /// Before the input gradient: h again, dh = s g B into "lora.dh", dB and dA accumulated.
  void lora_parameter_grads(const LinearBackwardArgs& a, const OpWorkspace& ws);
  /// For the dinp GEMM's tiles (N, C), adapters without dropout: dh A.
  LoraTileAdd lora_dinp_tiles(const LinearLora& l, const OpWorkspace& ws, float* dinp,
                              int64_t C) const;
  /// With dropout, after the dinp GEMM: each adapter's drop'(dh_i A_i) added to dinp.
  void lora_dinp_through_dropout(const LinearBackwardArgs& a, const OpWorkspace& ws);
  int threads_;
};

}  // namespace remat::cpu
