// Config parsing and validation with toml++ (see engine/config/config.h). Every key is declared
// once in kKeys (section, name, how to read it); cross-field checks run after all keys are read.
#include "engine/config/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <variant>

#include "engine/config/config_path.h"
#include "engine/config/hf_config.h"
#include "engine/config/lora.h"
#include "engine/config/policy.h"
#include "engine/config/rope_scaling.h"
#include "engine/config/shards_json.h"
#include "engine/core/error.h"
#include "engine/core/regular_file.h"
#include "engine/core/token_positions.h"
#include "engine/core/units.h"

namespace remat {
namespace {

// Where a key came from: "configs/tiny.toml:12:1" or "--set model.n_head=5".
struct Origin {
  std::string where;
  std::string key;  // "model.n_head"
};

[[noreturn]] void fail(const Origin& o, const std::string& problem, const std::string& fix) {
  throw ConfigError(fmt::format("{}: [config] {}: {}. Fix: {}", o.where, o.key, problem, fix));
}

const char* type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "another type";
  }
}

// "99999999999999999999": digits that overflowed TOML's 64-bit integer (a --set value falls back
// to a string then), so the user hears "out of range", not "got a string". Digits that fit, as in
// rank = "8", are a quoted number: read_int says so instead.
bool is_digit_string(const toml::node& n) {
  const std::string* s = n.as_string() ? &n.as_string()->get() : nullptr;
  if (!s) return false;
  const size_t first = !s->empty() && ((*s)[0] == '-' || (*s)[0] == '+') ? 1 : 0;
  return s->size() > first && s->find_first_not_of("0123456789_", first) == std::string::npos;
}
bool fits_int64(const std::string& digits) {
  std::string plain;
  for (char c : digits)
    if (c != '_' && c != '+') plain += c;
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(plain.data(), plain.data() + plain.size(), v);
  return ec == std::errc() && end == plain.data() + plain.size();
}

// `remat-train keys` documents each key by running its own reader in describe mode: the reader
// states what it accepts (type and range) instead of reading, so the table shows exactly what
// the parser enforces and cannot drift from it.
struct KeyAccepts {
  std::string type, values;
};
thread_local KeyAccepts* g_describe = nullptr;

// A range end as the key accepts it: counts take 4k / 1M, plain integers only digits.
std::string bound(int64_t v, bool count) {
  if (v == std::numeric_limits<int64_t>::max()) return "max";
  return count ? format_count(v) : std::to_string(v);
}

int64_t read_int(const toml::node& n, const Origin& o, int64_t lo, int64_t hi, bool allow_suffix) {
  if (g_describe) {
    *g_describe = {allow_suffix ? "count" : "integer",
                   fmt::format("{}..{}", bound(lo, allow_suffix), bound(hi, allow_suffix))};
    return lo;
  }
  if (is_digit_string(n) && fits_int64(*n.value<std::string>()))
    fail(o, fmt::format("expected an integer, got the string \"{}\"", *n.value<std::string>()),
         fmt::format("write {} without quotes", *n.value<std::string>()));
  if (is_digit_string(n))
    fail(o, fmt::format("{} is out of range", *n.value<std::string>()),
         hi == std::numeric_limits<int64_t>::max()
             ? fmt::format("use a value >= {}", lo)
             : fmt::format("use a value in [{}, {}]", lo, hi));
  std::optional<int64_t> v;
  if (n.is_integer())
    v = n.value<int64_t>();
  else if (allow_suffix && n.is_string()) {
    v = parse_count(*n.value<std::string>());
    if (!v)
      fail(o, fmt::format("'{}' is not a count", *n.value<std::string>()),
           "write an integer such as 4096, or 4k / 1M");
  } else {
    fail(o, fmt::format("expected an integer, got {}", type_name(n)),
         allow_suffix ? "write an integer such as 4096 or a count such as \"4k\""
                      : "write an integer");
  }
  if (*v < lo || *v > hi)
    fail(o, fmt::format("{} is out of range", *v),
         hi == std::numeric_limits<int64_t>::max()
             ? fmt::format("use a value >= {}", lo)
             : fmt::format("use a value in [{}, {}]", lo, hi));
  return *v;
}

double read_float(const toml::node& n, const Origin& o, double lo, double hi) {
  if (g_describe) {
    *g_describe = {"number", fmt::format("{:g}..{:g}", lo, hi)};
    return lo;
  }
  if (n.is_string()) {  // --set train.lr=1e400: TOML has no such float, so it came as a word
    const std::string text = *n.value<std::string>();
    char* end = nullptr;
    errno = 0;
    std::strtod(text.c_str(), &end);
    if (!text.empty() && end == text.c_str() + text.size() && errno == ERANGE)
      fail(o, fmt::format("{} is out of range", text),
           fmt::format("use a value in [{}, {}]", lo, hi));
  }
  if (!n.is_number())
    fail(o, fmt::format("expected a number, got {}", type_name(n)), "write a number such as 3e-4");
  double v = *n.value<double>();
  // TOML reads a float below the smallest double (1e-400) as 0: say so, since the file has no 0.
  const char* underflow =
      v == 0 && n.is_floating_point() ? " (a float below 1e-308 reads as 0)" : "";
  if (!(v >= lo && v <= hi))
    fail(o, fmt::format("{} is out of range{}", v, underflow),
         fmt::format("use a value in [{}, {}]", lo, hi));
  return v;
}

std::string read_choice(const toml::node& n, const Origin& o, std::vector<std::string> choices) {
  std::string quoted = fmt::format("\"{}\"", fmt::join(choices, "\" | \""));
  if (g_describe) {
    *g_describe = {"string", quoted};
    return choices.front();
  }
  if (!n.is_string())
    fail(o, fmt::format("expected a string, got {}", type_name(n)), "use one of " + quoted);
  std::string v = *n.value<std::string>();
  for (const auto& c : choices)
    if (v == c) return v;
  fail(o, fmt::format("unknown value \"{}\"", v), "use one of " + quoted);
}

// The config spellings of the enum-like keys, in the order `keys` lists them.
template <class E>
using EnumNames = std::vector<std::pair<std::string_view, E>>;
const EnumNames<ModelKind> kModelKinds = {
    {"gpt", ModelKind::Gpt}, {"llama", ModelKind::Llama}, {"mlp", ModelKind::Mlp}};
const EnumNames<PositionKind> kPositions = {{"learned", PositionKind::Learned},
                                            {"rope", PositionKind::Rope}};
const EnumNames<BackendKind> kBackends = {
    {"auto", BackendKind::Auto}, {"cpu", BackendKind::Cpu}, {"cuda", BackendKind::Cuda}};
const EnumNames<Precision> kPrecisions = {{"bf16", Precision::Bf16}, {"fp32", Precision::Fp32}};
const EnumNames<OffloadKind> kOffloads = {
    {"none", OffloadKind::None},
    {"checkpoints", OffloadKind::Checkpoints},
    {"checkpoints+optimizer", OffloadKind::CheckpointsOptimizer},
    {"checkpoints+optimizer+weights", OffloadKind::CheckpointsOptimizerWeights}};

template <class E>
E read_enum(const toml::node& n, const Origin& o, const EnumNames<E>& names) {
  std::vector<std::string> choices;
  for (const auto& [name, value] : names) choices.emplace_back(name);
  const std::string v = read_choice(n, o, choices);
  for (const auto& [name, value] : names)
    if (v == name) return value;
  return names.front().second;  // describe mode
}

template <class E>
std::string_view enum_name(E v, const EnumNames<E>& names) {
  for (const auto& [name, value] : names)
    if (v == value) return name;
  return "?";
}

std::string read_string(const toml::node& n, const Origin& o) {
  if (g_describe) {
    *g_describe = {"string", "any"};
    return {};
  }
  if (!n.is_string())
    fail(o, fmt::format("expected a string, got {}", type_name(n)), "quote the value");
  return *n.value<std::string>();
}

// A size in bytes; `budget`: a memory budget, held to memory_budget_problem's range (a size
// with a range of its own, parallel.bucket_bytes, checks it where it is validated).
uint64_t read_size(const toml::node& n, const Origin& o, bool budget = true) {
  if (g_describe) {
    *g_describe = {"size", "bytes or \"512MiB\", \"80GiB\", \"1.5GB\""};
    return 0;
  }
  std::optional<uint64_t> v;
  if (n.is_integer() && *n.value<int64_t>() >= 0) v = static_cast<uint64_t>(*n.value<int64_t>());
  if (n.is_string()) v = parse_size(*n.value<std::string>());
  if (!v) fail(o, "not a size", "write a size such as \"512MiB\", \"80GiB\" or \"1.5GB\"");
  if (auto problem = memory_budget_problem(*v); problem && budget)
    fail(o, *problem, kMemoryBudgetFix);
  return *v;
}

std::vector<int64_t> read_int_list(const toml::node& n, const Origin& o) {
  if (g_describe) {
    *g_describe = {"integers", "block indices"};
    return {};
  }
  const toml::array* arr = n.as_array();
  if (!arr)
    fail(o, fmt::format("expected an array of integers, got {}", type_name(n)),
         "write e.g. [0, 2, 3]");
  std::vector<int64_t> out;
  for (const toml::node& e : *arr)
    out.push_back(read_int(e, o, 0, std::numeric_limits<int64_t>::max(), false));
  return out;
}

bool read_bool(const toml::node& n, const Origin& o) {
  if (g_describe) {
    *g_describe = {"bool", "true | false"};
    return false;
  }
  if (!n.is_boolean())
    fail(o, fmt::format("expected a boolean, got {}", type_name(n)), "write true or false");
  return *n.value<bool>();
}

// model.rope_scaling as config.json writes it: an inline table { rope_type = "yarn", factor =
// 4.0, original_max_position_embeddings = 32768 } ("type" is accepted for rope_type, as older
// config.json files spell it; "default" or "none" is no scaling). The keys each type takes and
// their checks are engine/config/rope_scaling.h's, shared with config.json's reader.
RopeScaling read_rope_scaling(const toml::node& n, const Origin& o) {
  if (g_describe) {
    *g_describe = {"table",
                   "{ rope_type = \"linear\" | \"dynamic\" | \"yarn\" | \"llama3\", factor, "
                   "... } or \"none\""};
    return {};
  }
  if (n.is_string() && (*n.value<std::string>() == "none" || *n.value<std::string>() == "default"))
    return {};
  const toml::table* t = n.as_table();
  const std::string example =
      "write e.g. { rope_type = \"yarn\", factor = 4.0, original_max_position_embeddings = 4096 } "
      "or \"none\"";
  if (!t) fail(o, fmt::format("expected a table, got {}", type_name(n)), example);
  std::string type, type_key;
  std::vector<RopeKey> keys;
  for (auto&& [k, v] : *t) {
    const std::string key(k.str());
    if (key == "rope_type" || key == "type") {
      if (!v.is_string())
        fail({o.where, o.key + "." + key}, fmt::format("expected a string, got {}", type_name(v)),
             fmt::format("use one of {}", kScaledRopeTypes));
      // Both spellings, disagreeing: transformers would take one and this reader the other.
      if (!type.empty() && type != *v.value<std::string>())
        fail({o.where, o.key + "." + key},
             fmt::format("{} \"{}\" and {} \"{}\" disagree", type_key, type, key,
                         *v.value<std::string>()),
             "keep one of them");
      type = *v.value<std::string>();
      type_key = key;
      continue;
    }
    RopeKey rk{key, std::monostate{}, v.is_integer(), type_name(v)};
    if (v.is_number()) rk.value = *v.value<double>();
    if (v.is_boolean()) rk.value = *v.value<bool>();
    // A length may be written as counts are elsewhere ("32k"); a factor is a number.
    if (const std::optional<int64_t> count =
            v.is_string() && key == "original_max_position_embeddings"
                ? parse_count(*v.value<std::string>())
                : std::nullopt) {
      rk.value = static_cast<double>(*count);
      rk.is_integer = true;
    }
    keys.push_back(std::move(rk));
  }
  if (type.empty()) fail(o, "rope_scaling has no rope_type", example);
  try {
    return parse_rope_scaling(type, keys);
  } catch (const RopeScalingProblem& e) {
    fail({o.where, e.key.empty() ? o.key : o.key + "." + e.key}, e.what(), e.fix);
  }
}

// model.from_hf: a folder (whether it holds a config.json is hf::read_model_keys's to say).
std::string read_hf_folder(const toml::node& n, const Origin& o) {
  if (g_describe) {
    *g_describe = {"string", "a folder holding config.json"};
    return {};
  }
  if (!n.is_string() || n.value<std::string>()->empty())
    fail(o, fmt::format("expected a folder (a string), got {}", type_name(n)),
         "write from_hf = \"path/to/model\" (the folder holding config.json)");
  return *n.value<std::string>();
}

// One path or a list of them: "data/*.bin" or ["a.bin", "b.bin"].
std::vector<std::string> read_path_list(const toml::node& n, const Origin& o) {
  if (g_describe) {
    *g_describe = {"paths", "a path or a list: files, folders, globs"};
    return {};
  }
  std::vector<std::string> out;
  if (n.is_string()) {
    out.push_back(*n.value<std::string>());
  } else if (const toml::array* arr = n.as_array()) {
    for (const toml::node& e : *arr) {
      if (!e.is_string())
        fail(o, fmt::format("expected strings in the list, got {}", type_name(e)),
             "quote each path");
      out.push_back(*e.value<std::string>());
    }
  } else {
    fail(o, fmt::format("expected a path or a list of paths, got {}", type_name(n)),
         "write e.g. \"data/shard_*.bin\" or [\"a.bin\", \"b.bin\"]");
  }
  for (const auto& p : out)
    if (p.empty()) fail(o, "empty path", "give a file, a directory or a glob");
  return out;
}

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

std::vector<std::string> read_string_list(const toml::node& n, const Origin& o) {
  if (g_describe) {
    *g_describe = {"strings", "a list of names"};
    return {};
  }
  const toml::array* arr = n.as_array();
  if (!arr)
    fail(o, fmt::format("expected an array of strings, got {}", type_name(n)),
         n.is_string() ? fmt::format("write it as a list: [\"{}\"]", *n.value<std::string>())
                       : std::string("write a list of names, e.g. [\"a\", \"b\"]"));
  std::vector<std::string> out;
  for (const toml::node& e : *arr) out.push_back(read_string(e, o));
  return out;
}

struct KeySpec {
  const char* section;
  const char* key;
  const char* meaning;  // one line for `remat-train keys`
  std::function<void(Config&, const toml::node&, const Origin&)> read;
};

// Every accepted key, once. Defaults live in engine/config/config.h.
const std::vector<KeySpec>& key_specs() {
  static const std::vector<KeySpec> specs = {
      {"model", "kind",
       "the model: \"gpt\", the Llama family (\"llama\": Llama, Qwen, Mistral, SmolLM) or the "
       "checkpointing tutorial's \"mlp\" (required in a config file)",
       [](Config& c, auto& n, auto& o) { c.model.kind = read_enum(n, o, kModelKinds); }},
      {"model", "from_hf",
       "a Hugging Face model folder: every other [model] key from its config.json (docs/hf.md)",
       [](Config& c, auto& n, auto& o) { c.model.from_hf = read_hf_folder(n, o); }},
      {"model", "n_layer", "blocks",
       [](Config& c, auto& n, auto& o) { c.model.n_layer = read_int(n, o, 1, 4096, false); }},
      {"model", "n_head", "attention heads (query heads)",
       [](Config& c, auto& n, auto& o) { c.model.n_head = read_int(n, o, 1, 4096, false); }},
      {"model", "n_embd", "channels; the MLP's width",
       [](Config& c, auto& n, auto& o) { c.model.n_embd = read_int(n, o, 1, 1 << 20, true); }},
      {"model", "vocab_size", "tokens; 256 for text read as bytes",
       [](Config& c, auto& n, auto& o) { c.model.vocab_size = read_int(n, o, 2, 1 << 24, true); }},
      {"model", "n_ctx", "learned position table length (gpt with position = \"learned\")",
       [](Config& c, auto& n, auto& o) { c.model.n_ctx = read_int(n, o, 1, 1ll << 32, true); }},
      {"model", "d_ff", "MLP hidden size (llama: intermediate_size); 0 = 4 x n_embd",
       [](Config& c, auto& n, auto& o) { c.model.d_ff = read_int(n, o, 0, 1 << 22, true); }},
      {"model", "position", "learned position table or rotary embeddings",
       [](Config& c, auto& n, auto& o) { c.model.position = read_enum(n, o, kPositions); }},
      {"model", "rope_theta", "RoPE base",
       [](Config& c, auto& n, auto& o) { c.model.rope_theta = read_float(n, o, 1.0, 1e12); }},
      {"model", "dropout", "dropout after attention and MLP outputs (gpt)",
       [](Config& c, auto& n, auto& o) { c.model.dropout = read_float(n, o, 0.0, 0.99); }},
      {"model", "n_kv_head", "key/value heads, grouped-query attention (llama); 0 = n_head",
       [](Config& c, auto& n, auto& o) { c.model.n_kv_head = read_int(n, o, 0, 4096, false); }},
      {"model", "head_dim", "head size (llama); 0 = n_embd / n_head",
       [](Config& c, auto& n, auto& o) { c.model.head_dim = read_int(n, o, 0, 4096, false); }},
      {"model", "norm_eps", "RMSNorm epsilon (llama: rms_norm_eps)",
       [](Config& c, auto& n, auto& o) { c.model.norm_eps = read_float(n, o, 1e-12, 0.1); }},
      {"model", "rope_scaling",
       "RoPE frequency scaling (llama; transformers' rope_scaling): rope_type \"linear\", "
       "\"dynamic\", \"yarn\" or \"llama3\" and the keys it takes (docs/context-extension.md)",
       [](Config& c, auto& n, auto& o) { c.model.rope_scaling = read_rope_scaling(n, o); }},
      {"model", "attention_bias", "q/k/v projection biases (llama: Qwen2)",
       [](Config& c, auto& n, auto& o) { c.model.attention_bias = read_bool(n, o); }},
      {"model", "qk_norm", "per-head RMSNorm of q and k before RoPE (llama: Qwen3)",
       [](Config& c, auto& n, auto& o) { c.model.qk_norm = read_bool(n, o); }},
      {"model", "tie_embeddings", "LM head shares the token embedding (tie_word_embeddings)",
       [](Config& c, auto& n, auto& o) { c.model.tie_embeddings = read_bool(n, o); }},
      {"model", "max_position_embeddings",
       "the context the model was trained for (llama: config.json's max_position_embeddings); "
       "0 = unknown. A longer train.seq_len without rope_scaling warns; export writes it",
       [](Config& c, auto& n, auto& o) {
         c.model.max_position_embeddings = read_int(n, o, 0, kMax, true);
       }},
      {"train", "seq_len", "tokens per row",
       [](Config& c, auto& n, auto& o) { c.train.seq_len = read_int(n, o, 1, 1ll << 32, true); }},
      {"train", "batch_size", "rows per step",
       [](Config& c, auto& n, auto& o) { c.train.batch_size = read_int(n, o, 1, 1 << 20, true); }},
      {"train", "steps", "optimizer steps",
       [](Config& c, auto& n, auto& o) { c.train.steps = read_int(n, o, 1, kMax, true); }},
      {"train", "lr", "peak learning rate",
       [](Config& c, auto& n, auto& o) { c.train.lr = read_float(n, o, 0.0, 10.0); }},
      {"train", "warmup_steps", "linear warmup, then cosine decay to lr x min_lr_ratio",
       [](Config& c, auto& n, auto& o) { c.train.warmup_steps = read_int(n, o, 0, kMax, true); }},
      {"train", "min_lr_ratio", "the learning rate at the end, as a fraction of lr",
       [](Config& c, auto& n, auto& o) { c.train.min_lr_ratio = read_float(n, o, 0.0, 1.0); }},
      {"train", "weight_decay", "AdamW decoupled decay, on 2-D weights only",
       [](Config& c, auto& n, auto& o) { c.train.weight_decay = read_float(n, o, 0.0, 10.0); }},
      {"train", "grad_clip", "global gradient-norm clip; 0 = off",
       [](Config& c, auto& n, auto& o) { c.train.grad_clip = read_float(n, o, 0.0, 1e9); }},
      {"train", "seed", "all random streams (init, data, dropout) derive from it",
       [](Config& c, auto& n, auto& o) {
         c.train.seed = static_cast<uint64_t>(read_int(n, o, 0, kMax, false));
       }},
      {"train", "loss_chunk",
       "rows per fused LM-head chunk; 0 = chosen by the tool (~32 MiB of logits; on a GPU up to "
       "8192 rows, and on the CPU for a LoRA run's frozen head up to 512, as the budget allows)",
       [](Config& c, auto& n, auto& o) { c.train.loss_chunk = read_int(n, o, 0, kMax, true); }},
      {"train", "eval_every", "validation loss every N steps and after the last; 0 = off",
       [](Config& c, auto& n, auto& o) { c.train.eval_every = read_int(n, o, 0, kMax, true); }},
      {"train", "eval_tokens", "tokens per evaluation; 0 = 8 batches",
       [](Config& c, auto& n, auto& o) { c.train.eval_tokens = read_int(n, o, 0, kMax, true); }},
      {"train", "grad_accum",
       "micro-batches of batch_size rows per optimizer step (gradient accumulation): the "
       "gradients of one batch of grad_accum x batch_size rows",
       [](Config& c, auto& n, auto& o) { c.train.grad_accum = read_int(n, o, 1, 1 << 20, false); }},
      {"data", "source", "synthetic tokens, llm.c token shards, or text files read as bytes",
       [](Config& c, auto& n, auto& o) {
         c.data.source = read_choice(n, o, {"synthetic", "tokens", "text"});
       }},
      {"data", "path", "training files (tokens, text), relative to the working directory",
       [](Config& c, auto& n, auto& o) { c.data.path = read_path_list(n, o); }},
      {"data", "val_path", "validation files; empty = none, or val_fraction",
       [](Config& c, auto& n, auto& o) { c.data.val_path = read_path_list(n, o); }},
      {"data", "val_fraction", "hold out this tail of each training file for validation",
       [](Config& c, auto& n, auto& o) { c.data.val_fraction = read_float(n, o, 0.0, 0.5); }},
      {"data", "order",
       "random windows keyed by (seed, step, row), sequential epochs, or packed rows of whole "
       "documents (first-fit, shuffled by the seed)",
       [](Config& c, auto& n, auto& o) {
         c.data.order = read_choice(n, o, {"random", "sequential", "packed"});
       }},
      {"data", "attention",
       "causal over the whole row, or document: a token sees only its own document, whose "
       "positions start at 0 (documents end with data.eot_token)",
       [](Config& c, auto& n, auto& o) {
         c.data.attention = read_choice(n, o, {"causal", "document"});
       }},
      {"data", "eot_token",
       "the end-of-text id that ends each document; -1 = the one prepare_data.py recorded in "
       "shards.json beside the shards",
       [](Config& c, auto& n, auto& o) {
         c.data.eot_token = read_int(n, o, -1, (1 << 24) - 1, false);
       }},
      {"data", "loss_mask",
       "auto: a shard X.bin's targets are trained where X.mask.bin beside it says 1 (all when "
       "there is none); off: every target",
       [](Config& c, auto& n, auto& o) {
         c.data.loss_mask = read_choice(n, o, {"auto", "off"});
       }},
      {"data", "task", "synthetic data: random or copy tokens (gpt), regression (mlp)",
       [](Config& c, auto& n, auto& o) {
         c.data.task = read_choice(n, o, {"random", "copy", "regression"});
       }},
      {"remat", "policy", "what each checkpointed block keeps; auto = the planner's per-block plan",
       [](Config& c, auto& n, auto& o) { c.remat.policy = read_choice(n, o, policy_names()); }},
      {"remat", "save", "policy \"names\": the activations to keep",
       [](Config& c, auto& n, auto& o) { c.remat.save = read_string_list(n, o); }},
      {"remat", "plan", "one policy per block; overrides policy and blocks",
       [](Config& c, auto& n, auto& o) {
         c.remat.plan = read_string_list(n, o);
         for (const auto& p : c.remat.plan) {
           if (p == "auto")
             fail(o, "\"auto\" is not a per-block policy: it chooses the whole plan",
                  "set remat.policy = \"auto\" without remat.plan, or use none, full, save_dots or "
                  "save_attn per block");
           const Policy* policy = find_policy(p);
           if (!policy || !policy->builtin)
             fail(o, fmt::format("unknown per-block policy \"{}\"", p),
                  "use none, full, save_dots or save_attn per block");
         }
       }},
      {"remat", "every", "blocks per checkpoint segment (n_layer = whole model)",
       [](Config& c, auto& n, auto& o) { c.remat.every = read_int(n, o, 1, 4096, false); }},
      {"remat", "blocks", "which blocks are checkpointed; [] = all",
       [](Config& c, auto& n, auto& o) { c.remat.blocks = read_int_list(n, o); }},
      {"remat", "tile_tokens",
       "each block's second norm and MLP run over chunks of N token rows and are recomputed "
       "in the backward; 0 = off (auto may turn it on)",
       [](Config& c, auto& n, auto& o) { c.remat.tile_tokens = read_int(n, o, 0, kMax, false); }},
      {"remat", "attention_chunk",
       "attention runs as (query chunk, key chunk) pairs of N tokens, merged exactly; 0 = only "
       "where the backend needs it (CUDA, past cuDNN's 2^31-element limit)",
       [](Config& c, auto& n, auto& o) {
         c.remat.attention_chunk = read_int(n, o, 0, kMax, true);
         if (c.remat.attention_chunk % 64 != 0)
           fail(o,
                fmt::format("remat.attention_chunk = {} is not a multiple of 64 tokens",
                            c.remat.attention_chunk),
                "use 0 (chunk only where needed) or a multiple of 64, such as 262144");
       }},
      {"remat", "offload",
       "host memory between uses: checkpoints (out after each block's forward, back before its "
       "recompute), the AdamW moments (streamed through the device at the update), and the fp32 "
       "weights and gradients (fetched per block; AdamW then runs on the host)",
       [](Config& c, auto& n, auto& o) { c.remat.offload = read_enum(n, o, kOffloads); }},
      {"device", "backend", "auto = CUDA when a GPU is found, else the CPU",
       [](Config& c, auto& n, auto& o) { c.device.backend = read_enum(n, o, kBackends); }},
      {"device", "memory", "the pool budget; left out: the device's memory",
       [](Config& c, auto& n, auto& o) { c.device.memory_bytes = read_size(n, o); }},
      {"device", "host_memory",
       "the host pool's budget (remat.offload; pinned on CUDA); left out: the machine's memory",
       [](Config& c, auto& n, auto& o) { c.device.host_memory_bytes = read_size(n, o); }},
      {"device", "precision", "CUDA activations (weights and optimizer state stay fp32)",
       [](Config& c, auto& n, auto& o) { c.device.precision = read_enum(n, o, kPrecisions); }},
      {"device", "threads", "CPU threads; 0 = all cores",
       [](Config& c, auto& n, auto& o) { c.device.threads = read_int(n, o, 0, 1024, false); }},
      {"log", "every", "a progress line every N steps",
       [](Config& c, auto& n, auto& o) { c.log.every = read_int(n, o, 1, kMax, false); }},
      {"log", "metrics", "JSONL metrics file; empty = none (--metrics overrides)",
       [](Config& c, auto& n, auto& o) { c.log.metrics = read_string(n, o); }},
      {"checkpoint", "dir", "where step_NNNNNNNN/ folders go; empty = no checkpoints",
       [](Config& c, auto& n, auto& o) { c.checkpoint.dir = read_string(n, o); }},
      {"checkpoint", "every", "a checkpoint every N steps and after the last; 0 = at the end only",
       [](Config& c, auto& n, auto& o) { c.checkpoint.every = read_int(n, o, 0, kMax, true); }},
      {"checkpoint", "keep_last",
       "delete older checkpoints once a new one is complete; 0 = keep all",
       [](Config& c, auto& n, auto& o) {
         c.checkpoint.keep_last = read_int(n, o, 0, kMax, false);
       }},
      {"checkpoint", "on_interrupt", "SIGINT, SIGTERM or SIGHUP write a checkpoint before exit",
       [](Config& c, auto& n, auto& o) { c.checkpoint.on_interrupt = read_bool(n, o); }},
      {"parallel", "data",
       "data-parallel groups; 0 = the ranks started / parallel.context; each trains batch_size / "
       "data rows",
       [](Config& c, auto& n, auto& o) { c.parallel.data = read_int(n, o, 0, 1 << 16, false); }},
      {"parallel", "context", "ranks that split each sequence (ring attention; rope GPTs)",
       [](Config& c, auto& n, auto& o) { c.parallel.context = read_int(n, o, 1, 1 << 16, false); }},
      {"parallel", "bucket_bytes", "gradient bytes per reduction exchange (two in flight)",
       [](Config& c, auto& n, auto& o) { c.parallel.bucket_bytes = read_size(n, o, false); }},
      {"parallel", "shard_optimizer",
       "ZeRO-1: each rank keeps and updates the AdamW moments of 1/ranks of the weights",
       [](Config& c, auto& n, auto& o) { c.parallel.shard_optimizer = read_bool(n, o); }},
      {"parallel", "timeout",
       "seconds a rank waits for the others at one exchange before it aborts the job (a rank "
       "stopped or hung); 0 = forever",
       [](Config& c, auto& n, auto& o) { c.parallel.timeout_s = read_float(n, o, 0, 1e7); }},
      {"lora", "rank",
       "LoRA adapters of rank r on the chosen linears, every other weight frozen (docs/lora.md); "
       "0 = off: full fine-tuning",
       [](Config& c, auto& n, auto& o) {
         c.lora.rank = read_int(n, o, 0, LoraConfig::kMaxRank, false);
       }},
      {"lora", "alpha", "the adapters' scale is alpha / rank (alpha / sqrt(rank) with rslora)",
       [](Config& c, auto& n, auto& o) {
         c.lora.alpha = read_float(n, o, LoraConfig::kMinAlpha, LoraConfig::kMaxAlpha);
       }},
      {"lora", "targets",
       "Hugging Face module names that take adapters (llama: q_proj k_proj v_proj o_proj "
       "gate_proj up_proj down_proj; gpt: c_attn c_proj c_fc), matched as peft does; [] = every "
       "linear of the blocks",
       [](Config& c, auto& n, auto& o) { c.lora.targets = read_string_list(n, o); }},
      {"lora", "dropout", "dropout on each adapter's input (peft's lora_dropout)",
       [](Config& c, auto& n, auto& o) { c.lora.dropout = read_float(n, o, 0.0, 0.99); }},
      {"lora", "rslora", "rank-stabilized scale alpha / sqrt(rank) (peft's use_rslora)",
       [](Config& c, auto& n, auto& o) { c.lora.rslora = read_bool(n, o); }},
      {"lora", "modules_to_save",
       "whole modules that train beside the adapters, by Hugging Face name as peft matches them: "
       "embeddings, norms, the LM head (e.g. [\"embed_tokens\", \"norm\"])",
       [](Config& c, auto& n, auto& o) { c.lora.modules_to_save = read_string_list(n, o); }},
      {"lora", "base",
       "the storage of the blocks' frozen linear weights: \"fp32\", \"bf16\" (2 bytes each) or "
       "\"nf4\" (QLoRA: bitsandbytes' 4-bit NormalFloat, ~0.5 byte), decoded per GEMM; below "
       "fp32 the frozen embedding and LM head are bf16",
       [](Config& c, auto& n, auto& o) {
         c.lora.base = read_choice(n, o, {"fp32", "bf16", "nf4"});
       }},
      {"lora", "double_quant",
       "nf4: the absmax of each block of 64 weights quantised to 8 bits in blocks of 256 "
       "(bitsandbytes' compress_statistics); false keeps them f32",
       [](Config& c, auto& n, auto& o) { c.lora.double_quant = read_bool(n, o); }},
  };
  return specs;
}

std::vector<std::string> keys_of(const std::string& section) {
  std::vector<std::string> out;
  for (const auto& s : key_specs())
    if (section == s.section) out.emplace_back(s.key);
  return out;
}

// Records where each key came from, so cross-field checks can point at the right place.
class Origins {
 public:
  explicit Origins(std::string file) : file_(std::move(file)) {}
  void set(const std::string& key, std::string where) { map_[key] = std::move(where); }
  Origin of(const std::string& key) const {
    auto it = map_.find(key);
    return {it != map_.end() ? it->second : file_ + " (default)", key};
  }
  const std::string& file() const { return file_; }
  const std::map<std::string, std::string>& all() const { return map_; }

 private:
  std::string file_;
  std::map<std::string, std::string> map_;
};

std::string pos(const std::string& file, const toml::source_region& r) {
  return fmt::format("{}:{}:{}", file, r.begin.line, r.begin.column);
}

// The fix for an unknown key: the section's keys, or where transformers' quantisation flags
// (load_in_4bit, quantization_config, ...) live here.
std::string unknown_key_fix(const std::string& section, const std::string& key) {
  if (section == "model" &&
      (key.find("4bit") != std::string::npos || key.find("8bit") != std::string::npos ||
       key.find("quant") != std::string::npos))
    return "a frozen 4-bit base is [lora] base = \"nf4\" (docs/lora.md)";
  return fmt::format("valid keys are {}", fmt::join(keys_of(section), ", "));
}

// Reads one section table into the config.
void read_section(Config& c, const std::string& section, const toml::table& tbl, Origins& origins,
                  const std::function<std::string(const std::string&, const toml::node&)>& where) {
  for (auto&& [k, node] : tbl) {
    const std::string key(k.str());
    const std::string full = section + "." + key;
    const KeySpec* spec = nullptr;
    for (const auto& s : key_specs())
      if (section == s.section && key == s.key) spec = &s;
    Origin o{where(full, node), full};
    if (!spec)
      fail(o, fmt::format("unknown key '{}' in [{}]", key, section), unknown_key_fix(section, key));
    origins.set(full, o.where);
    spec->read(c, node, o);
  }
}

// The [model] keys only the Llama family reads: the GPT block has no grouped-query attention,
// RMSNorm, QK norm or attention bias, and learns or rotates positions without scaling them.
constexpr std::array<const char*, 7> kLlamaOnlyKeys = {"model.n_kv_head",
                                                       "model.head_dim",
                                                       "model.norm_eps",
                                                       "model.rope_scaling",
                                                       "model.attention_bias",
                                                       "model.qk_norm",
                                                       "model.max_position_embeddings"};

// The model kinds that read a sequence model's [model] key, for messages.
std::string kinds_with(std::string_view key) {
  if (std::find(kLlamaOnlyKeys.begin(), kLlamaOnlyKeys.end(), key) != kLlamaOnlyKeys.end() ||
      key == "model.tie_embeddings")
    return "\"llama\"";
  return key == "model.dropout" ? "\"gpt\"" : "\"gpt\" or \"llama\"";
}

// The keys that belong to one family of sequence models: the Llama family's in a GPT config (the
// GPT block has no grouped-query attention, RMSNorm or untied head), and GPT's dropout and
// learned positions in a Llama config.
void validate_model_family(const Config& c, const Origins& o) {
  const auto& m = c.model;
  if (m.kind == ModelKind::Gpt) {
    for (const char* key : kLlamaOnlyKeys)
      if (o.all().count(key))
        fail(o.of(key), fmt::format("{} applies to model.kind = \"llama\", not \"gpt\"", key),
             // A Hugging Face GPT-2 folder's kind is its own: only removing the key helps.
             m.from_hf.empty() ? fmt::format("remove {}, or set model.kind = \"llama\"", key)
                               : fmt::format("remove {}: GPT-2 learns its positions", key));
    if (!m.tie_embeddings)
      fail(o.of("model.tie_embeddings"), "the GPT's LM head is always the token embedding",
           "remove model.tie_embeddings, or set model.kind = \"llama\"");
    return;
  }
  if (m.position != PositionKind::Rope)
    fail(o.of("model.position"), "the Llama family encodes positions with RoPE only",
         "remove model.position (llama uses rope)");
  if (m.dropout > 0)
    fail(o.of("model.dropout"), "model.dropout applies to model.kind = \"gpt\"",
         "remove model.dropout (the Llama family trains without dropout)");
  if (m.n_head % m.kv_heads() != 0)
    fail(o.of("model.n_kv_head"),
         fmt::format("n_head = {} is not a multiple of n_kv_head = {}", m.n_head, m.kv_heads()),
         "choose n_kv_head dividing n_head (each key/value head serves n_head / n_kv_head "
         "query heads)");
}

// data.attention, data.eot_token: what documents need. Whether an end-of-text id is known for file
// data is settled when the data is opened (shards.json beside the shards, data/file_data.h).
void validate_documents(const Config& c, const Origins& o) {
  const bool sequence = c.model.has_sequence();
  if (c.data.documents() && !sequence)
    fail(o.of("data.attention"), "documents are runs of tokens, and the MLP model has none",
         "remove data.attention");
  if (c.data.eot_token >= c.model.vocab_size && sequence)
    fail(o.of("data.eot_token"),
         fmt::format("end-of-text id {} is outside the vocabulary (model.vocab_size = {})",
                     c.data.eot_token, c.model.vocab_size),
         "set the id the data was tokenized with, below model.vocab_size");
  if (c.data.source == "synthetic" && c.data.documents() && c.data.eot_token < 0)
    fail(o.of("data.attention"),
         "data.attention = \"document\" on synthetic data needs the end-of-text id that ends "
         "its documents, and no data.eot_token is set",
         "set data.eot_token (synthetic tokens equal to it end a document), or data.attention = "
         "\"causal\"");
}

// [lora] against the model: off (rank 0) means no other key; on, the names must select linears
// of the blocks and whole modules that can train (engine/config/lora.h says which and why).
void validate_lora(const Config& c, const Origins& o) {
  const LoraConfig& l = c.lora;
  if (!l.enabled()) {
    for (const char* key : {"lora.alpha", "lora.targets", "lora.dropout", "lora.rslora",
                            "lora.modules_to_save", "lora.base", "lora.double_quant"})
      if (o.all().count(key))
        fail(
            o.of(key),
            fmt::format("{} is set while lora.rank = 0, which is LoRA off (full fine-tuning)", key),
            c.model.kind == ModelKind::Mlp
                ? fmt::format("remove {}: LoRA adapts a language model's blocks, and model.kind "
                              "= \"mlp\" has none",
                              key)
                : fmt::format("set lora.rank (e.g. 16) to train adapters, or remove {}", key));
    return;
  }
  if (o.all().count("lora.double_quant") && l.base != "nf4")
    fail(o.of("lora.double_quant"),
         fmt::format("lora.double_quant quantises NF4's absmaxes, and lora.base = \"{}\" has none",
                     l.base),
         "set lora.base = \"nf4\", or remove lora.double_quant");
  if (c.model.kind == ModelKind::Mlp)
    fail(o.of("lora.rank"),
         "LoRA adapts the linears of a language model's blocks; model.kind = \"mlp\" has none",
         "remove [lora] (or set lora.rank = 0)");
  if (const lora::SiteChoice s = lora::select_sites(c.model, l.targets); !s.problem.empty())
    fail(o.of("lora.targets"), s.problem, "name the modules as in the model's Hugging Face form");
  if (const lora::SavedChoice s = lora::select_saved(c.model, l.modules_to_save);
      !s.problem.empty())
    fail(o.of("lora.modules_to_save"), s.problem,
         "name norms, or an embedding or LM head that is not tied, as in the model's Hugging "
         "Face form");
}

// Cross-field checks, each naming the key a user would change.
void validate(const Config& c, const Origins& o) {
  const auto& m = c.model;
  const auto& t = c.train;
  if (m.has_sequence()) {
    if (m.head_dim == 0 && m.n_embd % m.n_head != 0)
      fail(o.of("model.n_head"),
           fmt::format("n_embd = {} is not divisible by n_head = {}", m.n_embd, m.n_head),
           m.kind == ModelKind::Llama ? "choose n_head dividing n_embd, or set model.head_dim"
                                      : "choose n_head dividing n_embd");
    if (m.position == PositionKind::Rope && m.head_size() % 2 != 0)
      fail(o.of(m.head_dim ? "model.head_dim" : "model.n_head"),
           fmt::format("rope needs an even head size, got {}", m.head_size()),
           m.head_dim ? "choose an even model.head_dim"
                      : "choose n_head so that n_embd / n_head is even");
    validate_model_family(c, o);
    if (m.position == PositionKind::Learned && t.seq_len > m.n_ctx)
      fail(
          o.of("train.seq_len"),
          fmt::format("seq_len = {} exceeds model.n_ctx = {} with learned positions", t.seq_len,
                      m.n_ctx),
          // A Hugging Face folder's model is its config.json's: only the length can change.
          c.model.from_hf.empty()
              ? "raise model.n_ctx, lower train.seq_len, or set model.position = \"rope\""
              : fmt::format("set train.seq_len to at most {} (the folder's n_positions)", m.n_ctx));
    if (c.data.task == "regression")
      fail(o.of("data.task"), "the regression task is for model.kind = \"mlp\"",
           "use task = \"random\" or \"copy\"");
    if (c.data.source == "text" && m.vocab_size < 256)
      fail(o.of("model.vocab_size"),
           fmt::format("text data is read as bytes (256 symbols), vocab_size is {}", m.vocab_size),
           "set model.vocab_size = 256");
    if (c.data.source == "synthetic" && c.data.task == "copy" && t.seq_len < 4)
      fail(o.of("train.seq_len"), "the copy task needs seq_len >= 4", "raise train.seq_len");
  } else {
    if (c.data.source != "synthetic")
      fail(o.of("data.source"), "model.kind = \"mlp\" trains on the synthetic regression task",
           "set data.source = \"synthetic\"");
    if (c.data.task != "regression")
      fail(o.of("data.task"),
           fmt::format("model.kind = \"mlp\" trains on the regression task, not \"{}\"",
                       c.data.task),
           "set data.task = \"regression\"");
    for (const char* key :
         {"model.n_head", "model.vocab_size", "model.n_ctx", "model.d_ff", "model.position",
          "model.rope_theta", "model.dropout", "model.n_kv_head", "model.head_dim",
          "model.norm_eps", "model.rope_scaling", "model.attention_bias", "model.qk_norm",
          "model.tie_embeddings", "model.max_position_embeddings"})
      // In the file it is a mistake; from --set it is harmless (ignored), so one list of
      // overrides can sweep shapes across both kinds. A value that would change the model
      // (rope, its scaling, dropout) is an error from anywhere.
      if (o.all().count(key) &&
          (o.of(key).where.rfind("--set ", 0) != 0 ||
           (key == std::string("model.position") && m.position == PositionKind::Rope) ||
           (key == std::string("model.rope_scaling") && m.rope_scaling.kind != RopeScaling::None) ||
           (key == std::string("model.dropout") && m.dropout > 0)))
        fail(o.of(key),
             fmt::format("{} applies to model.kind = {}, not \"mlp\"", key, kinds_with(key)),
             fmt::format("remove {}{}", key,
                         std::string_view(key).find("head") != std::string_view::npos ||
                                 key == std::string("model.d_ff")
                             ? " (the MLP's width is model.n_embd)"
                             : ""));
    if (c.remat.tile_tokens > 0)
      fail(o.of("remat.tile_tokens"),
           "remat.tile_tokens chunks the token rows of a GPT block; the MLP model has none",
           "remove remat.tile_tokens (or set it to 0)");
  }
  if (c.parallel.data > 1 && t.batch_size % c.parallel.data != 0)
    fail(o.of("parallel.data"),
         fmt::format("train.batch_size = {} does not split evenly over {} data-parallel ranks",
                     t.batch_size, c.parallel.data),
         "choose a train.batch_size that is a multiple of parallel.data");
  if (c.parallel.context > 1) {
    if (!m.has_sequence())
      fail(o.of("parallel.context"), "context parallel splits the tokens of a model's sequences",
           "remove parallel.context (the MLP has no sequence)");
    if (m.position != PositionKind::Rope)
      fail(o.of("parallel.context"),
           "context parallel needs model.position = \"rope\" (learned positions are not split)",
           "set model.position = \"rope\", or parallel.context = 1");
    if (t.seq_len < 2 * c.parallel.context)
      fail(o.of("parallel.context"),
           fmt::format("seq_len = {} cannot give each of {} ranks two chunks of tokens", t.seq_len,
                       c.parallel.context),
           "raise train.seq_len or lower parallel.context");
  }
  if (c.parallel.bucket_bytes < 4096 || c.parallel.bucket_bytes > (1ull << 32))
    fail(o.of("parallel.bucket_bytes"),
         fmt::format("{} B per reduction exchange is outside 4 KiB .. 4 GiB",
                     c.parallel.bucket_bytes),
         "set e.g. parallel.bucket_bytes = \"16MiB\"");
  if (c.parallel.shard_optimizer && c.remat.offloads_optimizer())
    fail(o.of("parallel.shard_optimizer"),
         fmt::format("parallel.shard_optimizer keeps each rank's share of the AdamW moments on its "
                     "device, and remat.offload = \"{}\" moves them all to host memory",
                     c.remat.offload),
         "keep one: remat.offload = \"checkpoints\" with the sharded moments, or "
         "parallel.shard_optimizer = false");
  if (c.remat.offloads_weights() && c.parallel.world_ranks() > 1)
    fail(o.of("remat.offload"),
         fmt::format("remat.offload = \"{}\" trains on one rank, and [parallel] asks for {}",
                     c.remat.offload, c.parallel.world_ranks()),
         "run one rank (parallel.data = parallel.context = 1), or offload less: \"checkpoints\" "
         "or \"checkpoints+optimizer\"");
  // The weight stream copies each step's gradients OVER the host ones (weight_stream.h): a second
  // micro-batch would replace the first's instead of adding to it.
  if (t.grad_accum > 1 && c.remat.offloads_weights())
    fail(o.of("train.grad_accum"),
         fmt::format("grad_accum = {} with remat.offload = \"{}\": the gradients of weights in "
                     "host memory are replaced after each micro-batch, not summed",
                     t.grad_accum, c.remat.offload),
         "offload less (remat.offload = \"checkpoints+optimizer\"), or raise train.batch_size "
         "instead (train.grad_accum = 1)");
  const bool file_data = c.data.source != "synthetic";
  if (file_data && c.data.path.empty())
    fail(o.of("data.path"), fmt::format("data.source = \"{}\" needs files to read", c.data.source),
         "set data.path to a file, a directory or a glob, e.g. \"data/*.bin\"");
  for (const char* key :
       {"data.path", "data.val_path", "data.val_fraction", "data.order", "data.loss_mask"})
    if (!file_data && o.all().count(key))
      fail(o.of(key), fmt::format("{} applies to file data (source = \"tokens\" or \"text\")", key),
           "remove it, or set data.source");
  if (file_data && o.all().count("data.task"))
    fail(o.of("data.task"), "data.task selects a synthetic task",
         "remove data.task, or set data.source = \"synthetic\"");
  if (!c.data.val_path.empty() && c.data.val_fraction > 0)
    fail(o.of("data.val_fraction"), "both data.val_path and data.val_fraction are set",
         "keep one of them");
  validate_documents(c, o);
  if (!c.remat.save.empty() && c.remat.policy != "names")
    fail(o.of("remat.save"),
         fmt::format("remat.save applies to policy \"names\", and the policy is \"{}\"",
                     c.remat.policy),
         "remove remat.save (or set remat.save = []), or set remat.policy = \"names\"");
  if (!c.remat.plan.empty() && static_cast<int64_t>(c.remat.plan.size()) != m.n_layer)
    fail(o.of("remat.plan"),
         fmt::format("{} entries for n_layer = {} blocks", c.remat.plan.size(), m.n_layer),
         "give one policy per block");
  if (c.remat.offloads_checkpoints() && c.remat.plan.empty() && c.remat.policy == "none")
    fail(o.of("remat.offload"),
         fmt::format("remat.offload = \"{}\" moves checkpoints to host memory, and policy "
                     "\"none\" keeps none",
                     c.remat.offload),
         "set remat.policy (e.g. \"full\" or \"auto\"), or remove remat.offload");
  if (c.remat.policy == "names" && c.remat.save.empty())
    fail({o.of("remat.policy").where, "remat.save"},
         fmt::format("missing: policy \"names\" needs the list of activations to keep, and {} "
                     "has no remat.save",
                     o.file()),
         fmt::format("add save = [\"attn\", \"attn.lse\"] (or other names) under [remat] in {}, "
                     "or --set remat.save='[\"attn\"]', or choose another policy",
                     o.file()));
  // auto chooses these itself, so a value set beside it would be ignored. The neutral values
  // (plan = [], blocks = [], every = 1: every block, as auto's own plans) are accepted, so that
  // `--set remat.policy=auto` works on a file that spells out the defaults.
  const auto neutral = [&](const std::string& key) {
    return (key == "remat.plan" && c.remat.plan.empty()) ||
           (key == "remat.blocks" && c.remat.blocks.empty()) ||
           (key == "remat.every" && c.remat.every == 1);
  };
  if (c.remat.policy == "auto")
    for (const char* key : {"remat.plan", "remat.every", "remat.blocks"})
      if (o.all().count(key) && !neutral(key))
        fail(o.of(key),
             fmt::format(
                 "{} cannot be set with policy \"auto\", which chooses a plan per block itself",
                 key),
             fmt::format("remove {}, or choose a named policy", key));
  if (c.remat.every > m.n_layer)
    fail(o.of("remat.every"),
         fmt::format("every = {} exceeds model.n_layer = {}", c.remat.every, m.n_layer),
         fmt::format("use 1..{} (n_layer = whole model)", m.n_layer));
  for (size_t i = 0; i < c.remat.blocks.size(); ++i) {
    int64_t b = c.remat.blocks[i];
    if (b >= m.n_layer)
      fail(o.of("remat.blocks"),
           fmt::format("block {} does not exist (n_layer = {})", b, m.n_layer),
           fmt::format("list blocks in 0..{}", m.n_layer - 1));
    for (size_t j = 0; j < i; ++j)
      if (c.remat.blocks[j] == b)
        fail(o.of("remat.blocks"), fmt::format("block {} is listed twice", b),
             "list each block once");
  }
  validate_lora(c, o);
}

// "section.key=value" -> inserts value (parsed as TOML, else as a bare string) into `root`.
const std::vector<std::string> kSections = {"model", "train", "data",       "remat",   "device",
                                            "log",   "lora",  "checkpoint", "parallel"};

// The VALUE of an override "section.key=VALUE" as TOML reads it, under the key "v" (more keys
// when VALUE holds several, which apply_override refuses); a bare word (--set
// remat.policy=full) is a string.
toml::table override_value(const std::string& value) {
  try {
    return toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    toml::table word;
    word.insert_or_assign("v", value);
    return word;
  }
}

void apply_override(toml::table& root, const std::string& text, Origins& origins) {
  const auto eq = text.find('=');
  const auto dot = text.find('.');
  Origin o{fmt::format("--set {}", text), text.substr(0, eq)};
  if (text.find_first_of("\n\r") != std::string::npos)
    fail(o, "a line break in an override (one --set sets one key)",
         "give each key its own --set section.key=value");
  if (eq == std::string::npos || dot == std::string::npos || dot > eq || dot == 0 || dot + 1 == eq)
    fail(o, "malformed override", "write --set section.key=value, e.g. --set train.seq_len=4096");
  const std::string section = text.substr(0, dot);
  const std::string key = text.substr(dot + 1, eq - dot - 1);
  const std::string value = text.substr(eq + 1);
  if (std::find(kSections.begin(), kSections.end(), section) == kSections.end())
    fail(o, fmt::format("unknown section [{}]", section),
         fmt::format("use one of {}", fmt::join(kSections, ", ")));
  const toml::table parsed = override_value(value);
  if (parsed.size() != 1 || !parsed.contains("v"))
    fail(o, "the value holds more than one TOML key (one --set sets one key)",
         "give each key its own --set section.key=value");
  if (!root.contains(section)) root.insert_or_assign(section, toml::table{});
  toml::table* sec = root[section].as_table();
  if (!sec)
    fail(o, fmt::format("[{}] is not a table in the config file", section), "fix the config file");
  sec->insert_or_assign(key, *parsed.get("v"));
  origins.set(section + "." + key, o.where);
}

using WhereFn = std::function<std::string(const std::string&, const toml::node&)>;

// model.from_hf = "DIR": the [model] table becomes DIR/config.json's
// (engine/model_files/hf_names.h), so that it is exactly the checkpoint's. Any other [model] key
// beside it is an error, except vocab_size (a vocabulary padded for faster GEMMs: --init hf: pads
// the rows, docs/hf.md) and the RoPE scaling with the length it was trained for (rope_scaling,
// max_position_embeddings): extending a model's context is training or scoring its weights under
// another scaling (docs/context-extension.md). Each key taken from config.json names
// "DIR/config.json" as its origin in messages.
std::optional<hf::ModelKeys> expand_from_hf(toml::table& root, const WhereFn& where,
                                            std::map<std::string, std::string>& from_set) {
  toml::table* model = root["model"].as_table();
  if (!model || !model->contains("from_hf")) return std::nullopt;
  const Origin o{where("model.from_hf", *model->get("from_hf")), "model.from_hf"};
  const std::string dir = read_hf_folder(*model->get("from_hf"), o);
  for (auto&& [k, v] : *model) {
    const std::string key(k.str());
    const bool known = std::any_of(key_specs().begin(), key_specs().end(), [&](const KeySpec& s) {
      return std::string_view(s.section) == "model" && key == s.key;
    });
    if (!known)  // a typo, or transformers' own flags (load_in_4bit: lora.base = "nf4" here)
      fail({where("model." + key, v), "model." + key},
           fmt::format("unknown key '{}' in [model]", key), unknown_key_fix("model", key));
    if (key != "from_hf" && key != "vocab_size" && !rope_extension_key(key))
      fail({where("model." + key, v), "model." + key},
           fmt::format("set beside model.from_hf = \"{}\", whose config.json gives every "
                       "[model] key (--model hf: and --init hf: set model.from_hf too)",
                       dir),
           fmt::format("remove model.{}: the model is the folder's (docs/hf.md)", key));
  }
  hf::ModelKeys keys = hf::read_model_keys(dir);
  const std::string origin = (std::filesystem::path(dir) / "config.json").string();
  for (auto&& [k, v] : toml::parse(keys.toml)) {
    const std::string key(k.str());
    if (model->contains(key)) continue;  // given beside from_hf: the user's, not the folder's
    model->insert_or_assign(key, v);
    from_set["model." + key] = origin;
  }
  return keys;
}

// `given`: where keys merged into `root` from another file came from ("section.key" -> its
// "file:line:col"), so that messages point there and not at `name`.
Config build(toml::table root, const std::string& name, const std::vector<std::string>& overrides,
             const std::map<std::string, std::string>& given = {}) {
  Origins origins(name);
  std::map<std::string, std::string> from_set = given;
  for (const auto& ov : overrides) {
    apply_override(root, ov, origins);
    auto eq = ov.find('=');
    from_set[ov.substr(0, eq)] = "--set " + ov;
  }
  Config c;
  c.path = name;
  auto where = [&](const std::string& full, const toml::node& n) {
    auto it = from_set.find(full);
    return it != from_set.end() ? it->second : pos(name, n.source());
  };
  const std::optional<hf::ModelKeys> hf_keys = expand_from_hf(root, where, from_set);
  for (auto&& [k, node] : root) {
    const std::string section(k.str());
    const toml::table* tbl = node.as_table();
    Origin o{pos(name, node.source()), section};
    if (std::find(kSections.begin(), kSections.end(), section) == kSections.end())
      fail(o, fmt::format("unknown section [{}]", section),
           fmt::format("use one of {}", fmt::join(kSections, ", ")));
    if (!tbl)
      fail(o, fmt::format("'{}' must be a table", section),
           fmt::format("write it as [{}]", section));
    read_section(c, section, *tbl, origins, where);
  }
  if (c.model.kind == ModelKind::Mlp && !root["data"]["task"]) c.data.task = "regression";
  if (c.model.kind == ModelKind::Llama && !root["model"]["position"])
    c.model.position = PositionKind::Rope;  // the family's only kind of positions
  // `--model hf:DIR` alone takes every key not in config.json at its default; a learned-position
  // model (GPT-2) shorter than the default length takes its own length, as a default should fit.
  if (name.rfind("hf:", 0) == 0 && !root["train"]["seq_len"] &&
      c.model.position == PositionKind::Learned && c.model.has_sequence() &&
      c.train.seq_len > c.model.n_ctx)
    c.train.seq_len = c.model.n_ctx;
  if (hf_keys && hf_keys->attention_window > 0 && c.train.seq_len > hf_keys->attention_window)
    fail(origins.of("train.seq_len"),
         fmt::format("seq_len = {} is longer than the sliding window of {} ({} in {}/config.json): "
                     "attention here sees every earlier token, and {} sees only the last {}",
                     c.train.seq_len, hf_keys->attention_window, hf_keys->window_key,
                     c.model.from_hf, hf_keys->architecture, hf_keys->attention_window),
         fmt::format("train at seq_len <= {}, where the two are the same (docs/hf.md)",
                     hf_keys->attention_window));
  validate(c, origins);
  c.origins = origins.all();
  if (c.data.documents() && c.data.source == "tokens")
    for (const std::string& folder : data_folders(c.data.path))
      if (const std::optional<ShardsJson> s = read_shards_json(folder)) {
        c.data.mean_document_tokens = s->mean_document_tokens;
        break;
      }
  return c;
}

constexpr size_t kMaxConfigBytes = 1 << 20;

toml::table parse_toml(const std::string& toml_text, const std::string& name) {
  try {
    return toml::parse(toml_text, name);
  } catch (const toml::parse_error& e) {
    const auto line = e.source().begin.line;
    // toml++ words a key given twice with the key garbled when it is quoted ('"seseq_len" '): the
    // line itself says what is repeated.
    if (std::string_view(e.description()).find("cannot redefine existing") !=
        std::string_view::npos) {
      std::string text;
      std::istringstream lines(toml_text);
      for (std::uint32_t i = 0; i < line && std::getline(lines, text); ++i) {
      }
      while (!text.empty() && (text.back() == '\r' || text.back() == ' ')) text.pop_back();
      const size_t first = text.find_first_not_of(" \t");
      throw ConfigError(fmt::format(
          "{}:{}: [config] `{}` defines a key or table given earlier in this file (TOML allows "
          "each once). Fix: keep one of them",
          name, line, first == std::string::npos ? text : text.substr(first)));
    }
    throw ConfigError(fmt::format(
        "{}:{}:{}: [config] TOML syntax error: {}. Fix: correct the syntax at that position", name,
        line, e.source().begin.column, e.description()));
  }
}

// The folder of the running executable, through symlinks (/proc/self/exe is the real file), so a
// link to an installed remat-train still finds its share/ folder. Empty when it cannot be read.
std::string executable_dir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

// Where an installed remat-train keeps `path` under PREFIX/share/`share_dir`: `make install` puts
// the example configs in share/remat-train/configs and the manual in share/doc/remat-train,
// beside PREFIX/bin/remat-train (CMakeLists.txt, install rules).
std::filesystem::path installed_path(const std::string& exe_dir, const std::string& share_dir,
                                     const std::string& path) {
  return std::filesystem::path(exe_dir) / ".." / "share" / share_dir / path;
}

std::filesystem::path installed_data_path(const std::string& path, const std::string& exe_dir) {
  return installed_path(exe_dir, "remat-train", path);
}

// A config file is a small regular file: a device (/dev/zero), a FIFO or a directory is refused
// before a byte is read, and so is a file too large to be a config (reading it could not end).
std::string read_config_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if ((ec || !fs::exists(st)) && fs::path(path).is_relative())
    throw ConfigError(fmt::format(
        "{}: [config] cannot open the config file: not in the current folder ({}) nor in the "
        "installed configs ({}). Fix: check the path (configs/ has ready ones)",
        path, (fs::current_path(ec) / path).lexically_normal().string(),
        installed_data_path(path, executable_dir()).lexically_normal().string()));
  if (ec || !fs::exists(st))
    throw ConfigError(fmt::format(
        "{}: [config] cannot open the config file. Fix: check the path (configs/ has ready ones)",
        path));
  RegularFile file = RegularFile::open_read(path);
  if (file.problem() == RegularFile::Problem::NotRegular)
    throw ConfigError(fmt::format(
        "{}: [config] not a regular file (a directory, device or pipe). Fix: give a .toml file",
        path));
  std::string text;
  const int err = file.ok() ? file.read_all(text, kMaxConfigBytes) : file.error();
  if (err == EFBIG)
    throw ConfigError(
        fmt::format("{}: [config] larger than {} bytes: not a config. Fix: give a .toml file", path,
                    kMaxConfigBytes));
  if (!file.ok() || err != 0)
    throw ConfigError(
        fmt::format("{}: [config] cannot read the config file ({}). Fix: check its permissions",
                    path, file.ok() ? std::strerror(err) : file.problem_text()));
  return text;
}

}  // namespace

Config parse_config(const std::string& toml_text, const std::string& name,
                    const std::vector<std::string>& overrides) {
  return build(parse_toml(toml_text, name), name, overrides);
}

std::string resolve_config_path(const std::string& path, const std::string& exe_dir) {
  std::error_code ec;
  // Only a path that is not there falls back; one that cannot be looked at (EACCES) is read as
  // given, so that its own error is the one reported, not another file's contents.
  if (path.empty() || std::filesystem::path(path).is_absolute() ||
      std::filesystem::exists(path, ec) || ec || exe_dir.empty())
    return path;
  const std::filesystem::path installed = installed_data_path(path, exe_dir);
  return std::filesystem::exists(installed, ec) ? installed.lexically_normal().string() : path;
}

std::string resolve_config_path(const std::string& path) {
  return resolve_config_path(path, executable_dir());
}

std::string docs_page_path(const std::string& page) {
  const std::string exe_dir = executable_dir();
  if (exe_dir.empty()) return page;
  const std::filesystem::path installed = installed_path(exe_dir, "doc/remat-train", page);
  std::error_code ec;
  return std::filesystem::exists(installed, ec) ? installed.lexically_normal().string() : page;
}

bool rope_extension_key(std::string_view key) {
  return key == "rope_scaling" || key.starts_with("rope_scaling.") ||
         key == "max_position_embeddings";
}

std::string from_hf_override(const std::string& dir) {
  std::string quoted;
  for (char ch : dir) {
    if (ch == '"' || ch == '\\') quoted += '\\';
    quoted += ch;
  }
  return fmt::format("model.from_hf=\"{}\"", quoted);
}

std::optional<std::string> config_string_key(const std::string& given,
                                             const std::vector<std::string>& overrides,
                                             const std::string& section, const std::string& key) {
  const std::string prefix = section + "." + key + "=";
  for (auto it = overrides.rbegin(); it != overrides.rend(); ++it)
    if (it->rfind(prefix, 0) == 0) {
      toml::table root;
      Origins unused(given);
      apply_override(root, *it, unused);
      return root[section][key].value<std::string>();
    }
  if (given.empty()) return std::nullopt;
  if (given.rfind("hf:", 0) == 0)
    return section == "model" && key == "from_hf" ? std::optional(given.substr(3)) : std::nullopt;
  const std::string path = resolve_config_path(given);
  return parse_toml(read_config_file(path), path)[section][key].value<std::string>();
}

std::optional<std::string> config_from_hf(const std::string& given,
                                          const std::vector<std::string>& overrides) {
  return config_string_key(given, overrides, "model", "from_hf");
}

Config load_config(const std::string& given, const std::vector<std::string>& overrides) {
  // "hf:DIR" is `--model hf:DIR` without --config: no file, the model from DIR, every other key
  // at its default (the name is what fit's and sweep's trials pass on as --config).
  // Batch 1: the long-context runs a Hugging Face model is planned for train one row per step.
  if (given.rfind("hf:", 0) == 0) {
    std::vector<std::string> sets{from_hf_override(given.substr(3)), "train.batch_size=1"};
    sets.insert(sets.end(), overrides.begin(), overrides.end());
    return build(toml::table{}, given, sets);
  }
  // Resolved here too, not only by the CLI: every caller finds the installed configs the same way.
  const std::string path = resolve_config_path(given);
  toml::table root = parse_toml(read_config_file(path), path);
  // An empty, comment-only or truncated file must not train the built-in defaults: the file
  // says at least which model it trains, as [model] kind.
  const toml::table* model = root["model"].as_table();
  const bool from_hf = (model && model->contains("from_hf")) ||
                       std::any_of(overrides.begin(), overrides.end(), [](const std::string& o) {
                         return o.rfind("model.from_hf=", 0) == 0;
                       });
  if (!from_hf && (!model || !model->contains("kind")))
    throw ConfigError(fmt::format(
        "{}: [config] model.kind: missing: a config names at least the model it trains. Fix: "
        "add [model] with kind = \"gpt\", \"llama\" or \"mlp\" (configs/ has complete examples), "
        "or pass --model hf:DIR for a Hugging Face model folder",
        path));
  return build(std::move(root), path, overrides);
}

Config load_resume_config(const std::string& saved_toml, const std::string& saved_name,
                          const std::string& path, const std::vector<std::string>& overrides) {
  toml::table root = parse_toml(saved_toml, saved_name);
  // The ranks are where this job runs, not what the run is: the checkpoint's [parallel] holds the
  // layout its own launcher started (parallel.data resolved from it), so it is not carried over.
  root.erase("parallel");
  std::map<std::string, std::string> given;  // the file's keys: where each was set
  if (!path.empty() && path.rfind("hf:", 0) != 0) {
    const std::string file = resolve_config_path(path);
    for (auto&& [k, node] : parse_toml(read_config_file(file), file)) {
      const std::string section(k.str());
      const Origin o{pos(file, node.source()), section};
      if (std::find(kSections.begin(), kSections.end(), section) == kSections.end())
        fail(o, fmt::format("unknown section [{}]", section),
             fmt::format("use one of {}", fmt::join(kSections, ", ")));
      const toml::table* tbl = node.as_table();
      if (!tbl)
        fail(o, fmt::format("'{}' must be a table", section),
             fmt::format("write it as [{}]", section));
      if (!root.contains(section)) root.insert_or_assign(section, toml::table{});
      toml::table& into = *root[section].as_table();
      for (auto&& [key, value] : *tbl) {
        if (section == "model" && key.str() == "from_hf") continue;  // the checkpoint's model
        into.insert_or_assign(key, value);
        given[fmt::format("{}.{}", section, key.str())] = pos(file, value.source());
      }
    }
  }
  std::vector<std::string> sets;
  for (const std::string& o : overrides)
    if (o.rfind("model.from_hf=", 0) != 0) sets.push_back(o);
  return build(std::move(root), saved_name, sets, given);
}

std::string config_to_toml(const Config& c) {
  auto strings = [](const std::vector<std::string>& v) {
    toml::array a;
    for (const auto& s : v) a.push_back(s);
    return a;
  };
  auto ints = [](const std::vector<int64_t>& v) {
    toml::array a;
    for (int64_t x : v) a.push_back(x);
    return a;
  };
  toml::table model{{"kind", config_name(c.model.kind)},
                    {"n_layer", c.model.n_layer},
                    {"n_head", c.model.n_head},
                    {"n_embd", c.model.n_embd},
                    {"vocab_size", c.model.vocab_size},
                    {"n_ctx", c.model.n_ctx},
                    {"d_ff", c.model.d_ff},
                    {"position", config_name(c.model.position)},
                    {"rope_theta", c.model.rope_theta},
                    {"dropout", c.model.dropout}};
  if (c.model.kind == ModelKind::Llama) {  // a GPT refuses these keys, so only llama writes them
    model.erase("n_ctx");
    model.erase("dropout");
    model.insert("n_kv_head", c.model.n_kv_head);
    model.insert("head_dim", c.model.head_dim);
    model.insert("norm_eps", c.model.norm_eps);
    if (c.model.rope_scaling.kind != RopeScaling::None) {
      toml::table scaling;
      // A named copy of the key: clang before 16 refuses to capture a structured binding.
      for (const auto& entry : rope_scaling_entries(c.model.rope_scaling)) {
        const auto& key = entry.first;
        std::visit([&](const auto& v) { scaling.insert(key, v); }, entry.second);
      }
      model.insert("rope_scaling", std::move(scaling));
    }
    model.insert("attention_bias", c.model.attention_bias);
    model.insert("qk_norm", c.model.qk_norm);
    model.insert("tie_embeddings", c.model.tie_embeddings);
    model.insert("max_position_embeddings", c.model.max_position_embeddings);
  }
  if (c.model.kind ==
      ModelKind::Mlp)  // the MLP refuses the GPT's keys, so its state.json omits them
    for (const char* key :
         {"n_head", "vocab_size", "n_ctx", "d_ff", "position", "rope_theta", "dropout"})
      model.erase(key);
  toml::table train{{"seq_len", c.train.seq_len},
                    {"batch_size", c.train.batch_size},
                    {"steps", c.train.steps},
                    {"lr", c.train.lr},
                    {"warmup_steps", c.train.warmup_steps},
                    {"min_lr_ratio", c.train.min_lr_ratio},
                    {"weight_decay", c.train.weight_decay},
                    {"grad_clip", c.train.grad_clip},
                    {"seed", static_cast<int64_t>(c.train.seed)},
                    {"loss_chunk", c.train.loss_chunk},
                    {"eval_every", c.train.eval_every},
                    {"eval_tokens", c.train.eval_tokens},
                    {"grad_accum", c.train.grad_accum}};
  toml::table data{{"source", c.data.source}};
  if (c.data.source == "synthetic") {
    data.insert("task", c.data.task);
  } else {
    data.insert("path", strings(c.data.path));
    if (!c.data.val_path.empty()) data.insert("val_path", strings(c.data.val_path));
    data.insert("val_fraction", c.data.val_fraction);
    data.insert("order", c.data.order);
    data.insert("loss_mask", c.data.loss_mask);
  }
  data.insert("attention", c.data.attention);
  data.insert("eot_token", c.data.eot_token);
  toml::table remat{{"policy", c.remat.policy}, {"every", c.remat.every}};
  if (!c.remat.blocks.empty()) remat.insert("blocks", ints(c.remat.blocks));
  if (!c.remat.save.empty()) remat.insert("save", strings(c.remat.save));
  if (!c.remat.plan.empty()) remat.insert("plan", strings(c.remat.plan));
  remat.insert("tile_tokens", c.remat.tile_tokens);
  remat.insert("attention_chunk", c.remat.attention_chunk);
  remat.insert("offload", std::string(config_name(c.remat.offload)));
  if (c.remat.policy == "auto") {  // auto refuses every/blocks/plan beside it
    remat.erase("every");
    remat.erase("plan");
  }
  toml::table device{{"backend", config_name(c.device.backend)},
                     {"threads", c.device.threads},
                     {"precision", config_name(c.device.precision)}};
  if (c.device.memory_bytes) device.insert("memory", static_cast<int64_t>(c.device.memory_bytes));
  if (c.device.host_memory_bytes)
    device.insert("host_memory", static_cast<int64_t>(c.device.host_memory_bytes));
  toml::table log{{"every", c.log.every}};
  toml::table ckpt{{"every", c.checkpoint.every},
                   {"keep_last", c.checkpoint.keep_last},
                   {"on_interrupt", c.checkpoint.on_interrupt}};
  if (!c.checkpoint.dir.empty()) ckpt.insert("dir", c.checkpoint.dir);
  toml::table parallel{{"data", c.parallel.data},
                       {"context", c.parallel.context},
                       {"bucket_bytes", static_cast<int64_t>(c.parallel.bucket_bytes)},
                       {"shard_optimizer", c.parallel.shard_optimizer},
                       {"timeout", c.parallel.timeout_s}};
  toml::table root{{"model", model},     {"train", train},      {"data", data},
                   {"remat", remat},     {"device", device},    {"log", log},
                   {"checkpoint", ckpt}, {"parallel", parallel}};
  // [lora] only when it is on: off is rank = 0 and no other key (which is refused beside it).
  if (c.lora.enabled()) {
    toml::table lora{{"rank", c.lora.rank},
                     {"alpha", c.lora.alpha},
                     {"targets", strings(c.lora.targets)},
                     {"dropout", c.lora.dropout},
                     {"rslora", c.lora.rslora},
                     {"modules_to_save", strings(c.lora.modules_to_save)},
                     {"base", c.lora.base}};
    // double_quant is NF4's alone (set beside another base it is refused).
    if (c.lora.base == "nf4") lora.insert("double_quant", c.lora.double_quant);
    root.insert("lora", std::move(lora));
  }
  std::ostringstream out;
  out << root << '\n';
  return out.str();
}

std::string_view config_name(ModelKind v) {
  return enum_name(v, kModelKinds);
}
std::string_view config_name(PositionKind v) {
  return enum_name(v, kPositions);
}
std::string_view config_name(BackendKind v) {
  return enum_name(v, kBackends);
}
std::string_view config_name(Precision v) {
  return enum_name(v, kPrecisions);
}
std::string_view config_name(OffloadKind v) {
  return enum_name(v, kOffloads);
}
const std::vector<OffloadKind>& offload_kinds() {
  static const std::vector<OffloadKind> kinds = [] {
    std::vector<OffloadKind> out;
    for (const auto& [name, kind] : kOffloads) out.push_back(kind);
    return out;
  }();
  return kinds;
}
std::string offload_names(std::string_view sep) {
  std::vector<std::string_view> names;
  for (const auto& [name, kind] : kOffloads) names.push_back(name);
  return fmt::format("{}", fmt::join(names, sep));
}
std::string_view offloaded_what(OffloadKind v) {
  switch (v) {
    case OffloadKind::None:
      return "nothing";
    case OffloadKind::Checkpoints:
      return "checkpoints";
    case OffloadKind::CheckpointsOptimizer:
      return "checkpoints and AdamW moments";
    case OffloadKind::CheckpointsOptimizerWeights:
      return "checkpoints, AdamW moments, weights and gradients";
  }
  return "?";
}

void throw_config_error(const Config& c, const std::string& key, const std::string& problem,
                        const std::string& fix) {
  auto it = c.origins.find(key);
  fail({it != c.origins.end() ? it->second : c.path, key}, problem, fix);
}

}  // namespace remat

namespace remat {

namespace {

// A TOML value as a config file would spell it.
std::string toml_literal(const toml::node& n) {
  if (n.is_string()) return fmt::format("\"{}\"", *n.value<std::string>());
  if (n.is_integer()) return std::to_string(*n.value<int64_t>());
  if (n.is_floating_point()) return fmt::format("{}", *n.value<double>());
  if (n.is_boolean()) return *n.value<bool>() ? "true" : "false";
  if (const toml::array* a = n.as_array()) {
    std::vector<std::string> items;
    for (const toml::node& e : *a) items.push_back(toml_literal(e));
    return fmt::format("[{}]", fmt::join(items, ", "));
  }
  if (const toml::table* t = n.as_table()) {  // model.rope_scaling
    std::vector<std::string> items;
    for (auto&& [k, v] : *t) items.push_back(fmt::format("{} = {}", k.str(), toml_literal(v)));
    return fmt::format("{{ {} }}", fmt::join(items, ", "));
  }
  return "?";
}

// Every key config_to_toml writes, as "section.key" -> its TOML literal.
std::map<std::string, std::string> flat_keys(const Config& c) {
  std::map<std::string, std::string> out;
  for (auto&& [section, node] : toml::parse(config_to_toml(c)))
    if (const toml::table* t = node.as_table())
      for (auto&& [k, v] : *t) out[fmt::format("{}.{}", section.str(), k.str())] = toml_literal(v);
  return out;
}

// What `spec`'s reader accepts: the reader runs in describe mode (it states its type and range
// and reads nothing). The mode ends however the reader returns.
KeyAccepts describe_key(const KeySpec& spec) {
  KeyAccepts accepts;
  struct Describing {
    explicit Describing(KeyAccepts* a) { g_describe = a; }
    ~Describing() { g_describe = nullptr; }
  } describing(&accepts);
  Config scratch;
  spec.read(scratch, toml::value<int64_t>(0), Origin{"", ""});
  return accepts;
}

}  // namespace

std::vector<KeyChange> config_changes(const Config& before, const Config& after) {
  const std::map<std::string, std::string> a = flat_keys(before), b = flat_keys(after);
  std::vector<KeyChange> out;
  // Both maps' keys: a key one of them leaves out (device.memory = 0) still counts.
  std::map<std::string, int> keys;
  for (const auto& [k, v] : a) keys[k] = 0;
  for (const auto& [k, v] : b) keys[k] = 0;
  for (const auto& [key, unused] : keys) {
    const auto x = a.find(key), y = b.find(key);
    const std::string from = x != a.end() ? x->second : "(unset)";
    const std::string to = y != b.end() ? y->second : "(unset)";
    if (from == to) continue;
    const auto origin = after.origins.find(key);
    out.push_back({key, from, to, origin != after.origins.end() ? origin->second : after.path});
  }
  return out;
}

std::vector<KeyChange> refused_resume_changes(const Config& saved, const std::string& path,
                                              const std::vector<std::string>& overrides) {
  const std::map<std::string, std::string> before = flat_keys(saved);
  std::vector<KeyChange> out;
  auto consider = [&](const std::string& key, const std::string& after, const std::string& where) {
    if (changes_on_resume(key) || key == "model.from_hf") return;  // from_hf: not read on resume
    const auto it = before.find(key);
    const std::string from = it != before.end() ? it->second : "(unset)";
    if (from != after) out.push_back({key, from, after, where});
  };
  if (!path.empty() && path.rfind("hf:", 0) != 0) {
    const std::string file = resolve_config_path(path);
    for (auto&& [section, node] : parse_toml(read_config_file(file), file))
      if (const toml::table* t = node.as_table())
        for (auto&& [k, v] : *t)
          consider(fmt::format("{}.{}", section.str(), k.str()), toml_literal(v),
                   pos(file, v.source()));
  }
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    if (eq == std::string::npos) continue;
    const toml::table t = override_value(o.substr(eq + 1));
    if (t.size() != 1 || !t.contains("v")) continue;  // the override's own error says so
    consider(o.substr(0, eq), toml_literal(*t.get("v")), "--set " + o);
  }
  return out;
}

bool changes_on_resume(const std::string& key) {
  // Where and how long the run goes on, and what it keeps in memory: never what a step computes
  // from the weights and the data (the model, the seed, the batch, the optimizer's settings, the
  // data's order). Remat and the ranks change only the order of float sums, if anything.
  static const std::vector<std::string> kKeys = {"train.steps",
                                                 "train.eval_every",
                                                 "train.eval_tokens",
                                                 "train.loss_chunk",
                                                 "data.path",
                                                 "data.val_path",
                                                 "data.val_fraction",
                                                 "device.memory",
                                                 "device.host_memory",
                                                 "device.threads",
                                                 "device.backend",
                                                 "log.every",
                                                 "checkpoint.dir",
                                                 "checkpoint.every",
                                                 "checkpoint.keep_last",
                                                 "checkpoint.on_interrupt",
                                                 "model.max_position_embeddings"};
  return key.rfind("remat.", 0) == 0 || key.rfind("parallel.", 0) == 0 ||
         std::find(kKeys.begin(), kKeys.end(), key) != kKeys.end();
}

std::string config_keys_markdown() {
  // The defaults as config_to_toml writes them; a second config with file data brings out the
  // [data] keys that only file sources use, a third the Llama family's [model] keys, a fourth
  // the [lora] keys (written only when LoRA is on).
  Config defaults;
  Config with_files = defaults;
  with_files.data.source = "tokens";
  Config llama = defaults;  // and the [model] keys only the Llama family writes
  llama.model.kind = ModelKind::Llama;
  Config with_lora = defaults;  // [lora] is written when it is on: its defaults but the rank
  with_lora.lora.rank = 1;
  const toml::table plain = toml::parse(config_to_toml(defaults));
  const toml::table files = toml::parse(config_to_toml(with_files));
  const toml::table family = toml::parse(config_to_toml(llama));
  toml::table lora = toml::parse(config_to_toml(with_lora));
  lora["lora"].as_table()->insert_or_assign("rank", defaults.lora.rank);
  // double_quant is written only beside lora.base = "nf4" (config_to_toml): its default here.
  lora["lora"].as_table()->insert_or_assign("double_quant", defaults.lora.double_quant);
  std::string out = "| key | type | default | accepted | meaning |\n|---|---|---|---|---|\n";
  for (const KeySpec& spec : key_specs()) {
    const KeyAccepts accepts = describe_key(spec);
    const toml::node* d = plain.at_path(fmt::format("{}.{}", spec.section, spec.key)).node();
    if (!d) d = files.at_path(fmt::format("{}.{}", spec.section, spec.key)).node();
    if (!d) d = family.at_path(fmt::format("{}.{}", spec.section, spec.key)).node();
    if (!d) d = lora.at_path(fmt::format("{}.{}", spec.section, spec.key)).node();
    const std::string shown =
        d ? toml_literal(*d)
        : accepts.type == "strings" || accepts.type == "integers" || accepts.type == "paths" ? "[]"
        : accepts.type == "size"                                                             ? "0"
        : accepts.type == "table" ? "\"none\""  // model.rope_scaling: unwritten when off
                                  : "\"\"";
    auto cell = [](std::string s) {  // a | inside a table cell must be escaped
      std::string r;
      for (char ch : s) r += ch == '|' ? std::string("\\|") : std::string(1, ch);
      return r;
    };
    out += fmt::format("| `{}.{}` | {} | `{}` | {} | {} |\n", spec.section, spec.key, accepts.type,
                       cell(shown), cell(accepts.values), spec.meaning);
  }
  return out;
}

int64_t local_batch_size(const Config& c) {
  return c.train.batch_size / c.parallel.data_ranks();
}

BatchShare batch_share(const Config& c) {
  BatchShare s;
  s.rows = local_batch_size(c);
  s.first_row = c.parallel.data_rank() * s.rows;
  s.positions = parallel::context_positions(c.train.seq_len, static_cast<int>(c.parallel.context),
                                            c.parallel.context_rank());
  return s;
}

int64_t local_seq_len(const Config& c) {
  return parallel::context_positions(c.train.seq_len, static_cast<int>(c.parallel.context),
                                     c.parallel.context_rank())
      .tokens();
}

}  // namespace remat
