// The planner (see engine/planner.h).
#include "engine/planner.h"

#include <fmt/format.h>

#include <functional>

#include "engine/cpu/cpu_backend.h"
#include "engine/devices.h"
#include "engine/error.h"

namespace remat {

const std::vector<GpuPreset>& gpu_presets() {
  static const std::vector<GpuPreset> presets = {
      {"h200", 150754820096ull},       // 143771 MiB
      {"h100-80gb", 85045231616ull},   // 81105 MiB
      {"a100-80gb", 85097660416ull},   // 81155 MiB
      {"a100-40gb", 42505273344ull},   // 40536 MiB
      {"l4", 23580639232ull},          // 22488 MiB
      {"rtx4090", 25393692672ull},     // 24217 MiB
  };
  return presets;
}

PlanTarget plan_target(const Config& cfg, const std::string& gpu, std::optional<uint64_t> memory) {
  // `memory` is the pool budget; device_bytes adds the runtime reserve on top.
  PlanTarget t;
  const bool cuda = !gpu.empty() || cfg.device.backend == "cuda";
  if (cuda) {
    if (!gpu.empty()) {
      for (const auto& p : gpu_presets())
        if (gpu == p.name) t.device_bytes = p.bytes;
      if (!t.device_bytes) {
        std::string names;
        for (const auto& p : gpu_presets()) names += fmt::format("{}{}", names.empty() ? "" : ", ", p.name);
        throw ConfigError(fmt::format("--gpu {}: [plan] unknown GPU. Fix: use one of {}, or --memory SIZE", gpu, names));
      }
    } else if (cfg.device.memory_bytes) {
      memory = cfg.device.memory_bytes;  // the CUDA pool's budget, as in a run
    } else if (!memory) {
      throw ConfigError(fmt::format("{}: [plan] device.backend = \"cuda\" without a size. Fix: pass --gpu NAME "
                                    "(h200, h100-80gb, ...) or --memory SIZE, or set device.memory", cfg.path));
    }
    t.name = gpu.empty() ? "cuda" : gpu;
    t.count = CountTarget{"cuda", DType::BF16, 1};
    // Outside the pool: the CUDA context with cuBLAS(Lt) and cuDNN loaded (~600 MiB measured on
    // Hopper-class cards with CUDA 12/13) plus the caching slack of the driver.
    t.reserve_bytes = 768ull << 20;
    t.reserve_note = "CUDA context + library handles ~600 MiB, driver slack ~168 MiB";
  } else {
    t.name = "cpu";
    int threads = static_cast<int>(cfg.device.threads);
    if (threads <= 0) threads = cpu::default_threads();
    t.count = CountTarget{"cpu", DType::F32, threads};
    t.device_bytes = cfg.device.memory_bytes ? cfg.device.memory_bytes : host_memory_bytes();
    t.reserve_note = "none: every byte of a CPU run goes through the pool";
  }
  if (memory) t.device_bytes = *memory + t.reserve_bytes;
  return t;
}

double DryRun::recompute_overhead() const {
  const double base = cost[static_cast<size_t>(Phase::Forward)].flops + cost[static_cast<size_t>(Phase::Loss)].flops +
                      cost[static_cast<size_t>(Phase::Backward)].flops;
  return base > 0 ? cost[static_cast<size_t>(Phase::Recompute)].flops / base : 0.0;
}

DryRun Planner::dry_run(const Config& cfg, bool track_largest) const {
  CountBackend be(target_.count, UINT64_MAX);
  be.pool().set_track_largest(track_largest);
  RunParts parts = factory_(cfg, be);
  Model& model = *parts.model;
  Trainer trainer(cfg, be, model, *parts.data);
  be.reset_cost();
  trainer.step();
  DryRun r;
  r.policy = cfg.remat.plan.empty() ? cfg.remat.policy : "per-block";
  r.peak = be.pool().peak_snapshot();
  for (int i = 0; i < kNumPhases; ++i) r.cost[static_cast<size_t>(i)] = be.cost(static_cast<Phase>(i));
  r.n_params = model.n_params();
  return r;
}

namespace {

// Largest v in [1, hi] with fits(v) (fits is monotone: true then false); 0 if fits(1) is false.
int64_t search_largest(int64_t hi, const std::function<bool(int64_t)>& fits) {
  if (!fits(1)) return 0;
  int64_t lo = 1;
  // Exponential probe to bracket, then bisection.
  int64_t probe = 2;
  while (probe <= hi && fits(probe)) {
    lo = probe;
    probe *= 2;
  }
  int64_t bad = std::min(probe, hi + 1);
  while (bad - lo > 1) {
    const int64_t mid = lo + (bad - lo) / 2;
    (fits(mid) ? lo : bad) = mid;
  }
  return lo;
}

}  // namespace

int64_t Planner::longest_seq_len(const Config& cfg) const {
  const int64_t hi = (cfg.model.kind == "gpt" && cfg.model.position == "learned") ? cfg.model.n_ctx : (1ll << 26);
  if (cfg.model.kind != "gpt") return 0;
  return search_largest(hi, [&](int64_t t) {
    Config c = cfg;
    c.train.seq_len = t;
    if (c.data.task == "copy" && t < 4) c.data.task = "random";
    return fits(c);
  });
}

int64_t Planner::largest_batch(const Config& cfg) const {
  return search_largest(1ll << 20, [&](int64_t b) {
    Config c = cfg;
    c.train.batch_size = b;
    return fits(c);
  });
}

const std::vector<std::string>& builtin_policies() {
  static const std::vector<std::string> p = {"none", "full", "save_dots", "save_attn"};
  return p;
}

}  // namespace remat
