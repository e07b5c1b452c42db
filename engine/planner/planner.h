// The planner: the remat executor run on the count backend. A dry run is one real training step
// (data, forward, loss, backward with recompute, optimizer) that computes nothing, so its peak
// memory and FLOPs are those of a real step: on the CPU equal to the byte; on a GPU plus the
// runtime reserve (CUDA context, library workspaces), which is reported apart.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/config/policy.h"
#include "engine/core/backend.h"
#include "engine/core/count_backend.h"
#include "engine/core/memory_pool.h"
#include "engine/model.h"
#include "engine/training/trainer.h"

namespace remat {

/// The device a plan is for, and how much of it the pool may use.
struct PlanTarget {
  std::string name;  // "cpu" or a GPU preset ("h200")
  CountTarget count;
  uint64_t device_bytes = 0;   // what the device has
  uint64_t reserve_bytes = 0;  // outside the pool: CUDA context, allocator slack
  std::string reserve_note;    // how the reserve was sized
  uint64_t host_bytes = 0;     // the host pool's budget (remat.offload)
  std::string host_note;       // where that figure comes from
  // What turns a dry run's copy volume and FLOPs into seconds; 0 where not modelled (the CPU,
  // a CUDA budget without a preset).
  double link_bytes_per_s = 0;  // device <-> host copies, each direction
  double peak_flops_per_s = 0;  // dense peak at the activation dtype (fp32 accumulation)
  // The host's AdamW over parameters in host memory (remat.offload with weights), in bytes of
  // host memory traffic per second: 28 per parameter (reads w, g, m, v; writes w, m, v).
  double host_update_bytes_per_s = 0;
  std::string rates_note;  // "PCIe 5.0 x16 ~50 GB/s, bf16 dense 989 TFLOP/s"
  // Between ranks (parallel.data > 1): within a node of `gpus_per_node` cards, and across nodes.
  double peer_bytes_per_s = 0, network_bytes_per_s = 0;
  int gpus_per_node = 0;
  std::string peer_name, network_name;  // "NVLink 4", "InfiniBand NDR 400 Gb/s"
  uint64_t pool_budget() const {
    return device_bytes > reserve_bytes ? device_bytes - reserve_bytes : 0;
  }
  /// A CPU target: the host pool is the same RAM as the device pool, so offloading buys no
  /// memory there (it runs to test the executor), and auto never chooses it.
  bool host_is_device() const { return count.device == DeviceKind::Cpu; }
};

struct GpuPreset {
  const char* name;
  uint64_t bytes;         // as the CUDA runtime reports it (total, not free)
  uint64_t host_bytes;    // host RAM assumed beside one such card, for offloading
  double link_gb_per_s;   // pinned copies, one direction (GB = 1e9 B)
  const char* link_name;  // "PCIe 5.0 x16"
  double bf16_tflops;     // dense tensor-core peak with fp32 accumulation
  double fp32_tflops;     // dense fp32 peak without tensor cores (the fp32 build uses no TF32)
  // Between ranks: the cards of one node (line rate per direction per card), then the network
  // each card has to other nodes (GB = 1e9 B).
  int gpus_per_node;
  double peer_gb_per_s;
  const char* peer_name;  // "NVLink 4"
  double network_gb_per_s;
  const char* network_name;  // "InfiniBand NDR 400 Gb/s"
};
/// Common cards: memory, the host RAM and link assumed beside them, and their peak rates.
const std::vector<GpuPreset>& gpu_presets();

/// The target of `remat-train plan`: --gpu NAME, else the config's device (CPU threads as a run
/// would use them), with --memory overriding the budget. Throws ConfigError for unknown GPUs.
PlanTarget plan_target(const Config& cfg, const std::string& gpu, std::optional<uint64_t> memory);

/// The target of a run on `be` itself: its backend, threads and pool budget (train, compare).
PlanTarget run_plan_target(Backend& be);

struct DryRun {
  std::string policy;
  MemorySnapshot peak;       // the device pool
  MemorySnapshot host_peak;  // the host pool (remat.offload)
  std::array<OpCost, kNumPhases> cost{};
  int64_t n_params = 0;
  int64_t n_trainable_params = 0;   // of them, the ones with a gradient (LoRA: the adapters)
  int64_t host_updated_params = 0;  // of them, updated by the host's cores (weights offloaded)
  // Of those, the ones the step's first two uses read (the stem's and block 0's): the
  // stream fetches a use's weights one use ahead, so the device waits for both updates.
  int64_t host_first_use_params = 0;
  double recompute_overhead() const;  // recompute FLOPs / (forward + loss + backward FLOPs)
  double flops() const;               // every phase
  double to_host_bytes() const { return total(&OpCost::to_host_bytes); }  // copies per step
  double to_device_bytes() const { return total(&OpCost::to_device_bytes); }
  int ranks = 1;                 // every rank of the job; every figure above is one rank's
  int context_ranks = 1;         // of them, the ranks that split a sequence (the ring)
  uint64_t grad_sent_bytes = 0;  // gradient bytes each rank sends per step (ranks > 1)
  // parallel.shard_optimizer: each rank holds 1/ranks of the AdamW moments, and grad_sent_bytes
  // are the gradients' reduce-scatter and the updated weights' all-gather.
  bool sharded_optimizer = false;
  // context parallel: ring bytes this rank sends per step
  double ring_bytes() const { return total(&OpCost::ring_bytes); }
  double total(double OpCost::*field) const;  // a cost field summed over every phase
};

/// A step's device <-> host copies in seconds beside its compute, at the target's rates (zero
/// when the target has none). Copies overlap the compute of their own phase: forward copies
/// the forward, the backward's the recompute and backward, the optimizer's the update;
/// `exposed_s` is what a phase's copies take beyond its compute, the stall a user would see.
/// With the weights in host memory, AdamW runs on the host's cores (`host_update_s`), in the
/// order the next step fetches the weights and overlapping it: the device waits for the first
/// two uses' parameters (the stem's and block 0's: each is fetched one use ahead), and for the
/// rest only as far as they outlast the forward's compute. Before it the gradient norm reads
/// every gradient on the host while the device idles (`host_norm_s`). Both waits are part of
/// `exposed_s`.
struct CopyTime {
  double copy_s = 0;     // both directions, serialized on one copy engine
  double compute_s = 0;  // every FLOP of the step at the peak rate: a lower bound
  double exposed_s = 0;
  double host_update_s = 0;
  double host_norm_s = 0;
  bool modelled = false;
};
/// Host memory traffic of one AdamW update per parameter: w, g, m, v read; w, m, v written.
constexpr double kHostUpdateBytesPerParam = 28;
/// And of the gradient norm's pass: g read.
constexpr double kHostNormBytesPerParam = 4;
/// The rate the planner assumes for it beside a GPU preset (bytes/s); see planner.cpp.
constexpr double kAssumedHostUpdateBytesPerS = 100e9;
/// `flops_per_s`: the compute rate to set the copies against (0: the target's peak, the
/// lower bound; fit passes its estimated rate, so what its step time adds is what that rate would
/// not hide).
CopyTime copy_time(const DryRun& run, const PlanTarget& target, double flops_per_s = 0);

/// Data parallel: the gradient exchange of a step beside the backward it overlaps, at the
/// target's link between ranks (within a node up to gpus_per_node ranks, else the network).
/// Context parallel adds the ring: kv blocks (and dk | dv accumulators) each forward, recompute
/// and backward; they overlap the attention of their own phase.
struct ExchangeTime {
  double ring_s = 0;      // ring bytes at the context group's link (within a node if it fits)
  double gradient_s = 0;  // gradient bytes at the whole job's link
  double compute_s = 0;   // every FLOP of the step at peak: a lower bound
  double exposed_s = 0;   // per phase, what the exchanges take beyond that phase's compute
  std::string ring_link, gradient_link;  // "NVLink 4 ~450 GB/s per direction"
  bool modelled = false;
};
ExchangeTime exchange_time(const DryRun& run, const PlanTarget& target);

/// What a run is made of; the caller (cmd/, tests) supplies it so that engine/ does not depend
/// on layers/ or data/.
struct RunParts {
  std::unique_ptr<Model> model;
  std::unique_ptr<DataSource> data;
};
using RunFactory = std::function<RunParts(const Config&, Backend&)>;

/// What a dry run runs: one training step (Trainer::step), or one evaluation batch (`eval`: the
/// executor's forward_loss on the data source's first batch, no backward and no optimizer), with
/// or without the LM head's greedy predictions (`eval --passkey`).
enum class StepKind : uint8_t { Train, Eval, EvalPredictions };

class Planner {
 public:
  Planner(PlanTarget target, RunFactory factory)
      : target_(std::move(target)), factory_(std::move(factory)) {}
  const PlanTarget& target() const { return target_; }

  /// One training step of `cfg` on the count backend for the target (or what `kind` says).
  DryRun dry_run(const Config& cfg, bool track_largest = true,
                 StepKind kind = StepKind::Train) const;
  bool fits(const Config& cfg) const { return fits(dry_run(cfg, false)); }
  /// The device peak within the pool budget and the host peak within the host budget.
  bool fits(const DryRun& run) const;
  /// One number for the searches: the device peak, or the host peak scaled into device-budget
  /// units when that is larger. It is <= pool_budget() exactly when the run fits, and as
  /// monotone in seq_len or batch size as the two peaks are.
  uint64_t search_peak(const DryRun& run) const;
  /// Longest seq_len that fits (0 if even 1 does not); learned positions cap it at n_ctx.
  /// Searches over dry runs (engine/planner/budget_search.h); computes nothing.
  /// `at_cfg`, when the caller has it, is cfg's own dry run: one probe fewer.
  int64_t longest_seq_len(const Config& cfg, const DryRun* at_cfg = nullptr,
                          StepKind kind = StepKind::Train) const;
  /// Largest batch_size at the configured seq_len that fits (0 if none).
  int64_t largest_batch(const Config& cfg, const DryRun* at_cfg = nullptr) const;

 private:
  PlanTarget target_;
  RunFactory factory_;
};

// ---- remat.policy = "auto" ----
//
// "auto" is a planner feature: it resolves to a per-block plan (remat.plan) before anything
// runs, and the executor never sees it. It picks, per block, one of none, save_dots, save_attn,
// full (each keeps a subset of the previous one's tensors), minimizing the step's recompute
// FLOPs -- our estimate of recompute time -- subject to the dry-run peak <= pool_budget().
// Blocks are identical, so the search is over compositions (how many blocks get each policy),
// with the memory-heavier policies on the last blocks (planner.cpp says why). When there are at
// most 2000 compositions (C(L+3, 3), i.e. L <= 20) all are tried, cheapest recompute first, and
// the first that fits wins; deeper models try each mixture of two policies, with an exact
// search (engine/planner/budget_search.h) on how many blocks get the heavier one (the peak is
// monotone, and nearly affine, in that count). Feasibility and the reported peak and FLOPs come
// from real dry runs (track_largest off), never a model. tests/test_auto.cpp checks the result
// against every one of the 4^L plans on small models.

struct AutoPlan {
  std::vector<std::string> policies;  // one per block; every block "full" when nothing fits
  bool fits = false;
  uint64_t peak_bytes = 0;        // predicted peak of `policies`
  double recompute_flops = 0;     // per step
  double recompute_overhead = 0;  // recompute / (forward + loss + backward) FLOPs
  // Every block "full" in the candidate's segments: the smallest peak of any plan.
  uint64_t min_peak_bytes = 0;
  uint64_t min_host_peak_bytes = 0;         // that plan's host-pool peak
  uint64_t budget_bytes = 0;                // the target's pool budget
  int64_t n_dry_runs = 0;                   // how many candidates the search evaluated
  int64_t tile_tokens = 0;                  // the MLP tiling the plan runs with (remat.tile_tokens)
  int64_t every = 1;                        // blocks per checkpoint segment (remat.every)
  OffloadKind offload = OffloadKind::None;  // what the plan keeps in host memory (remat.offload)
  uint64_t host_peak_bytes = 0;             // predicted host-pool peak of `policies`
  uint64_t host_budget_bytes = 0;
  std::string smaller_base;  // smaller_lora_base_fix of the config, for infeasible_message
  /// The mix in plan order, block 0 first: "1 x full, 1 x save_attn, 2 x none".
  std::string mix() const;
  /// "chose 1 x full, 3 x none (recompute +4.2%, predicted peak 1.10 GiB of budget 1.20 GiB)".
  std::string summary() const;
  /// The one-line OutOfMemory message when nothing fits (smallest peak, budget, hint).
  std::string infeasible_message() const;
};

/// For a LoRA run whose frozen base is fp32 or bf16, the out-of-memory fix that no seq_len gives
/// (", or keep the frozen base in bf16 or NF4 (lora.base = ...)"); "" otherwise.
std::string smaller_lora_base_fix(const Config& cfg);

/// `cfg` with its [remat] section replaced by the per-block plan `policies`, checkpointed blocks
/// in segments of `every`.
Config with_block_plan(const Config& cfg, const std::vector<std::string>& policies,
                       int64_t every = 1);
/// `cfg` running what auto chose: its per-block plan (with_block_plan), segments, tiling and
/// offload.
Config with_auto_plan(const Config& cfg, const AutoPlan& chosen);

/// The plan remat.policy = "auto" runs for `cfg` on the planner's target (see above). Only the
/// model, train and data sections of `cfg` matter; its [remat] section is ignored.
AutoPlan choose_auto_plan(const Planner& planner, const Config& cfg);

/// The MLP chunk auto (and fit's hint) tries first for `rows` token rows: an eighth of them, so
/// the MLP's activations shrink ~8x, between 64 and 4096 rows, so its GEMMs keep their speed.
int64_t default_tile_tokens(int64_t rows);

/// The MLP chunks auto tries for `rows` token rows, in order: default_tile_tokens, then halved
/// while at least rows / 64 (and 64). Smaller chunks lower the peak a little more each time (the
/// MLP half's transient buffers), which is what fit's tiling hint counts on: it plans the longest
/// context with the chunk of a shorter length, a smaller share of the rows there.
std::vector<int64_t> auto_tile_tokens(int64_t rows);

/// choose_auto_plan, and when no per-block plan fits, the same search with more added, in order,
/// until one fits: the MLP tiled by each of auto_tile_tokens (a GPT whose remat.tile_tokens is
/// 0), then on a GPU target (not the CPU, whose host memory is the device's) checkpoints in host
/// memory, then the AdamW moments too, then the weights and gradients (when remat.offload is
/// "none"), all with the smallest chunk; then each of those with checkpoint segments of two
/// blocks (half the checkpoints for a larger working set: what a host full of checkpoints needs).
/// When nothing fits, the candidate with the smallest peak. tile_tokens, offload and every say
/// what the plan runs with.
AutoPlan choose_auto(const Planner& planner, const Config& cfg);

/// Where every command resolves "auto": when `cfg` says remat.policy = "auto" (and has no plan
/// yet), chooses the plan for the planner's target (choose_auto), writes it into cfg.remat.plan
/// (every block "full" when nothing fits), its tiling into cfg.remat.tile_tokens, its offload
/// into cfg.remat.offload and its segments into cfg.remat.every, and returns the choice, whose
/// `fits` the caller acts on; otherwise returns nothing and leaves `cfg` as it is.
std::optional<AutoPlan> resolve_auto(const Planner& planner, Config& cfg);

// ---- the LM head's chunk ----
//
// The fused LM head (engine/core/ops/loss.h) runs over chunks of rows; each chunk re-reads and
// re-writes the f32 weight gradient (V x C) and runs three GEMMs of `rows` rows. The default
// chunk (default_loss_chunk_rows: ~32 MiB of logits, 192 rows for GPT-2's vocabulary) keeps the
// head's memory negligible, which is what the CPU (but for a frozen head, below) and a GPU at its
// longest context want; a GPU with room to spare wants thousands of rows. Per chunk the GEMMs do 6
// rows V C FLOPs and the weight gradient moves 8 V C bytes, so at an H200's ~800 TFLOP/s and 4.8
// TB/s that traffic takes 222 / rows of the GEMMs' time: longer than the GEMMs at 192 rows, 3% at
// 8192.

/// The LM head's rows on one rank: its share of the batch, and of each row's tokens under
/// context parallel.
int64_t loss_rows_per_rank(const Config& cfg);
/// The chunk the model runs when train.loss_chunk = 0 and nothing resizes it:
/// default_loss_chunk_rows of one rank's rows and the vocabulary.
int64_t default_loss_chunk(const Config& cfg);

/// The largest LM-head chunk a GPU target is given, in rows.
constexpr int64_t kGpuLossChunkRows = 8192;
/// The largest a CPU target is given, and only for a frozen head (a LoRA run that does not train
/// it): its two GEMMs then stream the whole weight once per chunk and nothing else, so fewer
/// chunks cost less. SmolLM2-135M's LoRA step at 512 tokens on the Intel VM (2026-12-07, 3
/// alternated pairs): the head's op 180-182 ms in chunks of 192 rows, 158-164 in one of 512
/// (-10 to -25 ms a step); 1024 rows were slower than 512. A head that trains also re-reads and
/// re-writes its weight gradient per chunk, and there GPT-2 124M's step at 1024 tokens was no
/// faster in chunks of 256 or 512 rows (2 pairs): the CPU keeps its default chunk.
constexpr int64_t kCpuFrozenHeadChunkRows = 512;

/// The chunks resolve_loss_chunk tries for `rows` token rows (one rank's) and `vocab`, largest
/// first: min(rows rounded up to 64, `largest`), halved while larger than the default chunk.
/// Empty when the default chunk already holds every row.
std::vector<int64_t> loss_chunk_candidates(int64_t rows, int64_t vocab, int64_t largest);

/// The largest chunk resolve_loss_chunk may give `cfg` on the planner's target:
/// kGpuLossChunkRows on a GPU, kCpuFrozenHeadChunkRows on the CPU for a frozen head; 0 where the
/// tool leaves the chunk alone (the config sets it, the MLP, the CPU for a head that trains).
int64_t largest_loss_chunk(const Planner& planner, const Config& cfg);

/// Where every command that runs steps sizes the LM head's chunk: when `cfg` leaves it to the
/// tool (train.loss_chunk = 0) on a GPU, or on the CPU for a frozen head, the largest candidate
/// (up to kGpuLossChunkRows, kCpuFrozenHeadChunkRows) whose dry run still fits both pools (the
/// peak grows with the chunk, so a binary search), written into cfg.train.loss_chunk and
/// returned. Nothing when the config sets the chunk, on the CPU for a head that trains, for the
/// MLP, or when no candidate fits: the default chunk then stays. Call it after resolve_auto, so
/// that the chunk grows into what the chosen plan leaves free and never changes the plan.
std::optional<int64_t> resolve_loss_chunk(const Planner& planner, Config& cfg);

}  // namespace remat
