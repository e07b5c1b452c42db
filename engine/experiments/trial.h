// One training trial in a child process: `remat-train train ... -q --metrics FILE` re-executed
// from /proc/self/exe. `fit --measure` and `sweep` run every point this way, so an out-of-memory
// error (or a crash) in one trial cannot poison the next: each trial gets a fresh process, pool
// and allocator. The parent reads the child's exit code and its JSONL summary.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace remat::experiments {

struct TrialSpec {
  std::string config_path;
  std::vector<std::string> overrides;  // every --set the child gets, in order
};

struct TrialResult {
  int exit_code = -1;                     // the child's; -1 when it died from a signal
  std::optional<nlohmann::json> summary;  // the metrics file's {"summary": {...}} object
  std::string message;                    // the child's last stderr line (its error, if any)
  double wall_s = 0;
  bool interrupted = false;  // the parent was interrupted; the child was stopped
};

/// "ok" (exit 0), "oom" (exit 3) or "error" (anything else).
std::string trial_status(int exit_code);

/// Runs the trial and waits for it, calling `tick` about every 200 ms while it runs. When the
/// parent is interrupted (SIGINT), the child is terminated and the result says so.
TrialResult run_trial(const TrialSpec& spec, const std::function<void()>& tick = {});

}  // namespace remat::experiments
