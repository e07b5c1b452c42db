// Subcommands of remat-train. Each returns the process exit code; exceptions propagate to main,
// which maps them (the only place exit codes are chosen).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace remat {
struct RunParts;
class Backend;
struct Config;
class Checkpoint;
}  // namespace remat

namespace remat::cli {

/// The model and data source of `cfg` on `be` (what the planner and every command build). File
/// data is not opened: dry runs need shapes only; a command that trains calls data->open().
RunParts make_run_parts(const Config& cfg, Backend& be);

struct TrainOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set section.key=value
  std::string metrics_path;            // --metrics FILE (overrides log.metrics)
  std::string resume;                  // --resume DIR | latest (the newest in checkpoint.dir)
  std::string init_path;     // --init FILE: weights only (model.safetensors, a folder, or hf:DIR)
  std::string init_adapter;  // --init-adapter DIR: a PEFT LoRA adapter to start the adapters from
  int64_t stop_at = 0;  // --stop-at STEP: stop (and checkpoint) after this step; 0 = train.steps
  bool quiet = false;
  bool verbose = false;  // -v: the backend's libraries and kernels in the banner
};

int run_train(const TrainOptions& opt);

struct PlanOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string gpu;                 // --gpu preset
  std::optional<uint64_t> memory;  // --memory SIZE
  std::optional<int64_t> seq_len;  // --seq-len N
  std::optional<int64_t> batch_size;
  std::optional<int64_t> ranks, context;  // --ranks N, --context C: one rank of N (add_rank_sets)
  bool json = false;
  bool emit_config = false;  // --emit-config: print only auto's plan as a [remat] table
};

/// With --emit-config, exit 3 (OutOfMemory) when no plan fits the budget.
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

struct FitOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string gpu;                 // --gpu preset (excludes --memory and --measure)
  std::optional<uint64_t> memory;  // --memory SIZE: the pool budget
  std::optional<int64_t> batch_size;
  std::optional<int64_t> ranks, context;  // --ranks N, --context C: one rank of N (add_rank_sets)
  std::vector<std::string> policies;      // default: none,full,save_dots,save_attn
  bool measure = false;                   // confirm each answer with real steps in child processes
  bool json = false;
  std::string emit_config;  // --emit-config FILE: the answer's [train] and [remat] keys, as TOML
};

/// Exit 1 when --measure disagrees with the planner (loudly, with both numbers).
int run_fit(const FitOptions& opt);

struct SweepOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string seq_lens;               // --seq-lens 1k,2k,4k | 1k..64k
  std::vector<std::string> policies;  // default: none,full,save_dots,save_attn
  int64_t steps = 0;                  // steps per point (0: 3)
  std::string out_dir;                // default: out/sweep-<config name>
  bool json = false;
};

/// Exit 0 when every point ran (fitting or out of memory), 1 when a point failed otherwise,
/// 128 + signal when interrupted (the finished points are written, sweep.json says
/// "interrupted": true).
int run_sweep(const SweepOptions& opt);

struct BenchOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  int64_t steps = 0;  // timed steps after one warm-up (0: 3)
  bool json = false;
};

/// A step's time against the machine's SGEMM rate, by op family (a report: exit 0 unless the run
/// itself fails).
int run_bench(const BenchOptions& opt);

struct SampleOptions {
  std::string checkpoint;  // --checkpoint DIR (a step_* folder, or a checkpoint.dir: its newest)
  // --prompt TEXT: text for byte models and for token models with a tokenizer.json; otherwise ids
  // ("50256 464"). --prompt-ids IDS puts the ids here and sets prompt_is_ids.
  std::string prompt;
  bool prompt_is_ids = false;
  std::string prompt_file;  // --prompt-file F (read as --prompt is)
  std::string tokenizer;    // --tokenizer tokenizer.json | gpt2_tokenizer.bin (llm.c, decodes only)
  int64_t tokens = 256;     // --tokens N to generate
  double temperature = 1.0;  // --temperature T (0: greedy)
  int64_t top_k = 0;         // --top-k K (0: all)
  uint64_t seed = 1337;      // --seed S
};

/// Generates from a checkpoint with KV-cached decoding on the CPU; prints to stdout.
int run_sample(const SampleOptions& opt);

/// Token ids separated by whitespace and/or commas ("50256 464, 318"), each in [0, vocab).
/// Throws ConfigError naming `source` and the word, ending with `fix`.
std::vector<int32_t> parse_token_ids(const std::string& text, int64_t vocab,
                                     const std::string& source, const std::string& fix);

struct TokenizeOptions {
  std::string tokenizer;            // --tokenizer FILE: a Hugging Face tokenizer.json
  bool decode = false;              // --decode: ids on stdin, text out
  bool add_special_tokens = false;  // --add-special-tokens: the post-processor's template
};

/// Text on stdin to its ids (a JSON list on stdout), or with --decode ids (a JSON list, or
/// separated by whitespace) to their text, exactly (no newline added).
int run_tokenize(const TokenizeOptions& opt);

/// --checkpoint as `sample` and `export` take it (and train's --resume): a step_* folder, or a
/// checkpoint.dir (its newest complete checkpoint). `command` and `flag` name them in errors.
std::string resolve_checkpoint(const std::string& arg, const char* command,
                               const char* flag = "--checkpoint");
/// The config of checkpoint `ckpt` (its state.json), once its tensor files are known to hold
/// exactly the parameters of the model that config describes (Checkpoint::check_matches).
Config checkpoint_config(const Checkpoint& ckpt);

struct ExportOptions {
  std::string checkpoint;      // --checkpoint DIR (a step_* folder, or a checkpoint.dir)
  std::string out;             // --hf OUT: the Hugging Face folder to write (absent or empty)
  std::string adapter;         // --adapter OUT: a LoRA run's PEFT adapter folder instead
  bool bf16 = true;            // --dtype bf16 (default) | fp32
  std::string tokenizer_from;  // --tokenizer-from DIR: tokenizer files and token ids from there
  uint64_t shard_bytes = 5'000'000'000;  // --shard-size: shards with an index above this
};

/// Writes a checkpoint as a Hugging Face model folder (docs/hf.md): config.json and the
/// weights (a LoRA run's merged into its base), or a LoRA run's PEFT adapter folder (--adapter,
/// docs/lora.md), into OUT.tmp-<pid>, renamed to OUT when complete.
int run_export(const ExportOptions& opt);

struct EvalOptions {
  std::string checkpoint;              // --checkpoint DIR | latest (with --config)
  std::string model;                   // --model hf:DIR
  std::string config_path;             // --config F
  std::vector<std::string> overrides;  // --set section.key=value
  std::optional<int64_t> seq_len;      // --seq-len N (default: the config's train.seq_len)
  std::optional<int64_t> batch_size;   // --batch-size N: windows per forward pass (default 1)
  std::vector<std::string> data;       // --data FILES: score these instead of the held-out data
  int64_t windows = 0;                 // --windows N (0: 8)
  std::string passkey;                 // --passkey DIR (scripts/prepare_data.py --passkey)
  std::string label;                   // --label NAME (the JSON's, for scripts/plot_eval.py)
  bool json = false;
};

/// Scores a checkpoint or a Hugging Face folder: loss by position over held-out windows, or
/// passkey retrieval (cmd/eval_command.cpp).
int run_eval(const EvalOptions& opt);

/// The multi-line --version text: version, backends built, BLAS and its CPU kernel.
std::string version_text();

}  // namespace remat::cli
