#include "engine/config/hf_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <type_traits>
#include <variant>

#include "engine/config/rope_scaling.h"
#include "engine/core/error.h"
#include "engine/core/regular_file.h"

namespace remat::hf {
namespace {

using Json = nlohmann::json;

enum class Family : uint8_t { Llama, Mistral, Qwen2, Qwen3, Gpt2 };

struct Architecture {
  const char* name;
  const char* model_type;
  Family family;
};

const std::vector<Architecture> kArchitectures = {
    {"LlamaForCausalLM", "llama", Family::Llama},
    {"MistralForCausalLM", "mistral", Family::Mistral},
    {"Qwen2ForCausalLM", "qwen2", Family::Qwen2},
    {"Qwen3ForCausalLM", "qwen3", Family::Qwen3},
    {"GPT2LMHeadModel", "gpt2", Family::Gpt2},
};

// transformers' defaults for a key a config.json leaves out (the configuration classes'
// __init__ arguments, transformers 4.57): what the Python side would build from the same file.
struct Defaults {
  int64_t vocab, hidden, intermediate, layers, heads;
  int64_t kv_heads;  // 0: num_attention_heads
  int64_t head_dim;  // 0: hidden_size / num_attention_heads
  bool tie;
  int64_t max_positions;  // max_position_embeddings (the class default; 0: none)
};

Defaults defaults_of(Family f) {
  switch (f) {
    case Family::Llama:
      return {32000, 4096, 11008, 32, 32, 0, 0, false, 2048};
    case Family::Mistral:
      return {32000, 4096, 14336, 32, 32, 8, 0, false, 4096 * 32};
    case Family::Qwen2:
      return {151936, 4096, 22016, 32, 32, 32, 0, false, 32768};
    case Family::Qwen3:
      return {151936, 4096, 22016, 32, 32, 32, 128, false, 32768};
    case Family::Gpt2:
      return {50257, 768, 0, 12, 12, 0, 0, true, 0};  // PretrainedConfig ties by default
  }
  return {};
}

constexpr const char* kFixDocs = "docs/hf.md lists what remat-train imports";

// Reads keys of one config.json; every refusal names the file, the key and its value.
class ConfigFile {
 public:
  ConfigFile(std::string path, Json root) : path_(std::move(path)), root_(std::move(root)) {}
  const Json& root() const { return root_; }
  const std::string& path() const { return path_; }

  [[noreturn]] void refuse(const std::string& key, const Json* value, const std::string& problem,
                           const std::string& fix) const {
    throw ConfigError(fmt::format("{}: [hf] {} = {}: {}. Fix: {}", path_, key,
                                  value ? value->dump() : std::string("(absent)"), problem, fix));
  }

  /// The value of `key` in `obj`, or nullptr when it is absent or null (transformers reads both
  /// as "use the default").
  static const Json* get(const Json& obj, const std::string& key) {
    const auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }

  int64_t integer(const Json& obj, const std::string& key, int64_t fallback, int64_t lo, int64_t hi,
                  const std::string& shown = "") const {
    const Json* v = get(obj, key);
    if (!v) return fallback;
    const std::string name = shown.empty() ? key : shown;
    if (!v->is_number_integer()) refuse(name, v, "expected an integer", "correct config.json");
    const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX}
                          ? INT64_MAX
                          : v->get<int64_t>();
    if (x < lo || x > hi)
      refuse(name, v, fmt::format("out of range {}..{}", lo, hi), "correct config.json");
    return x;
  }

  double number(const Json& obj, const std::string& key, double fallback,
                const std::string& shown = "") const {
    const Json* v = get(obj, key);
    if (!v) return fallback;
    if (!v->is_number())
      refuse(shown.empty() ? key : shown, v, "expected a number", "correct config.json");
    return v->get<double>();
  }

  bool boolean(const Json& obj, const std::string& key, bool fallback) const {
    const Json* v = get(obj, key);
    if (!v) return fallback;
    if (!v->is_boolean()) refuse(key, v, "expected true or false", "correct config.json");
    return v->get<bool>();
  }

  std::string string(const Json& obj, const std::string& key, const std::string& fallback,
                     const std::string& shown = "") const {
    const Json* v = get(obj, key);
    if (!v) return fallback;
    if (!v->is_string())
      refuse(shown.empty() ? key : shown, v, "expected a string", "correct config.json");
    return v->get<std::string>();
  }

 private:
  std::string path_;
  Json root_;
};

// A folder saved quantised (bitsandbytes' load_in_4bit, GPTQ, AWQ, ...) holds packed integer
// tensors and their states, not weights: refused for every run, and QLoRA is named because it is
// what such a folder is usually for. lora.base = "nf4" quantises at load, from the unquantised
// weights, as transformers' load_in_4bit does.
void refuse_quantized(const ConfigFile& f, const Json& j) {
  constexpr const char* kWhy =
      "quantized weights are not imported, for LoRA on them either (lora.base = \"nf4\" "
      "quantizes at load, from the unquantized weights)";
  constexpr const char* kFix = "use the unquantized checkpoint (bf16, fp16 or fp32)";
  if (const Json* q = ConfigFile::get(j, "quantization_config"))
    f.refuse("quantization_config", q, kWhy, kFix);
  // AutoGPTQ's older layout says so in a file of its own beside config.json.
  namespace fs = std::filesystem;
  const fs::path gptq = fs::path(f.path()).parent_path() / "quantize_config.json";
  std::error_code ec;
  if (fs::exists(gptq, ec))
    throw ConfigError(fmt::format("{}: [hf] the folder holds {} (AutoGPTQ's): {}. Fix: {}",
                                  f.path(), gptq.filename().string(), kWhy, kFix));
}

constexpr size_t kMaxConfigJsonBytes = 16u << 20;

ConfigFile open_config(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string path = (fs::path(dir) / "config.json").string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw ConfigError(fmt::format(
        "{}: [hf] {}. Fix: give a Hugging Face model folder (the one holding config.json and "
        "model.safetensors){}",
        dir, fs::exists(dir, ec) ? "a file, not a folder" : "no such folder",
        fs::path(dir).filename() == "config.json"
            ? fmt::format(": {}", fs::path(dir).parent_path().string())
            : std::string()));
  RegularFile file = RegularFile::open_read(path);
  if (file.problem() == RegularFile::Problem::Missing)
    throw ConfigError(fmt::format(
        "{}: [hf] no config.json in the folder. Fix: give a Hugging Face model folder (the one "
        "holding config.json)",
        dir));
  if (!file.ok())
    throw ConfigError(
        fmt::format("{}: [hf] {}. Fix: give the folder's config.json", path, file.problem_text()));
  std::string text;
  if (const int err = file.read_all(text, kMaxConfigJsonBytes); err == EFBIG)
    throw ConfigError(fmt::format(
        "{}: [hf] larger than 16 MiB: not a model's config.json. Fix: check the folder", path));
  else if (err != 0)
    throw ConfigError(fmt::format("{}: [hf] cannot read the file ({}). Fix: check its permissions",
                                  path, std::strerror(err)));
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::exception& e) {
    throw ConfigError(
        fmt::format("{}: [hf] not valid JSON ({}). Fix: correct config.json", path, e.what()));
  }
  if (!root.is_object())
    throw ConfigError(fmt::format("{}: [hf] not a JSON object. Fix: correct config.json", path));
  return ConfigFile(path, std::move(root));
}

std::string supported_names() {
  std::string out;
  for (const Architecture& a : kArchitectures)
    out += (out.empty() ? "" : ", ") + std::string(a.name);
  return out;
}

const Architecture& find_architecture(const ConfigFile& f) {
  const Json& j = f.root();
  if (const Json* archs = ConfigFile::get(j, "architectures")) {
    if (!archs->is_array() || archs->size() != 1 || !(*archs)[0].is_string())
      f.refuse("architectures", archs, "expected a list of one architecture name",
               "remat-train imports one of " + supported_names());
    const std::string name = (*archs)[0].get<std::string>();
    const auto a = std::find_if(kArchitectures.begin(), kArchitectures.end(),
                                [&](const Architecture& x) { return name == x.name; });
    if (a == kArchitectures.end())
      f.refuse("architectures", archs, "not an architecture remat-train computes",
               "use a checkpoint of " + supported_names() + " (" + kFixDocs + ")");
    // transformers builds the configuration, and from it the model, of model_type (AutoConfig);
    // architectures only records what was saved. A folder whose two disagree is not one model.
    const Json* type = ConfigFile::get(j, "model_type");
    if (type && (!type->is_string() || type->get<std::string>() != a->model_type))
      f.refuse("model_type", type,
               fmt::format("disagrees with architectures = {} (whose model_type is \"{}\"; "
                           "transformers builds the model model_type names)",
                           archs->dump(), a->model_type),
               "correct whichever of the two is wrong in config.json");
    return *a;
  }
  // A config.json without "architectures" (saved from a bare configuration): model_type decides.
  const std::string type = f.string(j, "model_type", "");
  for (const Architecture& a : kArchitectures)
    if (type == a.model_type) return a;
  f.refuse("model_type", ConfigFile::get(j, "model_type"),
           "no \"architectures\" and not a model type remat-train computes",
           "use a checkpoint of " + supported_names() + " (" + kFixDocs + ")");
}

// A float as TOML reads it back: always with a '.' or an exponent, shortest round trip.
std::string toml_float(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

struct Rope {
  double theta = 10000.0;
  std::string scaling_toml;  // "" = none, else an inline table
};

// One RoPE description: the rope_scaling dict (rope_theta beside it) of transformers 4.x, or one
// entry of v5's rope_parameters (theta inside it), as a TOML inline table ("" for none). `where`
// is how messages name the dict. The original context a type needs and the dict leaves out is
// config.json's max_position_embeddings, as transformers 4.57 takes it (for dynamic always: it
// reads no other).
std::string read_scaling(const ConfigFile& f, const Json& s, const std::string& where,
                         int64_t default_max_positions) {
  const std::string type_key = s.contains("rope_type") ? "rope_type" : "type";
  const std::string type = f.string(s, type_key, "default", where + "." + type_key);
  // Keys without a type: transformers fails to build the rotary embedding (no function for None).
  const auto items = s.items();
  if (!ConfigFile::get(s, "rope_type") && !ConfigFile::get(s, "type") &&
      std::any_of(items.begin(), items.end(), [](const auto& kv) {
        return kv.key() != "rope_theta" && kv.key() != "partial_rotary_factor" &&
               !kv.value().is_null();
      }))
    f.refuse(where, &s, "has no rope_type (nor type)",
             "add \"rope_type\": \"linear\", \"dynamic\", \"yarn\" or \"llama3\", as the model "
             "was trained with (docs/context-extension.md)");
  // Both spellings, disagreeing: transformers 4.57 takes "type", a newer one "rope_type".
  if (ConfigFile::get(s, "rope_type") && ConfigFile::get(s, "type") &&
      f.string(s, "type", "", where + ".type") != type)
    f.refuse(where + ".type", ConfigFile::get(s, "type"),
             fmt::format("type and rope_type \"{}\" disagree (transformers' versions read "
                         "different ones)",
                         type),
             "keep one of them in config.json");
  if (const Json* p = ConfigFile::get(s, "partial_rotary_factor"))
    if (!p->is_number() || p->get<double>() != 1.0)
      f.refuse(where + ".partial_rotary_factor", p,
               "partial rotary embeddings are not supported (every head dimension is rotated)",
               kFixDocs);
  std::vector<RopeKey> keys;
  for (const auto& [key, v] : s.items()) {
    // transformers v5 keeps theta and the rotary fraction in the same dict; null is "unset".
    if (key == "rope_type" || key == "type" || key == "rope_theta" ||
        key == "partial_rotary_factor" || v.is_null())
      continue;
    RopeKey k{key, std::monostate{}, v.is_number_integer(), v.dump()};
    if (v.is_number()) k.value = v.get<double>();
    if (v.is_boolean()) k.value = v.get<bool>();
    keys.push_back(std::move(k));
  }
  const Json& root = f.root();
  const bool has_original = std::any_of(keys.begin(), keys.end(), [](const RopeKey& k) {
    return k.name == "original_max_position_embeddings";
  });
  if (type == "dynamic" || (type == "yarn" && !has_original)) {
    std::erase_if(keys,
                  [](const RopeKey& k) { return k.name == "original_max_position_embeddings"; });
    // Absent, the configuration class's default (LlamaConfig's 2048), as transformers takes it.
    const int64_t max_pos =
        f.integer(root, "max_position_embeddings", default_max_positions, 1, INT64_MAX);
    keys.push_back({"original_max_position_embeddings", static_cast<double>(max_pos), true,
                    std::to_string(max_pos)});
  }
  RopeScaling scaling;
  try {
    scaling = parse_rope_scaling(type, keys);
  } catch (const RopeScalingProblem& e) {
    const std::string key =
        e.key.empty() ? where : where + "." + (e.key == "rope_type" ? type_key : e.key);
    const Json* value =
        e.key.empty() ? &s : ConfigFile::get(s, e.key == "rope_type" ? type_key : e.key);
    f.refuse(key, value, e.what(), e.fix + " (docs/context-extension.md)");
  }
  std::string toml;
  for (const auto& [key, value] : rope_scaling_entries(scaling)) {
    const std::string v = std::visit(
        [](const auto& x) -> std::string {
          using X = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<X, double>) return toml_float(x);
          if constexpr (std::is_same_v<X, std::string>) return "\"" + x + "\"";
          if constexpr (std::is_same_v<X, bool>) return x ? "true" : "false";
          if constexpr (std::is_same_v<X, int64_t>) return std::to_string(x);
        },
        value);
    toml += fmt::format("{}{} = {}", toml.empty() ? "{ " : ", ", key, v);
  }
  return toml.empty() ? toml : toml + " }";
}

Rope read_rope(const ConfigFile& f, int64_t default_max_positions) {
  const Json& j = f.root();
  Rope r;
  if (const Json* p = ConfigFile::get(j, "partial_rotary_factor"))
    if (!p->is_number() || p->get<double>() != 1.0)
      f.refuse("partial_rotary_factor", p,
               "partial rotary embeddings are not supported (every head dimension is rotated)",
               kFixDocs);
  r.theta = f.number(j, "rope_theta", 10000.0);
  if (const Json* params = ConfigFile::get(j, "rope_parameters")) {
    // transformers v5: {"rope_type": ..., "rope_theta": ...}, or one such dict per layer type
    // ({"full_attention": {...}, "sliding_attention": {...}}), which must then agree.
    if (!params->is_object())
      f.refuse("rope_parameters", params, "expected a JSON object", "correct config.json");
    const Json* one = params;
    std::string where = "rope_parameters";
    const bool per_layer_type =
        !params->empty() &&
        std::all_of(params->begin(), params->end(), [](const Json& v) { return v.is_object(); });
    if (per_layer_type) {
      for (const auto& [type, v] : params->items())
        if (v != params->begin().value())
          f.refuse("rope_parameters", params,
                   fmt::format("layer types \"{}\" and \"{}\" rotate differently, and every "
                               "layer here uses one RoPE",
                               params->begin().key(), type),
                   kFixDocs);
      one = &params->begin().value();
      where += "." + params->begin().key();
    }
    const double top_theta = r.theta;
    r.theta = f.number(*one, "rope_theta", r.theta, where + ".rope_theta");
    r.scaling_toml = read_scaling(f, *one, where, default_max_positions);
    // transformers 4.57 reads rope_theta and rope_scaling, v5 rope_parameters: beside each
    // other they must describe one RoPE, or the model depends on the version that loads it.
    if (ConfigFile::get(j, "rope_theta") && r.theta != top_theta)
      f.refuse(where + ".rope_theta", ConfigFile::get(*one, "rope_theta"),
               fmt::format("differs from rope_theta = {} beside it", top_theta),
               "keep one of them in config.json");
    if (const Json* s = ConfigFile::get(j, "rope_scaling"))
      if (!s->is_object() ||
          read_scaling(f, *s, "rope_scaling", default_max_positions) != r.scaling_toml)
        f.refuse("rope_scaling", s,
                 fmt::format("differs from {} beside it ({})", where,
                             r.scaling_toml.empty() ? "no scaling" : r.scaling_toml),
                 "keep one of them in config.json");
  } else if (const Json* s = ConfigFile::get(j, "rope_scaling")) {
    if (!s->is_object())
      f.refuse("rope_scaling", s, "expected a JSON object or null", "correct config.json");
    r.scaling_toml = read_scaling(f, *s, "rope_scaling", default_max_positions);
  }
  if (!(r.theta >= 1.0 && r.theta <= 1e12))
    f.refuse("rope_theta", ConfigFile::get(j, "rope_theta"), "out of range 1..1e12",
             "correct config.json");
  return r;
}

// The sliding window transformers would apply to some layer of this checkpoint, or 0.
int64_t sliding_window(const ConfigFile& f, Family family, int64_t n_layer, std::string* key) {
  const Json& j = f.root();
  *key = "sliding_window";
  if (family == Family::Mistral)  // every layer, unless null; MistralConfig's default is 4096
    return f.integer(j, "sliding_window", j.contains("sliding_window") ? 0 : 4096, 1, INT64_MAX);
  if (family != Family::Qwen2 && family != Family::Qwen3) return 0;
  // Qwen2Config keeps sliding_window only with use_sliding_window, and applies it to the layers
  // that layer_types marks (by default those from max_window_layers on).
  if (!f.boolean(j, "use_sliding_window", false)) return 0;
  const int64_t window =
      f.integer(j, "sliding_window", j.contains("sliding_window") ? 0 : 4096, 1, INT64_MAX);
  if (window == 0) return 0;
  bool any_sliding = false;
  if (const Json* types = ConfigFile::get(j, "layer_types")) {
    if (!types->is_array())
      f.refuse("layer_types", types, "expected a list of layer types", "correct config.json");
    for (const Json& t : *types) {
      if (!t.is_string() || (t != "full_attention" && t != "sliding_attention"))
        f.refuse("layer_types", types,
                 fmt::format("layer type {} is not computed here (full_attention and "
                             "sliding_attention are)",
                             t.dump()),
                 kFixDocs);
      any_sliding = any_sliding || t == "sliding_attention";
    }
  } else {
    any_sliding = f.integer(j, "max_window_layers", 28, 0, INT64_MAX) < n_layer;
  }
  return any_sliding ? window : 0;
}

ModelKeys llama_family(const ConfigFile& f, const Architecture& arch) {
  const Json& j = f.root();
  const Defaults d = defaults_of(arch.family);
  const int64_t C = f.integer(j, "hidden_size", d.hidden, 1, 1 << 20);
  const int64_t NH = f.integer(j, "num_attention_heads", d.heads, 1, 4096);
  const int64_t L = f.integer(j, "num_hidden_layers", d.layers, 1, 4096);
  // Absent takes the class default; null means "as many as the query heads" (the classes' BC).
  int64_t KVH = NH;
  if (!j.contains("num_key_value_heads") && d.kv_heads > 0) KVH = d.kv_heads;
  KVH = f.integer(j, "num_key_value_heads", KVH, 1, 4096);
  int64_t HS = j.contains("head_dim") || d.head_dim == 0 ? 0 : d.head_dim;
  HS = f.integer(j, "head_dim", HS, 1, 4096);
  if (HS == 0) {
    if (C % NH != 0)
      f.refuse("hidden_size", ConfigFile::get(j, "hidden_size"),
               fmt::format("not divisible by num_attention_heads = {}, and no head_dim", NH),
               "correct config.json");
    HS = C / NH;
  }
  const std::string act = f.string(j, "hidden_act", "silu");
  if (act != "silu")
    f.refuse("hidden_act", ConfigFile::get(j, "hidden_act"),
             "the Llama family's MLP here is SwiGLU with SiLU", kFixDocs);
  if (arch.family == Family::Llama && f.boolean(j, "mlp_bias", false))
    f.refuse("mlp_bias", ConfigFile::get(j, "mlp_bias"),
             "the MLP's gate, up and down projections have no biases here", kFixDocs);
  // Llama's and Qwen3's attention_bias puts a bias on o_proj as well as on q, k and v; our block
  // has q/k/v biases only (Qwen2's layout). Mistral's modeling code ignores the key.
  if ((arch.family == Family::Llama || arch.family == Family::Qwen3) &&
      f.boolean(j, "attention_bias", false))
    f.refuse("attention_bias", ConfigFile::get(j, "attention_bias"),
             fmt::format("{} then has an o_proj bias, which the attention here does not have "
                         "(q/k/v biases only, as Qwen2)",
                         arch.name),
             kFixDocs);
  refuse_quantized(f, j);
  const Rope rope = read_rope(f, d.max_positions);
  const double eps = f.number(j, "rms_norm_eps", 1e-6);

  ModelKeys k;
  k.architecture = arch.name;
  k.attention_window = sliding_window(f, arch.family, L, &k.window_key);
  k.toml = fmt::format(
      "kind = \"llama\"\nposition = \"rope\"\nn_layer = {}\nn_head = {}\nn_kv_head = {}\n"
      "head_dim = {}\nn_embd = {}\nd_ff = {}\nvocab_size = {}\nrope_theta = {}\nnorm_eps = {}\n"
      "attention_bias = {}\nqk_norm = {}\ntie_embeddings = {}\n",
      L, NH, KVH, HS, C, f.integer(j, "intermediate_size", d.intermediate, 1, 1 << 22),
      f.integer(j, "vocab_size", d.vocab, 2, 1 << 24), toml_float(rope.theta), toml_float(eps),
      arch.family == Family::Qwen2, arch.family == Family::Qwen3,
      f.boolean(j, "tie_word_embeddings", d.tie));
  if (!rope.scaling_toml.empty()) k.toml += "rope_scaling = " + rope.scaling_toml + "\n";
  // The context the checkpoint was trained for: train warns past it without rope_scaling.
  if (const int64_t n = f.integer(j, "max_position_embeddings", d.max_positions, 0, INT64_MAX);
      n > 0)
    k.toml += fmt::format("max_position_embeddings = {}\n", n);
  return k;
}

ModelKeys gpt2(const ConfigFile& f, const Architecture& arch) {
  const Json& j = f.root();
  const Defaults d = defaults_of(Family::Gpt2);
  const int64_t C = f.integer(j, "n_embd", d.hidden, 1, 1 << 20);
  const std::string act = f.string(j, "activation_function", "gelu_new");
  if (act != "gelu_new")
    f.refuse("activation_function", ConfigFile::get(j, "activation_function"),
             "the GPT block's GELU is the tanh approximation (gelu_new)", kFixDocs);
  const double eps = f.number(j, "layer_norm_epsilon", 1e-5);
  if (std::abs(eps - 1e-5) > 1e-12)
    f.refuse("layer_norm_epsilon", ConfigFile::get(j, "layer_norm_epsilon"),
             "the GPT block's LayerNorm uses epsilon 1e-5", kFixDocs);
  if (!f.boolean(j, "scale_attn_weights", true))
    f.refuse("scale_attn_weights", ConfigFile::get(j, "scale_attn_weights"),
             "attention scores here are always scaled by 1/sqrt(head size)", kFixDocs);
  if (f.boolean(j, "scale_attn_by_inverse_layer_idx", false))
    f.refuse("scale_attn_by_inverse_layer_idx",
             ConfigFile::get(j, "scale_attn_by_inverse_layer_idx"),
             "attention scores here are not scaled by layer", kFixDocs);
  if (f.boolean(j, "add_cross_attention", false))
    f.refuse("add_cross_attention", ConfigFile::get(j, "add_cross_attention"),
             "the GPT block has no cross-attention", kFixDocs);
  if (!f.boolean(j, "tie_word_embeddings", d.tie))
    f.refuse("tie_word_embeddings", ConfigFile::get(j, "tie_word_embeddings"),
             "the GPT's LM head is always its token embedding", kFixDocs);
  refuse_quantized(f, j);
  ModelKeys k;
  k.architecture = arch.name;
  k.toml = fmt::format(
      "kind = \"gpt\"\nposition = \"learned\"\nn_layer = {}\nn_head = {}\nn_embd = {}\n"
      "d_ff = {}\nvocab_size = {}\nn_ctx = {}\n",
      f.integer(j, "n_layer", d.layers, 1, 4096), f.integer(j, "n_head", d.heads, 1, 4096), C,
      f.integer(j, "n_inner", 4 * C, 1, 1 << 22), f.integer(j, "vocab_size", d.vocab, 2, 1 << 24),
      f.integer(j, "n_positions", 1024, 1, int64_t{1} << 32));
  return k;
}

}  // namespace

ModelKeys read_model_keys(const std::string& dir) {
  const ConfigFile f = open_config(dir);
  const Architecture& arch = find_architecture(f);
  return arch.family == Family::Gpt2 ? gpt2(f, arch) : llama_family(f, arch);
}

std::string architecture_of(const ModelConfig& m) {
  if (m.kind == ModelKind::Gpt) {
    if (m.position != PositionKind::Learned)
      throw ConfigError(
          "[hf] a GPT with RoPE has no transformers architecture (GPT2LMHeadModel learns its "
          "positions). Fix: export a model trained with model.position = \"learned\", or a "
          "model.kind = \"llama\" one");
    return "GPT2LMHeadModel";
  }
  if (m.kind != ModelKind::Llama)
    throw ConfigError(
        "[hf] the MLP model has no transformers architecture. Fix: export a gpt or llama model");
  if (m.qk_norm && m.attention_bias)
    throw ConfigError(
        "[hf] q/k norms together with q/k/v biases have no transformers architecture "
        "(Qwen3ForCausalLM's attention_bias also puts a bias on o_proj). Fix: export a model "
        "with one of model.qk_norm and model.attention_bias");
  if (m.qk_norm) return "Qwen3ForCausalLM";
  if (m.attention_bias) return "Qwen2ForCausalLM";
  return "LlamaForCausalLM";
}

nlohmann::ordered_json config_json(const ModelConfig& m, int64_t seq_len,
                                   const std::string& torch_dtype, const nlohmann::json* source) {
  const std::string arch = architecture_of(m);
  using OJson = nlohmann::ordered_json;
  OJson j;
  j["architectures"] = {arch};
  auto from_source = [&](const char* key, OJson fallback) -> OJson {
    if (source && source->contains(key) && !(*source)[key].is_null()) return (*source)[key];
    return fallback;
  };
  if (arch == "GPT2LMHeadModel") {
    j["model_type"] = "gpt2";
    j["vocab_size"] = m.vocab_size;
    j["n_positions"] = m.n_ctx;
    j["n_embd"] = m.n_embd;
    j["n_layer"] = m.n_layer;
    j["n_head"] = m.n_head;
    j["n_inner"] = m.ff() == 4 * m.n_embd ? OJson(nullptr) : OJson(m.ff());
    j["activation_function"] = "gelu_new";
    // Our one dropout is transformers' resid_pdrop (after attention and after the MLP).
    j["resid_pdrop"] = m.dropout;
    j["embd_pdrop"] = 0.0;
    j["attn_pdrop"] = 0.0;
    j["layer_norm_epsilon"] = 1e-5;
    j["initializer_range"] = 0.02;
    j["scale_attn_weights"] = true;
    j["tie_word_embeddings"] = true;
  } else {
    j["model_type"] = arch == "Qwen3ForCausalLM"   ? "qwen3"
                      : arch == "Qwen2ForCausalLM" ? "qwen2"
                                                   : "llama";
    j["vocab_size"] = m.vocab_size;
    j["hidden_size"] = m.n_embd;
    j["intermediate_size"] = m.ff();
    j["num_hidden_layers"] = m.n_layer;
    j["num_attention_heads"] = m.n_head;
    j["num_key_value_heads"] = m.kv_heads();
    j["head_dim"] = m.head_size();
    j["hidden_act"] = "silu";
    // Dynamic NTK grows its base past max_position_embeddings (transformers 4.57 reads no other
    // key for it): that is the length the model was configured with.
    j["max_position_embeddings"] =
        m.rope_scaling.kind == RopeScaling::Dynamic
            ? OJson(m.rope_scaling.original_context)
            : from_source("max_position_embeddings",
                          m.max_position_embeddings > 0 ? m.max_position_embeddings : seq_len);
    j["rms_norm_eps"] = m.norm_eps;
    j["rope_theta"] = m.rope_theta;
    j["rope_scaling"] = nullptr;
    for (const auto& [key, value] : rope_scaling_entries(m.rope_scaling))
      std::visit([&, &key = key](const auto& v) { j["rope_scaling"][key] = v; }, value);
    if (arch != "Qwen2ForCausalLM") j["attention_bias"] = false;  // Qwen2's are always on
    if (arch == "LlamaForCausalLM") j["mlp_bias"] = false;
    if (arch != "LlamaForCausalLM") {  // Qwen: full attention in every layer
      j["use_sliding_window"] = false;
      j["sliding_window"] = nullptr;
      j["max_window_layers"] = m.n_layer;
    }
    j["attention_dropout"] = 0.0;
    j["initializer_range"] = 0.02;
    j["tie_word_embeddings"] = m.tie_embeddings;
  }
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"})
    if (source && source->contains(key)) j[key] = (*source)[key];
  // transformers 4.56+ write "dtype"; older releases read only "torch_dtype".
  j["dtype"] = torch_dtype;
  j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  return j;
}

}  // namespace remat::hf
