// The trainer: data -> forward/backward under the remat plan -> global-norm gradient clipping ->
// AdamW -> learning-rate schedule (linear warmup, cosine decay), one call per step.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/config.h"
#include "engine/model.h"
#include "engine/remat.h"

namespace remat {

/// Where batches come from (data/ implements it). Deterministic in (seed, step).
class DataSource {
 public:
  virtual ~DataSource() = default;
  virtual std::string describe() const = 0;
  /// The batch of step `step`, allocated on `be` (category transient).
  virtual Batch next(Backend& be, int64_t step) = 0;
  /// A task-specific metric from the per-row losses (the copy task's second-half loss), if any.
  virtual std::optional<double> task_metric(const std::vector<float>& row_losses) const {
    return std::nullopt;
  }
  virtual std::string task_metric_name() const { return ""; }
};

struct StepMetrics {
  int64_t step = 0;  // 1-based
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_ms = 0;
  double tokens_per_s = 0;
  uint64_t peak_bytes = 0;  // pool peak so far (setup included)
  std::optional<double> task_metric;
};

/// Learning rate at 0-based step `s`: linear warmup to train.lr, then cosine to lr*min_lr_ratio.
double learning_rate(const TrainConfig& t, int64_t s);

class Trainer {
 public:
  Trainer(const Config& cfg, Backend& be, Model& model, DataSource& data);
  StepMetrics step();
  const RematPlan& plan() const { return plan_; }
  int64_t steps_done() const { return step_; }

 private:
  const Config& cfg_;
  Backend& be_;
  Model& model_;
  DataSource& data_;
  RematPlan plan_;
  int64_t step_ = 0;
};

}  // namespace remat
