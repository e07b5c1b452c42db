// What a user sees: the banner, the per-step progress line, the final summary, and the JSONL
// metrics file. Formatting only; numbers come from the engine.
#pragma once

#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/core/backend.h"
#include "engine/core/error.h"
#include "engine/core/json_text.h"  // json_text, for every --json output
#include "engine/planner/planner.h"
#include "engine/training/trainer.h"

namespace remat::cli {

struct RunInfo {
  std::string backend_line;  // backend.describe() + why
  std::string model_line;
  int64_t n_params = 0;
  std::string policy_line;
  uint64_t budget_bytes = 0;
  uint64_t predicted_peak_bytes = 0;
  uint64_t predicted_host_peak_bytes = 0;  // remat.offload: the host pool's
  uint64_t host_budget_bytes = 0;
  std::optional<uint64_t> none_peak_bytes;  // the same run without remat (when a policy is set)
  std::string data_line;
  std::string documents_line;  // documents, packing, loss masks ("" when none)
  std::string resume_line;     // "resumed from DIR at step N", or empty
  std::string parallel_line;   // data parallel: ranks, rows per rank, gradient traffic; or empty
};

struct RunSummary {
  std::string policy;
  int64_t seq_len = 0, batch_size = 0, steps = 0, grad_accum = 1;
  int64_t steps_run = 0;  // by this process (a resumed run's steps count from its checkpoint)
  double final_loss = 0;
  std::optional<double> final_task_metric;
  std::string task_metric_name;
  MemorySnapshot peak;
  uint64_t predicted_peak_bytes = 0;
  MemorySnapshot host_peak;  // the host pool (remat.offload)
  uint64_t predicted_host_peak_bytes = 0;
  double median_step_ms = 0;
  double tokens_per_s = 0;
  std::array<OpCost, kNumPhases> cost_per_step{};
  bool interrupted = false;
  std::optional<double> final_val_loss;
  std::string checkpoint_path;  // the last checkpoint written, or empty
  std::string flops_note;       // attention_flops_note of the run's config
};

void print_banner(std::FILE* out, const RunInfo& info, const Config& cfg);

/// What a run of `cfg` would do as told and likely not as meant, one line each ("warning: ...
/// Fix: ..."): a Hugging Face model (`hf_source`, its folder; "" when none) trained on synthetic
/// tokens, a train.seq_len past the model's max_position_embeddings without rope_scaling, and a
/// run that ends inside its learning-rate warmup.
std::vector<std::string> run_warnings(const Config& cfg, const std::string& hf_source);
/// Whether `seq_len` tokens reach past the positions model `m` was trained for
/// (model.max_position_embeddings, when known) without a rope_scaling that stretches them.
bool past_trained_positions(const ModelConfig& m, int64_t seq_len);

/// The flag a command turned into the override `set` ("train.seq_len=4096" from --seq-len 4096),
/// so that an error about the key names what the user typed: with_flag_names writes each
/// "--set SET" a flag made as that flag (main applies it to every error).
/// add_flag_override appends `set` to `sets` and notes it so.
void add_flag_override(std::vector<std::string>& sets, std::string set, const std::string& flag);
std::string with_flag_names(std::string message);

/// Progress lines: rewritten in place on a terminal, plain lines otherwise.
class Progress {
 public:
  Progress(std::FILE* out, int64_t total_steps, int64_t every, bool quiet,
           std::string task_metric_name);
  void update(const StepMetrics& m);
  /// A validation result (always shown, on its own line).
  void eval(int64_t step, double val_loss);
  /// A message on its own line (checkpoints), without breaking a live progress line.
  void note(const std::string& text);
  void finish();

 private:
  /// Runs `print` and flushes; a write that fails (EPIPE: the reader is gone) stops the run as a
  /// signal would (experiments::request_stop) and silences the progress, never throws.
  void write(const std::function<void()>& print);
  std::FILE* out_;
  int64_t total_, every_;
  bool quiet_, tty_, dirty_ = false;
  std::string metric_name_;
};

void print_summary(std::FILE* out, const RunSummary& s);

/// "load average 0.91, CPU steal 12%": the machine's 1-minute load and the share of its CPU time a
/// hypervisor gave to other guests since this process started (when 1% or more), printed beside
/// every timing of
/// bench, fit, compare and sweep: a competing process slows a step ~2x per busy core it takes,
/// and on a VM the host's other guests do the same without showing in the load.
std::string load_note();

/// ", CPU steal 12%" (the share below) when it is 1% or more, else "": beside a timing.
std::string steal_note();
/// The share of this machine's CPU time (all cores) stolen by the hypervisor since this process
/// started, from /proc/stat; negative when unknown (no /proc/stat, or no time has passed).
double cpu_steal_share();

/// ", MLP in chunks of N tokens" when remat.tile_tokens is set, and ", checkpoints in host
/// memory" when remat.offload is, else "": for headers.
std::string tiling_note(const Config& cfg);

/// The chunks attention runs in on `device` (engine/core/ops/attention.h): one chunk (not chunked)
/// without a sequence or with context parallel (the ring runs attention there).
AttentionChunks attention_chunks_of(const Config& cfg, DeviceKind device);
/// ", attention in N chunks of L tokens" (and why, when the backend chose it) when attention runs
/// over chunks on `device`, else "": for headers.
std::string attention_chunk_note(const Config& cfg, DeviceKind device);
/// With data.attention = "document": what attention's FLOPs are counted for, "; attention counted
/// for documents of N tokens on average (shards.json)" or "; attention counted at its causal upper
/// bound ..." (no mean length known); "" for causal attention. For FLOP and time lines.
std::string attention_flops_note(const Config& cfg);

/// "  copies per step: X to host, Y back to the device; T s at the link's rate vs compute >= U s
/// at peak (...); the copies hide behind compute": what offloading costs on `target`.
/// " (on 8 ranks: 2 rows of the batch per data-parallel group, 4,096 tokens of each row per
/// context rank; figures are rank 0's)", or empty on one rank.
std::string parallel_note(const Config& cfg);
/// Commands that run steps in this one process (compare, bench, sweep, fit --measure) train one
/// rank's share only under [parallel]: refused, with the fix, when it asks for several ranks.
void refuse_several_ranks(const Config& cfg, const char* command);
/// --ranks N and --context C as config overrides: parallel.context = C (else the config's) and
/// parallel.data = N / C; a usage error when C does not divide N.
void add_rank_sets(std::vector<std::string>& sets, const std::string& config_path,
                   std::optional<int64_t> ranks, std::optional<int64_t> context);
/// Several ranks: the gradient and ring bytes each rank sends per step, and their time beside the
/// compute of their phase on the target's links between ranks.
std::string exchange_line(const DryRun& run, const PlanTarget& target);
std::string copy_line(const DryRun& run, const PlanTarget& target);
/// What `plan --emit-config` prints (and `fit --emit-config` writes when auto is its answer): a
/// [remat] table that runs auto's plan `a` on `t` as a fixed one, with a comment on its figures.
std::string auto_remat_table(const AutoPlan& a, const PlanTarget& t);
/// "  copies by phase: forward+loss 1.2 GiB out, 0 B in (0.03 s); ...": each phase group's copy
/// volume (and its time at the target's link rate, when it has one), as copy_time groups them.
std::string copy_phase_line(const DryRun& run, const PlanTarget& target);

/// A write to the metrics file failed (disk full, quota, I/O error). The training loop catches it
/// to save a checkpoint before the run exits 1.
class MetricsWriteError : public IoError {
 public:
  using IoError::IoError;
};

/// Refuses (ConfigError, exit 2) a --metrics path that cannot become a regular file: an existing
/// directory, device or pipe, or a path whose folder does not exist. Called before the first step.
void check_metrics_path(const std::string& path);

/// JSONL: one object per step, then {"summary": {...}}. Written straight to FILE (truncated when a
/// fresh run opens it, so an earlier run's file never stays looking current), one write(2) per
/// line: a run killed even by SIGKILL leaves every finished step readable under the name the user
/// gave, and a file without a summary line is a run that did not finish. A failed write is
/// MetricsWriteError naming the file; the file is cut back to its last whole line.
class MetricsWriter {
 public:
  /// With `keep_existing` (a resumed run), the lines of an earlier run's FILE (or its FILE.tmp, as
  /// older versions left it) are carried over, minus its summary, so resuming never loses metrics.
  MetricsWriter(std::string path, bool keep_existing = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  /// One step's line; `val_loss` when the step ended with an evaluation.
  void step(const StepMetrics& m, const std::string& task_metric_name,
            std::optional<double> val_loss = {});
  /// {"event": "checkpoint" | "resume" | "diverged", "step": N, "path": P, ...}
  void event(const std::string& kind, int64_t step, const std::string& path, double ms = -1);
  void summary(const RunSummary& s);
  /// Flushes the file to disk and closes it; throws MetricsWriteError when that fails.
  void close();
  const std::string& path() const { return path_; }
  /// Data parallel: every line carries {"rank": r}.
  void set_rank(int rank) { rank_ = rank; }

 private:
  void write_json(nlohmann::json& j);
  void write_line(const std::string& line);
  [[noreturn]] void fail(const std::string& what, int err);
  std::string path_;
  int fd_ = -1;
  int rank_ = -1;            // -1: one rank, no "rank" field
  uint64_t good_bytes_ = 0;  // the file's length after its last complete line
};

}  // namespace remat::cli
