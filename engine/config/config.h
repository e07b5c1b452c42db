// The config tree: one struct per TOML section, with documented defaults. load_config() parses
// a file, applies `--set section.key=value` overrides and validates everything; any problem is
// a ConfigError naming the file:line:column (or the --set flag), the key, and the fix.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "engine/core/ops/rope.h"
#include "engine/core/token_positions.h"

namespace remat {

// The enum-like keys, parsed once when the config is read; config_name() gives each value's
// spelling in a config file ("gpt", "rope", "cuda", "fp32"), for messages and state.json.
enum class ModelKind : uint8_t { Gpt, Llama, Mlp };    // model.kind
enum class PositionKind : uint8_t { Learned, Rope };   // model.position
enum class BackendKind : uint8_t { Auto, Cpu, Cuda };  // device.backend
enum class Precision : uint8_t { Bf16, Fp32 };         // device.precision
enum class OffloadKind : uint8_t {                     // remat.offload
  None,
  Checkpoints,
  CheckpointsOptimizer,
  CheckpointsOptimizerWeights
};
std::string_view config_name(ModelKind v);
std::string_view config_name(PositionKind v);
std::string_view config_name(BackendKind v);
std::string_view config_name(Precision v);
std::string_view config_name(OffloadKind v);
/// What an offload kind keeps in host memory, in words: "checkpoints and AdamW moments".
std::string_view offloaded_what(OffloadKind v);
/// Every remat.offload value, in the order `keys` lists them (the one table of their spellings).
const std::vector<OffloadKind>& offload_kinds();
/// Their spellings joined by `sep`: "none|checkpoints|checkpoints+optimizer|...".
std::string offload_names(std::string_view sep);

}  // namespace remat

// fmt prints the enum-like keys by their config spelling: fmt::format("{}", cfg.model.kind).
template <class E>
requires std::is_same_v<E, remat::ModelKind> || std::is_same_v<E, remat::PositionKind> ||
    std::is_same_v<E, remat::BackendKind> || std::is_same_v<E, remat::Precision> ||
    std::is_same_v<E, remat::OffloadKind>
struct fmt::formatter<E> : fmt::formatter<std::string_view> {
  auto format(E v, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(remat::config_name(v), ctx);
  }
};

namespace remat {

struct ModelConfig {
  ModelKind kind = ModelKind::Gpt;  // gpt | llama | mlp (the checkpointing tutorial's MLP)
  int64_t n_layer = 2;              // blocks
  int64_t n_head = 4;               // attention heads (gpt)
  int64_t n_embd = 64;              // channels; the MLP's width
  int64_t vocab_size = 256;         // tokens (gpt)
  int64_t n_ctx = 1024;             // learned position table length (gpt, position = learned)
  int64_t d_ff = 0;                 // MLP hidden size; 0 = 4 * n_embd
  PositionKind position = PositionKind::Learned;
  double rope_theta = 10000.0;  // RoPE base
  double dropout = 0.0;         // attention-output and MLP-output dropout probability
  // The Llama family (kind = "llama"; names as in Hugging Face's config.json where they differ):
  int64_t n_kv_head = 0;        // key/value heads (grouped-query attention); 0 = n_head
  int64_t head_dim = 0;         // head size; 0 = n_embd / n_head
  double norm_eps = 1e-5;       // RMSNorm epsilon (rms_norm_eps)
  RopeScaling rope_scaling{};   // none, or llama3 frequency scaling
  bool attention_bias = false;  // q/k/v projection biases (Qwen2)
  bool qk_norm = false;         // per-head RMSNorm of q and k before RoPE (Qwen3)
  bool tie_embeddings = true;   // LM head = token embedding (tie_word_embeddings)
  // The context the checkpoint was trained for (config.json's max_position_embeddings; llama).
  // Informs only: a longer train.seq_len without rope_scaling warns, and export writes it.
  int64_t max_position_embeddings = 0;  // 0 = unknown
  // model.from_hf: the Hugging Face folder whose config.json gave the keys above (docs/hf.md).
  // Not written back by config_to_toml, which writes the keys themselves.
  std::string from_hf;
  int64_t ff() const { return d_ff > 0 ? d_ff : 4 * n_embd; }
  /// Models over token sequences (gpt, llama): attention, seq_len, an LM head.
  bool has_sequence() const { return kind != ModelKind::Mlp; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
};

struct TrainConfig {
  int64_t seq_len = 256;
  int64_t batch_size = 4;
  int64_t steps = 20;
  double lr = 1e-3;          // peak learning rate
  int64_t warmup_steps = 0;  // linear warmup, then cosine decay to lr * min_lr_ratio
  double min_lr_ratio = 0.1;
  double weight_decay = 0.1;  // decoupled, on 2-D weights only
  double grad_clip = 1.0;     // global-norm clip; 0 = off
  uint64_t seed = 1337;
  int64_t loss_chunk = 0;   // rows per fused LM-head chunk; 0 = chosen by the tool
  int64_t eval_every = 0;   // validation loss every N steps (and after the last); 0 = off
  int64_t eval_tokens = 0;  // tokens per evaluation; 0 = 8 batches' worth
  // Micro-batches of batch_size rows per optimizer step: their gradients add up to those of one
  // batch of grad_accum x batch_size rows (engine/training/trainer.h).
  int64_t grad_accum = 1;
};

struct DataConfig {
  std::string source = "synthetic";  // "synthetic" | "tokens" (llm.c .bin shards) | "text" (bytes)
  std::string task = "random";       // synthetic: "random" | "copy" (gpt); "regression" (mlp)
  std::vector<std::string> path;  // tokens/text: files, directories or globs (relative to the cwd)
  std::vector<std::string>
      val_path;               // validation files (same format); empty = none or val_fraction
  double val_fraction = 0.0;  // hold out this tail of the training data for validation
  // "random" windows keyed by (seed, step, row) | "sequential" | "packed": rows of whole
  // documents, first-fit (data/file_data.h)
  std::string order = "random";
  // "causal": every token attends to every earlier one of its row | "document": only to earlier
  // tokens of its own document, positions restarting at 0 in each (docs/data.md#documents)
  std::string attention = "causal";
  // The end-of-text id that ends a document; -1: the one prepare_data.py recorded beside the
  // shards (shards.json), needed by attention "document" and order "packed".
  int64_t eot_token = -1;
  std::string loss_mask = "auto";  // "auto": X.mask.bin beside a shard X.bin is read | "off"
  // Resolved when the config is read, never a key: the documents' mean length recorded in a
  // shards.json beside data.path (prepare_data.py), for document attention's FLOP estimates;
  // 0: unknown (attention is counted at its causal upper bound).
  double mean_document_tokens = 0;
  bool documents() const { return attention == "document"; }
};

struct RematConfig {
  std::string policy =
      "none";         // "none" | "full" | "save_dots" | "save_attn" | "names" |
                      // "auto" (the planner's per-block plan; see engine/planner/planner.h)
  int64_t every = 1;  // blocks per checkpoint segment (n_layer = whole model)
  std::vector<int64_t> blocks;    // blocks that are checkpointed; empty = all
  std::vector<std::string> save;  // policy "names": activations to keep (JAX save_only_these_names)
  std::vector<std::string> plan;  // one policy per block; overrides policy/blocks when set
  int64_t tile_tokens = 0;        // GPT: LayerNorm 2 + MLP in chunks of this many rows; 0 = off
  int64_t attention_chunk = 0;    // tokens per attention chunk; 0 = where the backend needs it
  // What lives in host memory between its uses: checkpoints (copied out after each block's
  // forward, back before its recompute), optionally the AdamW moments, and optionally the fp32
  // weights and gradients too (the device then holds only the weights of the blocks it runs, and
  // AdamW runs on the host's cores: engine/remat/weight_stream.h).
  OffloadKind offload = OffloadKind::None;
  bool offloads_checkpoints() const { return offload != OffloadKind::None; }
  bool offloads_optimizer() const {
    return offload == OffloadKind::CheckpointsOptimizer ||
           offload == OffloadKind::CheckpointsOptimizerWeights;
  }
  bool offloads_weights() const { return offload == OffloadKind::CheckpointsOptimizerWeights; }
};

struct DeviceConfig {
  BackendKind backend = BackendKind::Auto;  // auto = CUDA when a GPU is found
  uint64_t memory_bytes = 0;                // budget; 0 = what the machine has
  uint64_t host_memory_bytes = 0;           // host pool budget (remat.offload); 0 = the machine's
  int64_t threads = 0;                      // CPU threads; 0 = all cores
  Precision precision = Precision::Bf16;    // CUDA activations (fp32 master weights either way)
};

struct LogConfig {
  int64_t every = 1;    // progress line every N steps
  std::string metrics;  // JSONL file; empty = none (--metrics overrides)
};

struct CheckpointConfig {
  std::string dir;           // where step_NNNNNNNN/ folders go; empty = no checkpoints
  int64_t every = 0;         // write one every N steps (and after the last); 0 = only at the end
  int64_t keep_last = 0;     // delete older ones once a new one is complete; 0 = keep all
  bool on_interrupt = true;  // SIGINT/SIGTERM/SIGHUP write one before exit
};

/// LoRA (docs/lora.md): adapters y = x W^T + s (x A^T) B^T on the chosen linears of the blocks,
/// with every other parameter frozen except `modules_to_save`. Which modules the names select, the
/// adapters' names and shapes: engine/config/lora.h.
struct LoraConfig {
  // The ranges of lora.rank and lora.alpha, which a PEFT adapter's r and lora_alpha must meet too.
  static constexpr int64_t kMaxRank = 65536;
  static constexpr double kMinAlpha = 1e-6, kMaxAlpha = 1e6;

  int64_t rank = 0;   // r; 0 = off (full fine-tuning)
  double alpha = 16;  // scale s = alpha / rank (alpha / sqrt(rank) with rslora)
  // Hugging Face module names, matched as peft does (llama: q_proj k_proj v_proj o_proj gate_proj
  // up_proj down_proj; gpt: c_attn c_proj c_fc); [] = every linear of the blocks.
  std::vector<std::string> targets;
  double dropout = 0;  // on each adapter's input, as peft's lora_dropout
  bool rslora = false;
  std::vector<std::string>
      modules_to_save;  // whole modules that train too: embeddings, norms, head
  // The storage of the blocks' frozen linear weights: "fp32", "bf16" (2 bytes a weight) or "nf4"
  // (QLoRA: bitsandbytes' 4-bit NormalFloat in blocks of 64, engine/core/nf4.h), decoded per GEMM.
  // Below fp32 the frozen token embedding and LM head are stored in bf16 too.
  std::string base = "fp32";
  bool double_quant = true;  // nf4: the blocks' absmaxes 8-bit quantised (bitsandbytes' default)
  bool enabled() const { return rank > 0; }
};

/// Several ranks (mpirun / srun; engine/parallel), data x context of them. Data parallel: each
/// group of `context` ranks trains on train.batch_size / data rows of every step. Context
/// parallel: each rank of a group holds 2 of 2 x context chunks of every row's tokens, and
/// attention is a ring over the group. Gradients are summed over every rank.
struct ParallelConfig {
  int64_t data = 0;     // data-parallel groups; 0 = the ranks the launcher started / context
  int64_t context = 1;  // ranks that split each sequence (ring attention)
  uint64_t bucket_bytes = 16ull << 20;  // gradients reduced per exchange (two in flight)
  // ZeRO-1: each rank keeps the AdamW moments of its shard of every bucket and updates only that
  // shard; the updated weights are gathered instead of the summed gradients.
  bool shard_optimizer = false;
  // Seconds a rank waits for the others at one exchange before it aborts the job, naming the
  // exchange (a rank stopped, hung or lost); 0 = forever. Ranks normally meet within a step's
  // imbalance; rank 0 writing a checkpoint keeps them apart for as long as the write takes.
  double timeout_s = 1800;
  int rank = 0;  // this process's rank: set at start-up from the launcher, never a config key
  /// The data-parallel groups this config runs on (0 means one outside a launcher).
  int64_t data_ranks() const { return data > 0 ? data : 1; }
  int64_t world_ranks() const { return data_ranks() * context; }
  /// Ranks are numbered group by group: rank = data_rank * context + context_rank.
  int data_rank() const { return rank / static_cast<int>(context); }
  int context_rank() const { return rank % static_cast<int>(context); }
  /// The AdamW moments are spread over the ranks (shard_optimizer with more than one rank).
  bool shards_optimizer() const { return shard_optimizer && world_ranks() > 1; }
};

struct Config {
  std::string path;  // where it came from, for messages
  /// "section.key" -> "file:line:col" or "--set ..." for every key that was given.
  std::map<std::string, std::string> origins;
  ModelConfig model;
  TrainConfig train;
  DataConfig data;
  RematConfig remat;
  DeviceConfig device;
  LogConfig log;
  CheckpointConfig checkpoint;
  ParallelConfig parallel;
  LoraConfig lora;
};

/// Rows of each step this rank trains on: train.batch_size split over the data-parallel groups.
int64_t local_batch_size(const Config& c);
/// Tokens of each row this rank holds: train.seq_len split over the context ranks (two chunks).
int64_t local_seq_len(const Config& c);

/// What of every step's batch the data sources give this rank (cfg.parallel.rank): rows
/// [first_row, first_row + rows) of the train.batch_size rows, and of each row's tokens the
/// global positions it holds (0 .. seq_len - 1 on a single rank).
struct BatchShare {
  int64_t rows = 0, first_row = 0;
  TokenPositions positions;
};
BatchShare batch_share(const Config& c);

/// The config as a TOML document (every key, resolved): what state.json keeps of a run.
std::string config_to_toml(const Config& c);

/// The config of a run resumed from a checkpoint: the checkpoint's own (`saved_toml`, its
/// state.json's; `saved_name` names it in messages), with the keys that the config file `path`
/// (empty or "hf:DIR": none) and `overrides` set on top. Keys that neither sets keep the
/// checkpoint's values, so a file without [model] (a run started with --init hf:DIR) resumes, and
/// model.from_hf (in the file or an override) is not read: the checkpoint holds the model's keys,
/// and its folder may be gone. [parallel] is not the checkpoint's (the ranks are where this job
/// runs). Whether the changes may be made is changes_on_resume's to say.
Config load_resume_config(const std::string& saved_toml, const std::string& saved_name,
                          const std::string& path, const std::vector<std::string>& overrides);

/// One key whose value differs between two configs, as a config file spells it ("20", "\"full\"").
struct KeyChange {
  std::string key;  // "train.steps"
  std::string before, after;
  std::string origin;  // where `after` was set: "ft.toml:12:1", "--set train.steps=40"
};
/// The keys config_to_toml writes whose values differ from `before` to `after`, by key name.
std::vector<KeyChange> config_changes(const Config& before, const Config& after);
/// Whether a resumed run may change `key` ("train.steps"): train.steps and the evaluation
/// cadence, the data files, the memory budget and remat, the ranks, logging and checkpoints --
/// what does not change what a step computes from the weights and its batch. The model, the seed,
/// the batch shape, the optimizer's settings and the data order may not.
bool changes_on_resume(const std::string& key);
/// The keys that the config file `path` (empty or "hf:DIR": none) and the --set `overrides` change
/// from their values in `saved` where changes_on_resume refuses a change, read from their text
/// alone: what to report when such a change leaves the resumed config invalid (lora.base =
/// "fp32" beside the checkpoint's lora.double_quant), where the validation would blame the
/// checkpoint's own line.
std::vector<KeyChange> refused_resume_changes(const Config& saved, const std::string& path,
                                              const std::vector<std::string>& overrides);

/// Every config key as a Markdown table: key, type, default, what the parser accepts (read from
/// the parser's own readers) and meaning. `remat-train keys` prints it; docs/configs.md shows it.
std::string config_keys_markdown();

/// The string key `section`.`key` that `path` (a config file, "hf:DIR", or empty: none) and
/// `overrides` set (the last --set wins), if any; reads the file's TOML without checking the
/// rest of it (a file that is no whole config, such as one without [model], still answers).
std::optional<std::string> config_string_key(const std::string& path,
                                             const std::vector<std::string>& overrides,
                                             const std::string& section, const std::string& key);
/// config_string_key for model.from_hf ("hf:DIR" as the path names DIR).
std::optional<std::string> config_from_hf(const std::string& path,
                                          const std::vector<std::string>& overrides);
/// The --set that means model.from_hf = `dir` (quoted, so that any folder name reads as a string).
std::string from_hf_override(const std::string& dir);
/// Whether [model] key `key` ("rope_scaling", "rope_scaling.factor", "max_position_embeddings")
/// is one a user may set on a model given whole (beside model.from_hf, or on eval --checkpoint):
/// its RoPE scaling and the length it was trained for. Extending a model's context is training or
/// scoring its weights under another scaling; any other key would make another model.
bool rope_extension_key(std::string_view key);

/// Parses and validates `path`, then applies each "section.key=value" override with the same
/// validation. A `path` of "hf:DIR" is no file: the [model] of DIR/config.json (model.from_hf),
/// train.batch_size = 1, every other key at its default. Throws ConfigError (or IoError when the
/// file cannot be read).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
/// Same, from TOML text; `name` stands for the file in messages.
Config parse_config(const std::string& toml_text, const std::string& name,
                    const std::vector<std::string>& overrides = {});

/// A ConfigError for a check made after parsing (e.g. activation names known only to the model),
/// pointing at where `key` was set.
[[noreturn]] void throw_config_error(const Config& c, const std::string& key,
                                     const std::string& problem, const std::string& fix);

}  // namespace remat
