// `remat-train eval`: did a model learn to use its context? Two measures, each run as `train`
// runs a step: the model of a checkpoint (--checkpoint) or a Hugging Face folder (--model hf:DIR)
// on the config's backend, within its memory budget, through the executor's forward-only pass
// (forward_loss: no backward, no optimizer) with the same chunked attention, tiling and offload,
// after the planner's dry run of that very pass has checked the budget.
//   loss by position  held-out windows of seq_len + 1 tokens (data/eval_windows.h); the mean loss
//                     of each position bin (1, 2, 3-4, 5-8, ... up to seq_len): a curve that keeps
//                     falling towards the far positions shows the far context being used.
//   --passkey DIR     the tasks scripts/prepare_data.py --passkey wrote (data/passkey_tasks.h),
//                     each at its own length; a task is answered exactly when, under teacher
//                     forcing, the LM head's greedy prediction of every scored target (its loss
//                     mask's 1s: the key's tokens) is that target.
// Prints a table (or --json, which scripts/plot_eval.py draws), and the measured peak beside the
// predicted one. A length the budget cannot hold is refused naming the longest that fits.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cmd/commands.h"
#include "cmd/report.h"
#include "cmd/train_lora.h"
#include "data/eval_windows.h"
#include "data/passkey_tasks.h"
#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/devices.h"
#include "engine/model_files/hf_weights.h"
#include "engine/planner/planner.h"
#include "engine/remat/executor.h"
#include "engine/training/checkpoint.h"
#include "engine/training/lora_checkpoint.h"
#include "layers/models.h"

namespace remat::cli {
namespace {

using Json = nlohmann::ordered_json;

constexpr int64_t kDefaultWindows = 8;

// Where the weights come from, and the config that describes their model.
struct Source {
  std::string name;        // the checkpoint folder, or hf:DIR
  std::string checkpoint;  // set for a checkpoint
  std::string hf_dir;      // set for a Hugging Face folder
  std::string lora_base;   // a LoRA checkpoint's frozen base folder (its state.json's record)
};

Source resolve_source(const EvalOptions& opt, Config& cfg) {
  Source src;
  if (!opt.model.empty()) {
    cfg = load_config(
        opt.config_path.empty() ? opt.model : opt.config_path,
        opt.config_path.empty() ? opt.overrides : [&] {
          std::vector<std::string> sets = opt.overrides;
          sets.push_back(from_hf_override(opt.model.substr(3)));
          return sets;
        }());
    src.hf_dir = cfg.model.from_hf;
    src.name = "hf:" + src.hf_dir;
    return src;
  }
  if (opt.checkpoint == "latest") {
    if (opt.config_path.empty())
      throw ConfigError(
          "[eval] --checkpoint latest names the newest checkpoint of a config's checkpoint.dir. "
          "Fix: add --config FILE, or give the checkpoint folder");
    const Config run = load_config(opt.config_path, opt.overrides);
    if (run.checkpoint.dir.empty())
      throw ConfigError(fmt::format(
          "{}: [eval] --checkpoint latest: checkpoint.dir is not set. Fix: set it, or give the "
          "checkpoint folder",
          opt.config_path));
    src.checkpoint = latest_checkpoint(run.checkpoint.dir);
    if (src.checkpoint.empty())
      throw CheckpointError(fmt::format(
          "[eval] --checkpoint latest: no complete checkpoint in {}. Fix: train first, or give "
          "a checkpoint folder",
          run.checkpoint.dir));
  } else {
    src.checkpoint = resolve_checkpoint(opt.checkpoint, "eval");
  }
  // The run's own config, as state.json keeps it, with --set on top (device, remat, data, and a
  // RoPE scaling to score it under): never another model, which would be scored silently.
  for (const std::string& set : opt.overrides) {
    const std::string key = set.substr(0, set.find('='));
    const bool model_key =
        key.rfind("model.", 0) == 0 && !rope_extension_key(std::string_view(key).substr(6));
    if (model_key || key.rfind("lora.", 0) == 0)
      throw ConfigError(fmt::format(
          "--set {}: [eval] scores the checkpoint's own model, and {} would change it. Fix: drop "
          "it (to score another model: export it with export --hf DIR, then eval --model hf:DIR)",
          set, key));
    // What the run held out is its own split: another one may be text it trained on.
    if (key == "data.path" || key == "data.val_path" || key == "data.val_fraction")
      throw ConfigError(fmt::format(
          "--set {}: [eval] scores what the checkpoint's run held out, and another {} may hold "
          "text it trained on. Fix: drop it, and pass held-out files with --data FILES",
          set, key));
  }
  const Checkpoint ckpt(src.checkpoint);
  cfg = parse_config(ckpt.state().config_toml, src.checkpoint + "/state.json", opt.overrides);
  src.name = src.checkpoint;
  if (cfg.lora.enabled()) {
    // A LoRA checkpoint holds the adapters (and the modules trained whole); the rest of the
    // model is the base it records, which must still be there unchanged.
    src.lora_base = required_lora_base(ckpt.state(), src.checkpoint, "evaluate");
  }
  return src;
}

void load_model_weights(const Source& src, const Config& cfg, Backend& be, Model& model) {
  if (!src.lora_base.empty()) hf::load_weights(src.lora_base, cfg.model, be, model);
  if (!src.checkpoint.empty())  // a LoRA checkpoint's: the parameters that trained
    load_weights(src.checkpoint, be, model);
  else
    hf::load_weights(src.hf_dir, cfg.model, be, model);
}

// The evaluation's plan: the forward pass at cfg's shape on the count backend, refused when its
// peak is over the budget, naming the longest seq_len whose evaluation fits.
DryRun plan_eval(const Planner& planner, const Config& cfg, StepKind kind, const char* length) {
  const DryRun run = planner.dry_run(cfg, true, kind);
  if (planner.fits(run)) return run;
  const int64_t longest = planner.longest_seq_len(cfg, &run, kind);
  const bool host = run.host_peak.total_bytes > planner.target().host_bytes;
  throw ConfigError(fmt::format(
      "[eval] {} {}: its forward pass peaks at {} ({} B) during {}, over the {} budget of {} ({}). "
      "Fix: {}, raise {}, or let more of it go (remat.attention_chunk, remat.tile_tokens, "
      "remat.offload)",
      length, cfg.train.seq_len,
      format_bytes(host ? run.host_peak.total_bytes : run.peak.total_bytes),
      host ? run.host_peak.total_bytes : run.peak.total_bytes,
      host ? run.host_peak.phase : run.peak.phase, host ? "host" : "device",
      format_bytes(host ? planner.target().host_bytes : planner.target().pool_budget()),
      host ? "device.host_memory" : "device.memory",
      (longest > 0 ? fmt::format("the longest that fits is {} {}", length, longest)
                   : std::string("no length fits this model here")) +
          (cfg.train.batch_size > 1
               ? fmt::format(" at --batch-size {} (a smaller one fits more)", cfg.train.batch_size)
               : std::string()),
      host ? "device.host_memory" : "device.memory"));
}

// A batch of `rows` windows of seq_len + 1 tokens, as the data sources allocate it (the dry run's
// DataSource::next), uploaded.
Batch make_batch(Backend& be, const std::vector<int32_t>& windows, int64_t rows, int64_t T) {
  Batch b;
  b.inputs = be.pool().allocate({rows, T}, DType::I32, MemCategory::Transient, "batch.inputs");
  b.targets = be.pool().allocate({rows, T}, DType::I32, MemCategory::Transient, "batch.targets");
  b.n_tokens = rows * T;
  std::vector<int32_t> inputs(static_cast<size_t>(rows * T)), targets(inputs.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < T; ++t) {
      inputs[static_cast<size_t>(r * T + t)] = windows[static_cast<size_t>(r * (T + 1) + t)];
      targets[static_cast<size_t>(r * T + t)] = windows[static_cast<size_t>(r * (T + 1) + t + 1)];
    }
  be.upload(b.inputs, inputs.data());
  be.upload(b.targets, targets.data());
  return b;
}

// The memory line: the measured peak beside the plan's.
Json memory_json(Backend& be, uint64_t predicted) {
  return {{"peak_bytes", be.pool().peak_bytes()}, {"predicted_peak_bytes", predicted}};
}
std::string memory_line(Backend& be, uint64_t predicted) {
  const uint64_t peak = be.pool().peak_bytes();
  return fmt::format(
      "memory  peak {} ({} B), predicted {} B: {}", format_bytes(peak), peak, predicted,
      peak == predicted
          ? "equal to the measured peak"
          : fmt::format("{:+.2f}% of the measured peak",
                        100.0 * (static_cast<double>(predicted) - static_cast<double>(peak)) /
                            static_cast<double>(peak)));
}

// Position bins by the tokens of context a prediction sees (position t + 1), each ending at a
// power of two: 1, 2, 3-4, 5-8, ..., the last one ending at seq_len.
struct Bin {
  int64_t first = 0, last = 0, tokens = 0;
  double sum = 0;
};
std::vector<Bin> position_bins(int64_t T) {
  std::vector<Bin> bins = {{1, 1}};
  for (int64_t end = 2; end / 2 < T; end *= 2) bins.push_back({end / 2 + 1, std::min(end, T)});
  return bins;
}
size_t bin_of(int64_t t) {  // t: 0-based position; its bin ends at the power of two >= t + 1
  return static_cast<size_t>(std::bit_width(static_cast<uint64_t>(t)));
}

int loss_by_position(const EvalOptions& opt, Config cfg, const Source& src, Backend& be,
                     const Planner& planner, const std::string& backend_line) {
  const int64_t wanted = opt.windows > 0 ? opt.windows : kDefaultWindows;
  // No more rows than windows to score (a --batch-size past them would only repeat windows): the
  // data is read before the plan then; with one row the plan's refusal comes first.
  std::optional<EvalWindows> held_out;
  if (cfg.train.batch_size > 1) {
    held_out.emplace(cfg, opt.data);
    cfg.train.batch_size = std::min(cfg.train.batch_size, std::min(wanted, held_out->count()));
  }
  const int64_t T = cfg.train.seq_len, B = cfg.train.batch_size;
  const DryRun predicted = plan_eval(planner, cfg, StepKind::Eval, "--seq-len");
  if (!held_out) held_out.emplace(cfg, opt.data);
  const EvalWindows& windows = *held_out;
  const int64_t n = std::min(wanted, windows.count());
  std::unique_ptr<Model> model = make_model(cfg, be);
  load_model_weights(src, cfg, be, *model);
  model->set_training(false);
  std::vector<Bin> bins = position_bins(T);
  double total = 0;
  std::vector<int32_t> rows(static_cast<size_t>(B * (T + 1)));
  std::vector<uint8_t> scored(static_cast<size_t>(B * T));
  int64_t counted = 0;
  for (int64_t w0 = 0; w0 < n; w0 += B) {
    // A last batch short of B rows repeats its windows (the shape stays the plan's); only the
    // windows asked for are counted, and of them the targets a loss mask does not hide.
    for (int64_t r = 0; r < B; ++r)
      windows.read(std::min(w0 + r, n - 1), rows.data() + r * (T + 1), scored.data() + r * T);
    be.pool().set_phase("eval data");
    const Batch batch = make_batch(be, rows, B, T);
    const StepLoss loss = forward_loss(be, *model, batch);
    for (int64_t r = 0; r < std::min(B, n - w0); ++r)
      for (int64_t t = 0; t < T; ++t) {
        if (!scored[static_cast<size_t>(r * T + t)]) continue;
        const double l = loss.row_losses[static_cast<size_t>(r * T + t)];
        Bin& bin = bins[bin_of(t)];
        bin.sum += l;
        ++bin.tokens;
        total += l;
        ++counted;
      }
  }
  if (counted == 0)
    throw DataError(fmt::format(
        "[eval] {}: the loss masks hide every target of the {} window{} scored. Fix: raise "
        "--windows, or pass other held-out files with --data",
        windows.describe(n), n, n == 1 ? "" : "s"));
  const double mean = total / static_cast<double>(counted);
  // A bin the masks emptied has no mean: null in JSON, "-" in the table.
  const auto bin_mean = [](const Bin& b) {
    return b.tokens ? Json(b.sum / static_cast<double>(b.tokens)) : Json(nullptr);
  };
  if (opt.json) {
    Json j = {{"eval", "loss_by_position"},
              {"label", opt.label.empty() ? src.name : opt.label},
              {"source", src.name},
              {"model", model->describe() + lora_summary(cfg, *model)},
              {"rope_scaling", std::string(rope_type_name(cfg.model.rope_scaling.kind))},
              {"seq_len", T},
              {"windows", n},
              {"tokens", counted},
              {"data", windows.describe(n)},
              {"loss", mean},
              {"bins", Json::array()}};
    for (const Bin& b : bins)
      j["bins"].push_back(
          {{"first", b.first}, {"last", b.last}, {"tokens", b.tokens}, {"loss", bin_mean(b)}});
    j["memory"] = memory_json(be, predicted.peak.total_bytes);
    fmt::print("{}\n", json_text(j, 1));
    return 0;
  }
  fmt::print("eval   {} | {} | seq_len {} | {}\n", src.name,
             model->describe() + lora_summary(cfg, *model), T, backend_line);
  fmt::print("data   {}\n{}", windows.describe(n), lora_scoring_note(cfg));
  fmt::print("{:<16}{:>10}{:>12}\n", "positions", "tokens", "mean loss");
  for (const Bin& b : bins)
    fmt::print(
        "{:<16}{:>10}{:>12}\n",
        b.first == b.last ? fmt::format("{}", b.first) : fmt::format("{}-{}", b.first, b.last),
        b.tokens,
        b.tokens ? fmt::format("{:.4f}", b.sum / static_cast<double>(b.tokens)) : std::string("-"));
  fmt::print("{:<16}{:>10}{:>12.4f}\n", "all", counted, mean);
  fmt::print("{}\n", memory_line(be, predicted.peak.total_bytes));
  return 0;
}

// One passkey task scored: exact when the greedy prediction of every scored target is it.
struct Scored {
  bool exact = true;
  double answer_loss = 0;  // mean over the scored targets
};
Scored score_task(Backend& be, Model& model, const std::vector<int32_t>& tokens,
                  const std::vector<uint8_t>& mask, int64_t T) {
  be.pool().set_phase("eval data");
  const Batch batch = make_batch(be, tokens, 1, T);
  const StepLoss loss = forward_loss(be, model, batch, /*predictions=*/true);
  Scored s;
  int64_t scored = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (mask[static_cast<size_t>(t + 1)] == 0) continue;  // the target of position t is token t+1
    ++scored;
    s.exact =
        s.exact && loss.predictions[static_cast<size_t>(t)] == tokens[static_cast<size_t>(t + 1)];
    s.answer_loss += loss.row_losses[static_cast<size_t>(t)];
  }
  s.answer_loss /= static_cast<double>(scored);
  return s;
}

std::string depth_label(double d) {
  return fmt::format("{:g}", d);
}

int passkey(const EvalOptions& opt, Config cfg, const Source& src, Backend& be,
            const Planner& planner, const std::string& backend_line) {
  const PasskeyTasks tasks(opt.passkey, cfg.model.vocab_size);
  const std::vector<int64_t> lengths = tasks.lengths();
  const std::vector<double> depths = tasks.depths();
  cfg.train.batch_size = 1;
  // (length, depth) -> exact answers, tasks
  std::map<std::pair<int64_t, double>, std::pair<int64_t, int64_t>> cells;
  Json task_rows = Json::array();
  uint64_t predicted_peak = 0;
  std::string model_line;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  for (const int64_t length : lengths) {
    if (cfg.model.position == PositionKind::Learned && length > cfg.model.n_ctx)
      throw ConfigError(fmt::format(
          "[eval] passkey length {}: the model learned positions up to n_ctx = {} only. Fix: "
          "tasks of at most that length",
          length, cfg.model.n_ctx));
    cfg.train.seq_len = length;
    const DryRun predicted = plan_eval(planner, cfg, StepKind::EvalPredictions, "passkey length");
    predicted_peak = std::max(predicted_peak, predicted.peak.total_bytes);
    std::unique_ptr<Model> model = make_model(cfg, be);
    load_model_weights(src, cfg, be, *model);
    model->set_training(false);
    model_line = model->describe() + lora_summary(cfg, *model);
    for (const PasskeyTask& t : tasks.tasks()) {
      if (t.length != length) continue;
      tasks.read(t, tokens, mask);
      const Scored s = score_task(be, *model, tokens, mask, length);
      auto& cell = cells[{t.length, t.depth}];
      cell.first += s.exact ? 1 : 0;
      cell.second += 1;
      task_rows.push_back({{"length", t.length},
                           {"depth", t.depth},
                           {"sample", t.sample},
                           {"key", t.key},
                           {"exact", s.exact},
                           {"answer_loss", s.answer_loss}});
    }
  }
  int64_t exact = 0;
  for (const auto& [where, c] : cells) exact += c.first;
  const auto n_tasks = static_cast<int64_t>(tasks.tasks().size());
  if (opt.json) {
    Json j = {{"eval", "passkey"},        {"label", opt.label.empty() ? src.name : opt.label},
              {"source", src.name},       {"model", model_line},
              {"tasks_dir", tasks.dir()}, {"tokenizer", tasks.tokenizer()},
              {"lengths", lengths},       {"depths", depths},
              {"exact", exact},           {"tasks", n_tasks},
              {"cells", Json::array()}};
    for (const auto& [where, c] : cells)
      j["cells"].push_back({{"length", where.first},
                            {"depth", where.second},
                            {"exact", c.first},
                            {"tasks", c.second}});
    j["task_results"] = task_rows;
    j["memory"] = memory_json(be, predicted_peak);
    fmt::print("{}\n", json_text(j, 1));
    return 0;
  }
  fmt::print("passkey {} | {} tasks ({}) | {} | {} | {}\n", tasks.dir(), n_tasks, tasks.tokenizer(),
             src.name, model_line, backend_line);
  fmt::print("{}exact answers per depth (rows) and length (columns)\n", lora_scoring_note(cfg));
  std::string head = fmt::format("{:<8}", "depth");
  for (const int64_t l : lengths) head += fmt::format("{:>10}", format_count(l));
  fmt::print("{}\n", head);
  for (const double d : depths) {
    std::string row = fmt::format("{:<8}", depth_label(d));
    for (const int64_t l : lengths) {
      const auto it = cells.find({l, d});
      row += it == cells.end()
                 ? fmt::format("{:>10}", "-")
                 : fmt::format("{:>10}", fmt::format("{}/{}", it->second.first, it->second.second));
    }
    fmt::print("{}\n", row);
  }
  fmt::print("exact match {} of {} ({:.0f}%)\n", exact, n_tasks,
             100.0 * static_cast<double>(exact) / static_cast<double>(n_tasks));
  fmt::print("{}\n", memory_line(be, predicted_peak));
  return 0;
}

}  // namespace

int run_eval(const EvalOptions& opt) {
  Config cfg;
  const Source src = resolve_source(opt, cfg);
  if (opt.seq_len) cfg.train.seq_len = *opt.seq_len;
  cfg.train.batch_size = opt.batch_size.value_or(1);
  if (cfg.model.position == PositionKind::Learned && cfg.model.has_sequence() &&
      opt.passkey.empty() && cfg.train.seq_len > cfg.model.n_ctx)
    throw ConfigError(fmt::format(
        "[eval] --seq-len {}: the model learned positions up to n_ctx = {} only. Fix: a seq_len "
        "of at most {} (RoPE models extend past their training length)",
        cfg.train.seq_len, cfg.model.n_ctx, cfg.model.n_ctx));
  if (!cfg.model.has_sequence())
    throw ConfigError(
        "[eval] the MLP model has no tokens to score. Fix: evaluate a gpt or llama "
        "model");
  if (cfg.parallel.context > 1 || cfg.parallel.data > 1) {  // eval runs on one process
    cfg.parallel.context = 1;
    cfg.parallel.data = 0;
  }
  cfg.checkpoint.dir.clear();  // eval writes no checkpoint (nor its staging buffer)
  BackendChoice choice = make_backend(cfg);
  Backend& be = *choice.backend;
  const Planner planner(run_plan_target(be), make_run_parts);
  const std::string backend_line = fmt::format("{} ({})", be.describe(), choice.why);
  if (!opt.passkey.empty()) return passkey(opt, cfg, src, be, planner, backend_line);
  return loss_by_position(opt, cfg, src, be, planner, backend_line);
}

}  // namespace remat::cli
