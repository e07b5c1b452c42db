// Banner, progress, summary and JSONL metrics (see cmd/report.h).
#include "cmd/report.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/error.h"
#include "engine/units.h"

namespace remat::cli {

void print_banner(std::FILE* out, const RunInfo& info, const Config& cfg) {
  fmt::print(out, "remat-train {} | {}\n", REMAT_VERSION, info.backend_line);
  fmt::print(out, "model  {} | {:.2f}M params | data {}\n", info.model_line,
             static_cast<double>(info.n_params) / 1e6, info.data_line);
  fmt::print(
      out, "run    batch {} x seq_len {} | {} steps | remat {} | predicted peak {} of budget {}\n",
      cfg.train.batch_size, cfg.train.seq_len, cfg.train.steps, info.policy_line,
      format_bytes(info.predicted_peak_bytes), format_bytes(info.budget_bytes));
  if (info.none_peak_bytes)
    fmt::print(out, "memory without remat (policy none): {} ({}); with {}: {}\n",
               format_bytes(*info.none_peak_bytes),
               *info.none_peak_bytes <= info.budget_bytes ? "fits the budget too"
                                                          : "does NOT fit the budget",
               cfg.remat.policy, format_bytes(info.predicted_peak_bytes));
  if (!info.resume_line.empty()) fmt::print(out, "{}\n", info.resume_line);
  std::fflush(out);
}

Progress::Progress(std::FILE* out, int64_t total_steps, int64_t every, bool quiet,
                   std::string task_metric_name)
    : out_(out),
      total_(total_steps),
      every_(every),
      quiet_(quiet),
      tty_(isatty(fileno(out)) != 0),
      metric_name_(std::move(task_metric_name)) {}

void Progress::update(const StepMetrics& m) {
  if (quiet_) return;
  if (m.step % every_ != 0 && m.step != total_ && m.step != 1) return;
  std::string line = fmt::format("step {:>{}}/{} | loss {:.4f}", m.step,
                                 std::to_string(total_).size(), total_, m.loss);
  if (m.task_metric) line += fmt::format(" | {} {:.4f}", metric_name_, *m.task_metric);
  line += fmt::format(" | lr {:.2e} | {:.1f} ms/step | {:.0f} tok/s | peak {:.1f} MiB", m.lr,
                      m.step_ms, m.tokens_per_s, static_cast<double>(m.peak_bytes) / (1 << 20));
  if (tty_) {
    fmt::print(out_, "\r\033[K{}", line);
    dirty_ = true;
  } else {
    fmt::print(out_, "{}\n", line);
  }
  std::fflush(out_);
}

void Progress::note(const std::string& text) {
  if (quiet_) return;
  if (dirty_) fmt::print(out_, "\n");
  dirty_ = false;
  fmt::print(out_, "{}\n", text);
  std::fflush(out_);
}

void Progress::eval(int64_t step, double val_loss) {
  note(fmt::format("step {:>{}}/{} | val_loss {:.4f}", step, std::to_string(total_).size(), total_,
                   val_loss));
}

void Progress::finish() {
  if (dirty_) fmt::print(out_, "\n");
  dirty_ = false;
}

void print_summary(std::FILE* out, const RunSummary& s) {
  fmt::print(out, "summary{}: {} steps, policy {}, batch {} x seq_len {}\n",
             s.interrupted ? " (interrupted)" : "", s.steps, s.policy, s.batch_size, s.seq_len);
  fmt::print(out, "  final loss      {:.4f}", s.final_loss);
  if (s.final_task_metric)
    fmt::print(out, " ({} {:.4f})", s.task_metric_name, *s.final_task_metric);
  if (s.final_val_loss) fmt::print(out, " | val_loss {:.4f}", *s.final_val_loss);
  if (!s.checkpoint_path.empty()) fmt::print(out, "\n  checkpoint      {}", s.checkpoint_path);
  fmt::print(out, "\n  speed           {:.1f} ms/step (median), {:.0f} tokens/s\n",
             s.median_step_ms, s.tokens_per_s);
  fmt::print(out, "  peak memory     {} ({} B), reached during {}\n",
             format_bytes(s.peak.total_bytes), s.peak.total_bytes, s.peak.phase);
  if (s.predicted_peak_bytes == s.peak.total_bytes)
    fmt::print(out, "  predicted peak  {} B: equal to the measured peak\n", s.predicted_peak_bytes);
  else
    fmt::print(
        out,
        "  predicted peak  {} B: WARNING: differs from the measured {} B by {:+} B (please "
        "report)\n",
        s.predicted_peak_bytes, s.peak.total_bytes,
        static_cast<int64_t>(s.peak.total_bytes) - static_cast<int64_t>(s.predicted_peak_bytes));
  for (int i = 0; i < kNumMemCategories; ++i) {
    const uint64_t b = s.peak.by_category[static_cast<size_t>(i)];
    if (b)
      fmt::print(out, "    {:<13} {:>12}\n", mem_category_name(static_cast<MemCategory>(i)),
                 format_bytes(b));
  }
  if (!s.peak.largest.empty()) {
    fmt::print(out, "  largest at peak");
    for (size_t i = 0; i < std::min<size_t>(3, s.peak.largest.size()); ++i)
      fmt::print(out, "{} {} {}", i ? "," : "", s.peak.largest[i].name,
                 format_bytes(s.peak.largest[i].bytes));
    fmt::print(out, "\n");
  }
  const auto& c = s.cost_per_step;
  const double fwd =
      c[static_cast<size_t>(Phase::Forward)].flops + c[static_cast<size_t>(Phase::Loss)].flops;
  const double bwd = c[static_cast<size_t>(Phase::Backward)].flops;
  const double rec = c[static_cast<size_t>(Phase::Recompute)].flops;
  fmt::print(out, "  FLOPs per step  forward+loss {}, backward {}, recompute {} (+{:.1f}%)\n",
             format_flops(fwd), format_flops(bwd), format_flops(rec),
             fwd + bwd > 0 ? 100.0 * rec / (fwd + bwd) : 0.0);
  if (s.median_step_ms > 0)
    fmt::print(out,
               "  achieved        {:.1f} GFLOP/s executed ({:.1f} GFLOP/s of model work, recompute "
               "excluded)\n",
               (fwd + bwd + rec) / (s.median_step_ms * 1e6),
               (fwd + bwd) / (s.median_step_ms * 1e6));
  std::fflush(out);
}

namespace {

// The lines of an earlier run's metrics, minus its summary (the resumed run writes its own).
std::string earlier_lines(const std::string& path, const std::string& tmp) {
  std::ifstream in(std::filesystem::exists(path) ? path : tmp);
  std::string kept, line;
  while (std::getline(in, line))
    if (!line.empty() && line.rfind("{\"summary\"", 0) != 0) kept += line + '\n';
  return kept;
}

}  // namespace

MetricsWriter::MetricsWriter(std::string path, bool keep_existing)
    : path_(std::move(path)), tmp_(path_ + ".tmp") {
  const std::string earlier = keep_existing ? earlier_lines(path_, tmp_) : std::string();
  out_.open(tmp_, std::ios::trunc);
  if (!out_)
    throw IoError(fmt::format(
        "[metrics] cannot write {}. Hint: check that the folder exists and is writable", tmp_));
  if (!earlier.empty()) write_line(earlier.substr(0, earlier.size() - 1));
}

void MetricsWriter::write_line(const std::string& line) {
  out_ << line << '\n';
  out_.flush();
  if (!out_)
    throw IoError(
        fmt::format("[metrics] writing {} failed (disk full?). Fix: free space or choose another "
                    "--metrics path",
                    tmp_));
}

void MetricsWriter::event(const std::string& kind, int64_t step, const std::string& path,
                          double ms) {
  nlohmann::json j = {{"event", kind}, {"step", step}, {"path", path}};
  if (ms >= 0) j["ms"] = ms;
  write_line(j.dump());
}

MetricsWriter::~MetricsWriter() {
  if (out_.is_open()) {  // an error path: keep what was written rather than lose it
    out_.close();
    std::error_code ec;
    std::filesystem::rename(tmp_, path_, ec);
  }
}

void MetricsWriter::step(const StepMetrics& m, const std::string& task_metric_name,
                         std::optional<double> val_loss) {
  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"lr", m.lr},
                      {"grad_norm", m.grad_norm},
                      {"step_ms", m.step_ms},
                      {"tokens_per_s", m.tokens_per_s},
                      {"peak_bytes", m.peak_bytes}};
  if (m.task_metric) j[task_metric_name] = *m.task_metric;
  if (val_loss) j["val_loss"] = *val_loss;
  write_line(j.dump());
}

void MetricsWriter::summary(const RunSummary& s) {
  nlohmann::json cats = nlohmann::json::object();
  for (int i = 0; i < kNumMemCategories; ++i)
    cats[mem_category_name(static_cast<MemCategory>(i))] =
        s.peak.by_category[static_cast<size_t>(i)];
  nlohmann::json flops = nlohmann::json::object();
  for (int i = 0; i < kNumPhases; ++i)
    flops[phase_name(static_cast<Phase>(i))] = s.cost_per_step[static_cast<size_t>(i)].flops;
  nlohmann::json j = {{"policy", s.policy},
                      {"seq_len", s.seq_len},
                      {"batch_size", s.batch_size},
                      {"steps", s.steps},
                      {"final_loss", s.final_loss},
                      {"peak_bytes", s.peak.total_bytes},
                      {"predicted_peak_bytes", s.predicted_peak_bytes},
                      {"peak_phase", s.peak.phase},
                      {"peak_by_category", cats},
                      {"median_step_ms", s.median_step_ms},
                      {"tokens_per_s", s.tokens_per_s},
                      {"flops_per_step", flops},
                      {"interrupted", s.interrupted}};
  if (s.final_task_metric) j["final_" + s.task_metric_name] = *s.final_task_metric;
  if (s.final_val_loss) j["final_val_loss"] = *s.final_val_loss;
  if (!s.checkpoint_path.empty()) j["checkpoint"] = s.checkpoint_path;
  write_line(nlohmann::json{{"summary", j}}.dump());
}

void MetricsWriter::close() {
  out_.close();
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  if (ec)
    throw IoError(fmt::format("[metrics] cannot rename {} to {}: {}", tmp_, path_, ec.message()));
}

}  // namespace remat::cli
