// `remat-train sweep`: every (seq_len, policy) point as one short training run in a child
// process (engine/experiments/trial.h), so an out-of-memory point is recorded as "oom" and the
// sweep goes on. Records predicted peak (the planner, in this process), measured peak, status,
// median ms/step, tokens/s and the recompute overhead; writes DIR/sweep.csv and DIR/sweep.json
// after every point (through a temporary file and a rename), so Ctrl-C or a crash keeps what
// finished. The schema is in docs/planning.md, "`fit` and `sweep`"; scripts/plot_sweep.py reads
// it.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cmd/commands.h"
#include "cmd/report.h"
#include "engine/config/config.h"
#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/experiments/interrupt.h"
#include "engine/experiments/trial.h"
#include "engine/planner/planner.h"
#include "layers/models.h"

namespace remat::cli {
namespace {

struct Point {
  int64_t seq_len = 0;
  std::string policy;
  std::vector<std::string> overrides;  // what the child gets (and the planner used)
  uint64_t predicted_peak_bytes = 0;
  uint64_t predicted_host_peak_bytes = 0;  // 0 unless the point offloads (remat.offload)
  double recompute_overhead = 0;
  double step_flops = 0;  // for the ETA: later points weigh more
  bool done = false;
  std::string status;  // ok | oom | error
  int exit_code = -1;
  std::optional<uint64_t> measured_peak_bytes, measured_host_peak_bytes;
  std::optional<double> median_step_ms, tokens_per_s;
  double wall_s = 0;
  std::string message;  // the child's error line (oom, error)
};

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return q + "\"";
}

std::string opt_str(const std::optional<uint64_t>& v) {
  return v ? std::to_string(*v) : std::string();
}

template <typename T>
nlohmann::json opt_json(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json();
}

void write_atomically(const std::filesystem::path& path, const std::string& text) {
  const auto tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out)
      throw IoError(
          fmt::format("[sweep] cannot write {}. Fix: check that the folder is writable", tmp));
    out << text;
  }
  std::filesystem::rename(tmp, path);
}

constexpr const char* kCsvHeader =
    "seq_len,policy,status,exit_code,predicted_peak_bytes,measured_peak_bytes,"
    "predicted_host_peak_bytes,measured_host_peak_bytes,median_step_ms,tokens_per_s,"
    "recompute_overhead,wall_s,message";

void write_outputs(const std::filesystem::path& dir, const nlohmann::json& meta,
                   const std::vector<Point>& points, bool is_interrupted) {
  std::string csv = std::string(kCsvHeader) + "\n";
  nlohmann::json j = meta;
  j["interrupted"] = is_interrupted;
  j["points"] = nlohmann::json::array();
  for (const auto& p : points) {
    if (!p.done) continue;
    csv +=
        fmt::format("{},{},{},{},{},{},{},{},{},{},{:.6f},{:.3f},{}\n", p.seq_len, p.policy,
                    p.status, p.exit_code, p.predicted_peak_bytes, opt_str(p.measured_peak_bytes),
                    p.predicted_host_peak_bytes, opt_str(p.measured_host_peak_bytes),
                    p.median_step_ms ? fmt::format("{:.3f}", *p.median_step_ms) : "",
                    p.tokens_per_s ? fmt::format("{:.1f}", *p.tokens_per_s) : "",
                    p.recompute_overhead, p.wall_s, csv_field(p.message));
    j["points"].push_back({{"seq_len", p.seq_len},
                           {"policy", p.policy},
                           {"status", p.status},
                           {"exit_code", p.exit_code},
                           {"predicted_peak_bytes", p.predicted_peak_bytes},
                           {"measured_peak_bytes", opt_json(p.measured_peak_bytes)},
                           {"predicted_host_peak_bytes", p.predicted_host_peak_bytes},
                           {"measured_host_peak_bytes", opt_json(p.measured_host_peak_bytes)},
                           {"median_step_ms", opt_json(p.median_step_ms)},
                           {"tokens_per_s", opt_json(p.tokens_per_s)},
                           {"recompute_overhead", p.recompute_overhead},
                           {"wall_s", p.wall_s},
                           {"message", p.message}});
  }
  write_atomically(dir / "sweep.csv", csv);
  write_atomically(dir / "sweep.json", json_text(j, 2) + "\n");
}

std::string format_duration(double s) {
  if (s < 60) return fmt::format("{:.0f}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  return fmt::format("{}h{:02}m", static_cast<int>(s) / 3600, (static_cast<int>(s) % 3600) / 60);
}

/// What a point weighs in the ETA: its FLOPs when it is predicted to fit; nothing when it is
/// predicted to run out of memory, since `train` then stops before its first step (counting
/// those FLOPs made an ETA of 8 minutes for a 23-second sweep).
double eta_weight(const Point& p, int64_t steps, uint64_t budget) {
  return p.predicted_peak_bytes <= budget ? p.step_flops * static_cast<double>(steps) : 0.0;
}

/// The live line on stderr: rewritten in place on a terminal, one line per finished point
/// otherwise.
class SweepProgress {
 public:
  SweepProgress(bool quiet, double total_weight)
      : quiet_(quiet),
        tty_(isatty(STDERR_FILENO) != 0),
        total_(total_weight),
        t0_(std::chrono::steady_clock::now()) {}

  /// ETA: elapsed time scaled by the FLOPs still to run (points grow with seq_len, so a plain
  /// count of points would promise far too early an end).
  std::string eta(double done_weight) const {
    if (done_weight <= 0) return "?";
    return format_duration(elapsed() * (total_ - done_weight) / done_weight);
  }
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

  /// On a terminal: the live line of the running point, redrawn when its text changes.
  void running(size_t i, size_t n, const Point& p, double done_weight) {
    if (quiet_ || !tty_) return;
    std::string line = fmt::format("sweep [{}/{}] seq_len {} {} ... | elapsed {} | ETA {}", i + 1,
                                   n, format_count(p.seq_len), p.policy, format_duration(elapsed()),
                                   eta(done_weight));
    if (line == live_) return;
    live_ = std::move(line);
    fmt::print(stderr, "\r\033[K{}", live_);
    std::fflush(stderr);
  }
  /// One permanent line per finished point (replacing the live line on a terminal).
  void finished(size_t i, size_t n, const Point& p, double done_weight) {
    if (quiet_) return;
    std::string what =
        p.status == "ok" ? fmt::format("ok, {:.1f} ms/step, peak {}", p.median_step_ms.value_or(0),
                                       format_bytes(p.measured_peak_bytes.value_or(0)))
                         : fmt::format("{} (exit {})", p.status, p.exit_code);
    fmt::print(stderr, "{}sweep [{}/{}] seq_len {} {}: {} | elapsed {} | ETA {}\n",
               tty_ ? "\r\033[K" : "", i + 1, n, format_count(p.seq_len), p.policy, what,
               format_duration(elapsed()), eta(done_weight));
    live_.clear();
    std::fflush(stderr);
  }
  void finish() {
    if (!quiet_ && tty_ && !live_.empty()) fmt::print(stderr, "\r\033[K");
    live_.clear();
  }

 private:
  bool quiet_, tty_;
  double total_;
  std::string live_;  // the live line on screen, if any
  std::chrono::steady_clock::time_point t0_;
};

// train.seq_len's own bound, and how many lengths one sweep may list: a range is checked before
// it is expanded, so a typo cannot allocate without bound.
constexpr int64_t kMaxSeqLen = 1ll << 32;
constexpr size_t kMaxSeqLens = 64;

/// "1k,2k,4k" or "1k..64k" (a, 2a, 4a, ... below b, then b itself: the end a user names is
/// always swept, so "100..300" is 100, 200, 300), or a mix; sorted, without duplicates.
std::vector<int64_t> parse_seq_lens(const std::string& text) {
  std::vector<int64_t> out;
  auto bad = [&](const std::string& part) {
    return ConfigError(
        fmt::format("--seq-lens {}: \"{}\" is not a sequence length or a range. Fix: write e.g. "
                    "1k,2k,4k or 1k..64k (doubling from 1k, ending at 64k)",
                    text, part));
  };
  auto check_bound = [&](int64_t t) {
    if (t > kMaxSeqLen)
      throw ConfigError(
          fmt::format("--seq-lens {}: {} is out of range. Fix: use lengths from 1 to "
                      "{} (train.seq_len's limit)",
                      text, t, format_count(kMaxSeqLen)));
  };
  auto check_count = [&] {
    if (out.size() > kMaxSeqLens)
      throw ConfigError(fmt::format("--seq-lens {}: more than {} lengths. Fix: sweep fewer points",
                                    text, kMaxSeqLens));
  };
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    const std::string part = text.substr(start, comma - start);
    start = comma + 1;
    if (part.empty()) throw bad(part);
    if (auto dots = part.find(".."); dots != std::string::npos) {
      auto a = parse_count(part.substr(0, dots)), b = parse_count(part.substr(dots + 2));
      if (a && b && *a >= 1 && *b < *a)
        throw ConfigError(fmt::format(
            "--seq-lens {}: the range \"{}\" ends below its start. Fix: write it from the "
            "shorter length to the longer, {}..{}",
            text, part, part.substr(dots + 2), part.substr(0, dots)));
      if (!a || !b || *a < 1) throw bad(part);
      check_bound(*b);
      for (int64_t t = *a; t < *b; t *= 2) {
        out.push_back(t);
        check_count();
      }
      out.push_back(*b);
      check_count();
    } else {
      auto t = parse_count(part);
      if (!t || *t < 1) throw bad(part);
      check_bound(*t);
      out.push_back(*t);
      check_count();
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}
}  // namespace

int run_sweep(const SweepOptions& opt) {
  const std::vector<int64_t> seq_lens = parse_seq_lens(opt.seq_lens);
  const Config base = load_config(opt.config_path, opt.overrides);
  refuse_several_ranks(base, "sweep");
  if (!base.model.has_sequence())
    throw ConfigError(fmt::format(
        "{}: [sweep] model.kind = \"{}\" has no sequence length to sweep. Fix: use a gpt or "
        "llama config",
        base.path, base.model.kind));
  const std::vector<std::string> policies =
      parse_policies(opt.policies, builtin_policies(), "sweep");
  const int64_t steps = opt.steps > 0 ? opt.steps : 3;
  const PlanTarget target = plan_target(base, "", std::nullopt);
  const Planner planner(target, make_run_parts);
  const uint64_t budget = target.pool_budget();

  // Every point's config is loaded (and so validated) before anything runs: a seq_len beyond a
  // learned n_ctx is a usage error now, not an "error" row an hour later.
  std::vector<Point> points;
  double total_weight = 0;
  for (int64_t t : seq_lens)
    for (const auto& pol : policies) {
      Point p;
      p.seq_len = t;
      p.policy = pol;
      p.overrides = opt.overrides;
      for (std::string s :
           {fmt::format("train.seq_len={}", t), fmt::format("train.steps={}", steps),
            fmt::format("device.memory={}", budget)})
        p.overrides.push_back(s);
      for (std::string s : policy_overrides(base, pol)) p.overrides.push_back(s);
      Config c = load_config(opt.config_path, p.overrides);
      // auto: the child's `train` chooses the same plan for the same budget (or exits 3, when
      // the prediction is the all-"full" plan's peak, the smallest achievable).
      resolve_auto(planner, c);
      resolve_loss_chunk(planner, c);  // and the head's chunk, likewise
      const DryRun d = planner.dry_run(c, false);
      p.predicted_peak_bytes = d.peak.total_bytes;
      p.predicted_host_peak_bytes = d.host_peak.total_bytes;
      p.recompute_overhead = d.recompute_overhead();
      for (const auto& cost : d.cost) p.step_flops += cost.flops;
      total_weight += eta_weight(p, steps, budget);
      points.push_back(std::move(p));
    }

  const std::filesystem::path dir =
      opt.out_dir.empty() ? std::filesystem::path("out") /
                                ("sweep-" + std::filesystem::path(opt.config_path).stem().string())
                          : std::filesystem::path(opt.out_dir);
  // Never over an earlier sweep's results: its points took minutes to hours to measure.
  if (std::filesystem::exists(dir) && !std::filesystem::is_directory(dir))
    throw ConfigError(
        fmt::format("[sweep] --out {}: a file, not a folder. Fix: choose a folder", dir.string()));
  for (const char* f : {"sweep.csv", "sweep.json"})
    if (std::filesystem::exists(dir / f))
      throw ConfigError(fmt::format(
          "[sweep] {} holds an earlier sweep's results ({}), which a sweep never replaces. Fix: "
          "choose another --out, or move that folder away to sweep into it again",
          dir.string(), f));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw IoError(fmt::format("[sweep] cannot create {}: {}. Fix: choose another --out",
                              dir.string(), ec.message()));
  const nlohmann::json meta = {{"config", base.path},
                               {"target", target.name},
                               {"budget_bytes", budget},
                               {"batch_size", base.train.batch_size},
                               {"tile_tokens", base.remat.tile_tokens},
                               {"steps", steps},
                               {"n_layer", base.model.n_layer},
                               {"n_embd", base.model.n_embd},
                               {"seq_lens", seq_lens},
                               {"policies", policies}};

  // A signal is forwarded to the running trial (engine/experiments/trial.cpp); this process stays
  // to clean up and to write sweep.json marked interrupted, also on a second signal.
  experiments::install_interrupt_handler(/*second_signal_exits=*/false);
  SweepProgress progress(opt.json, total_weight);
  if (!opt.json)
    fmt::print(stderr,
               "sweep {} on {} | budget {} | {} points ({} seq_lens x {} policies), {} step{} each "
               "-> {} | {}\n",
               base.path, target.name, format_bytes(budget), points.size(), seq_lens.size(),
               policies.size(), steps, steps == 1 ? "" : "s", dir.string(), load_note());
  double done_weight = 0;
  for (size_t i = 0; i < points.size() && !experiments::interrupted(); ++i) {
    Point& p = points[i];
    progress.running(i, points.size(), p, done_weight);
    const experiments::TrialResult r =
        experiments::run_trial(experiments::TrialSpec{opt.config_path, p.overrides},
                               [&] { progress.running(i, points.size(), p, done_weight); });
    if (r.interrupted) break;  // the unfinished point is dropped; the finished ones are kept
    p.done = true;
    p.exit_code = r.exit_code;
    p.status = experiments::trial_status(r.exit_code);
    p.wall_s = r.wall_s;
    if (p.status != "ok") p.message = r.message;
    if (r.summary && p.status == "ok") {
      p.measured_peak_bytes = (*r.summary)["peak_bytes"].get<uint64_t>();
      p.measured_host_peak_bytes = (*r.summary).at("host_peak_bytes").get<uint64_t>();
      p.median_step_ms = (*r.summary)["median_step_ms"].get<double>();
      p.tokens_per_s = (*r.summary)["tokens_per_s"].get<double>();
    }
    done_weight += eta_weight(p, steps, budget);
    progress.finished(i, points.size(), p, done_weight);
    write_outputs(dir, meta, points, false);
  }
  progress.finish();
  const bool stopped = experiments::interrupted();
  write_outputs(dir, meta, points, stopped);

  if (opt.json) {
    std::ifstream in(dir / "sweep.json");
    fmt::print("{}", std::string(std::istreambuf_iterator<char>(in), {}));
  } else {
    fmt::print("sweep {} on {} | budget {} | batch {}{} | {} step{} per point{} | {} at the end\n",
               base.path, target.name, format_bytes(budget), base.train.batch_size,
               tiling_note(base), steps, steps == 1 ? "" : "s",
               stopped ? " | INTERRUPTED: finished points only" : "", load_note());
    size_t w = 10;  // the policy column fits its longest entry ("full:tile=1024:offload=...")
    for (const auto& p : points) w = std::max(w, p.policy.size());
    // Host memory columns only when some point offloads to it (remat.offload).
    const bool host = std::any_of(points.begin(), points.end(),
                                  [](const Point& p) { return p.predicted_host_peak_bytes > 0; });
    auto measured = [](const std::optional<uint64_t>& m, uint64_t predicted) {
      return m ? (*m == predicted ? std::string("= predicted") : format_bytes(*m))
               : std::string("-");
    };
    fmt::print("{:>8} {:<{}} {:<6} {:>12} {:>12}{} {:>10} {:>11} {:>10}\n", "seq_len", "policy", w,
               "status", "predicted", "measured",
               host ? fmt::format(" {:>12} {:>12}", "host pred.", "host meas.") : "", "ms/step",
               "tokens/s", "recompute");
    for (const auto& p : points) {
      if (!p.done) continue;
      fmt::print(
          "{:>8} {:<{}} {:<6} {:>12} {:>12}{} {:>10} {:>11} {:>9.1f}%\n", format_count(p.seq_len),
          p.policy, w, p.status, format_bytes(p.predicted_peak_bytes),
          measured(p.measured_peak_bytes, p.predicted_peak_bytes),
          host ? fmt::format(" {:>12} {:>12}", format_bytes(p.predicted_host_peak_bytes),
                             measured(p.measured_host_peak_bytes, p.predicted_host_peak_bytes))
               : "",
          p.median_step_ms ? fmt::format("{:.1f}", *p.median_step_ms) : "-",
          p.tokens_per_s ? fmt::format("{:.0f}", *p.tokens_per_s) : "-",
          100.0 * p.recompute_overhead);
    }
    for (const auto& p : points)
      if (p.done && p.status == "error")
        fmt::print("error at seq_len {} {}: {}\n", p.seq_len, p.policy, p.message);
    fmt::print("wrote {} and {}\n", (dir / "sweep.csv").string(), (dir / "sweep.json").string());
  }
  if (stopped) return 128 + experiments::interrupt_signal();
  for (const auto& p : points)
    if (p.status == "error") return 1;
  return 0;
}

}  // namespace remat::cli
