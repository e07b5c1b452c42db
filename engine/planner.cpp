// The planner (see engine/planner.h).
#include "engine/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <utility>

#include "engine/budget_search.h"
#include "engine/checkpoint.h"
#include "engine/devices.h"
#include "engine/error.h"
#include "engine/units.h"

namespace remat {

PlanTarget run_plan_target(Backend& be) {
  PlanTarget t;
  t.name = be.name();
  const WorkspaceTarget w = be.workspace_target();
  t.count = CountTarget{w.device, be.act_dtype(), w.threads};
  t.device_bytes = be.pool().budget_bytes();
  return t;
}

const std::vector<GpuPreset>& gpu_presets() {
  static const std::vector<GpuPreset> presets = {
      {"h200", 150754820096ull},      // 143771 MiB
      {"h100-80gb", 85045231616ull},  // 81105 MiB
      {"a100-80gb", 85097660416ull},  // 81155 MiB
      {"a100-40gb", 42505273344ull},  // 40536 MiB
      {"l4", 23580639232ull},         // 22488 MiB
      {"rtx4090", 25393692672ull},    // 24217 MiB
  };
  return presets;
}

PlanTarget plan_target(const Config& cfg, const std::string& gpu, std::optional<uint64_t> memory) {
  // `memory` is the pool budget; device_bytes adds the runtime reserve on top.
  PlanTarget t;
  const bool cuda = !gpu.empty() || cfg.device.backend == BackendKind::Cuda;
  if (cuda) {
    if (!gpu.empty()) {
      for (const auto& p : gpu_presets())
        if (gpu == p.name) t.device_bytes = p.bytes;
      if (!t.device_bytes) {
        std::string names;
        for (const auto& p : gpu_presets())
          names += fmt::format("{}{}", names.empty() ? "" : ", ", p.name);
        throw ConfigError(fmt::format(
            "--gpu {}: [plan] unknown GPU. Fix: use one of {}, or --memory SIZE", gpu, names));
      }
    } else if (cfg.device.memory_bytes) {
      memory = cfg.device.memory_bytes;  // the CUDA pool's budget, as in a run
    } else if (!memory) {
      throw ConfigError(
          fmt::format("{}: [plan] device.backend = \"cuda\" without a size. Fix: pass --gpu NAME "
                      "(h200, h100-80gb, ...) or --memory SIZE, or set device.memory",
                      cfg.path));
    }
    t.name = gpu.empty() ? "cuda" : gpu;
    t.count = CountTarget{DeviceKind::Cuda,
                          cfg.device.precision == Precision::Fp32 ? DType::F32 : DType::BF16, 1};
    // Outside the pool: the CUDA context with cuBLAS(Lt) and cuDNN loaded (~600 MiB measured on
    // Hopper-class cards with CUDA 12/13) plus the caching slack of the driver.
    t.reserve_bytes = 768ull << 20;
    t.reserve_note = "CUDA context + library handles ~600 MiB, driver slack ~168 MiB";
  } else {
    t.name = "cpu";
    int threads = static_cast<int>(cfg.device.threads);
    if (threads <= 0) threads = host_default_threads();
    t.count = CountTarget{DeviceKind::Cpu, DType::F32, threads};
    t.device_bytes = cfg.device.memory_bytes ? cfg.device.memory_bytes : host_memory_bytes();
    t.reserve_note = "none: every byte of a CPU run goes through the pool";
  }
  if (memory) t.device_bytes = *memory + t.reserve_bytes;
  return t;
}

double DryRun::recompute_overhead() const {
  const double base = cost[static_cast<size_t>(Phase::Forward)].flops +
                      cost[static_cast<size_t>(Phase::Loss)].flops +
                      cost[static_cast<size_t>(Phase::Backward)].flops;
  return base > 0 ? cost[static_cast<size_t>(Phase::Recompute)].flops / base : 0.0;
}

DryRun Planner::dry_run(const Config& cfg, bool track_largest) const {
  CountBackend be(target_.count, UINT64_MAX);
  be.pool().set_track_largest(track_largest);
  RunParts parts = factory_(cfg, be);
  Model& model = *parts.model;
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, model), be, model, *parts.data);
  be.reset_cost();
  trainer.step();
  be.pool().set_phase("checkpoint");
  if (!cfg.checkpoint.dir.empty())
    allocate_checkpoint_staging(be, model);  // freed at once, as in a run
  DryRun r;
  r.policy = cfg.remat.plan.empty() ? cfg.remat.policy : "per-block";
  r.peak = be.pool().peak_snapshot();
  for (int i = 0; i < kNumPhases; ++i)
    r.cost[static_cast<size_t>(i)] = be.cost(static_cast<Phase>(i));
  r.n_params = model.n_params();
  return r;
}

namespace {
std::optional<PeakProbe> known_probe(int64_t x, const DryRun* run) {
  if (!run) return std::nullopt;
  return PeakProbe{x, run->peak.total_bytes};
}
}  // namespace

int64_t Planner::longest_seq_len(const Config& cfg, const DryRun* at_cfg) const {
  if (cfg.model.kind != ModelKind::Gpt) return 0;
  const int64_t hi = cfg.model.position == PositionKind::Learned ? cfg.model.n_ctx : (1ll << 26);
  return largest_fitting(
      hi, target_.pool_budget(),
      [&](int64_t t) {
        Config c = cfg;
        c.train.seq_len = t;
        if (c.data.task == "copy" && t < 4) c.data.task = "random";
        return dry_run(c, false).peak.total_bytes;
      },
      known_probe(cfg.train.seq_len, at_cfg));
}

int64_t Planner::largest_batch(const Config& cfg, const DryRun* at_cfg) const {
  return largest_fitting(
      1ll << 20, target_.pool_budget(),
      [&](int64_t b) {
        Config c = cfg;
        c.train.batch_size = b;
        return dry_run(c, false).peak.total_bytes;
      },
      known_probe(cfg.train.batch_size, at_cfg));
}

// ---- auto ----

namespace {

// auto's candidates, from the most memory (no recompute) to the least (the most recompute): each
// policy keeps a subset of the previous one's tensors (engine/policy.h).
constexpr size_t kNumAuto = 4;
const std::string& auto_policy(size_t p) {
  const std::vector<std::string>& order = builtin_policies_by_memory();
  REMAT_ASSERT(order.size() == kNumAuto, "auto: {} built-in policies, {} expected", order.size(),
               kNumAuto);
  return order[p];
}
constexpr int64_t kMaxCompositions = 2000;
using Counts = std::array<int64_t, kNumAuto>;  // blocks per policy, in auto_policy order

// The blocks of a composition, lightest memory first: "full" blocks come first and the
// memory-heavier policies go to the LAST blocks. The backward pass runs from the last block
// down and frees each block's tensors once it is done, and the block being back-propagated is
// fully live whatever its policy (recomputed if checkpointed). So the peak while block k is
// back-propagated counts the saved tensors of blocks 0..k-1 only: a block's saved tensors weigh
// on the backward of every block after it, and the later a block is, the shorter they live.
// Sorting ascending by memory makes every such prefix as small as it can be.
std::vector<std::string> arrange(const Counts& counts) {
  std::vector<std::string> out;
  for (size_t p = kNumAuto; p-- > 0;)
    out.insert(out.end(), static_cast<size_t>(counts[p]), auto_policy(p));
  return out;
}

int64_t n_compositions(int64_t n_layer) {
  // C(L + 3, 3) = (L+1)(L+2)(L+3)/6; saturate rather than overflow for huge L.
  if (n_layer > 100000) return kMaxCompositions + 1;
  return (n_layer + 1) * (n_layer + 2) * (n_layer + 3) / 6;
}

}  // namespace

std::string AutoPlan::mix() const {
  // In plan order, block 0 first, as `plan = [...]` lists them (runs of equal policies).
  std::string out;
  for (size_t i = 0; i < policies.size();) {
    size_t j = i;
    while (j < policies.size() && policies[j] == policies[i]) ++j;
    out += fmt::format("{}{} x {}", out.empty() ? "" : ", ", j - i, policies[i]);
    i = j;
  }
  return out;
}

std::string AutoPlan::summary() const {
  return fmt::format(
      "chose {}{} (recompute +{:.2f}%, predicted peak {} of budget {})", mix(),
      tile_tokens > 0 ? fmt::format(", MLP in chunks of {} tokens", tile_tokens) : std::string(),
      100.0 * recompute_overhead, format_bytes(peak_bytes), format_bytes(budget_bytes));
}

std::string AutoPlan::infeasible_message() const {
  return fmt::format(
      "[planner] remat.policy = \"auto\": no plan fits the budget of {} ({} B); the smallest "
      "achievable peak is {} ({} B, every block \"full\"{}). Fix: set device.memory = {} or "
      "more, or lower train.batch_size or train.seq_len; `remat-train plan` shows what fits.",
      format_bytes(budget_bytes), budget_bytes, format_bytes(min_peak_bytes), min_peak_bytes,
      tile_tokens > 0 ? fmt::format(", the MLP in chunks of {} tokens", tile_tokens)
                      : std::string(),
      min_peak_bytes);
}

int64_t default_tile_tokens(int64_t rows) {
  return std::clamp<int64_t>(rows / 8, 64, 4096);
}

AutoPlan choose_auto(const Planner& planner, const Config& cfg) {
  AutoPlan chosen = choose_auto_plan(planner, cfg);
  chosen.tile_tokens = cfg.remat.tile_tokens;
  if (chosen.fits || cfg.model.kind != ModelKind::Gpt || cfg.remat.tile_tokens > 0) return chosen;
  Config tiled = cfg;
  tiled.remat.tile_tokens = default_tile_tokens(cfg.train.batch_size * cfg.train.seq_len);
  // Taken whether or not it fits: when nothing fits, its smallest peak is the one to name.
  AutoPlan with_tiling = choose_auto_plan(planner, tiled);
  with_tiling.tile_tokens = tiled.remat.tile_tokens;
  with_tiling.n_dry_runs += chosen.n_dry_runs;
  return with_tiling.min_peak_bytes < chosen.min_peak_bytes ? with_tiling : chosen;
}

std::optional<AutoPlan> resolve_auto(const Planner& planner, Config& cfg) {
  if (cfg.remat.policy != "auto" || !cfg.remat.plan.empty()) return std::nullopt;
  AutoPlan chosen = choose_auto(planner, cfg);
  cfg.remat.plan = chosen.policies;
  cfg.remat.tile_tokens = chosen.tile_tokens;
  return chosen;
}

Config with_block_plan(const Config& cfg, const std::vector<std::string>& policies) {
  Config c = cfg;
  c.remat.policy = "none";  // remat.plan overrides it; "none" keeps the config free of "auto"
  c.remat.plan = policies;
  c.remat.every = 1;
  c.remat.blocks.clear();
  c.remat.save.clear();
  return c;
}

AutoPlan choose_auto_plan(const Planner& planner, const Config& cfg) {
  const int64_t L = cfg.model.n_layer;
  AutoPlan best;
  best.budget_bytes = planner.target().pool_budget();
  std::map<Counts, DryRun> runs;  // each composition is dry-run once
  auto evaluate = [&](const Counts& counts) {
    auto it = runs.find(counts);
    if (it == runs.end()) {
      ++best.n_dry_runs;
      it =
          runs.emplace(counts, planner.dry_run(with_block_plan(cfg, arrange(counts)), false)).first;
    }
    return it->second;
  };
  auto take = [&](const Counts& counts, const DryRun& r) {
    best.policies = arrange(counts);
    best.fits = r.peak.total_bytes <= best.budget_bytes;
    best.peak_bytes = r.peak.total_bytes;
    best.recompute_flops = r.cost[static_cast<size_t>(Phase::Recompute)].flops;
    best.recompute_overhead = r.recompute_overhead();
  };

  // The uniform plans: the cost of each policy per block, and the two ends of the search.
  std::array<DryRun, kNumAuto> uniform;
  for (size_t p = 0; p < kNumAuto; ++p) {
    Counts c{};
    c[p] = L;
    uniform[p] = evaluate(c);
  }
  const auto fits = [&](const DryRun& r) { return r.peak.total_bytes <= best.budget_bytes; };
  best.min_peak_bytes = uniform[kNumAuto - 1].peak.total_bytes;
  if (fits(uniform[0]) || !fits(uniform[kNumAuto - 1])) {  // nothing to trade, or nothing fits
    const size_t p = fits(uniform[0]) ? 0 : kNumAuto - 1;
    Counts c{};
    c[p] = L;
    take(c, uniform[p]);
    return best;
  }
  // Recompute FLOPs per block of each policy: blocks are identical, so they add up.
  std::array<double, kNumAuto> per_block{};
  for (size_t p = 0; p < kNumAuto; ++p)
    per_block[p] =
        uniform[p].cost[static_cast<size_t>(Phase::Recompute)].flops / static_cast<double>(L);
  auto estimate = [&](const Counts& c) {
    double f = 0;
    for (size_t p = 0; p < kNumAuto; ++p) f += static_cast<double>(c[p]) * per_block[p];
    return f;
  };
  // Among candidates of equal recompute, the lower peak wins.
  std::optional<std::pair<double, uint64_t>> best_key;
  auto consider = [&](const Counts& c, const DryRun& r) {
    if (!fits(r)) return;
    const std::pair<double, uint64_t> key{estimate(c), r.peak.total_bytes};
    if (!best_key || key < *best_key) {
      best_key = key;
      take(c, r);
    }
  };

  if (n_compositions(L) <= kMaxCompositions) {
    // Every composition, cheapest recompute first; the first estimate level with a fitting
    // candidate is the optimum (all candidates of that level are evaluated for the tie-break).
    std::vector<std::pair<double, Counts>> all;
    for (int64_t a = 0; a <= L; ++a)
      for (int64_t b = 0; a + b <= L; ++b)
        for (int64_t d = 0; a + b + d <= L; ++d) {
          const Counts c{a, b, d, L - a - b - d};
          all.emplace_back(estimate(c), c);
        }
    std::stable_sort(all.begin(), all.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    for (size_t i = 0; i < all.size(); ++i) {
      if (best_key && all[i].first > best_key->first) break;
      consider(all[i].second, evaluate(all[i].second));
    }
  } else {
    // Mixtures of a heavier policy h (on the last n blocks) and a lighter one l (on the first
    // L - n): the peak grows with n, so the largest fitting n is found by
    // interpolation search (largest_fitting_between).
    for (size_t h = 0; h < kNumAuto; ++h)
      for (size_t l = h + 1; l < kNumAuto; ++l) {
        if (!fits(uniform[l])) continue;
        auto mixture = [&](int64_t n) {
          Counts c{};
          c[h] = n;
          c[l] = L - n;
          return c;
        };
        int64_t ok = L;  // the largest fitting n
        if (!fits(uniform[h]))
          ok = largest_fitting_between(
              {0, uniform[l].peak.total_bytes}, {L, uniform[h].peak.total_bytes}, best.budget_bytes,
              [&](int64_t n) { return evaluate(mixture(n)).peak.total_bytes; });
        const DryRun ok_run = evaluate(mixture(ok));
        consider(mixture(ok), ok_run);
      }
  }
  REMAT_ASSERT(best_key.has_value(), "auto: uniform \"full\" fits but no candidate was taken");
  return best;
}

}  // namespace remat
