// What a user sees: the banner, the per-step progress line, the final summary, and the JSONL
// metrics file. Formatting only; numbers come from the engine.
#pragma once

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/config.h"
#include "engine/trainer.h"

namespace remat::cli {

struct RunInfo {
  std::string backend_line;  // backend.describe() + why
  std::string model_line;
  int64_t n_params = 0;
  std::string policy_line;
  uint64_t budget_bytes = 0;
  uint64_t predicted_peak_bytes = 0;
  std::string data_line;
};

struct RunSummary {
  std::string policy;
  int64_t seq_len = 0, batch_size = 0, steps = 0;
  double final_loss = 0;
  std::optional<double> final_task_metric;
  std::string task_metric_name;
  MemorySnapshot peak;
  uint64_t predicted_peak_bytes = 0;
  double median_step_ms = 0;
  double tokens_per_s = 0;
  std::array<OpCost, kNumPhases> cost_per_step{};
  bool interrupted = false;
};

void print_banner(std::FILE* out, const RunInfo& info, const Config& cfg);

/// Progress lines: rewritten in place on a terminal, plain lines otherwise.
class Progress {
 public:
  Progress(std::FILE* out, int64_t total_steps, int64_t every, bool quiet, std::string task_metric_name);
  void update(const StepMetrics& m);
  void finish();

 private:
  std::FILE* out_;
  int64_t total_, every_;
  bool quiet_, tty_, dirty_ = false;
  std::string metric_name_;
};

void print_summary(std::FILE* out, const RunSummary& s);

/// JSONL: one object per step, then {"summary": {...}}. Written through a temporary file and
/// renamed at close, so an interrupted run never leaves a half-written line.
class MetricsWriter {
 public:
  explicit MetricsWriter(std::string path);
  ~MetricsWriter();
  void step(const StepMetrics& m, const std::string& task_metric_name);
  void summary(const RunSummary& s);
  void close();

 private:
  std::string path_, tmp_;
  std::ofstream out_;
};

}  // namespace remat::cli
