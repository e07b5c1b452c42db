// `remat-train train`: build the backend, model and data from the config, train, report.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <memory>

#include "cmd/commands.h"
#include "cmd/report.h"
#include "data/synthetic.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cuda_api.h"
#include "engine/devices.h"
#include "engine/error.h"
#include "engine/planner.h"
#include "engine/trainer.h"
#include "layers/models.h"

namespace remat::cli {
namespace {

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted = true; }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

bool interrupted() { return g_interrupted; }
void install_interrupt_handler() { std::signal(SIGINT, on_sigint); }

std::string version_text() {
  const cpu::BlasInfo blas = cpu::blas_info();
  return fmt::format(
      "remat-train {}\nbackends: cpu{}\nBLAS: {}, CPU kernel {}{}\nCUDA: {}\n", REMAT_VERSION,
      cuda::is_built() ? ", cuda" : "", blas.library, blas.core,
      blas.is_generic ? " (generic fallback: slow; set OPENBLAS_CORETYPE)" : "", cuda::version_string());
}

int run_train(const TrainOptions& opt) {
  Config cfg = load_config(opt.config_path, opt.overrides);
  if (!opt.metrics_path.empty()) cfg.log.metrics = opt.metrics_path;

  BackendChoice choice = make_backend(cfg);
  Backend& be = *choice.backend;
  // The plan of this very run: the same step on the count backend.
  PlanTarget target;
  target.name = be.name();
  target.count = CountTarget{be.name(), be.act_dtype(), be.name() == "cpu" ? static_cast<cpu::CpuBackend&>(be).threads() : 1};
  target.device_bytes = be.pool().budget_bytes();
  const Planner planner(target, [](const Config& c, Backend& b) { return RunParts{make_model(c, b), make_synthetic_data(c)}; });
  if (cfg.remat.policy == "auto") {  // resolved here, for this very budget; the Trainer sees a per-block plan
    const AutoPlan chosen = choose_auto_plan(planner, cfg);
    if (!chosen.fits) throw OutOfMemory(chosen.infeasible_message());
    cfg.remat.plan = chosen.policies;
    if (!opt.quiet) fmt::print("auto: {}\n", chosen.summary());
  }
  const DryRun predicted = planner.dry_run(cfg);
  std::unique_ptr<Model> model = make_model(cfg, be);
  std::unique_ptr<DataSource> data = make_synthetic_data(cfg);
  Trainer trainer(cfg, be, *model, *data);

  RunInfo info;
  info.backend_line = fmt::format("{} ({})", be.describe(), choice.why);
  info.model_line = model->describe();
  info.n_params = model->n_params();
  info.policy_line = trainer.plan().describe();
  info.budget_bytes = be.pool().budget_bytes();
  info.predicted_peak_bytes = predicted.peak.total_bytes;
  info.data_line = data->describe();
  if (!opt.quiet) print_banner(stdout, info, cfg);

  std::unique_ptr<MetricsWriter> metrics;
  if (!cfg.log.metrics.empty()) metrics = std::make_unique<MetricsWriter>(cfg.log.metrics);

  Progress progress(stdout, cfg.train.steps, cfg.log.every, opt.quiet, data->task_metric_name());
  RunSummary summary;
  std::vector<double> step_ms;
  int64_t tokens = 0;
  double total_ms = 0;
  install_interrupt_handler();
  for (int64_t s = 0; s < cfg.train.steps && !interrupted(); ++s) {
    be.reset_cost();
    StepMetrics m = trainer.step();
    for (int i = 0; i < kNumPhases; ++i) summary.cost_per_step[static_cast<size_t>(i)] = be.cost(static_cast<Phase>(i));
    progress.update(m);
    if (metrics) metrics->step(m, data->task_metric_name());
    step_ms.push_back(m.step_ms);
    total_ms += m.step_ms;
    tokens += static_cast<int64_t>(m.tokens_per_s * m.step_ms / 1000.0 + 0.5);
    summary.final_loss = m.loss;
    summary.final_task_metric = m.task_metric;
  }
  progress.finish();

  summary.policy = cfg.remat.policy;
  summary.seq_len = cfg.train.seq_len;
  summary.batch_size = cfg.train.batch_size;
  summary.steps = trainer.steps_done();
  summary.task_metric_name = data->task_metric_name();
  summary.peak = be.pool().peak_snapshot();
  summary.predicted_peak_bytes = predicted.peak.total_bytes;
  summary.median_step_ms = median(step_ms);
  summary.tokens_per_s = total_ms > 0 ? static_cast<double>(tokens) * 1000.0 / total_ms : 0;
  summary.interrupted = interrupted();
  if (!opt.quiet) print_summary(stdout, summary);
  if (metrics) {
    metrics->summary(summary);
    metrics->close();
  }
  return summary.interrupted ? 130 : 0;
}

}  // namespace remat::cli
