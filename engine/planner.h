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

#include "engine/backend.h"
#include "engine/config.h"
#include "engine/count_backend.h"
#include "engine/memory_pool.h"
#include "engine/model.h"
#include "engine/trainer.h"

namespace remat {

/// The device a plan is for, and how much of it the pool may use.
struct PlanTarget {
  std::string name;              // "cpu" or a GPU preset ("h200")
  CountTarget count;
  uint64_t device_bytes = 0;     // what the device has
  uint64_t reserve_bytes = 0;    // outside the pool: CUDA context, allocator slack
  std::string reserve_note;      // how the reserve was sized
  uint64_t pool_budget() const { return device_bytes > reserve_bytes ? device_bytes - reserve_bytes : 0; }
};

struct GpuPreset {
  const char* name;
  uint64_t bytes;
};
/// Memory of common cards as the CUDA runtime reports it (total, not free).
const std::vector<GpuPreset>& gpu_presets();

/// The target of `remat-train plan`: --gpu NAME, else the config's device (CPU threads as a run
/// would use them), with --memory overriding the budget. Throws ConfigError for unknown GPUs.
PlanTarget plan_target(const Config& cfg, const std::string& gpu, std::optional<uint64_t> memory);

struct DryRun {
  std::string policy;
  MemorySnapshot peak;
  std::array<OpCost, kNumPhases> cost{};
  int64_t n_params = 0;
  double recompute_overhead() const;  // recompute FLOPs / (forward + loss + backward FLOPs)
};

/// What a run is made of; the caller (cmd/, tests) supplies it so that engine/ does not depend
/// on layers/ or data/.
struct RunParts {
  std::unique_ptr<Model> model;
  std::unique_ptr<DataSource> data;
};
using RunFactory = std::function<RunParts(const Config&, Backend&)>;

class Planner {
 public:
  Planner(PlanTarget target, RunFactory factory) : target_(std::move(target)), factory_(std::move(factory)) {}
  const PlanTarget& target() const { return target_; }

  /// One training step of `cfg` on the count backend for the target.
  DryRun dry_run(const Config& cfg, bool track_largest = true) const;
  bool fits(const Config& cfg) const { return dry_run(cfg, false).peak.total_bytes <= target_.pool_budget(); }
  /// Longest seq_len that fits (0 if even 1 does not); learned positions cap it at n_ctx.
  /// Binary search over dry runs; computes nothing.
  int64_t longest_seq_len(const Config& cfg) const;
  /// Largest batch_size at the configured seq_len that fits (0 if none).
  int64_t largest_batch(const Config& cfg) const;

 private:
  PlanTarget target_;
  RunFactory factory_;
};

/// The built-in policies a plan or a comparison covers, in order.
const std::vector<std::string>& builtin_policies();

}  // namespace remat
