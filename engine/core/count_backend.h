// The count backend: computes nothing. Its pool hands out fake addresses; each op allocates the
// workspace the target backend's rule lists for it (engine/core/workspace.h: the same rule the real
// backend allocates from, so there is no copy to keep in step) and counts FLOPs and bytes
// (engine/core/backend.cpp). Running the executor on it is a dry run of a training step: the
// planner's peak-memory and FLOP figures come from exactly the code path a real run takes.
#pragma once

#include <memory>
#include <string>

#include "engine/core/backend.h"

namespace remat {

/// The device a dry run stands in for.
struct CountTarget {
  DeviceKind device = DeviceKind::Cpu;
  DType act_dtype = DType::F32;
  int threads = 1;           // cpu: OpenMP threads (sizes the per-thread attention workspace)
  bool replay_tiles = true;  // Backend::for_each_row_tile; off: every tile runs (a test)
};

class CountBackend : public Backend {
 public:
  CountBackend(CountTarget target, uint64_t budget_bytes);
  std::string name() const override { return "count"; }
  std::string describe() const override;
  DType act_dtype() const override { return target_.act_dtype; }
  bool computes() const override { return false; }
  bool replays_row_tiles() const override { return target_.replay_tiles; }
  WorkspaceTarget workspace_target() const override { return {target_.device, target_.threads}; }
  bool device_is_host() const override { return target_.device == DeviceKind::Cpu; }
  const CountTarget& target() const { return target_; }
  bool attention_backward_needs_out() const override { return target_.device == DeviceKind::Cuda; }

  void upload(const Tensor&, const void*) override {}
  void download(void* host, const Tensor& src) override;

 protected:
  void copy_to_host_impl(const Tensor&, const Tensor&, CopyTicket) override {}
  void copy_to_device_impl(const Tensor&, const Tensor&, CopyTicket) override {}
  void fill_host_impl(const Tensor&, float) override {}
  void fill_impl(const Tensor&, float) override {}
  void copy_impl(const Tensor&, const Tensor&) override {}
  void linear_forward_impl(const LinearForwardArgs&, const OpWorkspace&) override {}
  void linear_backward_impl(const LinearBackwardArgs&, const OpWorkspace&) override {}
  void layernorm_forward_impl(const LayerNormForwardArgs&) override {}
  void layernorm_backward_impl(const LayerNormBackwardArgs&) override {}
  void rmsnorm_forward_impl(const RmsNormForwardArgs&) override {}
  void rmsnorm_backward_impl(const RmsNormBackwardArgs&) override {}
  void qk_norm_forward_impl(const QkNormForwardArgs&) override {}
  void qk_norm_backward_impl(const QkNormBackwardArgs&) override {}
  void attention_forward_impl(const AttentionForwardArgs&, const OpWorkspace&) override {}
  void attention_backward_impl(const AttentionBackwardArgs&, const OpWorkspace&) override {}
  void attention_delta_impl(const AttentionDeltaArgs&) override {}
  void activation_forward_impl(const ActivationForwardArgs&) override {}
  void activation_backward_impl(const ActivationBackwardArgs&) override {}
  void swiglu_forward_impl(const SwiGluForwardArgs&) override {}
  void swiglu_backward_impl(const SwiGluBackwardArgs&) override {}
  void add_impl(const Tensor&, const Tensor&, const Tensor&) override {}
  void embedding_forward_impl(const EmbeddingForwardArgs&) override {}
  void embedding_backward_impl(const EmbeddingBackwardArgs&, const OpWorkspace&) override {}
  void lm_head_loss_impl(const LmHeadLossArgs&, const OpWorkspace&) override {}
  void mse_loss_impl(const MseLossArgs&) override {}
  void ring_split_impl(const RingSplitArgs&) override {}
  void ring_merge_grad_impl(const RingMergeGradArgs&) override {}
  void ring_block_forward_impl(const RingBlockForwardArgs&) override {}
  void ring_finish_impl(const RingFinishArgs&) override {}
  void ring_block_backward_impl(const RingBlockBackwardArgs&) override {}
  void dropout_impl(const DropoutArgs&) override {}
  double sum_squares_impl(std::span<const Tensor>) override { return 0.0; }
  void adamw_update_impl(const AdamWArgs&) override {}

 private:
  CountTarget target_;
};

}  // namespace remat
