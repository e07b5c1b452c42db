// Weights and gradients in host memory (remat.offload = "checkpoints+optimizer+weights"): the
// ZeRO-Offload idea on one device. Every parameter's fp32 value, gradient and AdamW moments live
// in the host pool (Param::on_host); the device holds the weights of the part of the step it is
// running and of the next one only, and each part's gradients while it adds into them.
//
// The step is a list of parameter uses, in the order the executor runs them (step_uses): the
// stem's forward, each block's forward, the head (loss and its gradient), each recomputed block,
// each block's backward, the stem's backward. The rules, which the planner's dry run follows to
// the byte because it runs this same code:
//   * before use k: its weights are on the device (fetched ahead at use k - 1), the weights no
//     longer used are freed, and the weights of use k + 1 start coming on the copy queue, so a
//     fetch overlaps the compute before it: at most two uses' weights on the device at a time;
//   * a gradient is made on the device, zeroed, at its parameter's first use that adds into it
//     and copied to the host after its last one (a tied embedding: from the head to the stem's
//     backward); the copy overlaps the next use, after which the device copy is freed.
// Weights and gradients travel in fp32, as they are stored: the device computes with the same
// bits as without this offload (the ops cast to bf16 where they always did). The update then runs
// on the host's cores with the CPU backend's code: on the CPU a run with this offload is bitwise
// the run without it; on CUDA it matches to the rounding of the host's AdamW against the
// device kernel's. The cost is twice bf16's copy volume, which the planner times at the target's
// link rate. Every trainable parameter of the model must appear in some use (checked); frozen
// ones (LoRA's base: engine/model.h) are read where they are, on the device.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <vector>

#include "engine/core/backend.h"
#include "engine/model.h"
#include "engine/remat/executor.h"

namespace remat {

/// One part of a step and the parameters it touches.
struct ParamUse {
  std::vector<Param*> params;
  bool values = true;  // its ops read the weights
  bool grads = false;  // its ops add into the gradients
};

/// The uses of one training step of `model` under `plan`, in forward_backward's order: the stem,
/// blocks 0..L-1, the head, then per segment from the last its recomputed blocks in order and
/// its blocks' backwards in reverse, then the stem's backward (gradients only). Each lists the
/// trainable parameters only: a frozen one stays on the device.
std::vector<ParamUse> step_uses(Model& model, const RematPlan& plan);
/// The uses of forward_loss: the stem, every block, the head.
std::vector<ParamUse> eval_uses(Model& model);
/// Whether block j of `plan` is recomputed in the backward (some slot past its input not kept).
bool block_recomputes(const RematPlan& plan, size_t j);

class WeightStream {
 public:
  /// `uses`: every use of the step, in order (every parameter must be on_host). `keep_grads`:
  /// copy each gradient to the host after its last use (a training step), or drop it
  /// (evaluation, whose fused loss head still adds into the LM head's gradient).
  /// `ready`: called with each parameter before its host weights are read (ParamReady).
  WeightStream(Backend& be, std::vector<ParamUse> uses, bool keep_grads,
               std::function<void(const Param&)> ready = {});
  /// Orders every copy in flight before the device buffers are freed, and puts every host
  /// buffer back into its Param (also while an error unwinds).
  ~WeightStream();
  WeightStream(const WeightStream&) = delete;
  WeightStream& operator=(const WeightStream&) = delete;

  /// Before use k (k = 0, 1, ... in order) runs: the rules above.
  void begin(size_t k);
  /// After use k's ops are enqueued.
  void end(size_t k);
  /// After the last use: every copy retired, every Param holding its host buffers again.
  void finish();
  size_t size() const { return uses_.size(); }
  /// How many distinct parameters the uses name.
  size_t params() const { return states_.size(); }

 private:
  struct State {
    Buffer host_value, host_grad;  // parked here while a device copy is in the Param
    CopyTicket fetch{};            // the value on its way to the device
    CopyTicket grad_out{};         // the gradient on its way to the host
    size_t last_grad_use = 0;
  };
  State& state(Param* p) { return states_.at(p); }
  void fetch(Param* p);
  void wait_fetch(Param* p);
  void drop_value(Param* p);
  void make_grad(Param* p);
  void retire_grads();
  void restore(Param* p) noexcept;

  Backend& be_;
  std::vector<ParamUse> uses_;
  bool keep_grads_;
  std::function<void(const Param&)> ready_;
  std::map<Param*, State> states_;
  std::vector<Param*> on_device_;  // parameters whose value is a device copy now
  std::vector<Param*> going_out_;  // gradients copying to the host, retired at the next end()
  size_t next_ = 0;                // the use begin() expects
};

}  // namespace remat
