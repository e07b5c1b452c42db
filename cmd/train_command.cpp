// `remat-train train`: build the backend, model and data from the config, train, evaluate, write
// checkpoints, report. Resume continues bit-for-bit: every random stream and the data order are
// pure functions of (seed, step), so a checkpoint's step is all the state a run needs besides its
// tensors.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <system_error>

#include "cmd/commands.h"
#include "cmd/report.h"
#include "cmd/train_lora.h"
#include "data/dataset.h"
#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/cpu/attention_gemm.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cuda_api.h"
#include "engine/devices.h"
#include "engine/experiments/interrupt.h"
#include "engine/model_files/hf_weights.h"
#include "engine/parallel/communicator.h"
#include "engine/parallel/context_ring.h"
#include "engine/planner/planner.h"
#include "engine/training/checkpoint.h"
#include "engine/training/run_lock.h"
#include "engine/training/trainer.h"
#include "layers/models.h"

namespace remat::cli {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The checkpoint folder --resume names: a step_* folder, a checkpoint.dir (its newest), or
// "latest", the newest in the checkpoint.dir that the config file or --set give.
std::string find_resume_folder(const TrainOptions& opt) {
  if (opt.resume != "latest") return resolve_checkpoint(opt.resume, "train", "--resume");
  const std::optional<std::string> dir =
      config_string_key(opt.config_path, opt.overrides, "checkpoint", "dir");
  if (!dir || dir->empty())
    throw ConfigError(
        "--resume latest: [checkpoint] checkpoint.dir is not set. Fix: give the folder itself, "
        "--resume out/run (a checkpoint.dir: its newest checkpoint is taken) or a step_* folder, "
        "or set checkpoint.dir");
  const std::string path = latest_checkpoint(*dir);
  if (path.empty())
    throw CheckpointError(
        fmt::format("[checkpoint] --resume latest: no complete checkpoint in {}. Fix: check "
                    "checkpoint.dir, or start without --resume",
                    *dir));
  return path;
}

// What a resumed run continues: the checkpoint's config, with the changes that the config file
// and --set make (each listed in `changes`). Only what may change between steps may change
// (changes_on_resume): anything else is refused naming the key, before anything is built.
struct Resumed {
  std::string folder;
  CheckpointState state;
  Config cfg;
  std::vector<KeyChange> changes;
};

// A change a resume may not make (changes_on_resume), refused naming the key, where it was set
// and the two ways on.
[[noreturn]] void refuse_resume_change(const KeyChange& c, const Config& saved,
                                       const std::string& folder) {
  const std::string without =
      c.before == "(unset)" ? fmt::format("resume without setting {}", c.key)
                            : fmt::format("resume without that change ({} = {})", c.key, c.before);
  // A LoRA checkpoint holds adapters, not a model, and LoRA starts from a Hugging Face folder:
  // a new run that has or gets adapters starts from the checkpoint's merged export.
  const std::string anew =
      saved.lora.enabled() || c.key.starts_with("lora.")
          ? fmt::format(
                "or start a new run from it: export --checkpoint {} --hf DIR, then train --init "
                "hf:DIR{}",
                folder, saved.lora.enabled() ? "" : fmt::format(" --set {}={}", c.key, c.after))
          : fmt::format(
                "or start a new run from these weights with --init {} (a fresh optimizer, at step "
                "0)",
                folder);
  throw ConfigError(fmt::format(
      "{}: [checkpoint] {} is {} here but {} in the checkpoint {}: a resumed run continues the "
      "same model, seed, batch, optimizer and data order. Fix: {}, {}",
      c.origin, c.key, c.after, c.before, folder, without, anew));
}

Resumed resumed_run(const std::string& folder, const TrainOptions& opt) {
  Resumed r;
  r.folder = folder;
  r.state = read_checkpoint_state(folder);
  const std::string name = folder + "/state.json";
  const Config saved = parse_config(r.state.config_toml, name);
  try {
    r.cfg = load_resume_config(r.state.config_toml, name, opt.config_path, opt.overrides);
  } catch (const ConfigError&) {
    // A refused change can leave the merged config invalid (lora.base = "fp32" beside the
    // checkpoint's double_quant): the change is what to report, not the checkpoint's line.
    const std::vector<KeyChange> refused =
        refused_resume_changes(saved, opt.config_path, opt.overrides);
    if (!refused.empty()) refuse_resume_change(refused.front(), saved, folder);
    throw;
  }
  for (KeyChange& c : config_changes(saved, r.cfg)) {
    // Only what the config file or --set changed: [parallel] is never the checkpoint's.
    if (!r.cfg.origins.count(c.key)) continue;
    if (same_lora_selection(c.key, saved, r.cfg)) continue;  // written otherwise, the same modules
    if (!changes_on_resume(c.key)) refuse_resume_change(c, saved, folder);
    r.changes.push_back(std::move(c));
  }
  return r;
}

// "changed on resume: train.steps 20 -> 40 (--set train.steps=40), ...".
std::string changes_line(const std::vector<KeyChange>& changes) {
  std::string out;
  for (const KeyChange& c : changes)
    out += fmt::format("{}{} {} -> {} ({})", out.empty() ? "changed on resume: " : "; ", c.key,
                       c.before, c.after, c.origin);
  return out;
}

// Output paths are checked before anything is built: a run must not train for hours and then find
// that it cannot write what it produced.
void check_output_paths(const Config& cfg) {
  if (!cfg.log.metrics.empty()) check_metrics_path(cfg.log.metrics);
  std::error_code ec;
  const auto& dir = cfg.checkpoint.dir;
  if (!dir.empty() && std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec))
    throw ConfigError(fmt::format(
        "{}: [checkpoint] checkpoint.dir exists and is not a folder. Fix: choose another "
        "checkpoint.dir",
        dir));
}

// A fresh run would write over (and prune) another run's checkpoints: never silently.
void refuse_to_overwrite(const Config& cfg) {
  if (cfg.checkpoint.dir.empty()) return;
  const std::string newest = latest_checkpoint(cfg.checkpoint.dir);
  if (!newest.empty())
    throw CheckpointError(
        fmt::format("[checkpoint] checkpoint.dir {} already holds checkpoints of another run "
                    "(newest {}). Fix: continue it "
                    "with --resume latest, or choose another checkpoint.dir (or remove that "
                    "folder) to start over",
                    cfg.checkpoint.dir, newest));
}

// Where a resumed run writes its checkpoints: the folder of the checkpoint it resumed (not the
// checkpoint.dir recorded in it, which is relative to wherever that run started and may since hold
// another run's), unless checkpoint.dir is set again here. Either way it writes over nothing:
// a folder set here must hold no checkpoints, and the resumed folder no step after this one
// (refuse_later_steps: continuing there would replace them, and keep_last prunes by step number).
void place_resumed_checkpoints(Resumed& r) {
  namespace fs = std::filesystem;
  std::string& dir = r.cfg.checkpoint.dir;
  if (dir.empty()) return;  // this run writes no checkpoints
  // The folder above the step folder, however it was typed ("step_10" from inside the run's
  // folder, "out/run/step_10/" with the shell's trailing slash).
  fs::path step = fs::absolute(r.folder).lexically_normal();
  if (!step.has_filename()) step = step.parent_path();
  const fs::path here = step.parent_path();
  std::error_code ec1, ec2;
  const fs::path a = fs::weakly_canonical(dir, ec1), b = fs::weakly_canonical(here, ec2);
  const bool same = !ec1 && !ec2 && a == b;
  // Set here (the config file or --set), not read from the checkpoint's state.json.
  const auto origin = r.cfg.origins.find("checkpoint.dir");
  const bool set_here =
      origin != r.cfg.origins.end() && !origin->second.starts_with(r.folder + "/state.json:");
  if (!same && set_here) {
    const std::string newest = latest_checkpoint(dir);
    if (!newest.empty())
      throw CheckpointError(fmt::format(
          "{}: [checkpoint] checkpoint.dir {} already holds checkpoints (newest {}), and this run "
          "resumes {}: its checkpoints would mix with them, and keep_last would prune them. Fix: "
          "choose an empty checkpoint.dir, or resume without setting it (the run continues in {})",
          origin->second, dir, newest, r.folder, here.string()));
    return;
  }
  if (!same) {
    r.changes.push_back({"checkpoint.dir", fmt::format("\"{}\"", dir),
                         fmt::format("\"{}\"", here.string()), "the resumed checkpoint's folder"});
    dir = here.string();
  }
}

// Run under the checkpoint.dir's lock (another run may be writing there until then).
void refuse_later_steps(const Resumed& r) {
  const std::string& dir = r.cfg.checkpoint.dir;
  if (dir.empty()) return;
  const std::vector<std::string> later = step_entries_after(dir, r.state.step);
  if (later.empty()) return;
  const char* them = later.size() == 1 ? "it" : "them";
  // "Resume the newest" only when a complete checkpoint is newer (an incomplete step_N folder
  // would send --resume back to this one).
  const std::string newest = latest_checkpoint(dir);
  const bool newer =
      !newest.empty() && newest != r.folder && read_checkpoint_state(newest).step > r.state.step;
  throw CheckpointError(fmt::format(
      "[checkpoint] {} holds {} after the resumed step {}: continuing there would replace {}. "
      "Fix: {}continue into a new folder with --set 'checkpoint.dir=\"DIR\"', or move {} out "
      "of {}",
      dir, fmt::join(later, ", "), r.state.step, them,
      newer ? fmt::format("resume the newest (--resume {}), or ", newest) : "", them, dir));
}
// A resumed run with no step left says so and writes nothing (no lock, metrics or checkpoint).
bool nothing_to_train(const Resumed& r, const TrainOptions& opt) {
  const int64_t done = r.state.step, steps = r.cfg.train.steps;
  std::string why;
  if (done >= steps && opt.stop_at > 0 && done >= opt.stop_at)
    why = fmt::format(
        "already at step {} of {}, past --stop-at {}: nothing to train; raise --steps and "
        "--stop-at",
        done, steps, opt.stop_at);
  else if (done >= steps)
    why = fmt::format("already at step {} of {}: nothing to train; raise --steps", done, steps);
  else if (opt.stop_at > 0 && done >= opt.stop_at)
    why = fmt::format(
        "already at step {} of {}, past --stop-at {}: nothing to train; raise --stop-at", done,
        steps, opt.stop_at);
  else
    return false;
  Checkpoint verified(r.folder);  // a damaged checkpoint is reported all the same (exit 2)
  if (!opt.quiet) fmt::print("{}\n", why);
  return true;
}

// The Hugging Face folder the model came from: model.from_hf, or, resumed, what the checkpoint
// recorded (absolute; "" when none).
std::string hf_source_of(const Config& cfg, const std::optional<Resumed>& resumed) {
  if (resumed) {
    const nlohmann::json& extra = resumed->state.extra;
    return extra.contains("hf_source") && extra["hf_source"].is_string()
               ? extra["hf_source"].get<std::string>()
               : std::string();
  }
  return cfg.model.from_hf.empty() ? std::string()
                                   : std::filesystem::absolute(cfg.model.from_hf).string();
}

// `--init hf:DIR` trains that folder's model: it implies model.from_hf = DIR, and a config that
// names another folder is refused (its weights would not fit the model, or worse, would).
std::vector<std::string> overrides_for_init(const TrainOptions& opt) {
  std::vector<std::string> sets = opt.overrides;
  if (opt.init_path.rfind("hf:", 0) != 0) return sets;
  const std::string dir = opt.init_path.substr(3);
  const std::optional<std::string> named = config_from_hf(opt.config_path, opt.overrides);
  if (!named) {
    sets.push_back(from_hf_override(dir));
    return sets;
  }
  std::error_code ec1, ec2;
  if (std::filesystem::weakly_canonical(*named, ec1) != std::filesystem::weakly_canonical(dir, ec2))
    throw ConfigError(fmt::format(
        "{}: [hf] --init hf:{} but model.from_hf = \"{}\": the weights would not be the "
        "model's. Fix: name one folder (--init hf:DIR implies model.from_hf = DIR)",
        opt.config_path, dir, *named));
  return sets;
}

// One training run: the loop, its evaluations and checkpoints, and what it reports.
class TrainRun {
 public:
  TrainRun(const TrainOptions& opt, Config& cfg, Backend& be, Model& model, DataSource& data,
           Trainer& trainer, parallel::Communicator& world)
      : world_(world),
        opt_(opt),
        cfg_(cfg),
        be_(be),
        model_(model),
        data_(data),
        trainer_(trainer),
        progress_(stdout, cfg.train.steps, cfg.log.every, opt.quiet, data.task_metric_name()) {}

  /// The Hugging Face folder the model came from (absolute; "" if none), kept in every
  /// checkpoint's state.json so that `export` finds its tokenizer files.
  void set_hf_source(std::string dir) { hf_source_ = std::move(dir); }

  void open_metrics(bool resumed, const std::string& from) {
    // A resumed run starts at its checkpoint: a stop before the next step rewrites nothing.
    if (resumed) last_checkpoint_step_ = trainer_.steps_done();
    if (cfg_.log.metrics.empty()) return;
    metrics_ = std::make_unique<MetricsWriter>(cfg_.log.metrics, resumed);
    if (world_.size() > 1) metrics_->set_rank(world_.rank());
    if (resumed) metrics_->event("resume", trainer_.steps_done(), from);
  }

  RunSummary run(int64_t stop_at, const DryRun& predicted) {
    summary_.predicted_peak_bytes = predicted.peak.total_bytes;
    summary_.predicted_host_peak_bytes = predicted.host_peak.total_bytes;
    const int64_t last = std::min(cfg_.train.steps, stop_at > 0 ? stop_at : cfg_.train.steps);
    try {
      train_until(last);
    } catch (const MetricsWriteError& e) {
      progress_.finish();
      throw MetricsWriteError(e.what() + save_state_after_failure());
    } catch (const Diverged&) {
      // No checkpoint is written (save_checkpoint refuses non-finite weights) and none is pruned:
      // the newest one on disk stays the last finite state.
      progress_.finish();
      note_divergence();
      throw;
    }
    summary_.interrupted = stop_signal_ != 0 || !data_change_.empty();
    return finish_summary();
  }

  void train_until(int64_t last) {
    try {
      while (trainer_.steps_done() < last && !stop_requested()) one_step(last);
    } catch (const DataChanged& e) {
      // Several ranks cannot agree on where to stop without another exchange: the job aborts
      // (cmd/main.cpp), its newest checkpoint stays.
      if (world_.size() > 1) throw;
      data_change_ = e.what();  // stops like a signal: the steps done are kept
    }
    progress_.finish();
    const bool stopped = stop_signal_ != 0 || !data_change_.empty();
    if (!cfg_.checkpoint.dir.empty() && trainer_.steps_done() != last_checkpoint_step_ &&
        (!stopped || cfg_.checkpoint.on_interrupt) && trainer_.steps_done() > 0)
      save_checkpoint();
  }

  /// The stop signal every rank agreed on (0: none).
  int stop_signal() const { return stop_signal_; }

  /// Throws the DataChanged that stopped the run, saying where its steps went; nothing otherwise.
  void throw_data_change() const {
    if (data_change_.empty()) return;
    if (cfg_.checkpoint.dir.empty())
      throw DataChanged(data_change_ +
                        ". The steps done were not saved: checkpoint.dir is not set");
    // With checkpoint.on_interrupt off the stop writes none: the newest checkpoint (periodic, or
    // the one this run resumed from) may be behind the steps done, or there may be none.
    const int64_t done = trainer_.steps_done();
    const int64_t saved = std::max<int64_t>(last_checkpoint_step_, 0);
    std::string where;
    if (done == 0)
      where = ". This run did no step, so it wrote no checkpoint";
    else if (done == saved)
      where = summary_.checkpoint_path.empty()
                  ? fmt::format(
                        ". Training state is the checkpoint of step {} in {} (--resume "
                        "latest continues there)",
                        saved, cfg_.checkpoint.dir)
                  : fmt::format(". Training state is in {} (--resume latest continues there)",
                                summary_.checkpoint_path);
    else
      where = fmt::format(". The last {} steps were not saved (checkpoint.on_interrupt = false){}",
                          done - saved,
                          saved > 0 ? fmt::format("; --resume latest continues from step {}", saved)
                                    : std::string());
    throw DataChanged(data_change_ + where);
  }

  /// A LoRA run: what each checkpoint records of its frozen base (lora_checkpoint.h).
  void set_lora_base(nlohmann::json record) { lora_base_ = std::move(record); }

  void close_metrics() {
    if (!metrics_) return;
    metrics_->summary(summary_);
    metrics_->close();
  }

 private:
  // A stop signal may reach the ranks of a job at different steps: they agree between steps, so
  // that all of them stop after the same one (one would wait for the others forever otherwise).
  bool stop_requested() {
    int signal = experiments::interrupt_signal();
    if (world_.size() > 1) {
      const double mine = signal;
      for (double s : world_.allgather(&mine, 1))
        if (signal == 0) signal = static_cast<int>(s);
    }
    stop_signal_ = signal;
    return signal != 0;
  }

  void one_step(int64_t last) {
    be_.reset_cost();
    StepMetrics m = trainer_.step();
    for (int i = 0; i < kNumPhases; ++i)
      summary_.cost_per_step[static_cast<size_t>(i)] = be_.cost(static_cast<Phase>(i));
    progress_.update(m);
    std::optional<double> val;
    const int64_t every = cfg_.train.eval_every;
    try {
      if (every > 0 && (m.step % every == 0 || m.step == last)) val = evaluate(m.step);
    } catch (const DataChanged&) {  // the step itself is done: its line is kept
      if (metrics_) metrics_->step(m, data_.task_metric_name(), std::nullopt);
      throw;
    }
    if (metrics_) metrics_->step(m, data_.task_metric_name(), val);
    step_ms_.push_back(m.step_ms);
    tokens_per_step_ = std::round(m.tokens_per_s * m.step_ms / 1000.0);
    summary_.final_loss = m.loss;
    summary_.final_task_metric = m.task_metric;
    const int64_t ck = cfg_.checkpoint.every;
    if (!cfg_.checkpoint.dir.empty() && ck > 0 && m.step % ck == 0 && m.step != last)
      save_checkpoint();
  }

  // A metrics write failed: the steps trained so far are saved anyway (when checkpoints are on),
  // and the returned text tells where, or why not.
  std::string save_state_after_failure() {
    metrics_.reset();  // the file is what failed: the checkpoint is not logged there
    if (cfg_.checkpoint.dir.empty())
      return ". Training state was not saved: checkpoint.dir is not set";
    if (trainer_.steps_done() == 0) return "";
    if (trainer_.steps_done() == last_checkpoint_step_)
      return fmt::format(". Training state is in {}", summary_.checkpoint_path);
    if (trainer_.sharded_moments())  // a checkpoint needs every rank at once
      return fmt::format(
          ". Training state was not saved: the AdamW moments are sharded over the ranks "
          "(parallel.shard_optimizer), and a checkpoint needs every rank; the newest checkpoint "
          "is {}",
          summary_.checkpoint_path.empty() ? "none" : summary_.checkpoint_path);
    try {
      save_checkpoint();
    } catch (const std::exception& ce) {
      return fmt::format(". Saving a checkpoint failed too: {}", ce.what());
    }
    return fmt::format(". Training state was saved: {} (continue with --resume latest)",
                       summary_.checkpoint_path);
  }

  void note_divergence() {
    if (!metrics_) return;
    try {
      metrics_->event("diverged", trainer_.steps_done() + 1, summary_.checkpoint_path);
      metrics_->close();
    } catch (const MetricsWriteError&) {  // the divergence is the error to report
    }
  }

  std::optional<double> evaluate(int64_t step) {
    const double v = trainer_.evaluate(cfg_.train.eval_tokens);
    if (std::isnan(v)) return std::nullopt;
    progress_.eval(step, v);
    summary_.final_val_loss = v;
    return v;
  }

  void save_checkpoint() {
    trainer_.check_weights_finite();  // a checkpoint of NaN weights would replace a good one
    // Data parallel: every rank holds the same weights; rank 0 writes them, gathering the AdamW
    // moments from every rank when they are sharded.
    if (world_.rank() != 0) {
      if (DistributedMoments* moments = trainer_.sharded_moments())
        send_checkpoint_moments(model_, *moments);
      last_checkpoint_step_ = trainer_.steps_done();
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    be_.pool().set_phase("checkpoint");
    CheckpointState state;
    state.step = trainer_.steps_done();
    state.config_toml = config_to_toml(cfg_);
    // Where the model came from, so that `export` finds its tokenizer files (the config keeps
    // the expanded keys, not the folder, so that a resume never needs it).
    if (!hf_source_.empty()) state.extra["hf_source"] = hf_source_;
    if (!lora_base_.is_null()) state.extra["lora_base"] = lora_base_;
    // Each step drew grad_accum batches of the stream.
    state.data_cursor = data_.cursor(state.step * cfg_.train.grad_accum);
    if (summary_.final_val_loss) state.extra["val_loss"] = *summary_.final_val_loss;
    const std::string path =
        write_checkpoint(cfg_.checkpoint.dir, be_, model_, state, trainer_.sharded_moments());
    summary_.checkpoint_path = path;  // before the log line, whose write may fail
    last_checkpoint_step_ = state.step;
    prune_checkpoints(cfg_.checkpoint.dir, cfg_.checkpoint.keep_last);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    progress_.note(fmt::format("checkpoint {} ({:.0f} ms)", path, ms));
    if (metrics_) metrics_->event("checkpoint", state.step, path, ms);
  }

  RunSummary finish_summary() {
    summary_.policy = cfg_.remat.policy;
    summary_.seq_len = cfg_.train.seq_len;
    summary_.batch_size = cfg_.train.batch_size;
    summary_.flops_note = attention_flops_note(cfg_);
    summary_.grad_accum = cfg_.train.grad_accum;
    summary_.steps = trainer_.steps_done();
    summary_.steps_run = static_cast<int64_t>(step_ms_.size());
    summary_.task_metric_name = data_.task_metric_name();
    summary_.peak = be_.pool().peak_snapshot();
    summary_.host_peak = be_.host_pool().peak_snapshot();
    summary_.median_step_ms = median(step_ms_);
    // The rate of the median step, beside which it is printed: a mean over all steps would count
    // step 1's start-up (cuDNN plans, first-touch allocations), most of a short run on a GPU.
    summary_.tokens_per_s =
        summary_.median_step_ms > 0 ? tokens_per_step_ * 1000.0 / summary_.median_step_ms : 0;
    return summary_;
  }

  parallel::Communicator& world_;
  int stop_signal_ = 0;
  std::string data_change_;  // the DataChanged message that stopped the run ("" if none)
  const TrainOptions& opt_;
  Config& cfg_;
  Backend& be_;
  Model& model_;
  DataSource& data_;
  Trainer& trainer_;
  Progress progress_;
  std::unique_ptr<MetricsWriter> metrics_;
  RunSummary summary_;
  std::vector<double> step_ms_;
  double tokens_per_step_ = 0;  // the job's tokens of one step (every rank's rows)
  int64_t last_checkpoint_step_ = -1;
  std::string hf_source_;
  nlohmann::json lora_base_;
};

}  // namespace

RunParts make_run_parts(const Config& c, Backend& b) {
  return RunParts{make_model(c, b), make_data_source(c)};
}

namespace {

// The planner knows before step 1 whether the run fits: fail then, not minutes in, and say
// which policies would fit this very seq_len and batch.
void refuse_plan_over_budget(const Planner& planner, const Config& cfg, const DryRun& predicted) {
  const uint64_t host_budget = planner.target().host_bytes;
  if (predicted.host_peak.total_bytes > host_budget)
    throw OutOfMemory(fmt::format(
        "[memory] out of host memory before step 1: remat.offload = \"{}\" keeps up to {} ({} B) "
        "in host memory during {}, over the host budget of {} (device.host_memory). Fix: raise "
        "device.host_memory, offload less (remat.offload = \"checkpoints\" keeps the AdamW moments "
        "on the device), or lower train.batch_size or train.seq_len",
        cfg.remat.offload, format_bytes(predicted.host_peak.total_bytes),
        predicted.host_peak.total_bytes, predicted.host_peak.phase, format_bytes(host_budget)));
  const uint64_t budget = planner.target().pool_budget();
  if (predicted.peak.total_bytes <= budget) return;
  std::string cats;
  for (int i = 0; i < kNumMemCategories; ++i)
    if (const uint64_t b = predicted.peak.by_category[static_cast<size_t>(i)])
      cats += fmt::format("{}{} {}", cats.empty() ? "" : ", ",
                          mem_category_name(static_cast<MemCategory>(i)), format_bytes(b));
  std::string fitting;
  for (const std::string& p : builtin_policies()) {
    if (p == cfg.remat.policy && cfg.remat.plan.empty()) continue;
    const uint64_t peak = planner.dry_run(with_policy(cfg, p), false).peak.total_bytes;
    if (peak <= budget)
      fitting += fmt::format("{}{} ({})", fitting.empty() ? "" : ", ", p, format_bytes(peak));
  }
  throw OutOfMemory(fmt::format(
      "[memory] out of memory before step 1: the plan of this run peaks at {} ({} B) during {}, "
      "over the budget of {}: {}. {}; `remat-train plan` shows what fits.",
      format_bytes(predicted.peak.total_bytes), predicted.peak.total_bytes, predicted.peak.phase,
      format_bytes(budget), cats,
      (fitting.empty()
           ? "Fix: no remat policy fits at this train.seq_len and train.batch_size: lower them, or "
             "raise device.memory"
           : "Fix: policies that fit: " + fitting +
                 " (set remat.policy), or lower train.batch_size or train.seq_len") +
          smaller_lora_base_fix(cfg)));
}

}  // namespace

namespace {
// cmd/main.cpp sets GOMP_SPINCOUNT=3000 (and this marker) unless the user chose a policy; the test
// binary, whose remat-train processes inherit it, OMP_WAIT_POLICY=passive.
std::string openmp_wait_text() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  if (!policy && !spin)
    return "wait policy default (spinning ~300,000 times), from the environment";
  const std::string what = policy ? fmt::format("wait policy {}", policy)
                                  : fmt::format("wait policy: spin {} times, then sleep", spin);
  if (std::getenv("REMAT_TRAIN_SET_WAIT_POLICY"))
    return what +
           " (chosen by remat-train: the next parallel region of a step is caught spinning, and a "
           "competing process costs ~2x, not the ~10x of libgomp's default; "
           "OMP_WAIT_POLICY=passive|active to choose)";
  return what + (policy ? " (OMP_WAIT_POLICY)" : " (GOMP_SPINCOUNT)");
}
}  // namespace

std::string version_text() {
  const cpu::BlasInfo blas = cpu::blas_info();
  return fmt::format(
      "remat-train {}\nbackends: cpu{}\nBLAS: {}, CPU kernel {} (chosen by {}){}\n"
      "CPU GEMM: tiles on {} (chosen by {}){}\n"
      "CPU attention: flash tiles on {} (chosen by {})\nOpenMP: {}\nMPI: {}\nCUDA: {}\n",
      REMAT_VERSION, cuda::is_built() ? ", cuda" : "", blas.library, blas.core, blas.chosen_by,
      blas.warning.empty() ? "" : "\nwarning: " + blas.warning, blas.gemm, blas.gemm_chosen_by,
      blas.gemm_warning.empty() ? "" : "\nwarning: " + blas.gemm_warning,
      cpu::attention_isa() == cpu::AttentionIsa::Avx512 ? "AVX-512" : "AVX2",
      cpu::attention_isa_chosen_by(), openmp_wait_text(), parallel::mpi_library(),
      cuda::version_string());
}

namespace {

// [parallel] against the ranks the launcher started: data x context must be all of them
// (parallel.data = 0 takes every rank that context leaves).
void resolve_ranks(Config& cfg, const parallel::Communicator& world) {
  const int n = world.size();
  ParallelConfig& p = cfg.parallel;
  auto origin = [&](const char* key) {
    const auto it = cfg.origins.find(key);
    return it != cfg.origins.end() ? it->second : cfg.path;
  };
  if (n % p.context != 0)
    throw ConfigError(fmt::format(
        "{}: [parallel] context = {} does not divide the {} rank{} started. Fix: start a "
        "multiple of {} ranks (mpirun -np N), or change parallel.context",
        origin("parallel.context"), p.context, n, n == 1 ? "" : "s", p.context));
  if (p.data == 0) p.data = n / p.context;
  if (p.world_ranks() != n)
    throw ConfigError(fmt::format(
        "{}: [parallel] data = {} x context = {} is {} ranks, but {} {} started. Fix: start {} "
        "(mpirun -np {}), or set parallel.data = {} (or 0: every rank started)",
        origin("parallel.data"), p.data, p.context, p.world_ranks(), n, n == 1 ? "was" : "were",
        p.world_ranks(), p.world_ranks(), n / p.context));
  if (cfg.train.batch_size % p.data != 0)
    throw ConfigError(fmt::format(
        "{}: train.batch_size = {} does not split evenly over {} data-parallel groups. Fix: "
        "choose a multiple of {}",
        cfg.path, cfg.train.batch_size, p.data, p.data));
  // The config's own check sees the ranks it names; the launcher's are known only here.
  if (cfg.remat.offloads_weights() && n > 1)
    throw ConfigError(fmt::format(
        "{}: [remat] remat.offload = \"{}\" trains on one rank, and mpirun started {}. Fix: run "
        "one rank, or offload less: \"checkpoints\" or \"checkpoints+optimizer\"",
        origin("remat.offload"), cfg.remat.offload, n));
  p.rank = world.rank();
}

// One rank's file of per-rank metrics: FILE for rank 0, FILE with ".rankN" before its extension
// for the others ("metrics.jsonl" -> "metrics.rank1.jsonl").
std::string rank_metrics_path(const std::string& path, int rank) {
  if (rank == 0) return path;
  const std::filesystem::path p(path);
  return (p.parent_path() /
          fmt::format("{}.rank{}{}", p.stem().string(), rank, p.extension().string()))
      .string();
}

}  // namespace

int run_train(const TrainOptions& options) {
  parallel::Communicator& world = parallel::init_world();
  TrainOptions opt = options;
  opt.quiet = opt.quiet || world.rank() != 0;  // one rank prints; errors come from any rank
  refuse_adapter_as_init(opt.init_path);       // before the config, which such a folder cannot give
  // A resume reads its config from the checkpoint (state.json) before anything else: no --config,
  // --model or Hugging Face folder is needed, and a finished run stops here, having written
  // nothing.
  std::optional<Resumed> resumed;
  if (!opt.resume.empty()) {
    resumed = resumed_run(find_resume_folder(opt), opt);
    if (nothing_to_train(*resumed, opt)) return 0;
    place_resumed_checkpoints(*resumed);
  }
  Config cfg = resumed ? resumed->cfg : load_config(opt.config_path, overrides_for_init(opt));
  if (!opt.quiet)
    for (const std::string& w : run_warnings(cfg, hf_source_of(cfg, resumed)))
      fmt::print(stderr, "{}\n", w);
  if (!opt.metrics_path.empty()) cfg.log.metrics = opt.metrics_path;
  world.set_timeout(cfg.parallel.timeout_s);
  resolve_ranks(cfg, world);
  if (!cfg.log.metrics.empty()) cfg.log.metrics = rank_metrics_path(cfg.log.metrics, world.rank());
  check_output_paths(cfg);
  // Every rank's paths pass before any rank writes: a refused rank aborts the job (main's
  // stop_all_ranks) while the others wait here, before one of them truncates its metrics file.
  if (world.size() > 1) world.barrier();
  // Before the folder is read (latest) or written: one run per checkpoint.dir, until exit. Rank 0
  // writes the checkpoints, so it holds the lock for the job.
  std::unique_ptr<RunLock> lock;
  if (!cfg.checkpoint.dir.empty() && world.rank() == 0) {
    lock = std::make_unique<RunLock>(cfg.checkpoint.dir);
    if (!lock->warning().empty()) fmt::print(stderr, "{}\n", lock->warning());
  }
  // The checkpoint is opened (and verified) before anything is built, so a bad one fails fast.
  std::unique_ptr<Checkpoint> resume;
  if (resumed) {
    // The folder was chosen before the lock: a run that wrote a newer one since is refused.
    const std::string now = find_resume_folder(opt);
    if (now != resumed->folder)
      throw CheckpointError(fmt::format(
          "[checkpoint] --resume {}: {} appeared while this run started (another run wrote it), "
          "after {} was chosen. Fix: run the command again",
          opt.resume, now, resumed->folder));
    refuse_later_steps(*resumed);
    resume = std::make_unique<Checkpoint>(resumed->folder);
  } else {
    refuse_to_overwrite(cfg);
  }
  const LoraStart lora_start = check_lora_start(cfg, opt, resume.get());

  BackendChoice choice = make_backend(cfg);
  Backend& be = *choice.backend;
  if (cfg.data.documents() && be.workspace_target().device == DeviceKind::Cuda) {
    // The CUDA ops run documents through cuDNN with RoPE on one context rank (docs/gpu.md).
    if (cfg.model.kind == ModelKind::Gpt && cfg.model.position == PositionKind::Learned)
      throw_config_error(cfg, "data.attention",
                         "data.attention = \"document\" on CUDA restarts RoPE positions, and "
                         "this GPT's positions are a learned table, which has no CUDA kernel for "
                         "documents (docs/gpu.md)",
                         "set model.position = \"rope\", or train on the CPU "
                         "(device.backend = \"cpu\")");
    if (cfg.parallel.context > 1)
      throw_config_error(cfg, "parallel.context",
                         "data.attention = \"document\" over the context-parallel ring has no "
                         "CUDA kernel (docs/gpu.md)",
                         "set parallel.context = 1, or train on the CPU (device.backend = "
                         "\"cpu\")");
  }
  // The ranks that split each sequence: consecutive world ranks, a ring over MPI on the CPU and
  // over NCCL (bootstrapped through MPI) on CUDA. Declared before the model, which uses it.
  std::unique_ptr<parallel::Communicator> context_group;
  std::unique_ptr<parallel::RingChannel> ring_channel;
  if (cfg.parallel.context > 1) {
    context_group = world.split(cfg.parallel.data_rank(), cfg.parallel.context_rank());
    ring_channel = be.workspace_target().device == DeviceKind::Cuda
                       ? cuda::make_nccl_ring_channel(be, *context_group)
                       : parallel::make_mpi_ring_channel(*context_group);
  }
  // The plan of this very run: the same step on the count backend.
  const Planner planner(run_plan_target(be), make_run_parts);
  // auto, for this very budget: the Trainer sees a per-block plan.
  if (const std::optional<AutoPlan> chosen = resolve_auto(planner, cfg)) {
    if (!chosen->fits) throw OutOfMemory(chosen->infeasible_message());
    if (!opt.quiet) fmt::print("auto: {}\n", chosen->summary());
  }
  if (const std::optional<int64_t> rows = resolve_loss_chunk(planner, cfg); rows && !opt.quiet)
    fmt::print("loss head: chunks of {} rows, sized to the budget (train.loss_chunk = 0)\n", *rows);
  const DryRun predicted = planner.dry_run(cfg);
  refuse_plan_over_budget(planner, cfg, predicted);
  std::unique_ptr<Model> model = make_model(cfg, be, ring_channel.get());
  std::unique_ptr<DataSource> data = make_data_source(cfg);
  data->open();
  if (!opt.quiet)
    for (const std::string& w : data->warnings()) fmt::print(stderr, "{}\n", w);
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data,
                  data_parallel(cfg, &world));

  RunInfo info;
  if (resume) {
    const std::string base_line = load_lora_base(lora_start, cfg, be, *model);  // LoRA's base
    resume->load_into(be, *model, /*with_optimizer=*/true, trainer.sharded_moments());
    trainer.set_steps_done(resume->state().step);
    info.resume_line =
        fmt::format("resumed from {} at step {}", resume->path(), resume->state().step);
    if (!base_line.empty()) info.resume_line += "; " + base_line;
    if (!resumed->changes.empty()) info.resume_line += "\n" + changes_line(resumed->changes);
    if (const auto dir =
            opt.config_path.empty() ? std::nullopt : config_from_hf(opt.config_path, opt.overrides))
      info.resume_line += fmt::format(
          "\nmodel.from_hf = \"{}\" is not read on resume: the model is the checkpoint's", *dir);
  } else if (opt.init_path.rfind("hf:", 0) == 0) {
    info.resume_line =
        fmt::format("weights from {}: {} (optimizer state and step start fresh)", opt.init_path,
                    hf::load_weights(cfg.model.from_hf, cfg.model, be, *model));
  } else if (!opt.init_path.empty()) {
    load_weights(opt.init_path, be, *model);
    info.resume_line =
        fmt::format("weights from {} (optimizer state and step start fresh)", opt.init_path);
  }
  if (!opt.init_adapter.empty())
    info.resume_line += (info.resume_line.empty() ? "" : "; ") +
                        load_init_adapter(opt.init_adapter, cfg, be, *model);
  if (!lora_start.note.empty())
    info.resume_line += (info.resume_line.empty() ? "" : "; ") + lora_start.note;
  // The libraries and kernels behind -v (`remat-train --version` names them too).
  info.backend_line =
      fmt::format("{} ({})", opt.verbose ? be.describe() : be.describe_brief(), choice.why);
  info.model_line = model->describe() + lora_summary(cfg, *model);
  info.n_params = model->n_params();
  info.policy_line = trainer.plan().describe() + tiling_note(cfg) +
                     attention_chunk_note(cfg, be.workspace_target().device);
  info.budget_bytes = be.pool().budget_bytes();
  info.predicted_peak_bytes = predicted.peak.total_bytes;
  info.predicted_host_peak_bytes = predicted.host_peak.total_bytes;
  info.host_budget_bytes = be.host_pool().budget_bytes();
  if (cfg.remat.policy != "none") {  // what remat buys here: the peak without it
    info.none_peak_bytes = planner.dry_run(with_policy(cfg, "none"), false).peak.total_bytes;
  }
  info.data_line = data->describe();
  info.documents_line = data->documents_summary();
  if (world.size() > 1)
    info.parallel_line = fmt::format(
        "ranks  {} = data {} x context {}{}; predicted peak per rank; gradients {}{}, {} sent per "
        "rank per step",
        world.describe(), cfg.parallel.data, cfg.parallel.context, parallel_note(cfg),
        trainer.gradient_sync(),
        trainer.sharded_moments()
            ? fmt::format(", AdamW moments sharded over the {} ranks (ZeRO-1: each updates its "
                          "shard, the weights are gathered)",
                          world.size())
            : "",
        format_bytes(trainer.sent_bytes_per_step()));
  if (!opt.quiet) print_banner(stdout, info, cfg);

  TrainRun run(opt, cfg, be, *model, *data, trainer, world);
  run.set_hf_source(hf_source_of(cfg, resumed));
  run.set_lora_base(lora_start.base_record);
  run.open_metrics(resume != nullptr, resume ? resume->path() : std::string());
  resume.reset();  // unmaps the checkpoint's files before training
  experiments::install_interrupt_handler();
  const RunSummary summary = run.run(opt.stop_at, predicted);
  try {
    if (!opt.quiet) print_summary(stdout, summary);
  } catch (const std::system_error&) {
    // stdout is gone (its reader closed the pipe, or its disk is full): main reports it once the
    // metrics, which say everything the summary does, are closed.
  }
  run.close_metrics();
  run.throw_data_change();  // exit 2 (a DataError), after the summary and metrics are written
  return summary.interrupted ? 128 + run.stop_signal() : 0;
}

}  // namespace remat::cli
