// `remat-train bench`: how close a training step of a config gets to the machine's floor. It
// runs one warm-up step and N timed steps of the real trainer with per-op timing on
// (Backend::set_op_timing), measures the SGEMM rate after each step (CPU), and prints for the
// median step: its time, the FLOPs it executed and the model's FLOPs (MFU's count), their rates
// as shares of SGEMM (each step against the floor measured beside it), and where the time went by
// op family, with the recompute phase's share, the time making the batch took (reading or
// generating it, and uploading it) and the time no op accounts for (allocation, offload copies,
// gradient sync, host overhead). Timings are reports, never pass/fail. --json prints the same
// report as one JSON document. On an asynchronous backend (CUDA) op timing synchronizes after
// every op, which makes the step slower than a training step: there the N timed steps follow N
// steps with op timing off, whose median is the step a run gets (untimed_step_ms); the rows
// break down the op-timed step, which they add up to.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "cmd/commands.h"
#include "cmd/report.h"
#include "data/dataset.h"
#include "engine/config/config.h"
#include "engine/core/machine.h"
#include "engine/core/units.h"
#include "engine/cpu/blas_kernel.h"
#include "engine/devices.h"
#include "engine/experiments/interrupt.h"
#include "engine/planner/planner.h"
#include "engine/remat/executor.h"
#include "engine/training/trainer.h"
#include "layers/models.h"

namespace remat::cli {
namespace {

// The op families a step's time is reported by, in print order: a key for --json, the text
// report's label, and the ops it sums.
struct OpFamily {
  const char* key;
  const char* label;
  std::vector<std::string> ops;
};
const std::vector<OpFamily>& op_families() {
  static const std::vector<OpFamily> families = {
      // The linear ops carry the bias, where fused the GELU/ReLU, and LoRA's adapters
      // (engine/core/ops/linear.h, lora.h).
      {"linear",
       "linear (GEMM, fused bias + activation, LoRA)",
       {"linear_forward", "linear_backward"}},
      // attention_delta: the rowsum(dO * O) the backward takes (engine/core/ops/attention.h); the
      // ring
      // ops are context-parallel attention (engine/core/ops/ring_attention.h).
      {"attention",
       "attention",
       {"attention_forward", "attention_backward", "attention_delta", "ring_split",
        "ring_block_forward", "ring_finish", "ring_block_backward", "ring_merge_grad"}},
      // The key stays "layernorm" (bench --json readers), the family holds every normalization.
      {"layernorm",
       "layernorm (and RMSNorm, q/k norm)",
       {"layernorm_forward", "layernorm_backward", "rmsnorm_forward", "rmsnorm_backward",
        "qk_norm_forward", "qk_norm_backward"}},
      {"activation",
       "activation (GELU/ReLU unfused, SwiGLU)",
       {"activation_forward", "activation_backward", "swiglu_forward", "swiglu_backward"}},
      {"loss", "loss (LM head / MSE)", {"lm_head_loss", "mse_loss"}},
      {"optimizer", "optimizer (AdamW, norm)", {"adamw_update", "sum_squares"}},
      {"other",
       "other (embedding, add, dropout, copy, fill)",
       {"embedding_forward", "embedding_backward", "add", "dropout", "copy", "fill"}},
  };
  return families;
}

struct TimedStep {
  double ms = 0;
  double data_ms = 0;      // of ms: making the batch
  double flops = 0;        // the ops' (training work), as executed
  double model_flops = 0;  // the model's (engine/core/backend.h): the same under every policy
  double data_flops = 0;   // making the batch's, outside the ops (the regression's teacher GEMM)
  double sgemm_flops = 0;  // the floor, measured right after this step (CPU; 0 elsewhere)
  Backend::OpTimes ops;

  // `counted` FLOPs in this step's time as a share of the floor beside it (0 without a floor).
  double share_of_floor(double counted) const {
    return sgemm_flops > 0 ? counted / (ms / 1e3) / sgemm_flops : 0;
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One row of the breakdown: an op family, an op no family lists, the batch, or no op.
struct FamilyRow {
  std::string key, label;
  double seconds = 0, flops = 0;
  int64_t calls = 0;
};

// CPU steal above which bench says its timings are disturbed.
constexpr double kStealWarning = 0.05;

// What bench measured, computed once and printed as text or as JSON.
struct BenchReport {
  std::string config, device, policy;
  bool frozen = false;  // LoRA: model FLOPs leave out the frozen weights' gradients
  int64_t batch_size = 0;
  int64_t grad_accum = 1;  // micro-batches of batch_size rows per step
  int64_t seq_len = 0;     // a GPT's; 0 for the MLP, whose throughput is in rows
  int64_t loss_chunk = 0;  // rows per LM-head chunk as run (0: the MLP, or the default)
  std::vector<TimedStep> steps;
  TimedStep median_step;       // the step of median time, whose ops the rows break down
  std::vector<double> floors;  // FLOP/s, one per step (empty off the CPU)
  double floor = 0, floor_lowest = 0, floor_highest = 0;
  double share = 0;             // median of the steps' shares of their own floor (0 without floors)
  double model_share = 0;       // the same of the model FLOPs: MFU against the SGEMM floor
  double share_with_data = 0;   // the same with the batch's FLOPs counted too
  double throughput = 0;        // tokens (GPT) or rows (MLP) per second of the median step
  std::vector<FamilyRow> rows;  // the families, unlisted ops, data and no op: they add up
  std::vector<double> untimed_ms;  // steps with op timing off (asynchronous backends only)
  double untimed_step_ms = 0;      // their median (0: none were run)
  FamilyRow recompute;             // of all the rows: the recompute phase (calls 0: none)
  std::vector<std::string> warnings;
};

std::vector<FamilyRow> breakdown(const TimedStep& med, FamilyRow& recompute) {
  std::map<std::string, FamilyRow> by_op;
  double timed_s = 0;
  for (const auto& [key, t] : med.ops) {
    FamilyRow& r = by_op[key.first];
    r.seconds += t.seconds;
    r.flops += t.flops;
    r.calls += t.calls;
    timed_s += t.seconds;
    if (key.second == Phase::Recompute) {
      recompute.seconds += t.seconds;
      recompute.flops += t.flops;
      recompute.calls += t.calls;
    }
  }
  std::vector<FamilyRow> rows;
  for (const OpFamily& family : op_families()) {
    FamilyRow sum{family.key, family.label};
    for (const auto& op : family.ops)
      if (auto it = by_op.find(op); it != by_op.end()) {
        sum.seconds += it->second.seconds;
        sum.flops += it->second.flops;
        sum.calls += it->second.calls;
      }
    if (sum.calls) rows.push_back(sum);
  }
  // An op no family lists still shows, by name, so that no op's time is left out of the rows; what
  // no op accounts for (allocation, offload copies, gradient sync, host) is the last row.
  for (auto& [op, r] : by_op) {
    const bool listed = std::any_of(op_families().begin(), op_families().end(), [&](const auto& f) {
      return std::find(f.ops.begin(), f.ops.end(), op) != f.ops.end();
    });
    if (!listed) {
      r.key = op;
      r.label = op + " (in no family above)";
      rows.push_back(r);
    }
  }
  // The batch is not an op: the synthetic regression's (normals and its teacher's GEMM, FLOPs the
  // step's count leaves out but this row's rate counts) shows here, where it would otherwise hide
  // among "no op".
  const double step_s = med.ms / 1e3, data_s = med.data_ms / 1e3;
  rows.push_back({"data", "data (batch: read or generated, uploaded)", data_s, med.data_flops, 1});
  rows.push_back({"no_op", "no op (allocation, copies, sync, host)",
                  std::max(0.0, step_s - timed_s - data_s), 0, 0});
  recompute.key = "recompute";
  recompute.label = "of all the above: recompute phase";
  return rows;
}

BenchReport make_report(const Config& cfg, const std::string& device, std::vector<TimedStep> steps,
                        std::vector<double> untimed_ms, int64_t units_per_step) {
  BenchReport r;
  r.config = cfg.path;
  r.device = device;
  r.policy = cfg.remat.plan.empty() ? cfg.remat.policy : "per-block plan";
  r.frozen = cfg.lora.enabled();
  r.batch_size = cfg.train.batch_size;
  r.grad_accum = cfg.train.grad_accum;
  r.seq_len = cfg.model.has_sequence() ? cfg.train.seq_len : 0;
  r.loss_chunk = cfg.train.loss_chunk;
  std::vector<const TimedStep*> sorted;
  for (const auto& s : steps) sorted.push_back(&s);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->ms < b->ms; });
  r.median_step = *sorted[sorted.size() / 2];
  r.throughput = static_cast<double>(units_per_step) / (r.median_step.ms / 1e3);
  // The floor is measured after every step and each step is read against its own: a VM whose
  // speed drifts by tens of percent from one minute to the next then still gives a fair share.
  std::vector<double> shares, model_shares, shares_with_data;
  for (const auto& s : steps)
    if (s.sgemm_flops > 0) {
      r.floors.push_back(s.sgemm_flops);
      shares.push_back(s.share_of_floor(s.flops));
      model_shares.push_back(s.share_of_floor(s.model_flops));
      shares_with_data.push_back(s.share_of_floor(s.flops + s.data_flops));
    }
  if (!r.floors.empty()) {
    r.floor = median(r.floors);
    r.floor_lowest = *std::min_element(r.floors.begin(), r.floors.end());
    r.floor_highest = *std::max_element(r.floors.begin(), r.floors.end());
    r.share = median(shares);
    r.model_share = median(model_shares);
    r.share_with_data = median(shares_with_data);
    if (std::string w = unsteady_floor_warning(r.floor_lowest, r.floor_highest); !w.empty())
      r.warnings.push_back(std::move(w));
  }
  // On a VM the host may run other guests on these cores: the steps and the floors both slow
  // down, but not by the same factor from one second to the next.
  if (const double steal = cpu_steal_share(); steal >= kStealWarning)
    r.warnings.push_back(fmt::format(
        "warning: the hypervisor took {:.0f}% of this machine's CPU time during the run (steal in "
        "/proc/stat): these timings are below the machine's own; compare only runs made side by "
        "side, or rerun when the host is quiet",
        100 * steal));
  r.rows = breakdown(r.median_step, r.recompute);
  r.steps = std::move(steps);
  r.untimed_ms = std::move(untimed_ms);
  if (!r.untimed_ms.empty()) r.untimed_step_ms = median(r.untimed_ms);
  return r;
}

void print_text(const BenchReport& r) {
  const double step_s = r.median_step.ms / 1e3;
  fmt::print("bench {}: {}, policy {}, batch {}{}{}\n", r.config, r.device, r.policy, r.batch_size,
             r.seq_len > 0 ? fmt::format(" x seq_len {}", r.seq_len) : std::string(),
             r.grad_accum > 1 ? fmt::format(" x grad_accum {}", r.grad_accum) : std::string());
  if (!r.floors.empty())
    fmt::print(
        "floor: SGEMM 2048^3 {:.1f} GFLOP/s (median of {}, one after each step: {:.1f} to "
        "{:.1f}; {})\n",
        r.floor / 1e9, r.floors.size(), r.floor_lowest / 1e9, r.floor_highest / 1e9, load_note());
  for (const auto& w : r.warnings) fmt::print("{}\n", w);
  fmt::print("step:  {:.1f} ms (median of {}, after 1 warm-up), {:.0f} {}/s\n", r.median_step.ms,
             r.steps.size(), r.throughput, r.seq_len > 0 ? "tokens" : "rows");
  if (r.untimed_step_ms > 0)
    fmt::print(
        "       {:.1f} ms without the sync after each op (median of {} steps before the timed "
        "ones): the timed step is {:+.0f}%\n",
        r.untimed_step_ms, r.untimed_ms.size(), 100 * (r.median_step.ms / r.untimed_step_ms - 1));
  fmt::print("       {} executed -> {:.1f} GFLOP/s{}\n", format_flops(r.median_step.flops),
             r.median_step.flops / step_s / 1e9,
             r.floors.empty() ? std::string()
                              : fmt::format(", {:.0f}% of SGEMM (median of the steps' shares of "
                                            "their own floor)",
                                            100 * r.share));
  fmt::print("       {} model FLOPs (3x the forward's + the loss head's{}) -> {:.1f} GFLOP/s{}\n",
             format_flops(r.median_step.model_flops),
             r.frozen ? ", less the frozen weights' gradients" : "",
             r.median_step.model_flops / step_s / 1e9,
             r.floors.empty() ? std::string()
                              : fmt::format(", {:.0f}% of SGEMM (MFU)", 100 * r.model_share));
  // The teacher's GEMM is work the step does too, though not training: its share apart, so that
  // the lines above stay the training's alone.
  if (r.median_step.data_flops > 0)
    fmt::print("       with the {} making the batch -> {:.1f} GFLOP/s{}\n",
               format_flops(r.median_step.data_flops),
               (r.median_step.flops + r.median_step.data_flops) / step_s / 1e9,
               r.floors.empty() ? std::string()
                                : fmt::format(", {:.0f}% of SGEMM", 100 * r.share_with_data));
  fmt::print("\n{:<44} {:>7} {:>10} {:>7} {:>9}\n", "op family (median step)", "calls", "ms",
             "share", "GFLOP/s");
  auto row = [&](const FamilyRow& f) {
    fmt::print("{:<44} {:>7} {:>10.1f} {:>6.1f}% {:>9}\n", f.label, f.calls, f.seconds * 1e3,
               100 * f.seconds / step_s,
               f.flops > 0 && f.seconds > 0 ? fmt::format("{:.1f}", f.flops / f.seconds / 1e9)
                                            : std::string("-"));
  };
  for (const auto& f : r.rows) row(f);
  if (r.recompute.calls) row(r.recompute);
}

// The same report for scripts (scripts/bench_targets.py reads it): rates in GFLOP/s, times in
// ms, shares as fractions; null where a number does not exist (no floor off the CPU).
void print_json(const BenchReport& r) {
  using json = nlohmann::ordered_json;  // keys in the order written: the headline first
  const double step_s = r.median_step.ms / 1e3;
  auto gflops = [](double flops, double seconds) -> json {
    return flops > 0 && seconds > 0 ? json(flops / seconds / 1e9) : json(nullptr);
  };
  auto row = [&](const FamilyRow& f) {
    return json{{"key", f.key},
                {"label", f.label},
                {"calls", f.calls},
                {"ms", f.seconds * 1e3},
                {"share_of_step", f.seconds / step_s},
                {"gflops", gflops(f.flops, f.seconds)}};
  };
  json steps = json::array();
  for (const auto& s : r.steps)
    steps.push_back(
        {{"ms", s.ms},
         {"data_ms", s.data_ms},
         {"gflop", s.flops / 1e9},
         {"model_gflop", s.model_flops / 1e9},
         {"data_gflop", s.data_flops / 1e9},
         {"sgemm_gflops", s.sgemm_flops > 0 ? json(s.sgemm_flops / 1e9) : json()},
         {"share_of_sgemm", s.sgemm_flops > 0 ? json(s.share_of_floor(s.flops)) : json()},
         {"model_share_of_sgemm",
          s.sgemm_flops > 0 ? json(s.share_of_floor(s.model_flops)) : json()}});
  json rows = json::array();
  for (const auto& f : r.rows) rows.push_back(row(f));
  double load[1] = {0};
  const double steal = cpu_steal_share();
  const json out = {
      {"config", r.config},
      {"device", r.device},
      {"policy", r.policy},
      {"batch_size", r.batch_size},
      {"grad_accum", r.grad_accum},
      {"seq_len", r.seq_len > 0 ? json(r.seq_len) : json()},
      // The LM head's rows per chunk when the config or the budget set it (null: the default).
      {"loss_chunk", r.loss_chunk > 0 ? json(r.loss_chunk) : json()},
      {"step_ms", r.median_step.ms},
      // The step without a sync after each op (asynchronous backends; null on the CPU, whose
      // ops are synchronous and timed at no cost).
      {"untimed_step_ms", r.untimed_step_ms > 0 ? json(r.untimed_step_ms) : json()},
      {"untimed_steps_ms", r.untimed_ms},
      {"throughput", r.throughput},
      {"throughput_unit", r.seq_len > 0 ? "tokens/s" : "rows/s"},
      {"gflop", r.median_step.flops / 1e9},
      {"achieved_gflops", gflops(r.median_step.flops, step_s)},
      {"sgemm_gflops", r.floors.empty() ? json()
                                        : json{{"median", r.floor / 1e9},
                                               {"lowest", r.floor_lowest / 1e9},
                                               {"highest", r.floor_highest / 1e9}}},
      {"share_of_sgemm", r.floors.empty() ? json() : json(r.share)},
      {"model_gflop", r.median_step.model_flops / 1e9},
      {"model_share_of_sgemm", r.floors.empty() ? json() : json(r.model_share)},
      {"data_gflop", r.median_step.data_flops / 1e9},
      {"share_of_sgemm_with_data", r.floors.empty() ? json() : json(r.share_with_data)},
      {"steps", steps},
      {"op_families", rows},
      {"recompute", r.recompute.calls ? row(r.recompute) : json()},
      {"load_average", getloadavg(load, 1) == 1 ? json(load[0]) : json()},
      {"cpu_steal", steal >= 0 ? json(steal) : json()},
      {"warnings", r.warnings},
  };
  fmt::print("{}\n", json_text(out, 2));
}

}  // namespace

int run_bench(const BenchOptions& opt) {
  std::vector<std::string> sets = opt.overrides;
  const int64_t steps = opt.steps > 0 ? opt.steps : 3;
  // A median of a million steps is as exact as it gets; more would overflow the schedule below.
  constexpr int64_t kMaxSteps = 1'000'000;
  if (steps > kMaxSteps)
    throw ConfigError(fmt::format(
        "--steps {}: [bench] at most {} timed steps. Fix: give fewer (the median of a few is "
        "the step's time)",
        steps, kMaxSteps));
  // The schedule covers the warm-up (and the untimed steps of an asynchronous backend).
  add_flag_override(sets, fmt::format("train.steps={}", 2 * steps + 1),
                    fmt::format("--steps {} (train.steps = {})", steps, 2 * steps + 1));
  Config cfg = load_config(opt.config_path, sets);
  refuse_several_ranks(cfg, "bench");
  BackendChoice choice = make_backend(cfg);
  Backend& be = *choice.backend;
  const Planner planner(run_plan_target(be), make_run_parts);
  if (const std::optional<AutoPlan> chosen = resolve_auto(planner, cfg); chosen && !chosen->fits)
    throw OutOfMemory(chosen->infeasible_message());
  resolve_loss_chunk(planner, cfg);
  const WorkspaceTarget device = be.workspace_target();
  const bool cpu_floor = device.device == DeviceKind::Cpu;
  std::unique_ptr<Model> model = make_model(cfg, be);
  std::unique_ptr<DataSource> data = make_data_source(cfg);
  data->open();
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data);
  experiments::install_interrupt_handler();

  if (!opt.json) fmt::print(stderr, "bench: warm-up step...\n");
  trainer.step();
  // A synchronous backend times its ops for the cost of reading a clock; an asynchronous one
  // waits for every op, so its step as a run takes it is measured first, with op timing off.
  std::vector<double> untimed_ms;
  if (device.device != DeviceKind::Cpu)
    for (int64_t s = 0; s < steps && !experiments::interrupted(); ++s) {
      if (!opt.json) fmt::print(stderr, "bench: untimed step {}/{}...\n", s + 1, steps);
      untimed_ms.push_back(trainer.step().step_ms);
    }
  be.set_op_timing(true);
  std::vector<TimedStep> timed;
  for (int64_t s = 0; s < steps && !experiments::interrupted(); ++s) {
    if (!opt.json) fmt::print(stderr, "bench: step {}/{}...\n", s + 1, steps);
    be.reset_op_times();
    be.reset_cost();
    const StepMetrics m = trainer.step();
    TimedStep t{m.step_ms, m.data_ms, 0, model_flops(be), m.data_flops, 0, be.op_times()};
    for (int p = 0; p < kNumPhases; ++p) t.flops += be.cost(static_cast<Phase>(p)).flops;
    if (cpu_floor) t.sgemm_flops = cpu::measure_sgemm_flops(device.threads, 2048);
    timed.push_back(std::move(t));
  }
  if (timed.empty()) return 128 + experiments::interrupt_signal();
  const BenchReport report =
      make_report(cfg, be.describe(), std::move(timed), std::move(untimed_ms),
                  // Every micro-batch of the step counts, as train's tokens_per_s counts them.
                  cfg.train.batch_size * cfg.train.grad_accum *
                      (cfg.model.has_sequence() ? cfg.train.seq_len : 1));
  if (opt.json)
    print_json(report);
  else
    print_text(report);
  return experiments::interrupted() ? 128 + experiments::interrupt_signal() : 0;
}

}  // namespace remat::cli
