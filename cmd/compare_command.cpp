// `remat-train compare`: the checkpointing tutorial's exercise as a command. Trains the same
// steps under each policy and prints one table: measured and predicted peak, median ms/step,
// memory saved and time added relative to `none`, and whether losses and gradients were
// bitwise identical to `none` at the same tiling (they must be on the CPU: remat changes no
// number, while tiling sums row tiles in another order, so a tiled policy is compared with
// `none` at its tile size, which compare runs too).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

#include "cmd/commands.h"
#include "cmd/report.h"
#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/devices.h"
#include "engine/experiments/interrupt.h"
#include "engine/planner/planner.h"
#include "layers/models.h"

namespace remat::cli {
namespace {

struct CompareRow {
  std::string policy;
  int64_t tile_tokens = 0;  // the rows' tiling: policies compare bitwise within one
  int64_t steps_done = 0;   // fewer than asked when a signal stopped the run
  uint64_t measured = 0, predicted = 0;
  double median_ms = 0;
  double recompute_overhead = 0;
  bool oom = false;       // did not fit the budget: recorded with its predicted peak, not fatal
  bool host_oom = false;  // the budget it did not fit is the host's (remat.offload)
  uint64_t predicted_host = 0;  // the host pool's predicted peak
  uint64_t measured_host = 0;   // and its measured one (what remat.offload moved there)
  bool host_is_ram = false;     // the CPU backend: the host pool is in the same RAM
  std::string message;          // the out-of-memory error
  std::vector<double> losses;
  std::vector<float> grads;  // all parameter gradients of the last step, concatenated
};

void train_policy(const Config& cfg, Backend& be, int64_t steps, CompareRow& row);

// `head_chunk`: the LM head's rows per chunk every policy runs, so that the policies differ in
// remat alone. The first policy that fits sizes it to the budget (train's rule, resolve_loss_chunk:
// none comes first and holds the most at the head, so the others fit it too); unset until then.
CompareRow run_policy(const Config& base, const std::string& policy, int64_t steps,
                      std::optional<int64_t>& head_chunk) {
  Config cfg = with_policy(base, policy);
  BackendChoice choice = make_backend(cfg);
  Backend& be = *choice.backend;
  const Planner planner(run_plan_target(be), make_run_parts);
  CompareRow row;
  row.policy = policy;
  // auto: the plan `train` would run with this budget (its tiling too).
  const std::optional<AutoPlan> chosen = resolve_auto(planner, cfg);
  row.tile_tokens = cfg.remat.tile_tokens;
  if (chosen && !chosen->fits) {
    row.oom = true;
    row.predicted = chosen->min_peak_bytes;
    row.message = chosen->infeasible_message();
    return row;
  }
  std::optional<DryRun> at_default;  // the plan, unless the chunk grows
  if (head_chunk) {
    cfg.train.loss_chunk = *head_chunk;
  } else if (cfg.train.loss_chunk == 0 && cfg.model.has_sequence()) {
    at_default = planner.dry_run(cfg, false);
    if (planner.fits(*at_default)) {
      head_chunk = resolve_loss_chunk(planner, cfg);
      if (head_chunk)
        at_default.reset();
      else
        head_chunk = default_loss_chunk(cfg);
    }
  }
  const DryRun plan = at_default ? *at_default : planner.dry_run(cfg, false);
  row.predicted = plan.peak.total_bytes;
  row.predicted_host = plan.host_peak.total_bytes;
  row.recompute_overhead = plan.recompute_overhead();
  // The policy that does not fit is the one a comparison most needs to show: a row, not an exit.
  try {
    train_policy(cfg, be, steps, row);
  } catch (const OutOfMemory& e) {
    row.oom = true;
    row.message = e.what();
    row.host_oom = row.message.find("on the host") != std::string::npos;
  }
  return row;
}

void train_policy(const Config& cfg, Backend& be, int64_t steps, CompareRow& row) {
  RunParts parts = make_run_parts(cfg, be);
  parts.data->open();
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *parts.model), be, *parts.model, *parts.data);
  std::vector<double> ms;
  for (int64_t s = 0; s < steps && !experiments::interrupted(); ++s) {
    StepMetrics m = trainer.step();
    row.losses.push_back(m.loss);
    // The first step of a policy pays what no later one does (its pool's first touch of memory,
    // the kernels' first calls): timed only when it is the only step.
    if (s > 0 || steps == 1) ms.push_back(m.step_ms);
    ++row.steps_done;
  }
  for (Param& p : parts.model->params()) {
    if (!p.trainable()) continue;  // a frozen parameter has no gradient
    std::vector<float> g(static_cast<size_t>(p.grad.tensor().numel()));
    be.download(g.data(), p.grad);
    row.grads.insert(row.grads.end(), g.begin(), g.end());
  }
  std::sort(ms.begin(), ms.end());
  row.median_ms = ms.empty() ? 0 : ms[ms.size() / 2];
  row.measured = be.pool().peak_bytes();
  row.measured_host = be.host_pool().peak_bytes();
  row.host_is_ram = be.device_is_host();
}

// The row a row's bits are compared with: the first that ran to the end at its tiling, a none
// (compare adds one at each tiling a policy asks for) or, when none does not fit, the row the
// table's header names. Null when there is none: a tiling only auto chose, or whose none did not
// fit (the row is not its own reference).
const CompareRow* bits_reference(const std::vector<CompareRow>& rows, const CompareRow& r) {
  const auto ran = [&](const CompareRow& c) { return !c.oom && c.steps_done == r.steps_done; };
  const auto first = std::find_if(rows.begin(), rows.end(), ran);
  for (const CompareRow& c : rows)
    if (ran(c) && c.tile_tokens == r.tile_tokens)
      return &c == &r && &c != &*first && !c.policy.starts_with("none") ? nullptr : &c;
  return nullptr;
}

bool same_bits(const CompareRow& a, const CompareRow& b) {
  if (a.oom || b.oom) return false;
  return a.losses.size() == b.losses.size() && a.grads.size() == b.grads.size() &&
         std::memcmp(a.losses.data(), b.losses.data(), a.losses.size() * sizeof(double)) == 0 &&
         std::memcmp(a.grads.data(), b.grads.data(), a.grads.size() * sizeof(float)) == 0;
}

// What a row's last column says: its bits against its reference's, or why there is no answer.
std::string bits_verdict(const std::vector<CompareRow>& rows, const CompareRow& r) {
  const CompareRow* ref = bits_reference(rows, r);
  if (ref == nullptr) return "-";
  if (!same_bits(r, *ref)) return "NO";
  return r.tile_tokens > 0 ? fmt::format("yes (tile {})", r.tile_tokens) : "yes (bitwise)";
}

void print_json(const std::vector<CompareRow>& rows, const CompareRow& ref, double none_peak,
                int64_t steps) {
  using json = nlohmann::ordered_json;  // keys in the order written: the policy first
  json out = json::array();
  for (const auto& r : rows) {
    const bool interrupted = !r.oom && r.steps_done < steps;
    json j = {{"policy", r.policy},
              {"status", r.oom         ? "oom"
                         : interrupted ? "interrupted"
                                       : "ok"},
              {"predicted_peak_bytes", r.predicted},
              {"recompute_flops_overhead", r.recompute_overhead}};
    if (r.oom) {
      j["memory"] = r.host_oom ? "host" : "device";
      if (r.host_oom) j["predicted_host_peak_bytes"] = r.predicted_host;
      j["message"] = r.message;
    } else if (interrupted) {
      j["steps_done"] = r.steps_done;
    } else {
      j["measured_peak_bytes"] = r.measured;
      if (r.measured_host > 0) j["measured_host_peak_bytes"] = r.measured_host;
      j["median_step_ms"] = r.median_ms;
      j["memory_saved"] = 1.0 - static_cast<double>(r.measured) / none_peak;
      j["time_added"] = r.median_ms / ref.median_ms - 1.0;
      const CompareRow* bits = bits_reference(rows, r);
      j["identical_to_none"] = bits != nullptr && same_bits(r, *bits);
      if (bits != nullptr && bits->policy != "none") j["compared_with"] = bits->policy;
    }
    out.push_back(j);
  }
  fmt::print("{}\n", json_text(out, 2));
}

void print_table(const Config& cfg, const std::vector<CompareRow>& rows, const CompareRow& ref,
                 double none_peak) {
  fmt::print(
      "compare {} | {} steps | batch {}{}{} | {}\n", cfg.path, cfg.train.steps,
      cfg.train.batch_size,
      cfg.model.has_sequence() ? fmt::format(" x seq_len {}", cfg.train.seq_len) : std::string(),
      tiling_note(cfg), load_note());
  size_t w = 10;  // the policy column fits its longest entry ("full:tile=1024:offload=...")
  for (const auto& r : rows) w = std::max(w, r.policy.size());
  const std::string same_as = ref.policy == rows.front().policy ? "none" : ref.policy;
  fmt::print("{:<{}} {:>13} {:>13} {:>11} {:>8} {:>8} {:>10} {:>18}\n", "policy", w,
             "measured peak", "predicted", "ms/step", "saved", "time", "recompute",
             "same as " + same_as);
  for (const auto& r : rows) {
    if (r.oom) {  // the predicted peak of the pool that did not fit
      fmt::print("{:<{}} {:>13} {:>13} {:>11} {:>8} {:>8} {:>9.1f}% {:>18}\n", r.policy, w,
                 r.host_oom ? "host OOM" : "out of memory",
                 format_bytes(r.host_oom ? r.predicted_host : r.predicted), "-", "-", "-",
                 100.0 * r.recompute_overhead, "-");
      continue;
    }
    if (r.steps_done < cfg.train.steps) {
      fmt::print("{:<{}} interrupted after {} of {} steps: not compared\n", r.policy, w,
                 r.steps_done, cfg.train.steps);
      continue;
    }
    fmt::print("{:<{}} {:>13} {:>13} {:>11.1f} {:>7.1f}% {:>+7.1f}% {:>9.1f}% {:>18}\n", r.policy,
               w, format_bytes(r.measured),
               r.predicted == r.measured ? "= measured" : format_bytes(r.predicted), r.median_ms,
               100.0 * (1.0 - static_cast<double>(r.measured) / none_peak),
               100.0 * (r.median_ms / ref.median_ms - 1.0), 100.0 * r.recompute_overhead,
               bits_verdict(rows, r));
  }
  if (rows.front().oom)
    fmt::print("none does not fit the budget (predicted peak {}); saved is relative to that\n",
               format_bytes(rows.front().predicted));
  // On the CPU, offloading moves tensors from one pool of the RAM to another: "saved" is the
  // device pool's alone, which the same run on a GPU would save; say what the RAM holds.
  for (const auto& r : rows)
    if (!r.oom && r.host_is_ram && r.measured_host > 0)
      fmt::print(
          "{}: the host pool held {} more at its peak, in the same RAM on the CPU (device pool "
          "and host pool together: {}, {:.1f}% saved); on a GPU the device saves what the table "
          "shows\n",
          r.policy, format_bytes(r.measured_host), format_bytes(r.measured + r.measured_host),
          100.0 * (1.0 - static_cast<double>(r.measured + r.measured_host) / none_peak));
  if (std::any_of(rows.begin(), rows.end(), [](const CompareRow& r) { return r.tile_tokens > 0; }))
    fmt::print(
        "a tiled policy is compared with none at the same tile_tokens (tiling sums row tiles in "
        "another order: within fp32 rounding of the untiled run, never bitwise)\n");
}

// The policies to run: none first, and a none at each tile size a policy asks for that none does
// not run at yet (a tiled policy's bits are none's at that tiling).
std::vector<std::string> with_references(const Config& cfg, std::vector<std::string> policies) {
  if (policies.front() != "none") policies.insert(policies.begin(), "none");
  std::vector<int64_t> tiles;  // the tilings a none runs at
  for (size_t i = 0; i < policies.size(); ++i) {
    const Config c = with_policy(cfg, policies[i]);
    const int64_t tile = c.remat.tile_tokens;
    if (std::find(tiles.begin(), tiles.end(), tile) != tiles.end()) continue;
    if (c.remat.policy != "none") {
      policies.insert(policies.begin() + static_cast<std::ptrdiff_t>(i),
                      fmt::format("none:tile={}", tile));
      ++i;
    }
    tiles.push_back(tile);
  }
  return policies;
}

}  // namespace

int run_compare(const CompareOptions& opt) {
  // Each policy of --policies replaces the config's: a policy or plan given with --set would be
  // dropped without a word.
  for (const std::string& set : opt.overrides) {
    std::string key = set.substr(0, set.find('='));
    std::erase(key, ' ');
    if (key == "remat.policy" || key == "remat.plan")
      throw ConfigError(fmt::format(
          "--set {}: [compare] runs each policy of --policies in place of {}, so it would be "
          "ignored. Fix: name the policies with --policies (e.g. --policies none,full,auto); a "
          "plan of one policy per block trains with train --set {}",
          set, key, set));
  }
  std::vector<std::string> sets = opt.overrides;
  if (opt.steps > 0) {
    add_flag_override(sets, fmt::format("train.steps={}", opt.steps),
                      fmt::format("--steps {}", opt.steps));
  }
  const Config cfg = load_config(opt.config_path, sets);
  refuse_several_ranks(cfg, "compare");
  std::vector<std::string> defaults = builtin_policies();
  if (cfg.model.kind == ModelKind::Mlp)  // no attention: save_attn would be full
    defaults.erase(std::find(defaults.begin(), defaults.end(), "save_attn"));
  const std::vector<std::string> policies =
      with_references(cfg, parse_policies(opt.policies, defaults, "compare"));
  // Each policy's config as train would read it: a combination train refuses (none with
  // offload) is refused here too, before the first step.
  for (const std::string& p : policies) {
    std::vector<std::string> with_p = sets;
    for (std::string& o : policy_overrides(cfg, p)) with_p.push_back(std::move(o));
    try {
      (void)load_config(opt.config_path, with_p);
    } catch (const ConfigError& e) {  // named by the entry the user wrote, not its --set
      const std::string what = e.what();
      const size_t tag = what.find("[config]");
      throw ConfigError(
          fmt::format("--policies {}: {}", p, tag == std::string::npos ? what : what.substr(tag)));
    }
  }
  experiments::install_interrupt_handler();

  std::vector<CompareRow> rows;
  std::optional<int64_t> head_chunk;
  for (const auto& p : policies) {
    if (experiments::interrupted()) break;  // the rows so far, marked, then 128 + signal
    if (!opt.json) fmt::print(stderr, "compare: {} ({} steps)...\n", p, cfg.train.steps);
    rows.push_back(run_policy(cfg, p, cfg.train.steps, head_chunk));
  }
  // Bits and time are compared with the first policy that ran (none, when it fits); memory with
  // none's peak, measured or, when it does not fit, predicted.
  const auto ran =
      std::find_if(rows.begin(), rows.end(), [](const CompareRow& r) { return !r.oom; });
  if (ran == rows.end())
    throw OutOfMemory(fmt::format("[compare] no policy fits the budget: {}", rows.back().message));
  const CompareRow& ref = *ran;
  const double none_peak =
      static_cast<double>(rows.front().oom ? rows.front().predicted : rows.front().measured);
  if (opt.json)
    print_json(rows, ref, none_peak, cfg.train.steps);
  else
    print_table(cfg, rows, ref, none_peak);
  for (const auto& r : rows) {
    const CompareRow* bits = bits_reference(rows, r);
    if (!r.oom && bits != nullptr && !same_bits(r, *bits) &&
        cfg.device.backend != BackendKind::Cuda)
      return 1;
  }
  return experiments::interrupted() ? 128 + experiments::interrupt_signal() : 0;
}

}  // namespace remat::cli
