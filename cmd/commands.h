// Subcommands of remat-train. Each returns the process exit code; exceptions propagate to main,
// which maps them (the only place exit codes are chosen).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace remat::cli {

struct TrainOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set section.key=value
  std::string metrics_path;            // --metrics FILE (overrides log.metrics)
  bool quiet = false;
};

int run_train(const TrainOptions& opt);

struct PlanOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string gpu;                  // --gpu preset
  std::optional<uint64_t> memory;   // --memory SIZE
  std::optional<int64_t> seq_len;   // --seq-len N
  std::optional<int64_t> batch_size;
  bool json = false;
};

int run_plan(const PlanOptions& opt);

struct CompareOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::vector<std::string> policies;  // --policies none,full,... (none is always first)
  int64_t steps = 0;                  // --steps N (0: the config's)
  bool json = false;
};

/// Exit 1 when a policy changed the losses or gradients on the CPU (a bug by definition).
int run_compare(const CompareOptions& opt);

/// The multi-line --version text: version, backends built, BLAS and its CPU kernel.
std::string version_text();

/// Set by the SIGINT handler; the training loop stops after the current step.
bool interrupted();
void install_interrupt_handler();

}  // namespace remat::cli
