// `remat-train fit`: the longest seq_len that fits the memory budget, per policy, from the
// planner (binary search over dry runs: instant), with the predicted peak, the recompute
// overhead and an estimated tokens/s; then a recommendation. `--measure` confirms each answer
// on this machine: one real step at the predicted maximum (must fit) and one at maximum + 1
// (must run out of memory), each in a child process (engine/experiments/trial.h).
//
// The tokens/s figure is an estimate, not a measurement: FLOPs of one dry-run step divided by
// a rate. On the CPU the rate is this machine's SGEMM GFLOP/s, timed once here (an upper bound:
// attention, LayerNorm and the small GEMMs of a narrow model run slower than a large SGEMM);
// for a --gpu preset it is the card's nominal dense bf16 rate times kGpuEfficiency.
#include <fcntl.h>  // renameat2
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>
#include <vector>

#include "cmd/commands.h"
#include "cmd/report.h"
#include "cmd/train_lora.h"
#include "engine/config/config.h"
#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/cpu/blas_kernel.h"
#include "engine/experiments/interrupt.h"
#include "engine/experiments/trial.h"
#include "engine/planner/planner.h"
#include "layers/models.h"

namespace remat::cli {
namespace {

/// Fraction of the nominal dense bf16 rate a well-tuned training step sustains (model FLOPs
/// utilization); 0.4 is typical of single-GPU Transformer training with flash attention.
constexpr double kGpuEfficiency = 0.4;

struct NominalRate {
  const char* gpu;
  double flops_per_s;  // dense bf16 tensor-core peak, no sparsity (vendor datasheets)
};
constexpr NominalRate kNominalRates[] = {
    {"h200", 989e12},      {"h100-80gb", 989e12}, {"a100-80gb", 312e12},
    {"a100-40gb", 312e12}, {"l4", 121e12},        {"rtx4090", 165e12},
};

struct Rate {
  double flops_per_s = 0;  // 0: no estimate
  std::string note;
};

Rate estimate_rate(const PlanTarget& t) {
  for (const auto& n : kNominalRates)
    if (t.name == n.gpu)
      return {n.flops_per_s * kGpuEfficiency,
              fmt::format("{} nominal {:.0f} TFLOP/s bf16 dense x efficiency {:.1f} (estimate)",
                          n.gpu, n.flops_per_s / 1e12, kGpuEfficiency)};
  if (t.count.device == DeviceKind::Cpu && t.name == "cpu") {
    const double r = cpu::measure_sgemm_flops(t.count.threads);
    return {r,
            fmt::format(
                "this CPU's SGEMM {:.1f} GFLOP/s on {} threads, measured now at {} (an optimistic "
                "estimate)",
                r / 1e9, t.count.threads, load_note())};
  }
  return {0, "no rate known for this device: use --gpu NAME for an estimate"};
}

double step_flops(const DryRun& r) {
  double f = 0;
  for (const auto& c : r.cost) f += c.flops;
  return f;
}

// The step's FLOPs at the rate, plus what its host copies and a host AdamW (weights offloaded)
// add beyond the compute they overlap (copy_time at the same rate).
double est_tokens_per_s(const DryRun& r, const Config& c, const Rate& rate,
                        const PlanTarget& target) {
  const double f = step_flops(r);
  if (rate.flops_per_s <= 0 || f <= 0) return 0;
  const double step_s = f / rate.flops_per_s + copy_time(r, target, rate.flops_per_s).exposed_s;
  // A step trains grad_accum micro-batches, each of batch_size x seq_len tokens.
  return static_cast<double>(c.train.grad_accum * c.train.batch_size * c.train.seq_len) / step_s;
}

/// "2,598,161 tokens", or "64k tokens (65,536)": exact, with the k/M form (k = 1024) a
/// --seq-len or --seq-lens would take when there is one. Never a rounded "2.5M".
std::string say_tokens(int64_t n) {
  const std::string exact = format_grouped(n);
  const std::string short_form = format_count(n);
  return short_form == std::to_string(n) ? exact + " tokens"
                                         : fmt::format("{} tokens ({})", short_form, exact);
}

std::string fmt_rate(double tok_s) {
  return tok_s > 0 ? fmt::format("{:.0f}", tok_s) : std::string("-");
}

struct Measured {
  bool done = false;
  std::optional<int>
      at_max_exit;  // exit code of the step at the predicted maximum (want 0); absent if it is 0
  std::optional<int> above_exit;  // ... at maximum + 1 (want 3); absent when capped by n_ctx
  uint64_t measured_peak_bytes = 0;
  std::string message;  // the child's error when something else went wrong
  bool agrees() const {
    return (!at_max_exit || *at_max_exit == 0) && (!above_exit || *above_exit == 3);
  }
};

struct FitRow {
  std::string policy;
  std::vector<std::string> sets;      // the overrides that run this row (--measure's trials)
  Config cfg;                         // the policy's config at the configured seq_len
  std::optional<AutoPlan> auto_plan;  // the row of auto's search (when no listed policy fits)
  int64_t longest = 0;
  bool capped = false;  // learned positions: longest == n_ctx, not the budget
  DryRun at_longest;    // dry run at `longest` (when > 0)
  DryRun at_configured;
  bool fits_configured = false;
  double tok_s_longest = 0, tok_s_configured = 0;
  Measured measured;
};

/// " (a step ~31 min at the estimated rate)": what the longest context costs in time, which a
/// length that fits can make impractical. Empty without a rate.
std::string say_step_time(const FitRow& r) {
  if (r.tok_s_longest <= 0) return "";
  const double s =
      static_cast<double>(r.longest * r.cfg.train.batch_size * r.cfg.train.grad_accum) /
      r.tok_s_longest;
  const std::string t = s < 1      ? fmt::format("{:.0f} ms", s * 1e3)
                        : s < 120  ? fmt::format("{:.1f} s", s)
                        : s < 7200 ? fmt::format("{:.0f} min", s / 60)
                                   : fmt::format("{:.1f} h", s / 3600);
  return fmt::format(" (a step ~{} at the estimated rate)", t);
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The overrides that run a fixed per-block plan (auto's answer) as --set flags.
std::vector<std::string> plan_sets(const Config& c) {
  std::vector<std::string> quoted;
  for (const std::string& p : c.remat.plan) quoted.push_back(fmt::format("\"{}\"", p));
  return {"remat.policy=none", fmt::format("remat.plan=[{}]", fmt::join(quoted, ", ")),
          fmt::format("remat.every={}", c.remat.every),
          fmt::format("remat.tile_tokens={}", c.remat.tile_tokens),
          fmt::format("remat.offload=\"{}\"", c.remat.offload)};
}

// "auto:tile=4096:offload=checkpoints": auto's answer as --policies would spell its settings.
std::string auto_label(const AutoPlan& a) {
  return fmt::format("auto{}{}", a.tile_tokens ? fmt::format(":tile={}", a.tile_tokens) : "",
                     a.offload != OffloadKind::None ? fmt::format(":offload={}", a.offload) : "");
}

// What `--emit-config FILE` writes: the longest context's [train] and [remat] keys, with a comment
// on its figures, a TOML snippet to paste into the config (as `plan --emit-config` prints one).
std::string answer_config(const FitRow& r, const PlanTarget& target, const std::string& source) {
  const Config& c = r.cfg;
  std::string out = fmt::format(
      "# remat-train fit {} on {}: the longest context, {} tokens with {}, batch {}; predicted "
      "peak {} ({} B) of {}\n[train]\nseq_len = {}\nbatch_size = {}\n",
      source, target.name, format_grouped(r.longest), r.policy, c.train.batch_size,
      format_bytes(r.at_longest.peak.total_bytes), r.at_longest.peak.total_bytes,
      format_bytes(target.pool_budget()), r.longest, c.train.batch_size);
  if (c.train.grad_accum > 1) out += fmt::format("grad_accum = {}\n", c.train.grad_accum);
  out += "\n";
  if (r.auto_plan) {
    AutoPlan at = *r.auto_plan;  // its figures at the longest context
    at.peak_bytes = r.at_longest.peak.total_bytes;
    at.host_peak_bytes = r.at_longest.host_peak.total_bytes;
    at.recompute_overhead = r.at_longest.recompute_overhead();
    return out + auto_remat_table(at, target);
  }
  out += fmt::format("[remat]\npolicy = \"{}\"\n", c.remat.policy);
  if (!c.remat.save.empty()) {
    std::vector<std::string> quoted;
    for (const std::string& n : c.remat.save) quoted.push_back(fmt::format("\"{}\"", n));
    out += fmt::format("save = [{}]\n", fmt::join(quoted, ", "));
  }
  if (c.remat.every > 1) out += fmt::format("every = {}\n", c.remat.every);
  if (c.remat.tile_tokens > 0) out += fmt::format("tile_tokens = {}\n", c.remat.tile_tokens);
  if (c.remat.offload != OffloadKind::None)
    out += fmt::format("offload = \"{}\"\n", c.remat.offload);
  return out;
}

// --emit-config's file: new, in a folder that exists. Checked before any search runs, and again
// when the answer is written.
void refuse_existing(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw ConfigError(fmt::format(
        "--emit-config {}: [fit] a folder, not a file. Fix: name a file, e.g. {}/fit.toml", path,
        path));
  if (fs::exists(fs::symlink_status(path, ec)))
    throw ConfigError(fmt::format(
        "--emit-config {}: [fit] exists, and fit never overwrites a file. Fix: choose a new name, "
        "or remove that file",
        path));
  const fs::path folder = fs::path(path).parent_path();
  if (!folder.empty() && !fs::is_directory(folder, ec))
    throw ConfigError(fmt::format(
        "--emit-config {}: [fit] its folder {} does not exist. Fix: create it, or choose a file "
        "in an existing folder",
        path, folder.string()));
}

// Writes `text` to `path`, which must not exist: a temporary file of this process beside it (no
// other file's name), then renamed without replacing anything that appeared meanwhile.
void write_new_file(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  std::error_code ec;
  refuse_existing(path);
  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    if (!f.flush()) {
      fs::remove(tmp, ec);
      throw IoError(fmt::format(
          "[fit] cannot write {}. Fix: check that its folder is writable and has space", path));
    }
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) != 0) {
    const int err = errno;
    fs::remove(tmp, ec);
    if (err == EEXIST) refuse_existing(path);
    throw IoError(fmt::format("[fit] cannot write {}: {}. Fix: check that its folder is writable",
                              path, std::strerror(err)));
  }
}

int trial(const Config& cfg, const std::vector<std::string>& sets, int64_t seq_len, uint64_t budget,
          Measured& m, bool record_peak) {
  experiments::TrialSpec spec{
      cfg.path, concat(sets, {fmt::format("train.seq_len={}", seq_len), "train.steps=1",
                              fmt::format("device.memory={}", budget)})};
  // The copy task needs 4 tokens; below that the planner's search uses random data, and so must
  // the step that checks it.
  if (seq_len < 4 && cfg.data.task == "copy") spec.overrides.emplace_back("data.task=random");
  experiments::TrialResult r = experiments::run_trial(spec);
  if (r.interrupted) return -2;
  if (record_peak && r.summary) m.measured_peak_bytes = (*r.summary)["peak_bytes"].get<uint64_t>();
  if (r.exit_code != 0 && r.exit_code != 3 && m.message.empty()) m.message = r.message;
  return r.exit_code;
}

}  // namespace

int run_fit(const FitOptions& opt) {
  if (!opt.emit_config.empty()) refuse_existing(opt.emit_config);  // before any search runs
  std::vector<std::string> sets = opt.overrides;
  if (opt.batch_size) {
    add_flag_override(sets, fmt::format("train.batch_size={}", *opt.batch_size),
                      fmt::format("--batch-size {}", *opt.batch_size));
  }
  // fit's question is the longest context: on N ranks that is each sequence split over all of
  // them, unless --context (or the config) says otherwise.
  std::optional<int64_t> context = opt.context;
  if (opt.ranks && !context && load_config(opt.config_path, sets).parallel.context == 1)
    context = opt.ranks;
  add_rank_sets(sets, opt.config_path, opt.ranks, context);
  const Config base = load_config(opt.config_path, sets);
  if (opt.measure) refuse_several_ranks(base, "fit --measure");
  if (!base.model.has_sequence())
    throw ConfigError(fmt::format(
        "{}: [fit] model.kind = \"{}\" has no sequence length to fit. Fix: use a gpt or llama "
        "config",
        base.path, base.model.kind));
  if (opt.measure && !opt.gpu.empty())
    throw ConfigError(
        "--measure: [fit] measures on this machine, not on a --gpu preset. Fix: drop --gpu or "
        "--measure");
  const std::vector<std::string> policies = parse_policies(
      opt.policies, builtin_policies(), "fit",
      "\"auto\" is not one policy: at each seq_len it picks the cheapest per-block mix that fits, "
      "so its longest seq_len is that of \"full\". Fix: drop auto from --policies (the "
      "recommendation names the fastest policy that fits), or see `remat-train plan` for auto's "
      "plan");

  const PlanTarget target = plan_target(base, opt.gpu, opt.memory);
  const Planner planner(target, make_run_parts);
  const uint64_t budget = target.pool_budget();
  Rate rate = estimate_rate(target);
  // The ring's attention runs on our own fp32 CUDA-core kernels (engine/cuda/ring_attention.cu),
  // not at the tensor-core rate the estimate assumes: say so rather than guess how much slower.
  if (rate.flops_per_s > 0 && target.count.device == DeviceKind::Cuda && base.parallel.context > 1)
    rate.note +=
        "; context parallel's ring attention runs fp32 kernels on the CUDA cores, so the tokens/s "
        "for it are optimistic";
  experiments::install_interrupt_handler(
      /*second_signal_exits=*/false);  // --measure's trials are stopped

  // A row's figures: at the configured seq_len, the longest that fits, and at that one.
  const auto evaluate = [&](FitRow& r) {
    r.at_configured = planner.dry_run(r.cfg, false);
    r.longest = planner.longest_seq_len(r.cfg, &r.at_configured);
    r.capped = r.cfg.model.position == PositionKind::Learned && r.longest == r.cfg.model.n_ctx;
    if (r.longest > 0) {
      Config c = r.cfg;
      c.train.seq_len = r.longest;
      r.at_longest = planner.dry_run(c, false);
      r.tok_s_longest = est_tokens_per_s(r.at_longest, c, rate, target);
    }
    r.fits_configured = planner.fits(r.at_configured);
    r.tok_s_configured = est_tokens_per_s(r.at_configured, r.cfg, rate, target);
  };
  std::vector<FitRow> rows;
  for (const auto& p : policies) {
    FitRow r;
    r.policy = p;
    r.sets = concat(sets, policy_overrides(base, p));
    r.cfg = load_config(opt.config_path, r.sets);
    evaluate(r);
    rows.push_back(std::move(r));
  }
  // No listed policy fits even one token: the search `plan` runs for remat.policy = "auto" (a
  // per-block mix, then the MLP in chunks, then host memory on a GPU) gives the answer, so that
  // fit always names the longest context something reaches.
  if (std::none_of(rows.begin(), rows.end(), [](const FitRow& r) { return r.longest > 0; })) {
    FitRow r;
    r.auto_plan = choose_auto(planner, base);
    r.policy = auto_label(*r.auto_plan);
    r.cfg = with_auto_plan(base, *r.auto_plan);
    r.sets = concat(sets, plan_sets(r.cfg));
    evaluate(r);
    rows.push_back(std::move(r));
  }

  // --measure: a step at the maximum and one above it, each in a fresh process.
  bool all_agree = true;
  // A signal stops the measurements, not the report: the table is the planner's, and the rows
  // measured before the signal keep their column; the exit status still says interrupted.
  std::string interrupted_at;
  if (opt.measure) {
    for (auto& r : rows) {
      if (!opt.json)
        fmt::print(stderr, "fit --measure: {}: {}{}...\n", r.policy,
                   r.longest > 0 ? fmt::format("a step at seq_len {} (must fit)", r.longest) : "",
                   r.capped ? " (the n_ctx cap: nothing above)"
                            : fmt::format("{}a step at {} (must not fit)",
                                          r.longest > 0 ? ", " : "", r.longest + 1));
      Measured& m = r.measured;
      if (r.longest > 0) m.at_max_exit = trial(r.cfg, r.sets, r.longest, budget, m, true);
      if (!experiments::interrupted() && !r.capped)
        m.above_exit = trial(r.cfg, r.sets, r.longest + 1, budget, m, false);
      if (experiments::interrupted()) {
        interrupted_at = r.policy;
        break;
      }
      m.done = true;
      if (!m.agrees()) all_agree = false;
    }
  }

  // The recommendation: the longest context overall, and the fastest policy at the configured one.
  const FitRow* longest = nullptr;
  const FitRow* fastest = nullptr;
  for (const auto& r : rows) {
    if (!longest || r.longest > longest->longest ||
        (r.longest == longest->longest &&
         step_flops(r.at_longest) < step_flops(longest->at_longest)))
      longest = &r;
    // Equal FLOPs: the run that copies less to and from the host, then the untiled one (whole
    // GEMMs), then the lower peak.
    const auto speed_key = [](const FitRow& f) {
      return std::tuple(step_flops(f.at_configured),
                        f.at_configured.to_host_bytes() + f.at_configured.to_device_bytes(),
                        f.cfg.remat.tile_tokens > 0, f.at_configured.peak.total_bytes);
    };
    if (r.fits_configured && (!fastest || speed_key(r) < speed_key(*fastest))) fastest = &r;
  }
  const std::string conf_t = format_count(base.train.seq_len);
  const std::string batch = fmt::format(
      "batch {}{}", base.train.batch_size,
      base.train.grad_accum > 1 ? fmt::format(" x grad_accum {}", base.train.grad_accum) : "");
  std::string recommendation =
      longest && longest->longest > 0
          ? fmt::format("longest: {} with {}, {}{}{}", say_tokens(longest->longest),
                        longest->policy, batch, longest->capped ? " (capped by model.n_ctx)" : "",
                        say_step_time(*longest))
          : fmt::format(
                "longest: nothing fits at {}, not even seq_len 1, with any policy or "
                "auto's plans: {}",
                batch,
                rows.back().auto_plan ? rows.back().auto_plan->infeasible_message()
                                      : std::string("raise the budget"));
  recommendation += fastest
                        ? fmt::format("; at your configured {}, {} is the fastest policy that fits",
                                      conf_t, fastest->policy)
                        : fmt::format("; at your configured {}, no policy fits", conf_t);

  // What tiling the MLP would add to the longest context, when it is off (docs/tiling-offload.md:
  // "Tiling the MLP"): one more search, for the policy that reaches furthest.
  std::string tiling_hint;
  nlohmann::json tiling_json;  // null when there is no hint
  int64_t hinted_tile = 0;     // the hint's tile_tokens, which the offload hint builds on
  if (longest && !longest->auto_plan && longest->cfg.remat.tile_tokens == 0 &&
      longest->longest > 0 && !longest->capped) {
    const int64_t tile = default_tile_tokens(longest->longest * base.train.batch_size);
    Config tiled = longest->cfg;
    tiled.remat.tile_tokens = tile;
    const int64_t reach = planner.longest_seq_len(tiled);
    if (reach > longest->longest) {
      tiling_hint = fmt::format("tiling: with remat.tile_tokens = {}, {} reaches {} (+{:.0f}%)",
                                tile, longest->policy, say_tokens(reach),
                                100.0 * static_cast<double>(reach - longest->longest) /
                                    static_cast<double>(longest->longest));
      tiling_json = {
          {"tile_tokens", tile}, {"policy", longest->policy}, {"longest_seq_len", reach}};
      hinted_tile = tile;
    }
  }

  // What host memory would add on a GPU (docs/tiling-offload.md: "Offloading checkpoints"), on top
  // of the tiling hint's setting when it had one: the checkpoints out of the card, bounded by the
  // host budget.
  std::string offload_hint;
  nlohmann::json offload_json;  // null when there is no hint
  if (!target.host_is_device() && longest && !longest->auto_plan &&
      longest->cfg.remat.offload == OffloadKind::None && longest->longest > 0 && !longest->capped &&
      longest->cfg.remat.policy != "none") {
    Config offloaded = longest->cfg;
    if (hinted_tile > 0) offloaded.remat.tile_tokens = hinted_tile;
    offloaded.remat.offload = OffloadKind::Checkpoints;
    const int64_t reach = planner.longest_seq_len(offloaded);
    if (reach > longest->longest) {
      Config at = offloaded;
      at.train.seq_len = reach;
      const DryRun run = planner.dry_run(at, false);
      const CopyTime ct = copy_time(run, target);
      offload_hint = fmt::format(
          "offload: with remat.offload = \"checkpoints\"{}, {} reaches {} (+{:.0f}%), host peak "
          "{} of {}{}",
          offloaded.remat.tile_tokens
              ? fmt::format(" and tile_tokens = {}", offloaded.remat.tile_tokens)
              : std::string(),
          longest->policy, say_tokens(reach),
          100.0 * static_cast<double>(reach - longest->longest) /
              static_cast<double>(longest->longest),
          format_bytes(run.host_peak.total_bytes), format_bytes(target.host_bytes),
          ct.modelled ? fmt::format("; copies {:.3g} s vs compute >= {:.3g} s per step", ct.copy_s,
                                    ct.compute_s)
                      : std::string());
      offload_json = {{"offload", "checkpoints"},
                      {"tile_tokens", offloaded.remat.tile_tokens},
                      {"policy", longest->policy},
                      {"longest_seq_len", reach},
                      {"host_peak_bytes", run.host_peak.total_bytes}};
    }
  }

  const int exit_status = !interrupted_at.empty() ? 128 + experiments::interrupt_signal()
                          : all_agree             ? 0
                                                  : 1;
  if (!opt.emit_config.empty() && interrupted_at.empty()) {  // a stopped run writes no file
    if (!longest || longest->longest == 0) throw OutOfMemory(recommendation);
    write_new_file(opt.emit_config, answer_config(*longest, target, base.path));
  }

  if (opt.json) {
    nlohmann::json out = {{"config", base.path},
                          {"target", target.name},
                          {"pool_budget_bytes", budget},
                          {"batch_size", base.train.batch_size},
                          {"configured_seq_len", base.train.seq_len},
                          {"rate_flops_per_s", rate.flops_per_s},
                          {"rate_note", rate.note},
                          {"recommendation", recommendation},
                          {"tiling_hint", tiling_json},
                          {"offload_hint", offload_json},
                          {"policies", nlohmann::json::array()}};
    if (base.lora.enabled() && !rows.empty())  // so that fits without adapters keep their shape
      out["lora"] = lora_json(base, rows.front().at_configured.n_trainable_params);
    for (const auto& r : rows) {
      nlohmann::json j = {{"policy", r.policy},
                          {"longest_seq_len", r.longest},
                          {"capped_by_n_ctx", r.capped},
                          {"predicted_peak_bytes", r.at_longest.peak.total_bytes},
                          {"predicted_host_peak_bytes", r.at_longest.host_peak.total_bytes},
                          {"recompute_overhead", r.at_longest.recompute_overhead()},
                          {"est_tokens_per_s", r.tok_s_longest},
                          {"at_configured",
                           {{"fits", r.fits_configured},
                            {"predicted_peak_bytes", r.at_configured.peak.total_bytes},
                            {"recompute_overhead", r.at_configured.recompute_overhead()},
                            {"est_tokens_per_s", r.tok_s_configured}}}};
      if (r.measured.done) {
        j["measured"] = {
            {"exit_at_longest",
             r.measured.at_max_exit ? nlohmann::json(*r.measured.at_max_exit) : nlohmann::json()},
            {"exit_above_longest",
             r.measured.above_exit ? nlohmann::json(*r.measured.above_exit) : nlohmann::json()},
            {"measured_peak_bytes", r.measured.measured_peak_bytes},
            {"agrees", r.measured.agrees()}};
      }
      out["policies"].push_back(j);
    }
    if (opt.measure) out["interrupted"] = !interrupted_at.empty();
    fmt::print("{}\n", json_text(out, 2));
    return exit_status;
  }

  fmt::print("fit  {} on {} | pool budget {} | batch {}{} | configured seq_len {}{}\n", base.path,
             target.name, format_bytes(budget), base.train.batch_size, parallel_note(base), conf_t,
             tiling_note(base));
  if (base.lora.enabled() && !rows.empty())  // " + LoRA r 16 ...": what trains, on what base
    fmt::print("     {}\n",
               lora_summary(base, rows.front().at_configured.n_trainable_params).substr(3));
  fmt::print("     tokens/s estimated from step FLOPs / rate: {}{}\n\n", rate.note,
             attention_flops_note(base));
  size_t w = 10;  // the policy column fits its longest entry ("full:tile=1024:offload=...")
  for (const auto& r : rows) w = std::max(w, r.policy.size());
  // What a length needs of the host, to size the machine: shown when some row offloads.
  const bool any_host = std::any_of(rows.begin(), rows.end(), [](const FitRow& r) {
    return r.cfg.remat.offload != OffloadKind::None;
  });
  auto host_cell = [&](const FitRow& r) {
    if (!any_host) return std::string();
    return fmt::format(" {:>12}", r.longest && r.cfg.remat.offload != OffloadKind::None
                                      ? format_bytes(r.at_longest.host_peak.total_bytes)
                                      : std::string("-"));
  };
  fmt::print("{:<{}} {:>11} {:>12}{} {:>10} {:>11}   {:>12} {:>11}{}\n", "policy", w, "longest T",
             "peak there", any_host ? fmt::format(" {:>12}", "host there") : "", "recompute",
             "est. tok/s", fmt::format("at {}: peak", conf_t), "est. tok/s",
             opt.measure ? "   measured" : "");
  for (const auto& r : rows) {
    std::string measured;
    if (r.measured.done) {
      const Measured& m = r.measured;
      std::string fits, above;
      if (m.at_max_exit)
        fits = fmt::format("{} fits ({})", format_count(r.longest),
                           m.measured_peak_bytes == r.at_longest.peak.total_bytes
                               ? "peak = predicted"
                               : "peak " + format_bytes(m.measured_peak_bytes));
      if (m.above_exit)
        above = fmt::format("{}{} out of memory", fits.empty() ? "" : ", ",
                            format_count(r.longest + 1));
      measured = m.agrees() ? "   ok: " + fits + above : std::string("   DISAGREES (below)");
    }
    // A row that fits nothing has no recompute or speed to show: blank, not "0.0%".
    fmt::print("{:<{}} {:>11} {:>12}{} {:>10} {:>11}   {:>12} {:>11}{}\n", r.policy, w,
               format_count(r.longest) + (r.capped ? "*" : ""),
               r.longest ? format_bytes(r.at_longest.peak.total_bytes) : "-", host_cell(r),
               r.longest ? fmt::format("{:.1f}%", 100.0 * r.at_longest.recompute_overhead())
                         : std::string("-"),
               r.longest ? fmt_rate(r.tok_s_longest) : std::string("-"),
               (r.fits_configured ? "" : "NO ") + format_bytes(r.at_configured.peak.total_bytes),
               r.fits_configured ? fmt_rate(r.tok_s_configured) : "-", measured);
  }
  for (const auto& r : rows)
    if (r.capped) {
      fmt::print("* capped by model.n_ctx = {} (learned positions), not by memory\n",
                 r.cfg.model.n_ctx);
      break;
    }
  // Offload on a CPU target moves bytes from one pool to another in the same RAM: its rows reach
  // further within the budget only because the budget counts the device pool alone.
  for (const auto& r : rows)
    if (target.host_is_device() && r.cfg.remat.offload != OffloadKind::None) {
      fmt::print(
          "note: on the CPU the host pool is this machine's RAM too: offload buys no memory here "
          "(its rows count the device pool against the budget, not the host pool)\n");
      break;
    }
  if (const FitRow& last = rows.back(); last.auto_plan)
    fmt::print(
        "{}: no listed policy fits, so fit ran remat.policy = \"auto\"'s search (as plan does); "
        "at {} it {}\n",
        last.policy, conf_t, last.auto_plan->summary());
  fmt::print("\n{}\n", recommendation);
  if (longest && past_trained_positions(base.model, longest->longest))
    fmt::print(
        "note: the model was trained for {} positions (model.max_position_embeddings) and has no "
        "rope_scaling: past them it meets RoPE angles it never trained on (docs/hf.md)\n",
        base.model.max_position_embeddings);
  if (!interrupted_at.empty())
    fmt::print(
        "interrupted: --measure stopped during {}; the rows above it were measured, the rest are "
        "the planner's{}\n",
        interrupted_at, opt.emit_config.empty() ? "" : " (no --emit-config file written)");
  else if (!opt.emit_config.empty())
    fmt::print("wrote {}: the configuration of that answer ([train] and [remat])\n",
               opt.emit_config);
  if (!tiling_hint.empty()) fmt::print("{}\n", tiling_hint);
  if (!offload_hint.empty()) fmt::print("{}\n", offload_hint);
  for (const auto& r : rows) {
    if (!r.measured.done || r.measured.agrees()) continue;
    const Measured& m = r.measured;
    fmt::print(stderr,
               "\nMEASURE DISAGREES for policy {}: the planner predicts the longest seq_len is {} "
               "(peak {} of budget {});\n"
               "  {}{}{}\n",
               r.policy, r.longest, r.at_longest.peak.total_bytes, budget,
               m.at_max_exit ? fmt::format("a real step at seq_len {} exited {} (want 0: fits)",
                                           r.longest, *m.at_max_exit)
                             : "",
               m.above_exit
                   ? fmt::format("{}a real step at seq_len {} exited {} (want 3: out of memory)",
                                 m.at_max_exit ? "; " : "", r.longest + 1, *m.above_exit)
                   : "",
               m.message.empty() ? "" : "\n  child said: " + m.message);
  }
  return exit_status;
}

}  // namespace remat::cli
