// Rematerialization as data. A policy resolves to a RematPlan: per block, which activations
// stay alive after the forward pass, and which blocks form a checkpoint segment. The executor
// reads the plan; no layer ever asks which policy is active.
//
// Forward: each block computes all of its activations and keeps those the plan says (a segment
// keeps its input "x" as the checkpoint). Backward, segment by segment from the last: the
// segment's forward re-runs from its checkpoint, filling only what is missing (saved tensors
// are reused), then each block's backward runs and everything of that block is freed.
//
// Offload (remat.offload): a checkpoint is copied to the host pool after its block's forward
// and its device copy freed once that copy is done -- waited for after the NEXT block's forward
// has been enqueued, so on CUDA the copy overlaps it. In the backward, each segment's checkpoint
// must be on the device before the segment starts; the previous segment's starts coming back
// once the segment's first backward block is past its peak (ActStore::peak_passed: for the GPT
// block, after attention's backward), overlapping the rest of that backward without adding to
// the peak. These are executor rules, so the planner's dry run accounts them exactly.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/model.h"

namespace remat {

struct BlockPlan {
  std::vector<bool> keep;     // per activation slot of the block
  bool checkpointed = false;  // recomputed in the backward pass (some slot not kept)
};

struct Segment {
  size_t begin = 0, end = 0;  // blocks [begin, end)
};

struct RematPlan {
  std::string policy;
  int64_t every = 1;
  std::vector<BlockPlan> blocks;
  std::vector<Segment> segments;
  bool offload_checkpoints = false;  // remat.offload: checkpoints live in the host pool
  std::string describe() const;
};

/// Resolves the [remat] section of `cfg` for `model`. Throws ConfigError (pointing at the key)
/// for activation names the model does not have.
RematPlan resolve_remat_plan(const Config& cfg, Model& model);

/// Keep-set of one block under a named policy ("none", "full", "save_dots", "save_attn",
/// "names" with `save`), not counting the checkpoint input.
std::vector<bool> policy_keep_set(const std::string& policy, const std::vector<std::string>& save,
                                  const Block& block);

struct StepLoss {
  double mean = 0;                   // mean loss over the trained rows (all rows without a mask)
  int64_t counted = 0;               // the rows the mean is over (Batch::trained_targets)
  std::vector<float> row_losses;     // per row (B*T for the GPT; 0 where untrained), for metrics
  std::vector<int32_t> predictions;  // forward_loss with predictions: each row's argmax
};

/// Called with block i once block i's backward is done: its parameters' gradients are final
/// (data parallel starts summing them over the ranks then; engine/parallel/grad_reducer.h).
using BlockGradsReady = std::function<void(size_t block)>;

/// Called with a host parameter (remat.offload with weights) before its weights are copied to
/// the device: the previous step's AdamW may still be updating them on a host thread.
using ParamReady = std::function<void(const Param&)>;

/// Runs one forward + backward of `model` under `plan` on `be`. Parameter gradients accumulate
/// into the model's grad buffers (the caller zeroes them), except for parameters in host memory
/// (Param::on_host): their gradients are made zero on the device and copied OVER the host ones
/// after their last use (engine/remat/weight_stream.h), so a step leaves that step's gradients
/// only. `grads_ready`'s "final" then means enqueued on the device (that offload runs on one rank).
StepLoss forward_backward(Backend& be, Model& model, const RematPlan& plan, const Batch& batch,
                          const BlockGradsReady& grads_ready = {},
                          const ParamReady& param_ready = {});

/// The loss of `batch` with no backward pass (evaluation): each block's activations are freed as
/// soon as its output exists, so this never needs more memory than a training step. The fused
/// loss head still adds into the LM-head weight's gradient; the caller zeroes gradients before
/// the next step as usual. With `predictions`, the LM head's greedy prediction of every row too
/// (StepLoss::predictions; a buffer of one i32 per row beside the losses). The planner runs this
/// same function for `eval` (engine/planner/planner.h's StepKind).
StepLoss forward_loss(Backend& be, Model& model, const Batch& batch, bool predictions = false);

}  // namespace remat
