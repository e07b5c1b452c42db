// The planner (see engine/planner/planner.h).
#include "engine/planner/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <utility>

#include "engine/config/lora.h"
#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/devices.h"
#include "engine/planner/budget_search.h"
#include "engine/remat/weight_stream.h"
#include "engine/training/checkpoint.h"

namespace remat {

PlanTarget run_plan_target(Backend& be) {
  PlanTarget t;
  t.name = be.name();
  const WorkspaceTarget w = be.workspace_target();
  t.count = CountTarget{w.device, be.act_dtype(), w.threads};
  t.device_bytes = be.pool().budget_bytes();
  t.host_bytes = be.host_pool().budget_bytes();
  t.host_note = "the run's host pool";
  return t;
}

const std::vector<GpuPreset>& gpu_presets() {
  // Host RAM: what one card of a common node has beside it (an H200 here has 128 GiB); set
  // device.host_memory for yours. Links: pinned cudaMemcpy reaches ~80% of the PCIe line rate
  // (5.0 x16: 63 GB/s, 4.0 x16: 32 GB/s per direction). Peaks: the vendors' dense figures.
  // AdamW on the host (kAssumedHostUpdateBytesPerS, every preset): 100 GB/s of host memory
  // traffic, about a third of what a two-socket DDR5 server streams; an assumption until a device
  // run measures the step with the weights offloaded.
  constexpr uint64_t GiB = 1ull << 30;
  // Between ranks: SXM cards talk over NVLink inside a node of 8 (line rate per direction per
  // card) and over one 400 Gb/s (Hopper) or 200 Gb/s (A100) InfiniBand port each across nodes;
  // PCIe cards over PCIe inside the node and 100 Gb/s Ethernet across.
  static const std::vector<GpuPreset> presets = {
      {"h200", 150754820096ull, 128 * GiB, 50, "PCIe 5.0 x16", 989.4, 66.9,  // 143771 MiB
       8, 450, "NVLink 4", 50, "InfiniBand NDR 400 Gb/s"},
      {"h100-80gb", 85045231616ull, 128 * GiB, 50, "PCIe 5.0 x16", 989.4, 66.9,  // 81105 MiB
       8, 450, "NVLink 4", 50, "InfiniBand NDR 400 Gb/s"},
      {"a100-80gb", 85097660416ull, 128 * GiB, 25, "PCIe 4.0 x16", 312, 19.5,  // 81155 MiB
       8, 300, "NVLink 3", 25, "InfiniBand HDR 200 Gb/s"},
      {"a100-40gb", 42505273344ull, 64 * GiB, 25, "PCIe 4.0 x16", 312, 19.5,  // 40536 MiB
       8, 300, "NVLink 3", 25, "InfiniBand HDR 200 Gb/s"},
      {"l4", 23580639232ull, 64 * GiB, 25, "PCIe 4.0 x16", 121, 30.3,  // 22488 MiB
       8, 25, "PCIe 4.0 x16", 12.5, "Ethernet 100 Gb/s"},
      // GeForce tensor cores run bf16 with fp32 accumulation at half their fp16-accumulate rate
      // (330.3 TFLOP/s dense): 165.2; the CUDA cores' fp32 rate is 82.6 (Ada's datasheet).
      {"rtx4090", 25393692672ull, 64 * GiB, 25, "PCIe 4.0 x16", 165.2, 82.6,  // 24217 MiB
       8, 25, "PCIe 4.0 x16", 12.5, "Ethernet 100 Gb/s"},
  };
  return presets;
}

PlanTarget plan_target(const Config& cfg, const std::string& gpu, std::optional<uint64_t> memory) {
  // `memory` is the pool budget; device_bytes adds the runtime reserve on top.
  PlanTarget t;
  const bool cuda = !gpu.empty() || cfg.device.backend == BackendKind::Cuda;
  t.host_bytes = host_memory_bytes();
  t.host_note = "this machine's memory";
  if (cuda) {
    if (!gpu.empty()) {
      for (const auto& p : gpu_presets())
        if (gpu == p.name) {
          t.device_bytes = p.bytes;
          t.host_bytes = p.host_bytes;
          t.host_note = fmt::format("assumed beside one {}", p.name);
          t.link_bytes_per_s = p.link_gb_per_s * 1e9;
          t.host_update_bytes_per_s = kAssumedHostUpdateBytesPerS;
          const bool fp32 = cfg.device.precision == Precision::Fp32;
          t.peak_flops_per_s = (fp32 ? p.fp32_tflops : p.bf16_tflops) * 1e12;
          t.rates_note = fmt::format("{} ~{:.0f} GB/s per direction, {} dense peak {:.1f} TFLOP/s",
                                     p.link_name, p.link_gb_per_s, fp32 ? "fp32" : "bf16",
                                     fp32 ? p.fp32_tflops : p.bf16_tflops);
          t.gpus_per_node = p.gpus_per_node;
          t.peer_bytes_per_s = p.peer_gb_per_s * 1e9;
          t.peer_name = p.peer_name;
          t.network_bytes_per_s = p.network_gb_per_s * 1e9;
          t.network_name = p.network_name;
        }
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
  if (cfg.device.host_memory_bytes) {
    t.host_bytes = cfg.device.host_memory_bytes;
    t.host_note = "device.host_memory";
  }
  return t;
}

double DryRun::recompute_overhead() const {
  const double base = cost[static_cast<size_t>(Phase::Forward)].flops +
                      cost[static_cast<size_t>(Phase::Loss)].flops +
                      cost[static_cast<size_t>(Phase::Backward)].flops;
  return base > 0 ? cost[static_cast<size_t>(Phase::Recompute)].flops / base : 0.0;
}

double DryRun::flops() const {
  double f = 0;
  for (const OpCost& c : cost) f += c.flops;
  return f;
}

double DryRun::total(double OpCost::*field) const {
  double b = 0;
  for (const OpCost& c : cost) b += c.*field;
  return b;
}

CopyTime copy_time(const DryRun& run, const PlanTarget& target, double flops_per_s) {
  CopyTime t;
  if (target.link_bytes_per_s <= 0 || target.peak_flops_per_s <= 0) return t;
  t.modelled = true;
  const double rate = flops_per_s > 0 ? flops_per_s : target.peak_flops_per_s;
  auto phase = [&](Phase p) { return run.cost[static_cast<size_t>(p)]; };
  // The phases whose copies can hide behind their own compute.
  const std::vector<std::vector<Phase>> overlaps = {
      {Phase::Forward, Phase::Loss}, {Phase::Recompute, Phase::Backward}, {Phase::Optimizer}};
  for (const auto& group : overlaps) {
    double bytes = 0, flops = 0;
    for (Phase p : group) {
      bytes += phase(p).to_host_bytes + phase(p).to_device_bytes;
      flops += phase(p).flops;
    }
    const double copy = bytes / target.link_bytes_per_s;
    const double compute = flops / rate;
    t.copy_s += copy;
    t.compute_s += compute;
    t.exposed_s += std::max(0.0, copy - compute);
  }
  // AdamW on the host overlaps the next step's forward in fetch order
  // (engine/training/trainer.cpp's HostAdamW): the first two uses wait for their whole update, the
  // rest only beyond that compute; the gradient norm before it overlaps nothing.
  if (run.host_updated_params > 0 && target.host_update_bytes_per_s > 0) {
    const auto seconds = [&](int64_t params, double bytes_per_param) {
      return static_cast<double>(params) * bytes_per_param / target.host_update_bytes_per_s;
    };
    t.host_update_s = seconds(run.host_updated_params, kHostUpdateBytesPerParam);
    t.host_norm_s = seconds(run.host_updated_params, kHostNormBytesPerParam);
    const double first = seconds(run.host_first_use_params, kHostUpdateBytesPerParam);
    const double forward = (phase(Phase::Forward).flops + phase(Phase::Loss).flops) / rate;
    t.exposed_s += t.host_norm_s + first + std::max(0.0, t.host_update_s - first - forward);
  }
  return t;
}

ExchangeTime exchange_time(const DryRun& run, const PlanTarget& target) {
  ExchangeTime t;
  if (run.ranks <= 1 || target.peer_bytes_per_s <= 0 || target.peak_flops_per_s <= 0) return t;
  t.modelled = true;
  // A group of ranks goes no faster than its slowest hop: across nodes once it spans two.
  auto link = [&](int ranks, std::string& name) {
    const bool one_node = ranks <= target.gpus_per_node;
    const double rate = one_node ? target.peer_bytes_per_s : target.network_bytes_per_s;
    name = fmt::format("{} ~{:.0f} GB/s per direction",
                       one_node ? target.peer_name : target.network_name, rate / 1e9);
    return rate;
  };
  const double ring_rate = link(run.context_ranks, t.ring_link);
  const double grad_rate = link(run.ranks, t.gradient_link);
  auto phase = [&](Phase p) { return run.cost[static_cast<size_t>(p)]; };
  // Gradients go out during the recompute + backward, the ring in every phase with attention. A
  // sharded optimizer sends half of its bytes there (the reduce-scatter) and half after the
  // update (the weights' all-gather), where little compute hides them.
  const double grad_bytes = static_cast<double>(run.grad_sent_bytes);
  const double backward_share = run.sharded_optimizer ? 0.5 : 1.0;
  const std::vector<std::vector<Phase>> overlaps = {
      {Phase::Forward, Phase::Loss}, {Phase::Recompute, Phase::Backward}, {Phase::Optimizer}};
  for (size_t g = 0; g < overlaps.size(); ++g) {
    double ring = 0, flops = 0;
    for (Phase p : overlaps[g]) {
      ring += phase(p).ring_bytes;
      flops += phase(p).flops;
    }
    const double share = g == 1 ? backward_share : g == 2 ? 1.0 - backward_share : 0.0;
    const double grads = share * grad_bytes / grad_rate;
    const double compute = flops / target.peak_flops_per_s;
    t.ring_s += ring / ring_rate;
    t.gradient_s += grads;
    t.compute_s += compute;
    t.exposed_s += std::max(0.0, ring / ring_rate + grads - compute);
  }
  return t;
}

bool Planner::fits(const DryRun& run) const {
  return run.peak.total_bytes <= target_.pool_budget() &&
         run.host_peak.total_bytes <= target_.host_bytes;
}

uint64_t Planner::search_peak(const DryRun& run) const {
  const uint64_t device = run.peak.total_bytes;
  const uint64_t host = run.host_peak.total_bytes;
  if (host == 0) return device;
  if (target_.host_bytes == 0) return UINT64_MAX;
  // host * budget / host_budget in doubles (monotone, close to affine for the searches), then
  // clamped so that it is <= budget exactly when host <= host_budget.
  const uint64_t budget = target_.pool_budget();
  const double scaled = std::ceil(static_cast<double>(host) * static_cast<double>(budget) /
                                  static_cast<double>(target_.host_bytes));
  uint64_t host_scaled = scaled >= 1.8e19 ? UINT64_MAX : static_cast<uint64_t>(scaled);
  host_scaled = host <= target_.host_bytes ? std::min(host_scaled, budget)
                                           : std::max(host_scaled, budget + 1);
  return std::max(device, host_scaled);
}

namespace {

// `eval`'s step, as cmd/eval_command.cpp runs it: the model (built by the factory, weights and
// all), one batch of the data source's shape, then the executor's forward-only pass.
void eval_step(Backend& be, Model& model, DataSource& data, bool predictions) {
  be.reset_cost();
  be.pool().set_phase("eval data");
  const Batch batch = data.next(be, 0);
  model.set_training(false);
  forward_loss(be, model, batch, predictions);
}

}  // namespace

DryRun Planner::dry_run(const Config& cfg, bool track_largest, StepKind kind) const {
  CountBackend be(target_.count, UINT64_MAX);
  be.pool().set_track_largest(track_largest);
  RunParts parts = factory_(cfg, be);
  Model& model = *parts.model;
  DryRun r;
  r.policy = cfg.remat.plan.empty() ? cfg.remat.policy : "per-block";
  std::unique_ptr<Trainer> trainer;
  if (kind == StepKind::Train) {
    trainer = std::make_unique<Trainer>(cfg.train, resolve_remat_plan(cfg, model), be, model,
                                        *parts.data, data_parallel(cfg, nullptr));
    be.reset_cost();
    trainer->step();
    be.pool().set_phase("checkpoint");
    if (!cfg.checkpoint.dir.empty())
      allocate_checkpoint_staging(be, model);  // freed at once, as in a run
  } else {
    eval_step(be, model, *parts.data, kind == StepKind::EvalPredictions);
    r.policy = "eval";  // no backward: the remat policy plays no part
  }
  r.peak = be.pool().peak_snapshot();
  r.host_peak = be.host_pool().peak_snapshot();
  for (int i = 0; i < kNumPhases; ++i)
    r.cost[static_cast<size_t>(i)] = be.cost(static_cast<Phase>(i));
  r.n_params = model.n_params();
  r.n_trainable_params = model.n_trainable_params();
  for (Param& p : model.params())
    if (p.on_host) r.host_updated_params += p.value.tensor().numel();
  if (r.host_updated_params > 0) {
    const std::vector<ParamUse> uses = eval_uses(model);
    std::vector<const Param*> first;  // the first two uses' parameters, each once
    for (size_t k = 0; k < std::min<size_t>(2, uses.size()); ++k)
      for (const Param* p : uses[k].params)
        if (std::find(first.begin(), first.end(), p) == first.end()) first.push_back(p);
    for (const Param* p : first) r.host_first_use_params += p->value.tensor().numel();
  }
  r.ranks = static_cast<int>(cfg.parallel.world_ranks());
  r.context_ranks = static_cast<int>(cfg.parallel.context);
  if (trainer) {
    r.grad_sent_bytes = trainer->sent_bytes_per_step();
    r.sharded_optimizer = trainer->sharded_moments() != nullptr;
  }
  return r;
}

int64_t Planner::longest_seq_len(const Config& cfg, const DryRun* at_cfg, StepKind kind) const {
  if (!cfg.model.has_sequence()) return 0;
  const int64_t hi = cfg.model.position == PositionKind::Learned ? cfg.model.n_ctx : (1ll << 26);
  return largest_fitting(
      hi, target_.pool_budget(),
      [&](int64_t t) {
        Config c = cfg;
        c.train.seq_len = t;
        if (c.data.task == "copy" && t < 4) c.data.task = "random";
        return search_peak(dry_run(c, false, kind));
      },
      at_cfg ? std::optional(PeakProbe{cfg.train.seq_len, search_peak(*at_cfg)}) : std::nullopt);
}

int64_t Planner::largest_batch(const Config& cfg, const DryRun* at_cfg) const {
  // Data parallel: the batch grows by whole rows per rank (each rank's peak is what fits).
  const int64_t ranks = cfg.parallel.data_ranks();
  return ranks * largest_fitting(
                     (1ll << 20) / ranks, target_.pool_budget(),
                     [&](int64_t rows) {
                       Config c = cfg;
                       c.train.batch_size = rows * ranks;
                       return search_peak(dry_run(c, false));
                     },
                     at_cfg ? std::optional(PeakProbe{local_batch_size(cfg), search_peak(*at_cfg)})
                            : std::nullopt);
}

// ---- auto ----

namespace {

// auto's candidates, from the most memory (no recompute) to the least (the most recompute): each
// policy keeps a subset of the previous one's tensors (engine/config/policy.h).
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
  std::string host;
  if (offload != OffloadKind::None && host_peak_bytes > 0)
    host = fmt::format(", {} in host memory: peak {} of {}", offloaded_what(offload),
                       format_bytes(host_peak_bytes), format_bytes(host_budget_bytes));
  return fmt::format(
      "chose {}{}{} (recompute +{:.2f}%, predicted peak {} of budget {}{})", mix(),
      every > 1 ? fmt::format(", checkpoint segments of {} blocks", every) : std::string(),
      tile_tokens > 0 ? fmt::format(", MLP in chunks of {} tokens", tile_tokens) : std::string(),
      100.0 * recompute_overhead, format_bytes(peak_bytes), format_bytes(budget_bytes), host);
}

std::string smaller_lora_base_fix(const Config& cfg) {
  if (!cfg.lora.enabled() || cfg.lora.base == "nf4") return "";
  return cfg.lora.base == "bf16"
             ? ", or keep the frozen base in NF4 (lora.base = \"nf4\")"
             : ", or keep the frozen base in bf16 or NF4 (lora.base = \"bf16\" or \"nf4\")";
}

std::string AutoPlan::infeasible_message() const {
  std::string how;
  if (every > 1) how += fmt::format(", checkpoint segments of {} blocks", every);
  if (tile_tokens > 0) how += fmt::format(", the MLP in chunks of {} tokens", tile_tokens);
  if (offload != OffloadKind::None)
    how += fmt::format(", {} in host memory (host peak {} of budget {})", config_name(offload),
                       format_bytes(min_host_peak_bytes), format_bytes(host_budget_bytes));
  const bool host_short = offload != OffloadKind::None && min_host_peak_bytes > host_budget_bytes;
  return fmt::format(
      "[planner] remat.policy = \"auto\": no plan fits the budget of {} ({} B); the smallest "
      "achievable peak is {} ({} B, every block \"full\"{}). Fix: set device.memory = {} or "
      "more{}, or lower train.batch_size or train.seq_len{}; `remat-train plan` shows what fits.",
      format_bytes(budget_bytes), budget_bytes, format_bytes(min_peak_bytes), min_peak_bytes, how,
      min_peak_bytes,
      host_short ? fmt::format(" and device.host_memory = {} or more", min_host_peak_bytes)
                 : std::string(),
      smaller_base);
}

int64_t default_tile_tokens(int64_t rows) {
  return std::clamp<int64_t>(rows / 8, 64, 4096);
}

std::vector<int64_t> auto_tile_tokens(int64_t rows) {
  std::vector<int64_t> tiles{default_tile_tokens(rows)};
  const int64_t smallest = std::max<int64_t>(64, rows / 64);
  while (tiles.back() / 2 >= smallest) tiles.push_back(tiles.back() / 2);
  return tiles;
}

int64_t loss_rows_per_rank(const Config& cfg) {
  const auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / std::max<int64_t>(b, 1); };
  return ceil_div(cfg.train.batch_size, cfg.parallel.data_ranks()) *
         ceil_div(cfg.train.seq_len, cfg.parallel.context);
}

int64_t default_loss_chunk(const Config& cfg) {
  return default_loss_chunk_rows(loss_rows_per_rank(cfg), cfg.model.vocab_size);
}

std::vector<int64_t> loss_chunk_candidates(int64_t rows, int64_t vocab, int64_t largest) {
  const int64_t small = default_loss_chunk_rows(rows, vocab);
  std::vector<int64_t> candidates;
  if (small >= rows) return candidates;  // one chunk already
  for (int64_t r = std::min((rows + 63) / 64 * 64, largest); r > small; r /= 2)
    candidates.push_back(r);
  return candidates;
}

int64_t largest_loss_chunk(const Planner& planner, const Config& cfg) {
  if (cfg.train.loss_chunk > 0 || !cfg.model.has_sequence()) return 0;
  if (planner.target().count.device == DeviceKind::Cuda) return kGpuLossChunkRows;
  return lora::lm_head_frozen(cfg.model, cfg.lora) ? kCpuFrozenHeadChunkRows : 0;
}

std::optional<int64_t> resolve_loss_chunk(const Planner& planner, Config& cfg) {
  const int64_t largest = largest_loss_chunk(planner, cfg);
  if (largest == 0) return std::nullopt;
  const std::vector<int64_t> candidates =
      loss_chunk_candidates(loss_rows_per_rank(cfg), cfg.model.vocab_size, largest);
  const auto fits_with = [&](size_t i) {
    Config c = cfg;
    c.train.loss_chunk = candidates[i];
    return planner.fits(planner.dry_run(c, false));
  };
  if (candidates.empty()) return std::nullopt;
  // Short contexts: the largest fits, one dry run. Otherwise the smallest index (largest chunk)
  // that fits, if the last one does.
  size_t lo = 0, hi = candidates.size() - 1;
  if (fits_with(0))
    hi = 0;
  else if (hi == 0 || !fits_with(hi))
    return std::nullopt;
  else
    lo = 1;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (fits_with(mid))
      hi = mid;
    else
      lo = mid + 1;
  }
  cfg.train.loss_chunk = candidates[lo];
  return candidates[lo];
}

AutoPlan choose_auto(const Planner& planner, const Config& cfg) {
  // What auto may add when no per-block plan fits, cheapest first: MLP tiling (a little GEMM
  // efficiency), in smaller chunks while it does not fit, then checkpoints in host memory (copies
  // that hide behind compute), then the AdamW moments too (copies at the update that do not),
  // then the weights and gradients (fetched per block; AdamW on the host's cores; one rank only).
  // Offload only where host memory is not the device's own (a GPU target); settings the config
  // makes itself are kept.
  std::vector<Config> candidates{cfg};
  if (cfg.model.has_sequence() && cfg.remat.tile_tokens == 0)
    for (int64_t tile : auto_tile_tokens(cfg.train.batch_size * cfg.train.seq_len)) {
      Config tiled = cfg;
      tiled.remat.tile_tokens = tile;
      candidates.push_back(tiled);
    }
  if (!planner.target().host_is_device() && cfg.remat.offload == OffloadKind::None)
    for (OffloadKind k : {OffloadKind::Checkpoints, OffloadKind::CheckpointsOptimizer,
                          OffloadKind::CheckpointsOptimizerWeights}) {
      // Sharded moments stay on the device (config validation refuses both together), and
      // weights on the host train on one rank.
      if (k != OffloadKind::Checkpoints && cfg.parallel.shard_optimizer) break;
      if (k == OffloadKind::CheckpointsOptimizerWeights && cfg.parallel.world_ranks() > 1) break;
      // Nor with gradient accumulation (their gradients are replaced after each micro-batch).
      if (k == OffloadKind::CheckpointsOptimizerWeights && cfg.train.grad_accum > 1) break;
      Config offloaded = candidates.back();
      offloaded.remat.offload = k;
      candidates.push_back(offloaded);
    }
  // Segments of two blocks keep half the checkpoints (full recomputes each block's forward once
  // either way) for two blocks' activations at the backward's peak: for when the checkpoints fill
  // the host (or the card), after everything that keeps one block's working set.
  // Paired: the last candidate without offload (the smallest MLP chunk) and each offloading one.
  if (cfg.model.n_layer >= 2) {
    const size_t n = candidates.size();
    for (size_t i = 0; i < n; ++i) {
      const bool last_without_offload =
          candidates[i].remat.offload == OffloadKind::None &&
          (i + 1 == n || candidates[i + 1].remat.offload != OffloadKind::None);
      if (candidates[i].remat.offload == OffloadKind::None && !last_without_offload) continue;
      Config paired = candidates[i];
      paired.remat.every = 2;
      candidates.push_back(paired);
    }
  }
  AutoPlan best;
  int64_t n_dry_runs = 0;
  for (const Config& c : candidates) {
    AutoPlan p = choose_auto_plan(planner, c);
    p.tile_tokens = c.remat.tile_tokens;
    p.offload = c.remat.offload;
    p.every = c.remat.every;
    n_dry_runs += p.n_dry_runs;
    // When nothing fits, the smallest device peak is the one to name.
    if (p.fits || best.policies.empty() || p.min_peak_bytes < best.min_peak_bytes)
      best = std::move(p);
    if (best.fits) break;
  }
  best.n_dry_runs = n_dry_runs;
  best.smaller_base = smaller_lora_base_fix(cfg);
  return best;
}

std::optional<AutoPlan> resolve_auto(const Planner& planner, Config& cfg) {
  if (cfg.remat.policy != "auto" || !cfg.remat.plan.empty()) return std::nullopt;
  AutoPlan chosen = choose_auto(planner, cfg);
  cfg.remat.plan = chosen.policies;
  cfg.remat.tile_tokens = chosen.tile_tokens;
  cfg.remat.offload = chosen.offload;
  cfg.remat.every = chosen.every;
  return chosen;
}

Config with_block_plan(const Config& cfg, const std::vector<std::string>& policies, int64_t every) {
  Config c = cfg;
  c.remat.policy = "none";  // remat.plan overrides it; "none" keeps the config free of "auto"
  c.remat.plan = policies;
  c.remat.every = every;
  c.remat.blocks.clear();
  c.remat.save.clear();
  return c;
}

Config with_auto_plan(const Config& cfg, const AutoPlan& chosen) {
  Config c = with_block_plan(cfg, chosen.policies, chosen.every);
  c.remat.tile_tokens = chosen.tile_tokens;
  c.remat.offload = chosen.offload;
  return c;
}

AutoPlan choose_auto_plan(const Planner& planner, const Config& cfg) {
  const int64_t L = cfg.model.n_layer;
  AutoPlan best;
  best.budget_bytes = planner.target().pool_budget();
  best.host_budget_bytes = planner.target().host_bytes;
  std::map<Counts, DryRun> runs;  // each composition is dry-run once
  auto evaluate = [&](const Counts& counts) {
    auto it = runs.find(counts);
    if (it == runs.end()) {
      ++best.n_dry_runs;
      it = runs.emplace(counts, planner.dry_run(
                                    with_block_plan(cfg, arrange(counts), cfg.remat.every), false))
               .first;
    }
    return it->second;
  };
  auto take = [&](const Counts& counts, const DryRun& r) {
    best.policies = arrange(counts);
    best.fits = planner.fits(r);
    best.peak_bytes = r.peak.total_bytes;
    best.host_peak_bytes = r.host_peak.total_bytes;
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
  const auto fits = [&](const DryRun& r) { return planner.fits(r); };
  best.min_peak_bytes = uniform[kNumAuto - 1].peak.total_bytes;
  best.min_host_peak_bytes = uniform[kNumAuto - 1].host_peak.total_bytes;
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
              {0, planner.search_peak(uniform[l])}, {L, planner.search_peak(uniform[h])},
              best.budget_bytes,
              [&](int64_t n) { return planner.search_peak(evaluate(mixture(n))); });
        const DryRun ok_run = evaluate(mixture(ok));
        consider(mixture(ok), ok_run);
      }
  }
  REMAT_ASSERT(best_key.has_value(), "auto: uniform \"full\" fits but no candidate was taken");
  return best;
}

}  // namespace remat
