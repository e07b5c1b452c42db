// What the executor and the trainer need of a model, independent of its layers: named
// parameters, a stem (inputs -> residual stream), a list of checkpointable blocks, and a head
// (residual stream -> loss and its gradient). layers/ implements these; engine/ never includes
// layers/.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/config/act_kind.h"
#include "engine/core/backend.h"
#include "engine/core/memory_pool.h"

namespace remat {

/// Where the AdamW moments of the parameters live: the device pool, the host pool
/// (remat.offload = "checkpoints+optimizer"), or spread over the ranks (parallel.shard_optimizer:
/// engine/parallel/sharded_adamw.h holds this rank's share, and Param::m, v stay empty).
enum class MomentHome : uint8_t { Device, Host, Sharded };

/// One trainable tensor with its gradient and AdamW moments (all f32, all from the pool).
/// With remat.offload = "checkpoints+optimizer+weights" all four live in the host pool
/// (`on_host`): the step's WeightStream (engine/remat/weight_stream.h) swaps device copies into
/// `value` and `grad` while a block that reads them runs, and swaps the host ones back after, so
/// the ops read `value` and `grad` as always, and everything outside a step (checkpoints, AdamW,
/// export) sees the host copies.
///
/// A frozen parameter (LoRA's base, docs/lora.md) is a value and nothing else: `grad`, `m` and `v`
/// stay empty, so the ops skip its weight gradient (an empty dweight), and the trainer's loops,
/// the gradient sums of several ranks, ZeRO-1's buckets, the weight stream and checkpoints pass it
/// by (they iterate over trainable() parameters). Its value lives in the device pool whatever
/// remat.offload says (it is read by every step and never updated). Under lora.base = "bf16" or
/// "nf4" its value has that dtype (the blocks' linears) or bf16 (the token table and the LM head),
/// and the ops decode it per GEMM into their workspace (engine/core/cpu_workspace.h,
/// "gemm.weight_f32"; engine/core/cuda_workspace.h, "gemm.weight_bf16") or, the embedding, per
/// row looked up.
struct Param {
  std::string name;              // "blocks.3.attn.qkv.weight": the name used in checkpoint files
  Buffer value;                  // category weights
  Buffer grad;                   // category grads; empty when frozen
  Buffer m, v;                   // category optimizer; empty when the moments are sharded or frozen
  bool moments_on_host = false;  // m and v live in the host pool (remat.offload)
  bool on_host = false;          // value and grad too (and the moments): AdamW on the host
  bool use_decay = false;        // 2-D weights only
  bool frozen = false;           // no gradient, no moments: never updated
  bool trainable() const { return !frozen; }
};

/// A batch on the device. GPT: inputs and targets are (B, T) i32 tokens. MLP: (B, D) f32.
/// A target that is not trained (a loss mask's 0, the step from one document into the next,
/// padding) is kIgnoredTarget (engine/core/ops/loss.h).
struct Batch {
  Buffer inputs;
  Buffer targets;
  int64_t n_tokens = 0;     // what tokens/s counts (B*T for GPT, B for the MLP)
  double making_flops = 0;  // FLOPs spent making it (the synthetic regression's teacher GEMM)
  // Documents (data.attention = "document"): per token, the position in its row of its document's
  // first token (global positions under context parallel; engine/core/ops/attention.h). Empty:
  // causal attention over the whole row.
  Buffer doc_start{};  // (B, T) i32
  // This rank's targets that are trained; -1: every target (nothing is masked).
  int64_t trained_targets = -1;
  // The mean loss's divisor: the trained targets of the whole optimizer step, over every
  // micro-batch and every rank (the trainer sets it), so that the gradients added up over the
  // micro-batches and summed over the ranks are those of the step's mean loss. 0: this batch's
  // rows on every rank (Model::loss_rows_all_ranks), as for a step of one micro-batch with every
  // target trained.
  int64_t step_targets = 0;
};

/// The saved activations of one block, by slot (the block's act_names() order; slot 0 is "x",
/// the block input). The executor decides what stays; blocks only fill missing slots.
class ActStore {
 public:
  ActStore() = default;
  ActStore(std::string prefix, size_t n_slots, std::vector<MemCategory> categories);
  bool has(size_t slot) const { return !slots_[slot].empty(); }
  bool complete() const;
  const Tensor& get(size_t slot) const;
  /// Allocates slot `slot` if it is empty and returns its tensor; an existing tensor is returned
  /// as is (recomputation then rewrites it with the same bits).
  const Tensor& make(Backend& be, size_t slot, const std::vector<int64_t>& shape, DType dtype,
                     const std::vector<std::string>& names);
  void put(size_t slot, Buffer b) { slots_[slot] = std::move(b); }
  Buffer take(size_t slot) { return std::move(slots_[slot]); }
  /// Frees a slot the rest of the block's backward no longer reads.
  void release(size_t slot) { slots_[slot].reset(); }
  void keep_only(const std::vector<bool>& keep);
  void clear();
  /// The executor's hook for the moment a block's backward is past its largest working set
  /// (offload then starts bringing back the next checkpoint, so that it does not add to the
  /// peak). A block calls peak_passed() there; the executor calls it again when the backward
  /// returns, which runs the hook only if the block did not.
  void on_peak_passed(std::function<void()> hook) { peak_hook_ = std::move(hook); }
  void peak_passed() {
    if (peak_hook_) std::exchange(peak_hook_, nullptr)();
  }

 private:
  std::function<void()> peak_hook_;
  std::string prefix_;
  std::vector<Buffer> slots_;
  std::vector<MemCategory> categories_;
};

/// One saved activation of a block: its slot (the index into the block's ActStore), its name
/// (stable: configs and plans use it) and its kind. Each block lists its slots in ONE table, in
/// slot order, and derives its act_names() and act_kinds() from it (slot_names, slot_kinds).
template <class Slot>
struct SlotInfo {
  Slot slot;
  const char* name;
  ActKind kind;
};

/// True when `table` lists slots 0, 1, 2, ... in order (for a static_assert next to the table).
template <class Slot, size_t N>
constexpr bool slots_in_order(const SlotInfo<Slot> (&table)[N]) {
  for (size_t i = 0; i < N; ++i)
    if (static_cast<size_t>(table[i].slot) != i) return false;
  return true;
}
/// The names and kinds of a slot table, built once: what act_names() and act_kinds() return.
template <const auto& kTable>
const std::vector<std::string>& slot_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& s : kTable) out.emplace_back(s.name);
    return out;
  }();
  return names;
}
template <const auto& kTable>
const std::vector<ActKind>& slot_kinds() {
  static const std::vector<ActKind> kinds = [] {
    std::vector<ActKind> out;
    for (const auto& s : kTable) out.push_back(s.kind);
    return out;
  }();
  return kinds;
}

/// A checkpointable unit. Forward computes every activation missing from the store (so a
/// recompute reuses whatever was saved); backward needs them all.
class Block {
 public:
  virtual ~Block() = default;
  /// Activation names in computation order; [0] is "x". Stable: configs and plans use them.
  virtual const std::vector<std::string>& act_names() const = 0;
  /// The kind of each activation, same order as act_names().
  virtual const std::vector<ActKind>& act_kinds() const = 0;
  /// Fills every missing slot of `acts` (slot 0 must be present); writes the block output to
  /// `y` unless `y` is empty.
  virtual void forward(Backend& be, ActStore& acts, const Tensor& y) = 0;
  /// `dresid` holds dL/dy on entry and dL/dx on return (the residual-stream gradient, updated
  /// in place); parameter gradients accumulate. A model's first block may skip dL/dx where its
  /// stem_backward reads none (the MLP's, whose input is the data).
  virtual void backward(Backend& be, ActStore& acts, const Tensor& dresid) = 0;
  /// Called before each step's forward pass: random streams (dropout) derive from the step,
  /// so a recompute inside the same step reproduces them. Blocks without randomness ignore it.
  virtual void begin_step(int64_t step) {}
  /// Training mode (default) or evaluation (dropout off).
  virtual void set_training(bool training) {}
};

class Model {
 public:
  virtual ~Model() = default;
  virtual std::string describe() const = 0;
  std::vector<Param>& params() { return params_; }
  int64_t n_params() const;
  /// Elements of the parameters that train (all of them unless some are frozen: LoRA).
  int64_t n_trainable_params() const;
  /// The parameters each part of a step reads, for fetching them ahead when they live on the
  /// host: the stem (its forward reads their values; its backward writes their gradients), the
  /// head (values and gradients), and block i (every parameter named "blocks.<i>."). A tied
  /// embedding is in both the stem's and the head's list.
  const std::vector<Param*>& stem_params() const { return stem_params_; }
  const std::vector<Param*>& head_params() const { return head_params_; }
  std::vector<Param*> block_params(size_t i);
  size_t n_blocks() const { return blocks_.size(); }
  Block& block(size_t i) { return *blocks_[i]; }
  /// Shape of the residual stream, e.g. (B, T, C).
  virtual std::vector<int64_t> stream_shape() const = 0;
  /// Inputs -> block 0's input, allocated with `category` under the name "blocks.0.x".
  virtual Buffer stem_forward(Backend& be, const Batch& batch, MemCategory category) = 0;
  virtual void stem_backward(Backend& be, const Batch& batch, const Tensor& dx) = 0;
  /// Final stream -> per-row losses (N) f32 and dL/dx (written into dx) in one pass; with
  /// `predictions` (N) i32 given (evaluation; empty otherwise), each row's greedy prediction too
  /// (the LM head's argmax; models without one refuse it).
  virtual void head_forward_backward(Backend& be, const Tensor& x, const Batch& batch,
                                     const Tensor& losses, const Tensor& dx,
                                     const Tensor& predictions) = 0;
  /// Rows of the loss (B*T for the GPT, B for the MLP) on this rank.
  virtual int64_t loss_rows() const = 0;
  /// The same over every rank of the job: the divisor of one batch's mean loss.
  virtual int64_t loss_rows_all_ranks() const = 0;
  void begin_step(int64_t step) {
    for (auto& b : blocks_) b->begin_step(step);
  }
  void set_training(bool training) {
    for (auto& b : blocks_) b->set_training(training);
  }

 protected:
  std::vector<Param> params_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<Param*> stem_params_, head_params_;  // set by each model's constructor
};

}  // namespace remat
