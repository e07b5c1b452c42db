// `remat-train bench`: how close a training step of a config gets to the machine's floor. It
// runs one warm-up step and N timed steps of the real trainer with per-op timing on
// (Backend::set_op_timing), measures the SGEMM rate after each step (CPU), and prints for the
// median step: its time, the FLOPs it executed, their rate as a share of SGEMM (each step against
// the floor measured beside it), and where the time went by op family, with the recompute phase's
// share, the time making the batch took (reading or generating it, and uploading it) and the time
// no op accounts for (allocation, offload copies, gradient sync, host overhead).
// Timings are reports, never pass/fail.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <vector>

#include "cmd/commands.h"
#include "cmd/report.h"
#include "data/dataset.h"
#include "engine/config.h"
#include "engine/cpu/blas_kernel.h"
#include "engine/devices.h"
#include "engine/experiments/interrupt.h"
#include "engine/machine_load.h"
#include "engine/planner.h"
#include "engine/remat.h"
#include "engine/trainer.h"
#include "engine/units.h"
#include "layers/models.h"

namespace remat::cli {
namespace {

// The op families a step's time is reported by, in print order.
const std::vector<std::pair<const char*, std::vector<std::string>>>& op_families() {
  static const std::vector<std::pair<const char*, std::vector<std::string>>> families = {
      // The linear ops carry the bias and, where fused, the GELU/ReLU (engine/ops/linear.h).
      {"linear (GEMM, fused bias + activation)", {"linear_forward", "linear_backward"}},
      // attention_delta: the rowsum(dO * O) the backward takes (engine/ops/attention.h); the ring
      // ops are context-parallel attention (engine/ops/ring_attention.h).
      {"attention",
       {"attention_forward", "attention_backward", "attention_delta", "ring_split",
        "ring_block_forward", "ring_finish", "ring_block_backward", "ring_merge_grad"}},
      {"layernorm", {"layernorm_forward", "layernorm_backward"}},
      {"activation (GELU/ReLU, unfused)", {"activation_forward", "activation_backward"}},
      {"loss (LM head / MSE)", {"lm_head_loss", "mse_loss"}},
      {"optimizer (AdamW, norm)", {"adamw_update", "sum_squares"}},
      {"other (embedding, add, dropout, copy, fill)",
       {"embedding_forward", "embedding_backward", "add", "dropout", "copy", "fill"}},
  };
  return families;
}

struct TimedStep {
  double ms = 0;
  double data_ms = 0;  // of ms: making the batch
  double flops = 0;
  double sgemm_flops = 0;  // the floor, measured right after this step (CPU; 0 elsewhere)
  Backend::OpTimes ops;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct FamilyRow {
  double seconds = 0, flops = 0;
  int64_t calls = 0;
};

// CPU steal above which bench says its timings are disturbed.
constexpr double kStealWarning = 0.05;

void print_report(const Config& cfg, const std::string& device, const std::vector<TimedStep>& steps,
                  int64_t tokens) {
  std::vector<const TimedStep*> sorted;
  for (const auto& s : steps) sorted.push_back(&s);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->ms < b->ms; });
  const TimedStep& med = *sorted[sorted.size() / 2];
  const double step_s = med.ms / 1e3;

  const bool gpt = cfg.model.kind == ModelKind::Gpt;
  fmt::print("bench {}: {}, policy {}, batch {}{}\n", cfg.path, device,
             cfg.remat.plan.empty() ? cfg.remat.policy : "per-block plan", cfg.train.batch_size,
             gpt ? fmt::format(" x seq_len {}", cfg.train.seq_len) : std::string());
  // The floor is measured after every step and each step is read against its own: a VM whose
  // speed drifts by tens of percent from one minute to the next then still gives a fair share.
  std::vector<double> floors, shares;
  for (const auto& s : steps)
    if (s.sgemm_flops > 0) {
      floors.push_back(s.sgemm_flops);
      shares.push_back(s.flops / (s.ms / 1e3) / s.sgemm_flops);
    }
  const double sgemm_flops = floors.empty() ? 0.0 : median(floors);
  if (sgemm_flops > 0) {
    const auto [lowest, highest] = std::minmax_element(floors.begin(), floors.end());
    fmt::print(
        "floor: SGEMM 2048^3 {:.1f} GFLOP/s (median of {}, one after each step: {:.1f} to "
        "{:.1f}; {})\n",
        sgemm_flops / 1e9, floors.size(), *lowest / 1e9, *highest / 1e9, load_note());
    if (const std::string w = unsteady_floor_warning(*lowest, *highest); !w.empty())
      fmt::print("{}\n", w);
  }
  // On a VM the host may run other guests on these cores: the steps and the floors both slow
  // down, but not by the same factor from one second to the next.
  if (const double steal = cpu_steal_share(); steal >= kStealWarning)
    fmt::print(
        "warning: the hypervisor took {:.0f}% of this machine's CPU time during the run (steal in "
        "/proc/stat): these timings are below the machine's own; compare only runs made side by "
        "side, or rerun when the host is quiet\n",
        100 * steal);
  fmt::print("step:  {:.1f} ms (median of {}, after 1 warm-up), {:.0f} {}/s\n", med.ms,
             steps.size(), static_cast<double>(tokens) / step_s, gpt ? "tokens" : "rows");
  fmt::print("       {} executed -> {:.1f} GFLOP/s{}\n\n", format_flops(med.flops),
             med.flops / step_s / 1e9,
             sgemm_flops > 0 ? fmt::format(", {:.0f}% of SGEMM (median of the steps' shares of "
                                           "their own floor)",
                                           100 * median(shares))
                             : std::string());

  std::map<std::string, FamilyRow> by_op;
  FamilyRow recompute, timed;
  for (const auto& [key, t] : med.ops) {
    FamilyRow& r = by_op[key.first];
    r.seconds += t.seconds;
    r.flops += t.flops;
    r.calls += t.calls;
    timed.seconds += t.seconds;
    if (key.second == Phase::Recompute) {
      recompute.seconds += t.seconds;
      recompute.flops += t.flops;
      recompute.calls += t.calls;
    }
  }
  fmt::print("{:<44} {:>7} {:>10} {:>7} {:>9}\n", "op family (median step)", "calls", "ms", "share",
             "GFLOP/s");
  auto row = [&](const std::string& name, const FamilyRow& r) {
    fmt::print("{:<44} {:>7} {:>10.1f} {:>6.1f}% {:>9}\n", name, r.calls, r.seconds * 1e3,
               100 * r.seconds / step_s,
               r.flops > 0 && r.seconds > 0 ? fmt::format("{:.1f}", r.flops / r.seconds / 1e9)
                                            : std::string("-"));
  };
  for (const auto& [family, ops] : op_families()) {
    FamilyRow sum;
    for (const auto& op : ops)
      if (auto it = by_op.find(op); it != by_op.end()) {
        sum.seconds += it->second.seconds;
        sum.flops += it->second.flops;
        sum.calls += it->second.calls;
      }
    if (sum.calls) row(family, sum);
  }
  // An op no family lists still shows, by name, so that no op's time is left out of the rows; what
  // no op accounts for (allocation, offload copies, gradient sync, host) is the last row.
  for (const auto& [op, r] : by_op) {
    const bool listed = std::any_of(op_families().begin(), op_families().end(), [&](const auto& f) {
      return std::find(f.second.begin(), f.second.end(), op) != f.second.end();
    });
    if (!listed) row(op + " (in no family above)", r);
  }
  // The batch is not an op: the synthetic regression's (normals and its teacher's GEMM, FLOPs the
  // step's count leaves out) shows here, where it would otherwise hide among "no op".
  const double data_s = med.data_ms / 1e3;
  row("data (batch: read or generated, uploaded)", {data_s, 0, 1});
  row("no op (allocation, copies, sync, host)",
      {std::max(0.0, step_s - timed.seconds - data_s), 0, 0});
  if (recompute.calls) row("of all the above: recompute phase", recompute);
}

}  // namespace

int run_bench(const BenchOptions& opt) {
  std::vector<std::string> sets = opt.overrides;
  const int64_t steps = opt.steps > 0 ? opt.steps : 3;
  sets.push_back(fmt::format("train.steps={}", steps + 1));  // the schedule covers the warm-up
  Config cfg = load_config(opt.config_path, sets);
  refuse_several_ranks(cfg, "bench");
  BackendChoice choice = make_backend(cfg);
  Backend& be = *choice.backend;
  const Planner planner(run_plan_target(be), make_run_parts);
  if (const std::optional<AutoPlan> chosen = resolve_auto(planner, cfg); chosen && !chosen->fits)
    throw OutOfMemory(chosen->infeasible_message());
  const WorkspaceTarget device = be.workspace_target();
  const bool cpu_floor = device.device == DeviceKind::Cpu;
  std::unique_ptr<Model> model = make_model(cfg, be);
  std::unique_ptr<DataSource> data = make_data_source(cfg);
  data->open();
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data);
  experiments::install_interrupt_handler();

  fmt::print(stderr, "bench: warm-up step...\n");
  trainer.step();
  be.set_op_timing(true);
  std::vector<TimedStep> timed;
  for (int64_t s = 0; s < steps && !experiments::interrupted(); ++s) {
    fmt::print(stderr, "bench: step {}/{}...\n", s + 1, steps);
    be.reset_op_times();
    be.reset_cost();
    const StepMetrics m = trainer.step();
    TimedStep t{m.step_ms, m.data_ms, 0, 0, be.op_times()};
    for (int p = 0; p < kNumPhases; ++p) t.flops += be.cost(static_cast<Phase>(p)).flops;
    if (cpu_floor) t.sgemm_flops = cpu::measure_sgemm_flops(device.threads, 2048);
    timed.push_back(std::move(t));
  }
  if (timed.empty()) return 128 + experiments::interrupt_signal();
  print_report(cfg, be.describe(), timed,
               cfg.train.batch_size * (cfg.model.kind == ModelKind::Gpt ? cfg.train.seq_len : 1));
  return experiments::interrupted() ? 128 + experiments::interrupt_signal() : 0;
}

}  // namespace remat::cli
