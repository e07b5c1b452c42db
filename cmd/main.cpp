// remat-train entry point: parses the command line (CLI11), runs a subcommand, and maps
// exceptions to exit codes — the only place that chooses them:
//   0 ok, 1 runtime failure, 2 usage, config, data or checkpoint error, 3 does not fit the memory
//   budget, 128 + signal when stopped by SIGINT (130), SIGTERM (143) or SIGHUP (129).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "cmd/commands.h"
#include "cmd/report.h"
#include "engine/config/config.h"
#include "engine/config/config_path.h"
#include "engine/config/policy.h"
#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/cpu/blas_kernel.h"
#include "engine/cpu/openmp_wait.h"
#include "engine/experiments/interrupt.h"
#include "engine/parallel/communicator.h"
#include "engine/planner/planner.h"

namespace {

constexpr int kExitRuntime = 1;
constexpr int kExitUsage = 2;
constexpr int kExitOutOfMemory = 3;

// `remat-train --config F` means `remat-train train --config F`. `subcommands`: the app's, in
// the order --help lists them.
std::vector<std::string> with_default_subcommand(int argc, char** argv,
                                                 const std::vector<std::string>& kSubcommands) {
  std::vector<std::string> args(argv + 1, argv + argc);
  static const std::vector<std::string> kTopLevel = {"-h", "--help", "--version"};
  if (args.empty()) return args;
  for (const auto& s : kSubcommands)
    if (args[0] == s) return args;
  for (const auto& s : kTopLevel)
    if (args[0] == s) return args;
  // Only flags imply `train`; a word is a subcommand, and a misspelt one must not turn into
  // "--config is required".
  if (args[0].empty() || args[0][0] != '-')
    throw remat::ConfigError(fmt::format(
        "unknown subcommand '{}'. Fix: use one of {} (or `remat-train --config FILE` to train)",
        args[0], fmt::join(kSubcommands, ", ")));
  args.insert(args.begin(), "train");
  return args;
}

// Optional size / count flags ("80GiB", "32k"): empty means not given; malformed is a usage error.
std::optional<uint64_t> size_flag(const char* flag, const std::string& text) {
  if (text.empty()) return std::nullopt;
  auto v = remat::parse_size(text);
  if (!v)
    throw remat::ConfigError(
        fmt::format("{} {}: not a size. Fix: write e.g. 80GiB or 512MiB", flag, text));
  if (auto problem = remat::memory_budget_problem(*v))
    throw remat::ConfigError(
        fmt::format("{} {}: {}. Fix: {}", flag, text, *problem, remat::kMemoryBudgetFix));
  return v;
}

std::optional<int64_t> count_flag(const char* flag, const std::string& text, const char* example) {
  if (text.empty()) return std::nullopt;
  auto v = remat::parse_count(text);
  if (!v || *v < 1)
    throw remat::ConfigError(
        fmt::format("{} {}: not a count. Fix: write e.g. {}", flag, text, example));
  return v;
}

// CLI11's PositiveNumber states its range with a 309-digit bound; this says what is meant.
CLI::Validator at_least(int64_t lo) {
  return CLI::Validator(
      [lo](std::string& text) -> std::string {
        int64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec == std::errc::result_out_of_range)
          return text.starts_with('-')
                     ? "out of range: must be >= " + std::to_string(lo)
                     : "too large: at most " + std::to_string(std::numeric_limits<int64_t>::max());
        if (ec != std::errc() || ptr != end) return "must be an integer >= " + std::to_string(lo);
        if (v < lo) return "must be >= " + std::to_string(lo);
        return "";
      },
      ">= " + std::to_string(lo));
}

// A number in [lo, hi]: NaN is refused (CLI::Range lets it through: every comparison is false).
CLI::Validator number_in(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        double v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec != std::errc() || ptr != end || !(v >= lo && v <= hi))
          return fmt::format("{} is not a number in [{}, {}]", text, lo, hi);
        return "";
      },
      fmt::format("in [{}, {}]", lo, hi));
}

// A 64-bit unsigned integer, written in digits: "-1" is refused, not read as 2^64 - 1.
CLI::Validator unsigned_64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec != std::errc() || ptr != end)
          return fmt::format("{} is not an integer in [0, {}]", text,
                             std::numeric_limits<uint64_t>::max());
        return "";
      },
      "0 ..");
}

// -c/--config and --set: every subcommand that reads a config takes both.
CLI::Option* add_config_options(CLI::App* cmd, std::string& config_path,
                                std::vector<std::string>& overrides) {
  CLI::Option* config =
      cmd->add_option("-c,--config", config_path, "TOML config file (see configs/)")->required();
  cmd->add_option("--set", overrides, "Override a config key: --set section.key=value (repeatable)")
      ->type_name("SECTION.KEY=VALUE");
  return config;
}

// --model hf:DIR: the subcommands that train or plan a model take it from a Hugging Face folder's
// config.json (docs/hf.md); --config is then optional.
void add_model_option(CLI::App* cmd, CLI::Option* config, std::string& model) {
  config->required(false);
  cmd->add_option("--model", model,
                  "hf:DIR: the model of a Hugging Face folder's config.json (the same as --set "
                  "model.from_hf=DIR; without --config, every other key at its default)");
}

// --model hf:DIR as --set model.from_hf=DIR, or, without --config, as the whole config ("hf:DIR",
// which load_config reads as a config of that model and defaults).
void apply_model_option(const std::string& model, std::string& config_path,
                        std::vector<std::string>& overrides) {
  if (model.empty()) {
    if (config_path.empty())
      throw remat::ConfigError(
          "--config is required. Fix: give --config FILE, or --model hf:DIR for a Hugging Face "
          "model with default settings");
    return;
  }
  if (model.rfind("hf:", 0) != 0 || model.size() == 3)
    throw remat::ConfigError(
        fmt::format("--model {}: expected hf:DIR, a Hugging Face model folder. Fix: write --model "
                    "hf:path/to/model (the folder holding config.json)",
                    model));
  if (config_path.empty())
    config_path = model;
  else
    overrides.push_back(remat::from_hf_override(model.substr(3)));
}

// --policies a,b,c: the default list is the policy table's built-in rows.
void add_policies_option(CLI::App* cmd, std::vector<std::string>& policies) {
  cmd->add_option("--policies", policies,
                  fmt::format("Comma-separated policies, each optionally with :tile=N and "
                              ":offload={}, e.g. full:tile=1024:offload=checkpoints (default: {})",
                              remat::offload_names("|"), fmt::join(remat::builtin_policies(), ",")))
      ->delimiter(',');
}

// "h200, h100-80gb, ...": the planner's presets, for --gpu's help.
std::string gpu_preset_list() {
  std::vector<std::string> names;
  for (const remat::GpuPreset& g : remat::gpu_presets()) names.push_back(g.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

// An error is one line on the terminal, whatever it quotes: a tensor name from a file's header,
// a path or a flag's value may hold a newline (which could forge a second line) or an escape
// sequence (which could clear the screen). Those bytes are written as \n, \r, \t, \xNN.
std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f)
      out += c;
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else
      out += fmt::format("\\x{:02x}", u);
  }
  return out;
}

// Edits (insert, delete, substitute) between two flag names, for "did you mean".
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The flag of `cmd` a mistyped `--word` most likely meant ("" when none is close): one within a
// third of its length in edits (at least one), or one whose words it contains (--max-tokens:
// --tokens).
std::string closest_flag(const CLI::App& cmd, std::string_view word) {
  const std::string_view bare = word.substr(0, word.find('='));
  std::string best;
  size_t best_distance = std::max<size_t>(1, bare.size() / 3) + 1;
  for (const CLI::Option* opt : cmd.get_options()) {
    for (const std::string& name : opt->get_lnames()) {
      const std::string flag = "--" + name;
      const bool contained = bare.size() > flag.size() && bare.find(name) != std::string_view::npos;
      const size_t d = contained ? 1 : edit_distance(bare, flag);
      if (d < best_distance) {
        best_distance = d;
        best = flag;
      }
    }
  }
  return best;
}

// CLI11's complaint in the project's words: a flag given twice names the flag; arguments it did
// not expect come in the order they were typed (the parser took them reversed), with the flag a
// mistyped one most likely meant.
std::string parse_error_text(const CLI::ParseError& e, const CLI::App* cmd) {
  std::string what = e.what();
  while (!what.empty() && (what.back() == '.' || what.back() == '\n')) what.pop_back();
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr) {
    const size_t at = what.find(": At Most 1 required but received ");
    if (at != std::string::npos)
      return fmt::format("{} given {} times: it takes one value, give it once", what.substr(0, at),
                         what.substr(at + std::strlen(": At Most 1 required but received ")));
  }
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr && cmd != nullptr) {
    // The parser's list, in the order typed (an argument may hold spaces: "stray words").
    std::vector<std::string> extras = cmd->remaining();
    if (extras.empty()) {  // not the subcommand's: split the message's list, typed reversed
      const size_t colon = what.find(": ");
      if (colon == std::string::npos) return what;
      std::istringstream words(what.substr(colon + 2));
      for (std::string w; words >> w;) extras.insert(extras.begin(), w);
    }
    for (const std::string& w : extras)
      if (w.size() > 1 && w[0] == '-') {
        const std::string guess = closest_flag(*cmd, w);
        return fmt::format("remat-train {} has no flag {}{}", cmd->get_name(), w,
                           guess.empty() ? "" : fmt::format(" (did you mean {}?)", guess));
      }
    return fmt::format("unexpected argument{} {} (remat-train {} takes flags only)",
                       extras.size() > 1 ? "s" : "", fmt::join(extras, " "), cmd->get_name());
  }
  return what;
}

int run(int argc, char** argv) {
  CLI::App app{
      "remat-train: train long-context Transformers with activation rematerialization "
      "(gradient checkpointing) on one GPU or the CPU, and find the longest context "
      "that fits."};
  app.name("remat-train");
  app.footer(
      "`remat-train --config FILE [--set ...]` is short for `remat-train train --config FILE`.\n"
      "`remat-train SUBCOMMAND --help` lists a subcommand's flags; every config key, its default "
      "and range are in docs/configs.md; every subcommand in docs/commands.md.");
  app.require_subcommand(1);
  bool show_version = false;
  app.add_flag("--version", show_version,
               "Print version, backends, BLAS and CPU kernel, then exit");

  remat::cli::TrainOptions train;
  std::string train_model, plan_model, fit_model, sweep_model;
  CLI::App* train_cmd =
      app.add_subcommand("train", "Train a model from a TOML config (the default subcommand)");
  add_model_option(train_cmd, add_config_options(train_cmd, train.config_path, train.overrides),
                   train_model);
  int64_t train_steps = 0;
  train_cmd->add_option("--steps", train_steps, "Steps to train (the same as --set train.steps=N)")
      ->check(at_least(1));
  train_cmd->add_option("--metrics", train.metrics_path, "Write per-step metrics as JSONL to FILE");
  auto* resume_opt = train_cmd->add_option(
      "--resume", train.resume,
      "Continue bit-for-bit from a checkpoint: a step_* folder, a checkpoint.dir (its newest), or "
      "'latest' (the newest in the config's checkpoint.dir). The model and settings are the "
      "checkpoint's; --config and --set may change only what can change mid-run");
  train_cmd
      ->add_option("--init", train.init_path,
                   "Start from these weights only (model.safetensors, a checkpoint folder, or "
                   "hf:DIR, a Hugging Face folder, which implies --model hf:DIR)")
      ->excludes(resume_opt);
  train_cmd
      ->add_option("--init-adapter", train.init_adapter,
                   "A LoRA run ([lora] rank > 0) starts its adapters from this PEFT adapter folder "
                   "(adapter_config.json + adapter_model.safetensors) on the --init hf:DIR base")
      ->excludes(resume_opt);
  train_cmd
      ->add_option("--stop-at", train.stop_at,
                   "Stop after this step, write a checkpoint and exit 0; the schedule still runs "
                   "to train.steps")
      ->check(at_least(1));
  train_cmd->add_flag("-q,--quiet", train.quiet, "No banner, progress or summary");
  train_cmd->add_flag("-v,--verbose", train.verbose,
                      "Name the BLAS, GEMM and attention kernels in the banner's first line");

  remat::cli::PlanOptions plan;
  std::string plan_memory, plan_seq_len, plan_batch;
  CLI::App* plan_cmd = app.add_subcommand(
      "plan", "Predict peak memory, FLOPs and the longest seq_len per policy (no compute)");
  add_model_option(plan_cmd, add_config_options(plan_cmd, plan.config_path, plan.overrides),
                   plan_model);
  auto* mem_opt = plan_cmd->add_option("--memory", plan_memory,
                                       "Memory budget, e.g. 80GiB (default: the config's device)");
  plan_cmd->add_option("--gpu", plan.gpu, "Plan for a GPU preset: " + gpu_preset_list())
      ->excludes(mem_opt);
  plan_cmd->add_option("--seq-len", plan_seq_len, "Sequence length to plan for (4k, 32768, ...)");
  plan_cmd->add_option("--batch-size", plan_batch, "Batch size to plan for");
  std::string plan_ranks, fit_ranks, plan_context, fit_context;
  plan_cmd->add_option("--ranks", plan_ranks,
                       "Plan one rank of N (parallel.data = N / context): its rows and tokens, "
                       "peak, and traffic");
  plan_cmd->add_option("--context", plan_context,
                       "Split each sequence over C ranks (parallel.context = C; ring attention)");
  auto* plan_json = plan_cmd->add_flag("--json", plan.json, "Machine-readable output");
  plan_cmd
      ->add_flag("--emit-config", plan.emit_config,
                 "Print only the plan remat.policy = \"auto\" chooses, as a [remat] table to paste "
                 "into the config")
      ->excludes(plan_json);

  remat::cli::CompareOptions compare;
  CLI::App* compare_cmd = app.add_subcommand(
      "compare", "Train the same steps under each policy and compare memory, time and results");
  add_config_options(compare_cmd, compare.config_path, compare.overrides);
  add_policies_option(compare_cmd, compare.policies);
  compare_cmd
      ->add_option("--steps", compare.steps, "Steps per policy (default: the config's train.steps)")
      ->check(at_least(1));
  compare_cmd->add_flag("--json", compare.json, "Machine-readable output");

  remat::cli::FitOptions fit;
  std::string fit_memory, fit_batch;
  CLI::App* fit_cmd = app.add_subcommand(
      "fit", "The longest seq_len that fits, per policy, and the fastest policy at yours");
  add_model_option(fit_cmd, add_config_options(fit_cmd, fit.config_path, fit.overrides), fit_model);
  auto* fit_mem_opt = fit_cmd->add_option(
      "--memory", fit_memory, "Memory budget, e.g. 80GiB (default: the config's device)");
  auto* fit_gpu_opt =
      fit_cmd->add_option("--gpu", fit.gpu, "Fit a GPU preset: " + gpu_preset_list())
          ->excludes(fit_mem_opt);
  add_policies_option(fit_cmd, fit.policies);
  fit_cmd->add_option("--batch-size", fit_batch, "Batch size to fit for");
  fit_cmd->add_option("--ranks", fit_ranks,
                      "Fit one rank of N: each sequence split over all N (ring attention) unless "
                      "--context C or the config's parallel.context says otherwise");
  fit_cmd->add_option("--context", fit_context,
                      "Split each sequence over C ranks (parallel.context = C; ring attention)");
  fit_cmd
      ->add_flag(
          "--measure", fit.measure,
          "Confirm each answer with real steps (at the maximum and one above) in child processes")
      ->excludes(fit_gpu_opt);
  auto* fit_json = fit_cmd->add_flag("--json", fit.json, "Machine-readable output");
  fit_cmd
      ->add_option("--emit-config", fit.emit_config,
                   "Also write the answer's configuration (seq_len, batch and [remat]) to FILE, a "
                   "TOML snippet to paste into the config; FILE must not exist")
      ->excludes(fit_json);

  remat::cli::SweepOptions sweep;
  CLI::App* sweep_cmd = app.add_subcommand(
      "sweep",
      "Train a few steps at every (seq_len, policy) point; write sweep.csv and sweep.json");
  add_model_option(sweep_cmd, add_config_options(sweep_cmd, sweep.config_path, sweep.overrides),
                   sweep_model);
  sweep_cmd
      ->add_option(
          "--seq-lens", sweep.seq_lens,
          "1k,2k,4k, or 1k..64k: doubling from 1k, always ending at 64k (100..300 = 100,200,300)")
      ->required();
  add_policies_option(sweep_cmd, sweep.policies);
  sweep_cmd->add_option("--steps", sweep.steps, "Steps per point (default 3)")->check(at_least(1));
  sweep_cmd->add_option("--out", sweep.out_dir, "Output folder (default: out/sweep-<config name>)");
  sweep_cmd->add_flag("--json", sweep.json, "Machine-readable output (the sweep.json document)");

  remat::cli::BenchOptions bench;
  CLI::App* bench_cmd = app.add_subcommand(
      "bench", "Time a training step against this machine's SGEMM rate, by op family (a report)");
  add_config_options(bench_cmd, bench.config_path, bench.overrides);
  bench_cmd->add_option("--steps", bench.steps, "Timed steps after one warm-up (default 3)")
      ->check(at_least(1));
  bench_cmd->add_flag("--json", bench.json, "Machine-readable output");

  remat::cli::SampleOptions sample;
  CLI::App* keys_cmd = app.add_subcommand(
      "keys", "List every config key: type, default, accepted values, meaning (a Markdown table)");
  bool keys_policies = false;
  keys_cmd->add_flag("--policies", keys_policies,
                     "List the values of remat.policy instead: what each keeps (a Markdown table)");

  CLI::App* sample_cmd =
      app.add_subcommand("sample", "Generate text (byte models) or tokens from a checkpoint");
  sample_cmd
      ->add_option("--checkpoint", sample.checkpoint,
                   "Checkpoint folder, or a checkpoint.dir (its newest)")
      ->required();
  auto* prompt_opt = sample_cmd->add_option(
      "--prompt", sample.prompt,
      "Prompt text (byte models, and token models with --tokenizer tokenizer.json); token models "
      "without a tokenizer.json take token ids here");
  auto* prompt_file_opt =
      sample_cmd->add_option("--prompt-file", sample.prompt_file, "Read --prompt from a file")
          ->excludes(prompt_opt);
  auto* prompt_ids_opt = sample_cmd
                             ->add_option("--prompt-ids", sample.prompt,
                                          "Prompt as token ids (token models): \"50256 464 318\"")
                             ->excludes(prompt_opt)
                             ->excludes(prompt_file_opt);
  sample_cmd->add_option("--tokenizer", sample.tokenizer,
                         "A model's tokenizer.json (encodes --prompt text, prints text), llm.c's "
                         "gpt2_tokenizer.bin (prints text), or 'bytes' (ids 0-255 are bytes: text "
                         "in, text out)");
  sample_cmd->add_option("--tokens", sample.tokens, "Tokens to generate (default 256)")
      ->check(at_least(1));
  sample_cmd
      ->add_option("--temperature", sample.temperature,
                   "Sampling temperature; 0 = greedy (default 1)")
      ->check(number_in(0.0, 100.0));
  sample_cmd
      ->add_option("--top-k", sample.top_k,
                   "Sample from the K most likely tokens; 0 = all (default)")
      ->check(at_least(0));
  sample_cmd->add_option("--seed", sample.seed, "Random seed (default 1337)")->check(unsigned_64());

  remat::cli::TokenizeOptions tokenize;
  CLI::App* tokenize_cmd = app.add_subcommand(
      "tokenize",
      "Text on stdin to token ids (a JSON list) with a tokenizer.json, or ids to text (--decode)");
  tokenize_cmd
      ->add_option("--tokenizer", tokenize.tokenizer,
                   "The model's Hugging Face tokenizer.json (a BPE model), or bytes (a "
                   "byte-level model's ids: the bytes)")
      ->required();
  auto* decode_opt = tokenize_cmd->add_flag(
      "--decode", tokenize.decode,
      "Read token ids (a JSON list, or separated by whitespace) and print their text");
  tokenize_cmd
      ->add_flag("--add-special-tokens", tokenize.add_special_tokens,
                 "Add the tokenizer's template of special tokens (Llama 2's <s>), as "
                 "Tokenizer.encode does by default")
      ->excludes(decode_opt);

  remat::cli::ExportOptions export_opt;
  std::string export_dtype = "bf16", export_shard;
  remat::cli::EvalOptions eval;
  std::string eval_seq_len, eval_batch;
  CLI::App* eval_cmd = app.add_subcommand(
      "eval",
      "Score a checkpoint or Hugging Face model: loss by position on held-out data, or passkey "
      "retrieval");
  auto* eval_ckpt = eval_cmd->add_option(
      "--checkpoint", eval.checkpoint,
      "Checkpoint folder, a checkpoint.dir (its newest), or 'latest' (--config's checkpoint.dir)");
  eval_cmd
      ->add_option("--model", eval.model,
                   "hf:DIR: a Hugging Face folder's model and weights (instead of --checkpoint)")
      ->excludes(eval_ckpt);
  eval_cmd->add_option("-c,--config", eval.config_path,
                       "With --model: the run's settings; with --checkpoint latest: its "
                       "checkpoint.dir");
  eval_cmd->add_option("--set", eval.overrides, "Override a config key (device, remat, data, ...)")
      ->type_name("SECTION.KEY=VALUE");
  auto* eval_len =
      eval_cmd->add_option("--seq-len", eval_seq_len,
                           "Window length (default: the config's train.seq_len; 4k, 32768, ...)");
  auto* eval_rows =
      eval_cmd->add_option("--batch-size", eval_batch, "Windows per forward pass (default 1)");
  auto* eval_data = eval_cmd->add_option(
      "--data", eval.data,
      "Score these files (token shards or text, as data.source says) instead of the config's "
      "held-out data");
  auto* eval_windows = eval_cmd
                           ->add_option("--windows", eval.windows,
                                        "Windows to score (default 8, or fewer there are)")
                           ->check(at_least(1));
  eval_cmd
      ->add_option("--passkey", eval.passkey,
                   "Passkey retrieval: the folder scripts/prepare_data.py --passkey wrote (each "
                   "task at its own length)")
      ->excludes(eval_data)
      ->excludes(eval_len)
      ->excludes(eval_rows)
      ->excludes(eval_windows);
  eval_cmd->add_option("--label", eval.label,
                       "The result's name in --json (plot_eval.py's legend)");
  eval_cmd->add_flag("--json", eval.json,
                     "Machine-readable output (scripts/plot_eval.py draws it)");

  CLI::App* export_cmd = app.add_subcommand(
      "export", "Write a checkpoint as a Hugging Face model folder (config.json + safetensors)");
  export_cmd
      ->add_option("--checkpoint", export_opt.checkpoint,
                   "Checkpoint folder, or a checkpoint.dir (its newest)")
      ->required();
  auto* export_hf = export_cmd->add_option(
      "--hf", export_opt.out,
      "The Hugging Face folder to write (a LoRA run: merged into its base); it must not exist or "
      "be empty (never overwritten)");
  export_cmd
      ->add_option("--adapter", export_opt.adapter,
                   "A LoRA run's PEFT adapter folder to write instead (peft loads it); it must not "
                   "exist or be empty")
      ->excludes(export_hf);
  // The options of --hf alone: an adapter is written as trained (F32, one file), as peft saves it.
  const CLI::Option* hf_only[] = {
      export_cmd->add_option("--dtype", export_dtype, "Weights as bf16 (default) or fp32")
          ->check(CLI::IsMember({"bf16", "fp32"})),
      export_cmd->add_option("--tokenizer-from", export_opt.tokenizer_from,
                             "Copy tokenizer files and token ids from this Hugging Face folder "
                             "(default: the run's model.from_hf, when it is still there)"),
      export_cmd->add_option("--shard-size", export_shard,
                             "Weights above this size go into shards with an index (default 5GB, "
                             "as save_pretrained)")};

  std::vector<std::string> args, names_of_subcommands;
  try {
    std::vector<std::string>& names = names_of_subcommands;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
      names.push_back(sub->get_name());
    args = with_default_subcommand(argc, argv, names);
  } catch (const remat::ConfigError& e) {
    fmt::print(stderr, "error: {}\n", printable(e.what()));
    return kExitUsage;
  }
  std::reverse(args.begin(), args.end());       // CLI11 takes a reversed vector
  const std::vector<std::string> given = args;  // parse() consumes args
  try {
    if (!args.empty() && args.back() == "--version") {
      fmt::print("{}", remat::cli::version_text());
      return 0;
    }
    app.parse(args);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    // One line, as every other refusal: the parser's complaint and where the flags are listed.
    std::string sub;  // the first word that names a subcommand (reversed, as parse() took it)
    for (auto it = given.rbegin(); it != given.rend() && sub.empty(); ++it)
      if (std::find(names_of_subcommands.begin(), names_of_subcommands.end(), *it) !=
          names_of_subcommands.end())
        sub = *it;
    const CLI::App* cmd = sub.empty() ? nullptr : app.get_subcommand(sub);
    fmt::print(stderr, "error: {}. Fix: see `remat-train {}--help` (docs/commands.md)\n",
               printable(parse_error_text(e, cmd)), sub.empty() ? "" : sub + " ");
    return kExitUsage;
  }
  // A flag given an empty value (an unset shell variable: --gpu "$GPU") is no value: refused, not
  // taken as the flag left out, which would run on defaults without a word.
  for (const CLI::App* sub : app.get_subcommands())
    for (const CLI::Option* opt : sub->get_options()) {
      if (opt->count() == 0 || opt->get_expected_min() == 0) continue;  // absent, or a switch
      if (opt->get_name() == "--prompt") continue;  // an empty prompt starts from end-of-text
      const auto& values = opt->results();
      if (std::any_of(values.begin(), values.end(), [](const std::string& v) { return v.empty(); }))
        throw remat::ConfigError(
            fmt::format("[cli] {} {}: an empty value. Fix: give it a value, or leave {} out",
                        sub->get_name(), opt->get_name(), opt->get_name()));
    }
  if (!train_cmd->parsed() && remat::parallel::launched_ranks() > 1)
    throw remat::ConfigError(fmt::format(
        "[parallel] a launcher started {} ranks of `remat-train {}`, which runs on one. Fix: run "
        "it without mpirun/srun (only `train` runs on several ranks)",
        remat::parallel::launched_ranks(), app.get_subcommands().front()->get_name()));
  if (train_cmd->parsed() && train.config_path.empty() && train_model.empty() &&
      train.init_path.rfind("hf:", 0) == 0)
    train_model = train.init_path;  // --init hf:DIR alone: that folder's model, default settings
  // A resume needs no config: the checkpoint holds it (cmd/train_command.cpp).
  if (train_cmd->parsed() &&
      !(!train.resume.empty() && train.config_path.empty() && train_model.empty()))
    apply_model_option(train_model, train.config_path, train.overrides);
  if (plan_cmd->parsed()) apply_model_option(plan_model, plan.config_path, plan.overrides);
  if (fit_cmd->parsed()) apply_model_option(fit_model, fit.config_path, fit.overrides);
  if (sweep_cmd->parsed()) apply_model_option(sweep_model, sweep.config_path, sweep.overrides);
  // A relative --config missing here comes from the installed share/remat-train/ (configs from
  // any folder after `make install`); resolved once, the banner names the file actually read and
  // the child processes of fit and sweep read it too.
  for (std::string* path : {&train.config_path, &plan.config_path, &compare.config_path,
                            &fit.config_path, &sweep.config_path, &bench.config_path})
    *path = remat::resolve_config_path(*path);
  if (train_cmd->parsed()) {
    if (train_steps > 0) {
      remat::cli::add_flag_override(train.overrides, fmt::format("train.steps={}", train_steps),
                                    fmt::format("--steps {}", train_steps));
    }
    return remat::cli::run_train(train);
  }
  if (compare_cmd->parsed()) return remat::cli::run_compare(compare);
  if (sample_cmd->parsed()) {
    sample.prompt_is_ids = prompt_ids_opt->count() > 0;
    return remat::cli::run_sample(sample);
  }
  if (tokenize_cmd->parsed()) return remat::cli::run_tokenize(tokenize);
  if (eval_cmd->parsed()) {
    if (eval.checkpoint.empty() == eval.model.empty())
      throw remat::ConfigError(
          "[eval] what to score: give --checkpoint DIR (or latest with --config) or --model "
          "hf:DIR. Fix: add one of them");
    if (!eval.model.empty() && (eval.model.rfind("hf:", 0) != 0 || eval.model.size() == 3))
      throw remat::ConfigError(fmt::format(
          "--model {}: expected hf:DIR, a Hugging Face model folder. Fix: write --model "
          "hf:path/to/model (the folder holding config.json)",
          eval.model));
    if (!eval.config_path.empty() && !eval.checkpoint.empty() && eval.checkpoint != "latest")
      throw remat::ConfigError(fmt::format(
          "[eval] --config {} with --checkpoint {}: a checkpoint brings its own config. Fix: drop "
          "--config (--set changes its device, remat or data keys), or use --checkpoint latest to "
          "take the newest of the config's checkpoint.dir",
          eval.config_path, eval.checkpoint));
    if (!eval.config_path.empty()) eval.config_path = remat::resolve_config_path(eval.config_path);
    eval.seq_len = count_flag("--seq-len", eval_seq_len, "4096 or 32k");
    eval.batch_size = count_flag("--batch-size", eval_batch, "4");
    return remat::cli::run_eval(eval);
  }
  if (export_cmd->parsed()) {
    if (export_opt.out.empty() && export_opt.adapter.empty())
      throw remat::ConfigError(
          "[export] nothing to write. Fix: give --hf OUT (a Hugging Face model folder) or "
          "--adapter OUT (a LoRA run's PEFT adapter)");
    if (!export_opt.adapter.empty())
      for (const CLI::Option* o : hf_only)
        if (o->count() > 0)
          throw remat::ConfigError(fmt::format(
              "[export] {} shapes a --hf model folder; --adapter writes the adapter's tensors as "
              "trained (F32, one file), as peft saves them. Fix: drop {}",
              o->get_name(), o->get_name()));
    export_opt.bf16 = export_dtype == "bf16";
    if (!export_shard.empty()) {
      const std::optional<uint64_t> v = remat::parse_size(export_shard);
      if (!v || *v == 0)
        throw remat::ConfigError(
            fmt::format("--shard-size {}: not a size. Fix: write e.g. 5GB or 500MB", export_shard));
      export_opt.shard_bytes = *v;
    }
    return remat::cli::run_export(export_opt);
  }
  if (keys_cmd->parsed()) {
    fmt::print("{}",
               keys_policies ? remat::policy_table_markdown() : remat::config_keys_markdown());
    return 0;
  }
  if (sweep_cmd->parsed()) return remat::cli::run_sweep(sweep);
  if (bench_cmd->parsed()) return remat::cli::run_bench(bench);
  if (fit_cmd->parsed()) {
    fit.memory = size_flag("--memory", fit_memory);
    fit.batch_size = count_flag("--batch-size", fit_batch, "8");
    fit.ranks = count_flag("--ranks", fit_ranks, "8");
    fit.context = count_flag("--context", fit_context, "8");
    return remat::cli::run_fit(fit);
  }
  if (plan_cmd->parsed()) {
    plan.memory = size_flag("--memory", plan_memory);
    plan.seq_len = count_flag("--seq-len", plan_seq_len, "4096 or 32k");
    plan.batch_size = count_flag("--batch-size", plan_batch, "8");
    plan.ranks = count_flag("--ranks", plan_ranks, "8");
    plan.context = count_flag("--context", plan_context, "8");
    return remat::cli::run_plan(plan);
  }
  return kExitUsage;
}

}  // namespace

// What each kind of error exits with (docs/commands.md, "Exit codes"): bad input the user can
// fix is a usage error, a run that does not fit is out of memory, anything else a runtime failure.
static int exit_code_of(const remat::Error& e) {
  if (dynamic_cast<const remat::OutOfMemory*>(&e)) return kExitOutOfMemory;
  if (dynamic_cast<const remat::ConfigError*>(&e) || dynamic_cast<const remat::DataError*>(&e) ||
      dynamic_cast<const remat::CheckpointError*>(&e))
    return kExitUsage;
  return kExitRuntime;
}

// The manual's page that answers an error, named at the end of its one-line message so that a
// user who hits it knows where to read on (docs/ in the repository, or the installed copy in
// share/doc/remat-train). The component tag a message carries ("[hf] ...", "file: [sample] ...")
// names the page of that component; untagged messages go by the kind of error. Empty where the
// message alone is the answer.
static const char* docs_page_of_tag(const std::string& message) {
  static const std::pair<const char*, const char*> kPages[] = {
      {"config", "docs/configs.md"},
      {"cli", "docs/commands.md"},
      {"hf", "docs/hf.md"},
      {"export", "docs/hf.md"},
      {"sample", "docs/checkpoints.md"},
      {"tokenizer", "docs/data.md"},
      {"checkpoint", "docs/checkpoints.md"},
      {"data", "docs/data.md"},
      {"parallel", "docs/multi-gpu.md"},
      {"remat", "docs/remat.md"},
      {"memory", "docs/planning.md"},
      {"plan", "docs/planning.md"},
      {"fit", "docs/planning.md"},
      {"sweep", "docs/planning.md"},
      {"metrics", "docs/training.md"},
      {"train", "docs/training.md"},
      {"cuda", "docs/gpu.md"},
      {"device", "docs/gpu.md"},
      {"lora", "docs/lora.md"},
      {"peft", "docs/lora.md"}};
  // The tag is the first "[word]" at the start or after ": ".
  for (size_t at = message.find('['); at != std::string::npos; at = message.find('[', at + 1)) {
    if (at != 0 && (at < 2 || message.compare(at - 2, 2, ": ") != 0)) continue;
    const size_t end = message.find(']', at);
    if (end == std::string::npos) return nullptr;
    const std::string tag = message.substr(at + 1, end - at - 1);
    for (const auto& [name, page] : kPages)
      if (tag == name) return page;
    return nullptr;
  }
  return nullptr;
}

static const char* docs_page_of(const remat::Error& e) {
  // The [lora] keys, and any error about a LoRA run (its base, its checkpoint), are lora.md's.
  const std::string_view what = e.what();
  if (what.find("[config] lora.") != std::string_view::npos ||
      what.find("LoRA") != std::string_view::npos)
    return "docs/lora.md";
  if (dynamic_cast<const remat::DataChanged*>(&e)) return "docs/shared-files.md";
  if (dynamic_cast<const remat::Diverged*>(&e)) return "docs/commands.md";
  if (const char* page = docs_page_of_tag(e.what())) return page;
  if (dynamic_cast<const remat::OutOfMemory*>(&e)) return "docs/planning.md";
  if (dynamic_cast<const remat::ConfigError*>(&e)) return "docs/configs.md";
  if (dynamic_cast<const remat::DataError*>(&e)) return "docs/data.md";
  if (dynamic_cast<const remat::CheckpointError*>(&e)) return "docs/checkpoints.md";
  return "";
}

static std::string error_line(const remat::Error& e) {
  const char* page = docs_page_of(e);
  const std::string what = printable(remat::cli::with_flag_names(e.what()));
  return *page == 0 ? fmt::format("error: {}", what)
                    : fmt::format("error: {} (see {})", what, remat::docs_page_path(page));
}

// Before any library initializes (engine/cpu/openmp_wait.h says why).
REMAT_OPENMP_WAIT_BEFORE_LIBRARIES(remat::cpu::reexec_with_short_openmp_spin);

// An error on one rank of several stops the whole job (the others would wait for it forever in
// the next exchange): the message names the rank, and MPI_Abort makes mpirun exit with `code`.
static int stop_all_ranks(const std::string& message, int code) {
  remat::parallel::Communicator& world = remat::parallel::world();
  if (world.size() == 1) {
    fmt::print(stderr, "{}\n", message);
    return code;
  }
  fmt::print(stderr, "[rank {}] {}\n", world.rank(), message);
  world.abort(code);
  return code;  // abort() does not return
}

int main(int argc, char** argv) {
  remat::cpu::select_blas_kernel();  // before any BLAS call (engine/cpu/blas_kernel.h says why)
  // A file over RLIMIT_FSIZE (ulimit -f, a quota-like limit) is a full disk: the write fails with
  // EFBIG and the error names the file, where SIGXFSZ's default would kill the run silently.
  std::signal(SIGXFSZ, SIG_IGN);
  // A reader that goes away (`remat-train train ... | head`) is EPIPE on the next write, not a
  // SIGPIPE that kills a training run between checkpoints: train stops after the step with its
  // checkpoint, every command exits 128 + SIGPIPE without a word, as the shell expects.
  std::signal(SIGPIPE, SIG_IGN);
  const auto reader_gone = [](int err) {
    return err == EPIPE || remat::experiments::interrupt_signal() == SIGPIPE;
  };
  // What a command printed to stdout (sample's text, tokenize's ids, --json) must have reached
  // it: a full disk or a closed file is an error, not exit 0 with the output cut short.
  const auto stdout_lost = [] { return std::fflush(stdout) != 0 || std::ferror(stdout) != 0; };
  const auto stdout_error = [](int err) {
    return fmt::format(
        "error: [io] stdout: cannot write ({}): the output is incomplete. Fix: free space on that "
        "disk, or write it elsewhere",
        std::strerror(err ? err : EIO));
  };
  try {
    const int code = run(argc, argv);
    if (stdout_lost()) {
      if (reader_gone(errno)) {
        remat::parallel::finalize_world();  // the ranks stopped together (train's stop signal)
        return 128 + SIGPIPE;
      }
      return stop_all_ranks(stdout_error(errno), kExitRuntime);
    }
    remat::parallel::finalize_world();
    return code;
  } catch (const std::system_error& e) {
    // fmt::print throws this when a write to stdout fails (its message: "cannot write to file").
    if (std::string_view(e.what()).find("cannot write to file") != std::string_view::npos) {
      if (reader_gone(e.code().value())) return 128 + SIGPIPE;
      return stop_all_ranks(stdout_error(e.code().value()), kExitRuntime);
    }
    return stop_all_ranks(
        fmt::format("error: [internal] unexpected failure ({}). This is a bug: please report it",
                    e.what()),
        kExitRuntime);
  } catch (const remat::Error& e) {
    return stop_all_ranks(error_line(e), exit_code_of(e));
  } catch (const std::bad_alloc&) {
    // The pool checks every device allocation against the budget; what is left is host memory
    // (a buffer beside the pool), which is out of memory all the same.
    return stop_all_ranks(
        "error: [memory] out of host memory: the model or a buffer does not fit this machine's "
        "RAM. Fix: `remat-train plan` shows the peak; choose a smaller model, train.batch_size or "
        "train.seq_len (see " +
            remat::docs_page_path("docs/planning.md") + ")",
        kExitOutOfMemory);
  } catch (const std::exception& e) {
    return stop_all_ranks(
        fmt::format("error: [internal] unexpected failure ({}). This is a bug: please report it",
                    e.what()),
        kExitRuntime);
  }
}
