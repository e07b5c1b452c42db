// The backend interface: ~20 coarse, layer-level ops, each taking a struct of named arguments
// declared with its shape checks and cost in engine/core/ops/<op>.h.
// Implementations: engine/cpu (fp32 reference, BLAS + OpenMP), engine/cuda (bf16/fp32),
// engine/core/count_backend (computes nothing: allocates from the pool and counts FLOPs and bytes;
// it is what `plan` runs on). An op's scratch memory is declared once per backend as a pure
// rule (engine/core/workspace.h) that the public op allocates before calling the implementation.
//
// Gradient contract, stated once for every op family:
//   * parameter gradients ACCUMULATE (+=), so micro-batches sum;
//   * activation gradients OVERWRITE (=),
//   * except where a field says "[+=] residual stream": the LayerNorm input gradient adds into
//     the residual-stream gradient that flows through the block.
// Shapes use the letters of layers/layer.h: B batch, T time, C channels, NH heads, HS head
// size, V vocabulary, N = B*T rows, OC output channels. Activations have backend.act_dtype();
// LayerNorm statistics, log-sum-exp, losses and all parameters are f32; tokens are i32.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/memory_pool.h"
#include "engine/core/ops/activation.h"
#include "engine/core/ops/adamw.h"
#include "engine/core/ops/attention.h"
#include "engine/core/ops/embedding.h"
#include "engine/core/ops/layernorm.h"
#include "engine/core/ops/linear.h"
#include "engine/core/ops/lora.h"
#include "engine/core/ops/loss.h"
#include "engine/core/ops/op.h"
#include "engine/core/ops/ring_attention.h"
#include "engine/core/ops/rmsnorm.h"
#include "engine/core/ops/swiglu.h"
#include "engine/core/tensor.h"
#include "engine/core/workspace.h"

namespace remat {

/// A copy between the device and the host pool in flight (Backend::copy_to_host/copy_to_device).
/// Every ticket is waited on once (Backend::wait_copy); 0 is "no copy".
struct CopyTicket {
  uint64_t id = 0;
};

/// What the executor is doing; FLOPs and bytes are counted per phase.
enum class Phase : uint8_t { Forward, Recompute, Backward, Loss, Optimizer, kCount };
constexpr int kNumPhases = static_cast<int>(Phase::kCount);
const char* phase_name(Phase p);

class Backend;
/// The model FLOPs of a step from its FLOPs by phase, as model FLOPs utilization
/// (MFU, the PaLM paper's appendix B) counts them: the forward's three times (a backward does
/// twice a forward's work: each GEMM's input and weight gradients), plus the loss phase's, whose
/// head runs its forward and backward in one op. What a step executes differs by implementation:
/// recompute adds FLOPs, the MLP's first block skips the gradient of its data (one of the 3L
/// GEMMs of an L-layer step), flash attention's backward recomputes the scores (2.5x its forward).
/// None of that changes what the model needs, so a saving is not read as a loss of efficiency, and
/// every remat policy has the same count. A frozen parameter (LoRA's base) is different: its
/// weight gradient is not part of the model's work at all, so the backward's skipped dW FLOPs
/// (OpCost::skipped_flops) are subtracted: a LoRA step's model FLOPs are the forward of the base
/// and the adapters, the backward's input gradients everywhere, the adapters' weight gradients
/// and the loss head's (without dW when the head is frozen). docs/lora.md has the arithmetic.
double model_flops(const std::array<OpCost, kNumPhases>& cost_by_phase);
double model_flops(const Backend& be);  // of its cost() since reset_cost

class Backend {
 public:
  virtual ~Backend() = default;

  /// "cpu", "cuda", "count".
  virtual std::string name() const = 0;
  /// One line for the banner: device, threads, BLAS kernel / GPU name.
  virtual std::string describe() const = 0;
  /// The same without the libraries' and kernels' detail (the CPU's BLAS, GEMM and attention
  /// kernels), for a banner that is not verbose.
  virtual std::string describe_brief() const { return describe(); }
  /// dtype of activations (f32 on the CPU, bf16 or f32 on CUDA).
  virtual DType act_dtype() const = 0;
  /// False for the count backend: its tensors have fake addresses and ops compute nothing.
  virtual bool computes() const { return true; }
  /// Whose op-workspace rules apply (engine/core/workspace.h): this backend's own; the count
  /// backend's are those of the backend it stands in for.
  virtual WorkspaceTarget workspace_target() const = 0;
  /// True when device memory is host memory (the CPU backend, and dry runs for it): host-side
  /// buffers such as checkpoint staging then count against the device budget, through the pool.
  virtual bool device_is_host() const { return false; }
  MemoryPool& pool() { return *pool_; }
  /// Host memory that remat.offload moves tensors to, with its own budget (device.host_memory):
  /// pinned memory on CUDA; on the CPU a second pool in the same RAM (a distinct memory space, so
  /// that the offloading executor and its accounting run and are tested there); fake addresses on
  /// the count backend. The device pool never sees these bytes.
  MemoryPool& host_pool() { return *host_pool_; }
  /// Waits until every queued op has finished (step timing). Synchronous backends: no-op.
  virtual void synchronize() {}

  // ---- data movement ----
  /// Sets every element to `value` (f32 or act tensors; i32 with an integral value).
  void fill(const Tensor& t, float value);
  /// fill(t, 0.0f) of every f32 tensor of `tensors` (a step's gradients), counted and timed as
  /// that many fills under one "fill" row; CUDA zeroes them in a few launches instead of one per
  /// tensor. Nothing when empty.
  void fill_zero(std::span<const Tensor> tensors);
  void copy(const Tensor& dst, const Tensor& src);
  /// Host -> device, raw bytes (dst.bytes() of them).
  virtual void upload(const Tensor& dst, const void* host) = 0;
  /// Device -> host, raw bytes (src.bytes() of them). The count backend writes zeros.
  virtual void download(void* host, const Tensor& src) = 0;
  /// The same without waiting: the bytes are in `host` once the next synchronize() or download()
  /// returns, and `src` may be freed at once (pool frees are ordered after the copy). `host` must
  /// stay valid until then. For a result the host needs only at the end of a step (the losses),
  /// so that reading it does not stall the device mid-step. Default: download().
  virtual void download_async(void* host, const Tensor& src) { download(host, src); }
  /// Drops every download_async not yet completed, so that no later sync writes into a `host`
  /// an error has since freed (the step unwinding). Never throws.
  virtual void discard_downloads() noexcept {}

  // ---- device <-> host pool (remat.offload) ----
  /// Starts copying device tensor `src` into host-pool tensor `dst` (same byte size) on the copy
  /// queue, after every op enqueued so far, and returns the ticket to wait on. CUDA: a second
  /// stream, so the copy overlaps the ops enqueued after it; CPU: done on return.
  CopyTicket copy_to_host(const Tensor& dst, const Tensor& src);
  /// The same from host-pool tensor `src` into device tensor `dst` (a fresh pool allocation).
  CopyTicket copy_to_device(const Tensor& dst, const Tensor& src);
  /// Orders every op enqueued after this call, and every pool free, after the copy: after it, the
  /// copy's destination may be read and its source freed or overwritten. Waits on the host only
  /// where the backend has no queue.
  void wait_copy(CopyTicket t);
  /// Writes `value` into every element of a host-pool f32 tensor (AdamW moments offloaded).
  void fill_host(const Tensor& t, float value);

  // ---- layer ops (see the Args structs for shapes and the += / = contract) ----
  void linear_forward(const LinearForwardArgs& a);
  void linear_backward(const LinearBackwardArgs& a);
  void layernorm_forward(const LayerNormForwardArgs& a);
  void layernorm_backward(const LayerNormBackwardArgs& a);
  void rmsnorm_forward(const RmsNormForwardArgs& a);
  void rmsnorm_backward(const RmsNormBackwardArgs& a);
  void qk_norm_forward(const QkNormForwardArgs& a);
  void qk_norm_backward(const QkNormBackwardArgs& a);
  void attention_forward(const AttentionForwardArgs& a);
  void attention_backward(const AttentionBackwardArgs& a);
  void attention_delta(const AttentionDeltaArgs& a);
  /// Whether attention_backward must be given `out` (cuDNN recomputes D from O itself), or
  /// takes `delta` from attention_delta instead (the CPU), so that O can be freed before it.
  virtual bool attention_backward_needs_out() const = 0;
  void activation_forward(const ActivationForwardArgs& a);
  void activation_backward(const ActivationBackwardArgs& a);
  void swiglu_forward(const SwiGluForwardArgs& a);
  void swiglu_backward(const SwiGluBackwardArgs& a);
  /// out = a + b elementwise (N, C) act. out may alias a or b.
  void add(const Tensor& out, const Tensor& a, const Tensor& b);
  void embedding_forward(const EmbeddingForwardArgs& a);
  void embedding_backward(const EmbeddingBackwardArgs& a);
  void lm_head_loss(const LmHeadLossArgs& a);
  void mse_loss(const MseLossArgs& a);
  // Ring attention's local pieces (context parallel; engine/parallel/context_ring.h runs them).
  void ring_split(const RingSplitArgs& a);
  void ring_merge_grad(const RingMergeGradArgs& a);
  void ring_block_forward(const RingBlockForwardArgs& a);
  void ring_finish(const RingFinishArgs& a);
  void ring_block_backward(const RingBlockBackwardArgs& a);
  /// Counts `bytes` sent to another rank in the current phase (the ring's exchanges, counted the
  /// same in a dry run, which sends nothing).
  void count_ring_bytes(double bytes) { add_cost({.ring_bytes = bytes}); }
  void dropout(const DropoutArgs& a);

  // ---- optimizer ----
  /// Sum of squares of every element of every tensor (f32), in double.
  double sum_squares(std::span<const Tensor> tensors);
  void adamw_update(const AdamWArgs& a);
  /// adamw_update of each of `all`, in order, as that many calls would be checked, counted and
  /// timed (one "adamw_update" row); CUDA updates them in a few launches instead of one per
  /// parameter. The tensors of different updates must not overlap. Nothing when empty.
  void adamw_update(std::span<const AdamWArgs> all);

  // ---- cost counters (every backend counts; the count backend only counts) ----
  void set_phase(Phase p) { phase_ = p; }
  Phase phase() const { return phase_; }
  const OpCost& cost(Phase p) const { return cost_[static_cast<size_t>(p)]; }
  void reset_cost() { cost_ = {}; }

  // ---- row tiles (the tiled MLP), and a dry run's shortcut through them ----
  /// Runs tile(r0, n) over the rows [0, rows) in tiles of `tile_rows`, in order. A backend that
  /// computes runs every tile. A dry run runs the first full tile and replays its counts for the
  /// other full ones, then runs the partial last tile: full tiles run the same ops on the same
  /// shapes, and each leaves the pools as it found it (checked), so each would count the same
  /// numbers in the same order and reach the same peak. The counters end with the same bits as
  /// if every tile had run. (At millions of tokens the planner's searches spent ~95% of their
  /// time in these tiles, thousands per block per dry run.)
  template <class Tile>
  void for_each_row_tile(int64_t rows, int64_t tile_rows, Tile&& tile) {
    int64_t r0 = 0;
    if (const int64_t full = rows / tile_rows; replays_row_tiles() && full >= 2) {
      TileReplay replay(*this);
      tile(int64_t{0}, tile_rows);
      replay.repeat(full - 1);
      r0 = full * tile_rows;
    }
    for (; r0 < rows; r0 += tile_rows) tile(r0, std::min(tile_rows, rows - r0));
  }
  /// Whether for_each_row_tile replays full tiles: the count backend's, unless its target says
  /// otherwise (the test that the replay changes no number).
  virtual bool replays_row_tiles() const { return false; }

  // ---- per-op wall time (remat-train bench) ----
  struct OpTime {
    double seconds = 0;
    double flops = 0;
    int64_t calls = 0;
  };
  using OpTimes = std::map<std::pair<std::string, Phase>, OpTime>;
  /// Off by default. On: every op is timed by (op name, phase), and an asynchronous backend
  /// synchronizes after each op, so the time is the op's own (and the step slower).
  void set_op_timing(bool on) { op_timing_ = on; }
  bool op_timing() const { return op_timing_; }
  const OpTimes& op_times() const { return op_times_; }
  void reset_op_times() { op_times_.clear(); }

 protected:
  Backend(std::unique_ptr<MemoryPool> pool, std::unique_ptr<MemoryPool> host_pool);

  /// The copies of the host-pool API. Defaults: synchronous memcpy (host-addressable memory on
  /// both sides), nothing to wait on.
  virtual void copy_to_host_impl(const Tensor& dst, const Tensor& src, CopyTicket t);
  virtual void copy_to_device_impl(const Tensor& dst, const Tensor& src, CopyTicket t);
  virtual void wait_copy_impl(CopyTicket) {}
  virtual void fill_host_impl(const Tensor& t, float value);

  virtual void fill_impl(const Tensor& t, float value) = 0;
  virtual void copy_impl(const Tensor& dst, const Tensor& src) = 0;
  virtual void linear_forward_impl(const LinearForwardArgs& a, const OpWorkspace& ws) = 0;
  virtual void linear_backward_impl(const LinearBackwardArgs& a, const OpWorkspace& ws) = 0;
  virtual void layernorm_forward_impl(const LayerNormForwardArgs& a) = 0;
  virtual void layernorm_backward_impl(const LayerNormBackwardArgs& a) = 0;
  virtual void rmsnorm_forward_impl(const RmsNormForwardArgs& a) = 0;
  virtual void rmsnorm_backward_impl(const RmsNormBackwardArgs& a) = 0;
  virtual void qk_norm_forward_impl(const QkNormForwardArgs& a) = 0;
  virtual void qk_norm_backward_impl(const QkNormBackwardArgs& a) = 0;
  virtual void attention_forward_impl(const AttentionForwardArgs& a, const OpWorkspace& ws) = 0;
  virtual void attention_backward_impl(const AttentionBackwardArgs& a, const OpWorkspace& ws) = 0;
  virtual void attention_delta_impl(const AttentionDeltaArgs& a) = 0;
  virtual void activation_forward_impl(const ActivationForwardArgs& a) = 0;
  virtual void activation_backward_impl(const ActivationBackwardArgs& a) = 0;
  virtual void swiglu_forward_impl(const SwiGluForwardArgs& a) = 0;
  virtual void swiglu_backward_impl(const SwiGluBackwardArgs& a) = 0;
  virtual void add_impl(const Tensor& out, const Tensor& a, const Tensor& b) = 0;
  virtual void embedding_forward_impl(const EmbeddingForwardArgs& a) = 0;
  virtual void embedding_backward_impl(const EmbeddingBackwardArgs& a, const OpWorkspace& ws) = 0;
  virtual void lm_head_loss_impl(const LmHeadLossArgs& a, const OpWorkspace& ws) = 0;
  virtual void mse_loss_impl(const MseLossArgs& a) = 0;
  virtual void ring_split_impl(const RingSplitArgs& a) = 0;
  virtual void ring_merge_grad_impl(const RingMergeGradArgs& a) = 0;
  virtual void ring_block_forward_impl(const RingBlockForwardArgs& a) = 0;
  virtual void ring_finish_impl(const RingFinishArgs& a) = 0;
  virtual void ring_block_backward_impl(const RingBlockBackwardArgs& a) = 0;
  virtual void dropout_impl(const DropoutArgs& a) = 0;
  virtual double sum_squares_impl(std::span<const Tensor> tensors) = 0;
  virtual void adamw_update_impl(const AdamWArgs& a) = 0;
  // The batched ops' implementations; by default one single op's implementation per element.
  virtual void fill_zero_impl(std::span<const Tensor> tensors);
  virtual void adamw_updates_impl(std::span<const AdamWArgs> all);
  // The ops above that take an OpWorkspace receive the parts their backend's rule lists
  // (engine/core/cpu_workspace.h, engine/core/cuda_workspace.h), allocated by the public op.

 private:
  void count(const OpCost& op);
  void add_cost(const OpCost& c);  // into the current phase's counters, and a TileReplay's list

  // Records the counts of one tile while it runs and the pools' live bytes around it; repeat()
  // checks that the tile left the pools as it found them and adds its counts again, in order.
  class TileReplay {
   public:
    explicit TileReplay(Backend& be);
    ~TileReplay() { be_.tile_counts_ = nullptr; }  // also when the tile throws (OutOfMemory)
    TileReplay(const TileReplay&) = delete;
    TileReplay& operator=(const TileReplay&) = delete;
    void repeat(int64_t times);

   private:
    using LiveBytes = std::array<uint64_t, 2 * kNumMemCategories>;  // device, then host pool
    LiveBytes live_bytes() const;
    Backend& be_;
    Phase phase_;
    LiveBytes live_before_;
    std::vector<std::pair<Phase, OpCost>> counts_;
  };
  template <class Args>
  void run_op(const char* op, const Args& a, void (Backend::*impl)(const Args&));
  template <class Args>
  void run_op(const char* op, const Args& a,
              void (Backend::*impl)(const Args&, const OpWorkspace&));
  template <class Run>
  void timed(const char* op, const OpCost& c, Run&& run);
  // One row for a batch: the ops' FLOPs and calls, as if each had been timed on its own.
  template <class Run>
  void timed(const char* op, std::span<const OpCost> costs, Run&& run);
  CopyTicket start_copy(const Tensor& dst, const Tensor& src, bool to_host);
  std::unique_ptr<MemoryPool> pool_;
  std::unique_ptr<MemoryPool> host_pool_;
  uint64_t next_ticket_ = 1;
  std::set<uint64_t> pending_copies_;  // tickets not yet waited on
  Phase phase_ = Phase::Forward;
  std::array<OpCost, kNumPhases> cost_{};
  std::vector<std::pair<Phase, OpCost>>* tile_counts_ = nullptr;  // a TileReplay's, while it runs
  bool op_timing_ = false;
  OpTimes op_times_;
};

/// Rows per LM-head chunk when the config leaves it to the tool: enough rows to keep the GEMM
/// efficient, few enough that the (rows, V) f32 logits stay near 32 MiB.
int64_t default_loss_chunk_rows(int64_t n_rows, int64_t vocab);

/// Uploads `dst`'s f32 values from `values` (numel of them) into a weight of any storage: as they
/// are (F32), or encoded on the host first (a frozen base's BF16 or NF4, engine/core/nf4.h).
void upload_weight(Backend& be, const Tensor& dst, const float* values);

}  // namespace remat
