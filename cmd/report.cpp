// Banner, progress, summary and JSONL metrics (see cmd/report.h).
#include "cmd/report.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "engine/core/cpu_workspace.h"
#include "engine/core/cuda_workspace.h"
#include "engine/core/error.h"
#include "engine/core/machine.h"
#include "engine/core/units.h"
#include "engine/devices.h"
#include "engine/experiments/interrupt.h"

namespace remat::cli {

void print_banner(std::FILE* out, const RunInfo& info, const Config& cfg) {
  fmt::print(out, "remat-train {} | {}\n", REMAT_VERSION, info.backend_line);
  fmt::print(out, "model  {} | {:.2f}M params | data {}\n", info.model_line,
             static_cast<double>(info.n_params) / 1e6, info.data_line);
  if (!info.documents_line.empty()) fmt::print(out, "docs   {}\n", info.documents_line);
  fmt::print(
      out,
      "run    batch {} x seq_len {}{} | {} steps | remat {} | predicted peak {} of budget {}{}\n",
      cfg.train.batch_size, cfg.train.seq_len,
      cfg.train.grad_accum > 1
          ? fmt::format(" x grad_accum {} ({} tokens per step)", cfg.train.grad_accum,
                        format_grouped(cfg.train.grad_accum * cfg.train.batch_size *
                                       (cfg.model.has_sequence() ? cfg.train.seq_len : 1)))
          : std::string(),
      cfg.train.steps, info.policy_line, format_bytes(info.predicted_peak_bytes),
      format_bytes(info.budget_bytes),
      info.predicted_host_peak_bytes
          ? fmt::format(", host {} of {}", format_bytes(info.predicted_host_peak_bytes),
                        format_bytes(info.host_budget_bytes))
          : std::string());
  if (info.none_peak_bytes)
    fmt::print(out, "memory without remat (policy none): {} ({}); with {}: {}\n",
               format_bytes(*info.none_peak_bytes),
               *info.none_peak_bytes <= info.budget_bytes ? "fits the budget too"
                                                          : "does NOT fit the budget",
               cfg.remat.policy, format_bytes(info.predicted_peak_bytes));
  if (!info.parallel_line.empty()) fmt::print(out, "{}\n", info.parallel_line);
  if (!info.resume_line.empty()) fmt::print(out, "{}\n", info.resume_line);
  std::fflush(out);
}

bool past_trained_positions(const ModelConfig& m, int64_t seq_len) {
  return m.has_sequence() && m.max_position_embeddings > 0 && seq_len > m.max_position_embeddings &&
         m.rope_scaling.kind == RopeScaling::None;
}

std::vector<std::string> run_warnings(const Config& cfg, const std::string& hf_source) {
  std::vector<std::string> out;
  if (!hf_source.empty() && cfg.data.source == "synthetic")
    out.push_back(fmt::format(
        "warning: [data] the model of {} trains on synthetic random tokens (data.source = "
        "\"{}\"), which teaches it nothing and unlearns what it knows. Fix: set data.source = "
        "\"tokens\" and data.path to shards of your text (scripts/prepare_data.py; "
        "configs/finetune.toml, docs/finetune.md)",
        hf_source, cfg.data.source));
  if (past_trained_positions(cfg.model, cfg.train.seq_len))
    out.push_back(fmt::format(
        "warning: [model] train.seq_len = {} is past the {} positions the model was trained for "
        "(model.max_position_embeddings), and it has no rope_scaling: it has never seen RoPE "
        "angles that large. Fix: train at train.seq_len <= {}, or start from a model made for "
        "longer contexts (docs/hf.md)",
        cfg.train.seq_len, cfg.model.max_position_embeddings, cfg.model.max_position_embeddings));
  // A budget past the RAM is planned against memory that is not there: the run ends out of
  // memory (exit 3) instead of the planner refusing it up front.
  const uint64_t ram = host_memory_bytes();
  if (picks_cpu(cfg) && cfg.device.memory_bytes > ram)
    out.push_back(fmt::format(
        "warning: [device] device.memory = {} is more than this machine's {} of RAM, where the CPU "
        "backend trains: the planner counts on memory that is not there, and a run that needs it "
        "stops out of memory (exit 3). Fix: leave device.memory unset (the RAM) or set it to at "
        "most {}",
        format_bytes(cfg.device.memory_bytes), format_bytes(ram), format_bytes(ram)));
  if (cfg.device.host_memory_bytes > ram)
    out.push_back(fmt::format(
        "warning: [device] device.host_memory = {} is more than this machine's {} of RAM: what is "
        "offloaded past it stops the run out of memory (exit 3). Fix: leave device.host_memory "
        "unset (the RAM) or set it to at most {}; plan for a bigger host with fit or plan instead",
        format_bytes(cfg.device.host_memory_bytes), format_bytes(ram), format_bytes(ram)));
  const TrainConfig& t = cfg.train;
  if (t.lr > 0 && t.warmup_steps > 0 && t.steps <= t.warmup_steps)
    out.push_back(fmt::format(
        "warning: [train] the run ends inside its warmup: train.steps = {} <= train.warmup_steps "
        "= {}, so the learning rate only rises (to {:.2e} at the last step) and never decays. "
        "Fix: raise train.steps (--steps) above {}, or lower train.warmup_steps",
        t.steps, t.warmup_steps, learning_rate(t, t.steps - 1), t.warmup_steps));
  return out;
}

namespace {
std::vector<std::pair<std::string, std::string>>& flag_overrides() {
  static std::vector<std::pair<std::string, std::string>> noted;
  return noted;
}
}  // namespace

void add_flag_override(std::vector<std::string>& sets, std::string set, const std::string& flag) {
  flag_overrides().emplace_back("--set " + set, flag);
  sets.push_back(std::move(set));
}

std::string with_flag_names(std::string message) {
  for (const auto& [set, flag] : flag_overrides())
    for (size_t at = message.find(set); at != std::string::npos;
         at = message.find(set, at + flag.size())) {
      const size_t end = at + set.size();  // the whole override, not a prefix of a longer one
      if (end < message.size() && message[end] != ':' && message[end] != ' ') continue;
      message.replace(at, set.size(), flag);
    }
  return message;
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
  write([&] {
    if (tty_) {
      fmt::print(out_, "\r\033[K{}", line);
      dirty_ = true;
    } else {
      fmt::print(out_, "{}\n", line);
    }
  });
}

void Progress::note(const std::string& text) {
  if (quiet_) return;
  write([&] {
    if (dirty_) fmt::print(out_, "\n");
    dirty_ = false;
    fmt::print(out_, "{}\n", text);
  });
}

void Progress::eval(int64_t step, double val_loss) {
  note(fmt::format("step {:>{}}/{} | val_loss {:.4f}", step, std::to_string(total_).size(), total_,
                   val_loss));
}

void Progress::finish() {
  if (quiet_) return;
  write([&] {
    if (dirty_) fmt::print(out_, "\n");
    dirty_ = false;
  });
}

void Progress::write(const std::function<void()>& print) {
  int err = 0;
  try {
    print();
    if (std::fflush(out_) == 0) return;
    err = errno;
  } catch (const std::system_error& e) {  // fmt's "cannot write to file"
    err = e.code().value();
  }
  // The output is gone: no more progress. Its reader closed the pipe (`train ... | head`): the
  // run stops after this step as SIGPIPE's default would stop it, but with its checkpoint and
  // metrics. Another failure (a full disk under a redirect) lets the run go on; main reports it.
  quiet_ = true;
  if (err == EPIPE) experiments::request_stop(SIGPIPE);
}

std::string tiling_note(const Config& cfg) {
  std::string note;
  if (cfg.remat.tile_tokens > 0)
    note += fmt::format(", MLP in chunks of {} tokens", cfg.remat.tile_tokens);
  if (cfg.remat.offloads_checkpoints())
    note += fmt::format(", {} in host memory", offloaded_what(cfg.remat.offload));
  return note;
}

AttentionChunks attention_chunks_of(const Config& cfg, DeviceKind device) {
  const ModelConfig& m = cfg.model;
  if (!m.has_sequence() || cfg.parallel.context > 1) return {};
  const int64_t W = (m.n_head + 2 * m.kv_heads()) * m.head_size();
  const Tensor qkv(nullptr, {cfg.train.batch_size, cfg.train.seq_len, W}, DType::BF16);
  return device == DeviceKind::Cuda ? cuda::attention_chunks(qkv, cfg.remat.attention_chunk)
                                    : cpu::attention_chunks(qkv, cfg.remat.attention_chunk);
}

std::string attention_chunk_note(const Config& cfg, DeviceKind device) {
  const AttentionChunks ch = attention_chunks_of(cfg, device);
  if (!ch.chunked()) return "";
  return fmt::format(", attention in {} chunks of {} tokens{}", ch.count(), ch.L,
                     cfg.remat.attention_chunk > 0 ? "" : " (cuDNN's 2^31-element limit)");
}

std::string attention_flops_note(const Config& cfg) {
  if (!cfg.data.documents()) return "";
  if (cfg.data.mean_document_tokens > 0)
    return fmt::format(
        "; attention counted for documents of {:.0f} tokens on average (shards.json)",
        cfg.data.mean_document_tokens);
  return "; attention counted at its causal upper bound (documents cost less: a shards.json beside "
         "the data with their mean length gives the estimate)";
}

std::string copy_line(const DryRun& run, const PlanTarget& target) {
  const CopyTime ct = copy_time(run, target);
  std::string line = fmt::format("  copies per step: {} to host, {} back to the device",
                                 format_bytes(static_cast<uint64_t>(run.to_host_bytes())),
                                 format_bytes(static_cast<uint64_t>(run.to_device_bytes())));
  if (!ct.modelled)
    return line + (target.host_is_device()
                       ? " (CPU: the host pool is the same RAM; offload here tests the executor)"
                       : " (no link or peak rates for this target: use --gpu NAME)");
  const std::string host_update =
      ct.host_update_s > 0
          ? fmt::format(
                "; AdamW on the host ~{:.3g} s ({} parameters x {:.0f} B at an assumed "
                "{:.0f} GB/s of host memory traffic), overlapping the next forward, after the "
                "gradient norm's ~{:.3g} s",
                ct.host_update_s, format_grouped(run.host_updated_params), kHostUpdateBytesPerParam,
                target.host_update_bytes_per_s / 1e9, ct.host_norm_s)
          : std::string();
  return line +
         fmt::format("; {:.3g} s at the link's rate vs compute >= {:.3g} s at peak ({}){}; {}",
                     ct.copy_s, ct.compute_s, target.rates_note, host_update,
                     ct.exposed_s > 0
                         ? fmt::format("up to {:.3g} s of copying{} is not hidden by compute",
                                       ct.exposed_s, ct.host_update_s > 0 ? " and host AdamW" : "")
                         : std::string("the copies hide behind compute"));
}

std::string copy_phase_line(const DryRun& run, const PlanTarget& target) {
  // The groups copy_time sets against their own compute.
  struct Group {
    const char* name;
    std::vector<Phase> phases;
  };
  const Group groups[] = {{"forward+loss", {Phase::Forward, Phase::Loss}},
                          {"recompute+backward", {Phase::Recompute, Phase::Backward}},
                          {"optimizer", {Phase::Optimizer}}};
  std::string line = "  copies by phase:";
  for (const Group& g : groups) {
    double out = 0, in = 0;
    for (Phase p : g.phases) {
      out += run.cost[static_cast<size_t>(p)].to_host_bytes;
      in += run.cost[static_cast<size_t>(p)].to_device_bytes;
    }
    line += fmt::format(" {} {} out, {} in", g.name, format_bytes(static_cast<uint64_t>(out)),
                        format_bytes(static_cast<uint64_t>(in)));
    if (target.link_bytes_per_s > 0)
      line += fmt::format(" ({:.3g} s)", (out + in) / target.link_bytes_per_s);
    line += g.phases.front() == Phase::Optimizer ? "" : ";";
  }
  return line;
}

std::string parallel_note(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  if (p.world_ranks() == 1) return "";
  std::string parts;
  if (p.data_ranks() > 1)
    parts = fmt::format("{} rows of the batch on each of {} data-parallel groups",
                        local_batch_size(cfg), p.data_ranks());
  if (p.context > 1)
    parts += fmt::format("{}{} tokens of each row on each of {} context ranks",
                         parts.empty() ? "" : ", ", format_count(local_seq_len(cfg)), p.context);
  return fmt::format(" (on {} ranks: {}; figures are rank {}'s)", p.world_ranks(), parts, p.rank);
}

void refuse_several_ranks(const Config& cfg, const char* command) {
  if (cfg.parallel.world_ranks() <= 1) return;
  throw ConfigError(fmt::format(
      "{}: [parallel] data = {} x context = {} asks for {} ranks, and `remat-train {}` runs one "
      "process. Fix: train with `mpirun -np {} remat-train train --config {}`, plan a rank with "
      "`remat-train plan` or `fit` (without --measure), or remove [parallel] for {}",
      cfg.path, cfg.parallel.data_ranks(), cfg.parallel.context, cfg.parallel.world_ranks(),
      command, cfg.parallel.world_ranks(), cfg.path, command));
}

void add_rank_sets(std::vector<std::string>& sets, const std::string& config_path,
                   std::optional<int64_t> ranks, std::optional<int64_t> context) {
  if (context) {
    add_flag_override(sets, fmt::format("parallel.context={}", *context),
                      fmt::format("--context {}", *context));
  }
  if (!ranks) return;
  const int64_t c = context ? *context : load_config(config_path, sets).parallel.context;
  if (*ranks % c != 0)
    throw ConfigError(fmt::format(
        "--ranks {}: [parallel] {} ranks do not form groups of parallel.context = {}. Fix: give "
        "a multiple of {} ranks, or another --context",
        *ranks, *ranks, c, c));
  add_flag_override(sets, fmt::format("parallel.data={}", *ranks / c),
                    fmt::format("--ranks {}", *ranks));
}

std::string auto_remat_table(const AutoPlan& a, const PlanTarget& t) {
  // One line when short; deep models get one array line per 6 blocks (TOML arrays may span lines).
  std::string quoted;
  const bool wrap = a.policies.size() > 8;
  for (size_t i = 0; i < a.policies.size(); ++i)
    quoted += fmt::format("{}\"{}\"",
                          i == 0 ? (wrap ? "\n  " : "") : (wrap && i % 6 == 0 ? ",\n  " : ", "),
                          a.policies[i]);
  if (wrap) quoted += ",\n";
  return fmt::format(
      "[remat]\n# remat.policy = \"auto\" on {} with a budget of {}: predicted peak {} ({} B), "
      "recompute +{:.2f}%{}\nplan = [{}]\n{}{}",
      t.name, format_bytes(a.budget_bytes), format_bytes(a.peak_bytes), a.peak_bytes,
      100.0 * a.recompute_overhead,
      a.offload != OffloadKind::None
          ? fmt::format(", host peak {} of {}", format_bytes(a.host_peak_bytes),
                        format_bytes(a.host_budget_bytes))
          : std::string(),
      quoted,
      (a.every > 1 ? fmt::format("every = {}\n", a.every) : std::string()) +
          (a.tile_tokens > 0 ? fmt::format("tile_tokens = {}\n", a.tile_tokens) : std::string()),
      a.offload != OffloadKind::None ? fmt::format("offload = \"{}\"\n", a.offload)
                                     : std::string());
}

std::string exchange_line(const DryRun& run, const PlanTarget& target) {
  std::string line = fmt::format(
      "  {} ranks ({} per sequence): every figure is one rank's{}; sent per rank per step: {} {}",
      run.ranks, run.context_ranks,
      run.sharded_optimizer ? fmt::format(", AdamW moments 1/{} (sharded)", run.ranks) : "",
      run.sharded_optimizer ? "gradients (reduce-scatter) and weights (all-gather)" : "gradients",
      format_bytes(run.grad_sent_bytes));
  if (run.context_ranks > 1)
    line += fmt::format(", ring {}", format_bytes(static_cast<uint64_t>(run.ring_bytes())));
  const ExchangeTime et = exchange_time(run, target);
  if (!et.modelled)
    return line + (target.count.device == DeviceKind::Cpu
                       ? " (CPU ranks of one machine exchange through shared memory; not timed)"
                       : " (no link rates for this target: use --gpu NAME)");
  line += fmt::format("; {} {:.3g} s at {}",
                      run.sharded_optimizer ? "gradients and weights" : "gradients", et.gradient_s,
                      et.gradient_link);
  if (run.context_ranks > 1) line += fmt::format(", ring {:.3g} s at {}", et.ring_s, et.ring_link);
  return line +
         fmt::format(" vs compute >= {:.3g} s at peak: {}", et.compute_s,
                     et.exposed_s > 0
                         ? fmt::format("up to {:.3g} s of exchange is not hidden by its phase's "
                                       "compute",
                                       et.exposed_s)
                         : std::string("every phase's exchange can hide behind its compute"));
}

namespace {
const CpuTicks kStartTicks = read_cpu_ticks();  // when the process started
}  // namespace

double cpu_steal_share() {
  return steal_share(kStartTicks, read_cpu_ticks());
}

std::string steal_note() {
  // Only when the host took some: on a quiet host (or bare metal) the note is empty.
  const double steal = cpu_steal_share();
  return steal >= 0.005 ? fmt::format(", CPU steal {:.0f}%", 100 * steal) : std::string();
}

std::string load_note() {
  double load[1] = {0};
  return (getloadavg(load, 1) == 1 ? fmt::format("load average {:.2f}", load[0])
                                   : std::string("load average unknown")) +
         steal_note();
}

void print_summary(std::FILE* out, const RunSummary& s) {
  fmt::print(out, "summary{}: {} steps, policy {}, batch {} x seq_len {}{}\n",
             s.interrupted ? " (interrupted)" : "", s.steps, s.policy, s.batch_size, s.seq_len,
             s.grad_accum > 1 ? fmt::format(" x grad_accum {}", s.grad_accum) : std::string());
  fmt::print(out, "  final loss      {:.4f}", s.final_loss);
  if (s.final_task_metric)
    fmt::print(out, " ({} {:.4f})", s.task_metric_name, *s.final_task_metric);
  if (s.final_val_loss) fmt::print(out, " | val_loss {:.4f}", *s.final_val_loss);
  if (!s.checkpoint_path.empty()) fmt::print(out, "\n  checkpoint      {}", s.checkpoint_path);
  fmt::print(out, "\n  speed           {:.1f} ms/step (median), {:.0f} tokens/s{}\n",
             s.median_step_ms, s.tokens_per_s, steal_note());
  fmt::print(out, "  peak memory     {} ({} B), reached during {}\n",
             format_bytes(s.peak.total_bytes), s.peak.total_bytes, s.peak.phase);
  if (s.steps_run == 0)  // the measured peak is the set-up's alone: nothing to compare
    fmt::print(out, "  predicted peak  {} B: no step ran to compare it with\n",
               s.predicted_peak_bytes);
  else if (s.predicted_peak_bytes == s.peak.total_bytes)
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
  if (s.steps_run > 0 && (s.host_peak.total_bytes || s.predicted_host_peak_bytes)) {
    const uint64_t h = s.host_peak.total_bytes;
    fmt::print(out, "  host peak       {} ({} B) in host memory (remat.offload), {}\n",
               format_bytes(h), h,
               h == s.predicted_host_peak_bytes
                   ? std::string("equal to the predicted")
                   : fmt::format("WARNING: predicted {} B, {:+} B off (please report)",
                                 s.predicted_host_peak_bytes,
                                 static_cast<int64_t>(h) -
                                     static_cast<int64_t>(s.predicted_host_peak_bytes)));
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
  fmt::print(out, "  FLOPs per step  forward+loss {}, backward {}, recompute {} (+{:.1f}%){}\n",
             format_flops(fwd), format_flops(bwd), format_flops(rec),
             fwd + bwd > 0 ? 100.0 * rec / (fwd + bwd) : 0.0, s.flops_note);
  const double model = model_flops(c);  // MFU's count: the same for every policy
  const bool frozen = c[static_cast<size_t>(Phase::Backward)].skipped_flops > 0;
  if (s.median_step_ms > 0)
    fmt::print(out,
               "  achieved        {:.1f} GFLOP/s executed ({:.1f} GFLOP/s of model FLOPs: 3x the "
               "forward's + the loss head's{})\n",
               (fwd + bwd + rec) / (s.median_step_ms * 1e6), model / (s.median_step_ms * 1e6),
               frozen ? ", less the frozen weights' gradients" : "");
  std::fflush(out);
}

namespace {

// The lines of an earlier run's metrics, minus its summary (the resumed run writes its own).
std::string earlier_lines(const std::string& path) {
  const std::string tmp = path + ".tmp";  // what versions before direct writes left when killed
  std::ifstream in(std::filesystem::exists(path) ? path : tmp);
  std::string kept, line;
  while (std::getline(in, line))
    if (!line.empty() && line.rfind("{\"summary\"", 0) != 0) kept += line + '\n';
  return kept;
}

bool write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Replaces `path` with `text` atomically (tmp, fsync, rename): a resumed run's carried-over lines
// are never lost to a crash between truncating the file and writing them back.
void replace_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const bool ok = fd >= 0 && write_all(fd, text.data(), text.size()) && ::fsync(fd) == 0;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw MetricsWriteError(
        fmt::format("[metrics] cannot write {}: {}. Fix: free space or choose "
                    "another --metrics path",
                    path, std::strerror(ok ? errno : err)));
  }
}

}  // namespace

void check_metrics_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::exists(st) && !fs::is_regular_file(st))
    throw ConfigError(fmt::format(
        "--metrics {}: [metrics] exists and is not a regular file (a directory, device or pipe). "
        "Fix: give a file name, e.g. {}/metrics.jsonl",
        path, fs::is_directory(st) ? path : std::string("run")));
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec))
    throw ConfigError(fmt::format(
        "--metrics {}: [metrics] the folder {} does not exist. Fix: create it, or choose another "
        "path",
        path, parent.string()));
}

MetricsWriter::MetricsWriter(std::string path, bool keep_existing) : path_(std::move(path)) {
  const std::string earlier = keep_existing ? earlier_lines(path_) : std::string();
  if (!earlier.empty()) replace_file(path_, earlier);
  const int flags = earlier.empty() ? O_TRUNC : O_APPEND;
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | flags, 0644);
  if (fd_ < 0)
    throw IoError(
        fmt::format("[metrics] cannot write {}: {}. Fix: check that the folder exists "
                    "and is writable",
                    path_, std::strerror(errno)));
  good_bytes_ = earlier.size();
  std::error_code ec;
  std::filesystem::remove(path_ + ".tmp", ec);  // an older version's leftover, now carried over
}

void MetricsWriter::fail(const std::string& what, int err) {
  throw MetricsWriteError(
      fmt::format("[metrics] {} {} failed: {}. Fix: free space or choose another --metrics path",
                  what, path_, std::strerror(err)));
}

void MetricsWriter::write_json(nlohmann::json& j) {
  if (rank_ >= 0) j["rank"] = rank_;
  write_line(json_text(j));
}

void MetricsWriter::write_line(const std::string& line) {
  if (fd_ < 0) fail("writing", EBADF);
  const std::string text = line + '\n';
  if (!write_all(fd_, text.data(), text.size())) {
    const int err = errno ? errno : EIO;
    // Cut a partial line off, so the file still parses line by line.
    [[maybe_unused]] const int cut = ::ftruncate(fd_, static_cast<off_t>(good_bytes_));
    fail("writing", err);
  }
  good_bytes_ += text.size();
}

void MetricsWriter::event(const std::string& kind, int64_t step, const std::string& path,
                          double ms) {
  nlohmann::json j = {{"event", kind}, {"step", step}, {"path", path}};
  if (ms >= 0) j["ms"] = ms;
  write_json(j);
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);  // an error path: every finished line is already in the file
}

void MetricsWriter::step(const StepMetrics& m, const std::string& task_metric_name,
                         std::optional<double> val_loss) {
  nlohmann::json j = {{"step", m.step},       {"loss", m.loss},
                      {"lr", m.lr},           {"grad_norm", m.grad_norm},
                      {"step_ms", m.step_ms}, {"tokens_per_s", m.tokens_per_s},
                      {"tokens", m.tokens},   {"peak_bytes", m.peak_bytes}};
  if (m.task_metric) j[task_metric_name] = *m.task_metric;
  if (val_loss) j["val_loss"] = *val_loss;
  write_json(j);
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
                      {"grad_accum", s.grad_accum},
                      {"steps", s.steps},
                      {"final_loss", s.final_loss},
                      {"peak_bytes", s.peak.total_bytes},
                      {"predicted_peak_bytes", s.predicted_peak_bytes},
                      {"host_peak_bytes", s.host_peak.total_bytes},
                      {"predicted_host_peak_bytes", s.predicted_host_peak_bytes},
                      {"peak_phase", s.peak.phase},
                      {"peak_by_category", cats},
                      {"median_step_ms", s.median_step_ms},
                      {"tokens_per_s", s.tokens_per_s},
                      {"flops_per_step", flops},
                      {"interrupted", s.interrupted}};
  if (s.final_task_metric) j["final_" + s.task_metric_name] = *s.final_task_metric;
  if (s.final_val_loss) j["final_val_loss"] = *s.final_val_loss;
  if (!s.checkpoint_path.empty()) j["checkpoint"] = s.checkpoint_path;
  nlohmann::json line = {{"summary", j}};
  write_json(line);
}

void MetricsWriter::close() {
  if (fd_ < 0) return;
  const bool synced = ::fsync(fd_) == 0 || errno == EINVAL;  // EINVAL: a file that cannot sync
  const int err = errno;
  const bool closed = ::close(fd_) == 0;
  fd_ = -1;
  if (!synced || !closed) fail("closing", synced ? errno : err);
}

}  // namespace remat::cli
