// Hugging Face folders in and out (engine/config/hf_config, engine/model_files/hf_names and
// hf_weights, `train --init hf:`, `export`, `--model hf:`; docs/hf.md).
//
// The fixtures are written here, by this file's own list of transformers' tensor names and
// shapes, never by the mapping under test, so that a wrong name or layout in
// engine/model_files/hf_names.cpp (q/k/v in another order, a Conv1D weight not transposed) shows as
// a mismatch. The goldens of tests/golden/hf/ (transformers 4.57.6 itself, scripts/hf_golden.py)
// check the numbers: one forward/backward of each imported model against transformers' loss and
// every gradient.
//
// Tolerances against the goldens (fp32 here against transformers' fp32): the loss within 1e-6
// relative, every gradient within 1e-5 of its tensor's largest entry (max |ours - theirs| <=
// 1e-5 max |theirs|). Measured at writing, grouped-query heads and llama3 RoPE included: the
// loss within 9e-8 relative, the gradients within 9.5e-7 of their largest entry (an embedding;
// GPT-2's key bias, whose gradient is rounding noise on both sides, is compared with the q and v
// biases of its tensor). Both sides sum the same ~100-term products in other orders (blocked
// GEMMs, flash attention against a full softmax), each step rounding at 6e-8, so ~1e-6 is the
// scale of disagreement; the bounds leave ~10x. A mapping bug moves numbers by O(1): q/k/v in
// another order, or a Conv1D weight not transposed, fails the import checks, the loss and the
// gradients (both were planted and caught).
#include <fmt/format.h>

#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "data/documents.h"
#include "engine/config/config.h"
#include "engine/config/hf_config.h"
#include "engine/core/error.h"
#include "engine/core/rng.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/model_files/hf_names.h"
#include "engine/model_files/hf_weights.h"
#include "engine/model_files/safetensors.h"
#include "engine/remat/executor.h"
#include "layers/decoder.h"
#include "layers/models.h"
#include "tests/cli_util.h"
#include "tests/temp_dir.h"
#include "tests/test_util.h"

namespace remat::test {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using Catch::Matchers::Contains;

const std::string kGoldenDir = std::string(REMAT_SOURCE_DIR) + "/tests/golden/hf";

// ---- Hugging Face folders as this test writes and reads them ----

struct HfTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
using HfTensors = std::map<std::string, HfTensor>;

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Values that bf16 and f16 both hold exactly (8 significant bits, none below 2^-10), so one
// fixture serves every dtype.
HfTensor random_tensor(std::vector<int64_t> shape, uint64_t seed, uint64_t stream) {
  HfTensor t{std::move(shape), {}};
  t.data.resize(static_cast<size_t>(numel(t.shape)));
  for (size_t i = 0; i < t.data.size(); ++i) {
    const float v = static_cast<float>(rng_normal(seed, stream, i) * 0.5);
    uint32_t bits = 0;
    std::memcpy(&bits, &v, 4);
    bits &= 0xffff0000u;
    std::memcpy(&t.data[i], &bits, 4);
    if (std::abs(t.data[i]) < std::ldexp(1.0f, -10)) t.data[i] = 0.0f;
  }
  return t;
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  REQUIRE(out.good());
}

// One safetensors file of `names` (all of `t` when empty), as F32, BF16 or F16.
void write_tensors(const fs::path& path, const HfTensors& t, const std::string& dtype,
                   const std::vector<std::string>& names = {}) {
  std::vector<std::string> which = names;
  if (which.empty())
    for (const auto& [name, tensor] : t) which.push_back(name);
  std::vector<safetensors::TensorInfo> infos;
  for (const std::string& n : which) infos.push_back({n, dtype, t.at(n).shape});
  safetensors::Writer w(path.string(), infos, {{"format", "pt"}});
  for (const std::string& n : which) {
    const std::vector<float>& d = t.at(n).data;
    if (dtype == "F32") {
      w.write(d.data(), d.size() * 4);
      continue;
    }
    std::vector<uint16_t> h(d.size());
    for (size_t i = 0; i < d.size(); ++i) {
      uint32_t bits = 0;
      std::memcpy(&bits, &d[i], 4);
      if (dtype == "BF16") {
        h[i] = static_cast<uint16_t>(bits >> 16);
      } else {  // F16 of a value with few enough bits and a small enough exponent: exact
        const uint32_t sign = (bits >> 16) & 0x8000u;
        const int exp = static_cast<int>((bits >> 23) & 0xff) - 127 + 15;
        const uint32_t mant = (bits >> 13) & 0x3ffu;
        h[i] = (bits & 0x7fffffffu) == 0 ? static_cast<uint16_t>(sign)
                                         : static_cast<uint16_t>(sign | (exp << 10) | mant);
      }
    }
    w.write(h.data(), h.size() * 2);
  }
  w.finish();
}

// Every tensor of a Hugging Face folder (one file, or the shards of its index), as f32.
HfTensors read_folder(const fs::path& dir) {
  std::vector<std::string> files;
  if (fs::exists(dir / "model.safetensors.index.json")) {
    std::ifstream in(dir / "model.safetensors.index.json");
    const Json index = Json::parse(in);
    std::set<std::string> unique;
    for (const auto& [name, file] : index["weight_map"].items())
      unique.insert(file.get<std::string>());
    files.assign(unique.begin(), unique.end());
  } else {
    files.push_back("model.safetensors");
  }
  HfTensors out;
  for (const std::string& f : files) {
    safetensors::Reader r((dir / f).string());
    for (const safetensors::TensorInfo& t : r.tensors()) {
      HfTensor& h = out[t.name];
      h.shape = t.shape;
      h.data.resize(static_cast<size_t>(numel(t.shape)));
      REQUIRE(safetensors::to_f32(t.dtype, r.data(t), h.data.size(), h.data.data()));
    }
  }
  return out;
}

Json read_json(const fs::path& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return Json::parse(in);
}

// ---- fixtures: transformers' names and shapes, written out here ----

struct LlamaShape {
  std::string arch = "LlamaForCausalLM";
  int64_t V = 37, C = 32, L = 2, NH = 4, KVH = 4, HS = 8, FF = 48;
  bool bias = false, qk_norm = false, tied = false;
};

// One tensor of a Hugging Face folder as this test writes it: transformers' name, its shape, and
// the parameter of ours it goes into. A Conv1D weight (GPT-2) is stored (in, out), ours (out,
// in); tensors that go into one parameter of ours (q, k and v into attn.qkv) are concatenated in
// list order.
struct HfEntry {
  std::string hf, ours;
  std::vector<int64_t> shape;
  bool conv1d = false;
};

// Appends `layer`'s entries for each of L layers: transformers' names under `hf_prefix` + "l.",
// ours under "blocks.l.".
void add_layers(std::vector<HfEntry>& entries, int64_t L, const std::string& hf_prefix,
                const std::vector<HfEntry>& layer) {
  for (int64_t l = 0; l < L; ++l)
    for (const HfEntry& e : layer)
      entries.push_back({fmt::format("{}{}.{}", hf_prefix, l, e.hf),
                         fmt::format("blocks.{}.{}", l, e.ours), e.shape, e.conv1d});
}

std::vector<HfEntry> llama_entries(const LlamaShape& s) {
  const int64_t Q = s.NH * s.HS, KV = s.KVH * s.HS;
  std::vector<HfEntry> layer = {{"input_layernorm.weight", "norm1.weight", {s.C}},
                                {"self_attn.q_proj.weight", "attn.qkv.weight", {Q, s.C}},
                                {"self_attn.k_proj.weight", "attn.qkv.weight", {KV, s.C}},
                                {"self_attn.v_proj.weight", "attn.qkv.weight", {KV, s.C}}};
  if (s.bias)
    layer.insert(layer.end(), {{"self_attn.q_proj.bias", "attn.qkv.bias", {Q}},
                               {"self_attn.k_proj.bias", "attn.qkv.bias", {KV}},
                               {"self_attn.v_proj.bias", "attn.qkv.bias", {KV}}});
  if (s.qk_norm)
    layer.insert(layer.end(), {{"self_attn.q_norm.weight", "attn.q_norm.weight", {s.HS}},
                               {"self_attn.k_norm.weight", "attn.k_norm.weight", {s.HS}}});
  layer.insert(layer.end(), {{"self_attn.o_proj.weight", "attn.proj.weight", {s.C, Q}},
                             {"post_attention_layernorm.weight", "norm2.weight", {s.C}},
                             {"mlp.gate_proj.weight", "mlp.gate.weight", {s.FF, s.C}},
                             {"mlp.up_proj.weight", "mlp.up.weight", {s.FF, s.C}},
                             {"mlp.down_proj.weight", "mlp.down.weight", {s.C, s.FF}}});
  std::vector<HfEntry> entries = {{"model.embed_tokens.weight", "wte", {s.V, s.C}}};
  add_layers(entries, s.L, "model.layers.", layer);
  entries.push_back({"model.norm.weight", "normf.weight", {s.C}});
  if (!s.tied) entries.push_back({"lm_head.weight", "lm_head.weight", {s.V, s.C}});
  return entries;
}

Json llama_config(const LlamaShape& s) {
  Json j = {{"architectures", {s.arch}},
            {"hidden_size", s.C},
            {"intermediate_size", s.FF},
            {"num_hidden_layers", s.L},
            {"num_attention_heads", s.NH},
            {"num_key_value_heads", s.KVH},
            {"head_dim", s.HS},
            {"vocab_size", s.V},
            {"hidden_act", "silu"},
            {"rms_norm_eps", 1e-5},
            {"rope_theta", 500000.0},
            {"tie_word_embeddings", s.tied},
            {"max_position_embeddings", 64},
            {"torch_dtype", "float32"}};
  if (s.arch == "Qwen3ForCausalLM") j["attention_bias"] = false;
  return j;
}

struct Gpt2Shape {
  int64_t V = 41, C = 32, L = 2, NH = 4, FF = 48, P = 24;
};

std::vector<HfEntry> gpt2_entries(const Gpt2Shape& s) {
  std::vector<HfEntry> entries = {{"transformer.wte.weight", "wte", {s.V, s.C}},
                                  {"transformer.wpe.weight", "wpe", {s.P, s.C}}};
  add_layers(entries, s.L, "transformer.h.",
             {{"ln_1.weight", "ln1.weight", {s.C}},
              {"ln_1.bias", "ln1.bias", {s.C}},
              {"attn.c_attn.weight", "attn.qkv.weight", {s.C, 3 * s.C}, true},
              {"attn.c_attn.bias", "attn.qkv.bias", {3 * s.C}},
              {"attn.c_proj.weight", "attn.proj.weight", {s.C, s.C}, true},
              {"attn.c_proj.bias", "attn.proj.bias", {s.C}},
              {"ln_2.weight", "ln2.weight", {s.C}},
              {"ln_2.bias", "ln2.bias", {s.C}},
              {"mlp.c_fc.weight", "mlp.fc.weight", {s.C, s.FF}, true},
              {"mlp.c_fc.bias", "mlp.fc.bias", {s.FF}},
              {"mlp.c_proj.weight", "mlp.proj.weight", {s.FF, s.C}, true},
              {"mlp.c_proj.bias", "mlp.proj.bias", {s.C}}});
  entries.insert(entries.end(), {{"transformer.ln_f.weight", "lnf.weight", {s.C}},
                                 {"transformer.ln_f.bias", "lnf.bias", {s.C}}});
  return entries;
}

Json gpt2_config(const Gpt2Shape& s) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"vocab_size", s.V},
          {"n_embd", s.C},
          {"n_layer", s.L},
          {"n_head", s.NH},
          {"n_inner", s.FF},
          {"n_positions", s.P},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", 1e-5},
          {"bos_token_id", 0},
          {"eos_token_id", 0}};
}

void write_folder(const fs::path& dir, const Json& config, const HfTensors& t,
                  const std::string& dtype = "F32") {
  fs::create_directories(dir);
  write_file(dir / "config.json", config.dump(2));
  write_tensors(dir / "model.safetensors", t, dtype);
}

// ---- our side ----

struct Loaded {
  Config cfg;
  std::unique_ptr<cpu::CpuBackend> be;
  std::unique_ptr<Model> model;
  std::string note;
};

Loaded load(const fs::path& dir, const std::vector<std::string>& sets = {}) {
  Loaded l;
  std::vector<std::string> all = {"train.seq_len=13", "train.batch_size=2"};
  all.insert(all.end(), sets.begin(), sets.end());
  l.cfg = load_config("hf:" + dir.string(), all);
  l.be = std::make_unique<cpu::CpuBackend>(1ull << 30, kTestThreads);
  l.model = make_model(l.cfg, *l.be);
  l.note = hf::load_weights(dir.string(), l.cfg.model, *l.be, *l.model);
  return l;
}

std::vector<float> param_values(Model& model, const std::string& name, bool grad = false) {
  for (Param& p : model.params())
    if (p.name == name) return to_host(grad ? p.grad.tensor() : p.value.tensor());
  FAIL("no parameter " << name);
  return {};
}

std::vector<float> transposed(const HfTensor& t) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  std::vector<float> out(t.data.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = t.data[r * cols + c];
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// A Hugging Face folder this test writes: its config.json, its tensors (random, seeded, in entry
// order) and our parameters as the test assembles them from the tensors by its own entries.
struct HfFolder {
  Json config;
  HfTensors tensors;
  std::map<std::string, std::vector<float>> params;
};

HfFolder make_folder(Json config, const std::vector<HfEntry>& entries, uint64_t seed) {
  HfFolder f{std::move(config), {}, {}};
  uint64_t stream = 0;
  for (const HfEntry& e : entries) {
    const HfTensor& t = f.tensors[e.hf] = random_tensor(e.shape, seed, stream++);
    const std::vector<float> ours = e.conv1d ? transposed(t) : t.data;
    std::vector<float>& p = f.params[e.ours];
    p.insert(p.end(), ours.begin(), ours.end());
  }
  return f;
}

HfFolder llama_folder(const LlamaShape& s, uint64_t seed) {
  return make_folder(llama_config(s), llama_entries(s), seed);
}

HfFolder gpt2_folder(const Gpt2Shape& s, uint64_t seed) {
  return make_folder(gpt2_config(s), gpt2_entries(s), seed);
}

void check_params(Model& model, const std::map<std::string, std::vector<float>>& want) {
  REQUIRE(model.params().size() == want.size());
  for (const auto& [name, values] : want) {
    INFO("parameter " << name);
    CHECK(same_bits(param_values(model, name), values));
  }
}

// Export through write_weights (fp32) and compare every tensor, name and bits, with `t`.
void check_export_round_trip(Loaded& l, const HfTensors& t) {
  TempDir out("hf-export");
  hf::write_weights(out.str(), l.cfg.model,
                    [&](const std::string& name) { return param_values(*l.model, name); },
                    {.bf16 = false});
  const HfTensors back = read_folder(out.path);
  REQUIRE(back.size() == t.size());
  for (const auto& [name, tensor] : t) {
    INFO("tensor " << name);
    REQUIRE(back.count(name));
    CHECK(back.at(name).shape == tensor.shape);
    CHECK(same_bits(back.at(name).data, tensor.data));
  }
}

std::string config_error(const std::string& path, const std::vector<std::string>& sets = {}) {
  try {
    load_config(path, sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string load_error(const fs::path& dir) {
  try {
    load(dir);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

// ---- config.json -> [model] ----

TEST_CASE("hf config.json: every architecture maps to its [model] keys", "[hf]") {
  TempDir tmp("hf-config");
  SECTION("Llama 3.1: GQA, llama3 RoPE scaling, untied") {
    Json j =
        llama_config({.V = 128256, .C = 4096, .L = 32, .NH = 32, .KVH = 8, .HS = 128, .FF = 14336});
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
    write_file(tmp.path / "config.json", j.dump());
    const Config c = load_config("hf:" + tmp.str());
    CHECK(c.model.kind == ModelKind::Llama);
    CHECK(c.model.position == PositionKind::Rope);
    CHECK(c.model.n_layer == 32);
    CHECK(c.model.n_head == 32);
    CHECK(c.model.n_kv_head == 8);
    CHECK(c.model.head_dim == 128);
    CHECK(c.model.n_embd == 4096);
    CHECK(c.model.d_ff == 14336);
    CHECK(c.model.vocab_size == 128256);
    CHECK(c.model.rope_theta == 500000.0);
    CHECK(c.model.norm_eps == 1e-5);
    CHECK(c.model.rope_scaling.kind == RopeScaling::Llama3);
    CHECK(c.model.rope_scaling.factor == 8.0);
    CHECK(c.model.rope_scaling.original_context == 8192);
    CHECK_FALSE(c.model.tie_embeddings);
    CHECK_FALSE(c.model.attention_bias);
    CHECK_FALSE(c.model.qk_norm);
    CHECK(c.model.from_hf == tmp.str());
    // state.json keeps the expanded keys, not the folder: a resume never needs it.
    const std::string toml = config_to_toml(c);
    CHECK(toml.find("from_hf") == std::string::npos);
    const Config again = parse_config(toml, "state.json");
    CHECK(again.model.rope_scaling == c.model.rope_scaling);
    CHECK(again.model.n_kv_head == 8);
  }
  SECTION("Qwen2: q/k/v biases always, defaults where keys are absent") {
    write_file(tmp.path / "config.json", Json{{"architectures", {"Qwen2ForCausalLM"}},
                                              {"hidden_size", 256},
                                              {"num_attention_heads", 32},
                                              {"num_hidden_layers", 2},
                                              {"intermediate_size", 96},
                                              {"vocab_size", 300},
                                              {"use_sliding_window", false},
                                              {"sliding_window", 4096},
                                              {"tie_word_embeddings", true}}
                                             .dump());
    const Config c = load_config("hf:" + tmp.str());
    CHECK(c.model.attention_bias);
    CHECK_FALSE(c.model.qk_norm);
    CHECK(c.model.n_kv_head == 32);  // Qwen2Config's default when the key is absent
    CHECK(c.model.norm_eps == 1e-6);
    CHECK(c.model.rope_theta == 10000.0);
    CHECK(c.model.tie_embeddings);
  }
  SECTION("Qwen3: q/k norms, head_dim 128 by default") {
    write_file(tmp.path / "config.json", Json{{"architectures", {"Qwen3ForCausalLM"}},
                                              {"hidden_size", 256},
                                              {"num_attention_heads", 4},
                                              {"num_key_value_heads", 2},
                                              {"num_hidden_layers", 1},
                                              {"intermediate_size", 96},
                                              {"vocab_size", 300}}
                                             .dump());
    const Config c = load_config("hf:" + tmp.str());
    CHECK(c.model.qk_norm);
    CHECK_FALSE(c.model.attention_bias);
    CHECK(c.model.head_dim == 128);
    CHECK_FALSE(c.model.tie_embeddings);
  }
  SECTION("Mistral: head_dim null, sliding window null or beyond seq_len") {
    Json j = llama_config({.arch = "MistralForCausalLM"});
    j["head_dim"] = nullptr;
    j["sliding_window"] = nullptr;
    write_file(tmp.path / "config.json", j.dump());
    Config c = load_config("hf:" + tmp.str(), {"train.seq_len=100000"});
    CHECK(c.model.head_size() == 8);
    CHECK(c.model.n_kv_head == 4);
    j["sliding_window"] = 64;
    write_file(tmp.path / "config.json", j.dump());
    c = load_config("hf:" + tmp.str(), {"train.seq_len=64"});
    CHECK(c.train.seq_len == 64);
    CHECK_THAT(config_error("hf:" + tmp.str(), {"train.seq_len=65"}),
               Contains("train.seq_len") && Contains("sliding window of 64"));
    j.erase("sliding_window");  // MistralConfig's default: 4096
    write_file(tmp.path / "config.json", j.dump());
    CHECK_THAT(config_error("hf:" + tmp.str(), {"train.seq_len=4097"}),
               Contains("sliding window of 4096"));
  }
  SECTION("transformers v5: rope_parameters, also one per layer type") {
    Json j = llama_config({});
    j.erase("rope_theta");
    j["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 250000.0},
                            {"factor", 32.0},          {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
    write_file(tmp.path / "config.json", j.dump());
    Config c = load_config("hf:" + tmp.str());
    CHECK(c.model.rope_theta == 250000.0);
    CHECK(c.model.rope_scaling.factor == 32.0);
    j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e6}}}};
    write_file(tmp.path / "config.json", j.dump());
    c = load_config("hf:" + tmp.str());
    CHECK(c.model.rope_theta == 1e6);
    CHECK(c.model.rope_scaling.kind == RopeScaling::None);
  }
  SECTION("GPT-2: learned positions, n_positions -> n_ctx, tied") {
    write_file(tmp.path / "config.json", gpt2_config({}).dump());
    const Config c = load_config("hf:" + tmp.str(), {"train.seq_len=24"});
    CHECK(c.model.kind == ModelKind::Gpt);
    CHECK(c.model.position == PositionKind::Learned);
    CHECK(c.model.n_ctx == 24);
    CHECK(c.model.d_ff == 48);
    CHECK(c.model.vocab_size == 41);
    CHECK(c.model.dropout == 0.0);
    CHECK_THAT(config_error("hf:" + tmp.str(), {"train.seq_len=25"}),
               Contains("train.seq_len") && Contains("n_ctx = 24"));
    // Without a length (fit, sweep and eval --model hf:DIR), its own, not the default 256.
    CHECK(load_config("hf:" + tmp.str()).train.seq_len == 24);
  }
}

TEST_CASE("hf config.json: what is not computed here is refused, naming the key", "[hf]") {
  TempDir tmp("hf-refuse");
  auto error_with = [&](const std::function<void(Json&)>& change,
                        const LlamaShape& s = LlamaShape{}) {
    Json j = llama_config(s);
    change(j);
    write_file(tmp.path / "config.json", j.dump());
    return config_error("hf:" + tmp.str());
  };
  CHECK_THAT(error_with([](Json& j) { j["architectures"] = {"GemmaForCausalLM"}; }),
             Contains("config.json: [hf] architectures = [\"GemmaForCausalLM\"]") &&
                 Contains("LlamaForCausalLM"));
  // transformers builds the model of model_type (AutoConfig), not of architectures: a
  // disagreement names both.
  for (const char* type : {"gpt2", "foo"})
    CHECK_THAT(error_with([&](Json& j) { j["model_type"] = type; }),
               Contains(fmt::format("model_type = \"{}\"", type)) &&
                   Contains("architectures = [\"LlamaForCausalLM\"]"));
  CHECK_THAT(error_with([](Json& j) { j["model_type"] = "llama"; }), Contains("(no error)"));
  // RoPE scaling: a type not computed here is named with the supported ones, in either spelling.
  for (const char* type : {"longrope", "ntk"})
    CHECK_THAT(error_with([&](Json& j) {
                 j["rope_scaling"] = {{"rope_type", type}, {"factor", 4.0}};
               }),
               Contains(fmt::format("rope_scaling.rope_type = \"{}\"", type)) &&
                   Contains("linear, dynamic, yarn, llama3"));
  CHECK_THAT(error_with([](Json& j) {
               j["rope_scaling"] = {{"type", "longrope"}, {"factor", 4.0}};
             }),
             Contains("rope_scaling.type = \"longrope\""));
  CHECK_THAT(error_with([](Json& j) {
               j["rope_parameters"] = {{"rope_type", "longrope"}, {"factor", 2.0}};
             }),
             Contains("rope_parameters.rope_type = \"longrope\""));
  // Two descriptions of one RoPE that disagree: transformers' versions read different ones, so
  // the model would depend on the version that loads it. Agreeing ones load.
  CHECK_THAT(error_with([](Json& j) {
               j["rope_scaling"] = {{"type", "linear"}, {"rope_type", "yarn"}, {"factor", 4.0}};
             }),
             Contains("rope_scaling.type = \"linear\": type and rope_type \"yarn\" disagree"));
  CHECK_THAT(error_with([](Json& j) {
               j["rope_scaling"] = {{"type", "linear"}, {"rope_type", "linear"}, {"factor", 4.0}};
             }),
             Contains("(no error)"));
  CHECK_THAT(error_with([](Json& j) {
               j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 4.0}};
               j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
             }),
             Contains("[hf] rope_scaling = {") &&
                 Contains("differs from rope_parameters beside it ({ rope_type = \"linear\", "
                          "factor = 4.0 })"));
  CHECK_THAT(error_with([](Json& j) {
               j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 4.0}};
               j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
             }),
             Contains("(no error)"));
  CHECK_THAT(error_with([](Json& j) {
               j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 20000.0}};
               j["rope_theta"] = 10000.0;
             }),
             Contains("rope_parameters.rope_theta = 20000.0: differs from rope_theta = 10000"));
  CHECK_THAT(error_with([](Json& j) {
               j["rope_scaling"] = {{"factor", 4.0}};
             }),
             Contains("rope_scaling = {\"factor\":4.0}: has no rope_type (nor type)"));
  // yarn without a factor; a key its type does not take; one no type has.
  CHECK_THAT(error_with([](Json& j) {
               j["rope_scaling"] = {{"rope_type", "yarn"}, {"beta_fast", 16.0}};
             }),
             Contains("[hf] rope_scaling = {") && Contains("rope_type \"yarn\" needs factor"));
  CHECK_THAT(error_with([](Json& j) {
               j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"beta_fast", 16.0}};
             }),
             Contains("rope_scaling.beta_fast = 16.0") &&
                 Contains("does not apply to rope_type \"linear\""));
  CHECK_THAT(error_with([](Json& j) {
               j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2.0}, {"alpha", 1.0}};
             }),
             Contains("rope_scaling.alpha = 1.0") && Contains("unknown key 'alpha'"));
  CHECK_THAT(error_with([](Json& j) { j["hidden_act"] = "gelu"; }),
             Contains("hidden_act = \"gelu\""));
  CHECK_THAT(error_with([](Json& j) { j["mlp_bias"] = true; }), Contains("mlp_bias = true"));
  CHECK_THAT(error_with([](Json& j) { j["attention_bias"] = true; }),
             Contains("attention_bias = true") && Contains("o_proj"));
  CHECK_THAT(error_with([](Json& j) { j["attention_bias"] = true; }, {.arch = "Qwen3ForCausalLM"}),
             Contains("attention_bias = true"));
  CHECK_THAT(error_with([](Json& j) { j["partial_rotary_factor"] = 0.5; }),
             Contains("partial_rotary_factor = 0.5"));
  CHECK_THAT(error_with([](Json& j) {
               j["architectures"] = {"Qwen2ForCausalLM"};
               j["use_sliding_window"] = true;
               j["sliding_window"] = 8;
               j["max_window_layers"] = 1;
             }),
             Contains("train.seq_len") && Contains("sliding window of 8"));
  CHECK_THAT(error_with([](Json& j) {
               j["quantization_config"] = {{"bits", 4}};
             }),
             Contains("quantization_config") && Contains("lora.base = \"nf4\" quantizes at load"));
  // GPT-2's fixed choices.
  Json g = gpt2_config({});
  g["activation_function"] = "relu";
  write_file(tmp.path / "config.json", g.dump());
  CHECK_THAT(config_error("hf:" + tmp.str()), Contains("activation_function = \"relu\""));
  g = gpt2_config({});
  g["tie_word_embeddings"] = false;
  write_file(tmp.path / "config.json", g.dump());
  CHECK_THAT(config_error("hf:" + tmp.str()), Contains("tie_word_embeddings = false"));
  // AutoGPTQ's older layout: quantize_config.json beside a config.json without quantization_config.
  write_file(tmp.path / "config.json", gpt2_config({}).dump());
  write_file(tmp.path / "quantize_config.json", R"({"bits": 4, "group_size": 128})");
  CHECK_THAT(config_error("hf:" + tmp.str()),
             Contains("quantize_config.json (AutoGPTQ's)") && Contains("use the unquantized"));
  fs::remove(tmp.path / "quantize_config.json");
  // The [model] table is the folder's: another key beside from_hf names itself (vocab_size, a
  // padded vocabulary, is the one exception).
  write_file(tmp.path / "config.json", llama_config({}).dump());
  write_file(tmp.path / "run.toml",
             fmt::format("[model]\nfrom_hf = \"{}\"\nn_layer = 3\n", tmp.str()));
  CHECK_THAT(config_error(tmp / "run.toml"),
             Contains("run.toml:3:11: [config] model.n_layer: set beside model.from_hf"));
  write_file(tmp.path / "run.toml", fmt::format("[model]\nfrom_hf = \"{}\"\n", tmp.str()));
  CHECK(load_config(tmp / "run.toml", {"model.vocab_size=64"}).model.vocab_size == 64);
  // Its RoPE scaling and trained length may be set beside it: extending a model's context is
  // training (or scoring) its weights under another scaling. The rest stays the folder's.
  const Config yarn =
      load_config("hf:" + tmp.str(), {"model.rope_scaling={ rope_type = \"yarn\", factor = 4.0, "
                                      "original_max_position_embeddings = 64 }",
                                      "model.max_position_embeddings=256"});
  CHECK(yarn.model.rope_scaling.kind == RopeScaling::Yarn);
  CHECK(yarn.model.rope_scaling.factor == 4.0);
  CHECK(yarn.model.max_position_embeddings == 256);
  CHECK(yarn.model.n_layer == load_config("hf:" + tmp.str()).model.n_layer);
  CHECK_THAT(config_error("hf:" + tmp.str() + "/missing"), Contains("no such folder"));
}

// ---- weights in and out ----

// `f` written to `dir` and imported: every parameter as the test assembles it; exported back bit
// for bit.
void check_import_export(const fs::path& dir, const HfFolder& f) {
  write_folder(dir, f.config, f.tensors);
  Loaded l = load(dir);
  check_params(*l.model, f.params);
  check_export_round_trip(l, f.tensors);
}

TEST_CASE("hf weights: each architecture imports by name and exports back bit for bit", "[hf]") {
  TempDir tmp("hf-weights");
  SECTION("Llama, untied") {
    check_import_export(tmp.path, llama_folder({}, 1));
  }
  SECTION("Qwen2: q/k/v biases, tied, GQA") {
    check_import_export(
        tmp.path,
        llama_folder({.arch = "Qwen2ForCausalLM", .KVH = 2, .bias = true, .tied = true}, 2));
  }
  SECTION("Qwen3: q/k norms, head_dim apart from n_embd / n_head") {
    check_import_export(
        tmp.path,
        llama_folder({.arch = "Qwen3ForCausalLM", .KVH = 2, .HS = 12, .qk_norm = true}, 3));
  }
  SECTION("Mistral") {
    check_import_export(tmp.path, llama_folder({.arch = "MistralForCausalLM", .KVH = 1}, 4));
  }
  SECTION("GPT-2: Conv1D weights transposed in, transposed back out") {
    check_import_export(tmp.path, gpt2_folder({}, 5));
  }
  SECTION("GPT-2 saved from the bare GPT2Model (no transformer. prefix), with old buffers") {
    const Gpt2Shape s{};
    const HfFolder f = gpt2_folder(s, 6);
    HfTensors bare;
    for (const auto& [name, tensor] : f.tensors)
      bare[name.substr(std::string("transformer.").size())] = tensor;
    bare["h.0.attn.bias"] = random_tensor({1, 1, s.P, s.P}, 6, 99);
    bare["h.0.attn.masked_bias"] = random_tensor({1}, 6, 98);
    write_folder(tmp.path, f.config, bare);
    Loaded l = load(tmp.path);
    check_params(*l.model, f.params);
    CHECK_THAT(l.note, Contains("2 buffers skipped"));
  }
}

TEST_CASE("hf weights: BF16 and F16 convert exactly, shards load as one file", "[hf]") {
  TempDir tmp("hf-dtypes");
  const HfFolder f = llama_folder({.arch = "Qwen2ForCausalLM", .KVH = 2, .bias = true}, 7);
  const HfTensors& t = f.tensors;
  for (const char* dtype : {"BF16", "F16"}) {
    INFO(dtype);
    const fs::path dir = tmp.path / dtype;
    write_folder(dir, f.config, t, dtype);
    Loaded l = load(dir);
    check_params(*l.model, f.params);
    CHECK_THAT(l.note, Contains(fmt::format("({} -> f32)", dtype)));
  }
  // f16 specials and subnormals, and bf16 -> f32 -> bf16 rounding to nearest even.
  const uint16_t f16[] = {0x0001, 0x03ff, 0x8400, 0x7c00, 0xfc00, 0x3c00};
  float f32[6];
  REQUIRE(safetensors::to_f32("F16", reinterpret_cast<const std::byte*>(f16), 6, f32));
  CHECK(f32[0] == std::ldexp(1.0f, -24));
  CHECK(f32[1] == std::ldexp(1023.0f, -24));
  CHECK(f32[2] == -std::ldexp(1.0f, -14));
  CHECK(std::isinf(f32[3]));
  CHECK(f32[4] < 0);
  CHECK(f32[5] == 1.0f);
  CHECK(safetensors::f32_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);  // tie: to even
  CHECK(safetensors::f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);

  const fs::path sharded = tmp.path / "sharded";
  fs::create_directories(sharded);
  write_file(sharded / "config.json", f.config.dump());
  std::vector<std::string> first, second;
  Json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", Json::object()}};
  for (const auto& [name, tensor] : t) {
    (name.find("layers.1.") == std::string::npos ? first : second).push_back(name);
    index["weight_map"][name] = name.find("layers.1.") == std::string::npos
                                    ? "model-00001-of-00002.safetensors"
                                    : "model-00002-of-00002.safetensors";
  }
  write_tensors(sharded / "model-00001-of-00002.safetensors", t, "BF16", first);
  write_tensors(sharded / "model-00002-of-00002.safetensors", t, "F32", second);
  write_file(sharded / "model.safetensors.index.json", index.dump());
  Loaded l = load(sharded);
  check_params(*l.model, f.params);
  CHECK_THAT(l.note, Contains("from 2 files (BF16, F32 -> f32)"));
  // Exported in shards too: every parameter whole in one shard, the index naming each tensor.
  TempDir out("hf-shards");
  const std::vector<std::string> files = hf::write_weights(
      out.str(), l.cfg.model, [&](const std::string& n) { return param_values(*l.model, n); },
      {.bf16 = false, .shard_bytes = 20000});
  CHECK(files.size() > 2);
  CHECK(files.back() == "model.safetensors.index.json");
  const HfTensors back = read_folder(out.path);
  REQUIRE(back.size() == t.size());
  for (const auto& [name, tensor] : t) CHECK(same_bits(back.at(name).data, tensor.data));
}

TEST_CASE("hf weights: a vocabulary padded or stripped by model.vocab_size", "[hf]") {
  TempDir tmp("hf-vocab");
  const LlamaShape s{};  // V = 37, untied: the embedding and the head both change
  const HfFolder folder = llama_folder(s, 8);
  const HfTensors& t = folder.tensors;
  write_folder(tmp.path, folder.config, t);
  const int64_t C = s.C;
  Loaded padded = load(tmp.path, {"model.vocab_size=64"});
  CHECK_THAT(padded.note, Contains("vocabulary rows 37..63 added as zeros"));
  for (const char* name : {"wte", "lm_head.weight"}) {
    const std::vector<float> w = param_values(*padded.model, name);
    const std::vector<float>& f =
        t.at(name == std::string("wte") ? "model.embed_tokens.weight" : "lm_head.weight").data;
    CHECK(std::equal(f.begin(), f.end(), w.begin()));
    CHECK(std::all_of(w.begin() + 37 * C, w.end(), [](float v) { return v == 0.0f; }));
  }
  Loaded stripped = load(tmp.path, {"model.vocab_size=32"});
  CHECK_THAT(stripped.note, Contains("vocabulary rows 32..36 of the file dropped"));
  const std::vector<float>& emb = t.at("model.embed_tokens.weight").data;
  CHECK(same_bits(param_values(*stripped.model, "wte"),
                  std::vector<float>(emb.begin(), emb.begin() + 32 * C)));
}

TEST_CASE("hf weights: a missing, left-over or mis-shaped tensor is refused by name", "[hf]") {
  TempDir tmp("hf-bad");
  const HfFolder good = llama_folder({.KVH = 2}, 9);
  auto error_with = [&](const std::function<void(HfTensors&)>& change) {
    HfTensors t = good.tensors;
    change(t);
    write_folder(tmp.path, good.config, t);
    return load_error(tmp.path);
  };
  CHECK_THAT(error_with([](HfTensors& t) { t.erase("model.layers.1.self_attn.k_proj.weight"); }),
             Contains("no tensor 'model.layers.1.self_attn.k_proj.weight'") &&
                 Contains("blocks.1.attn.qkv.weight"));
  CHECK_THAT(error_with([](HfTensors& t) {
               t["model.layers.0.mlp.extra.weight"] = t["model.norm.weight"];
             }),
             Contains("model.safetensors: tensor 'model.layers.0.mlp.extra.weight' is not part"));
  CHECK_THAT(error_with([](HfTensors& t) {
               t["model.layers.0.self_attn.q_proj.weight"] = random_tensor({32, 16}, 1, 1);
             }),
             Contains("tensor 'model.layers.0.self_attn.q_proj.weight' has shape [32, 16]") &&
                 Contains("[32, 32]"));
  // A tied head stored anyway must equal the embedding.
  const HfFolder tied = llama_folder({.tied = true}, 10);
  HfTensors t = tied.tensors;
  t["lm_head.weight"] = t["model.embed_tokens.weight"];
  write_folder(tmp.path, tied.config, t);
  CHECK_THAT(load(tmp.path).note, Contains("lm_head.weight equals the embedding"));
  t["lm_head.weight"].data[5] += 1;
  write_folder(tmp.path, tied.config, t);
  CHECK_THAT(load_error(tmp.path),
             Contains("lm_head.weight differs from model.embed_tokens.weight"));
  fs::remove(tmp.path / "model.safetensors");
  CHECK_THAT(load_error(tmp.path), Contains("neither model.safetensors nor"));
}

TEST_CASE("hf weights: a NaN or an infinity is refused at import, naming the file and tensor",
          "[hf]") {
  TempDir tmp("hf-nan");
  const LlamaShape s{};
  for (const char* dtype : {"F32", "BF16"}) {
    for (const float bad : {std::nanf(""), -INFINITY}) {
      INFO(dtype << " " << bad);
      HfTensors t = llama_folder(s, 16).tensors;
      t["model.layers.1.mlp.up_proj.weight"].data[7] = bad;
      write_folder(tmp.path, llama_config(s), t, dtype);
      CHECK_THAT(load_error(tmp.path),
                 Contains("model.safetensors: tensor 'model.layers.1.mlp.up_proj.weight'") &&
                     Contains(std::isnan(bad) ? "NaN" : "-inf") && Contains("element 7"));
    }
  }
}

TEST_CASE("hf weights: a value beyond bf16's range is refused where the frozen base is bf16",
          "[hf][lora]") {
  // 3.4e38 is finite in f32 and rounds to inf in bf16: a bf16 base would hold an infinity and
  // the run would "diverge at step 1" with learning-rate fixes. An fp32 base keeps it.
  TempDir tmp("hf-bf16-range");
  const LlamaShape s{};
  HfTensors t = llama_folder(s, 16).tensors;
  t["model.layers.1.mlp.up_proj.weight"].data[5] = -3.4e38f;
  write_folder(tmp.path, llama_config(s), t);
  const auto error = [&](const std::string& base, const std::string& more = "lora.rank=4") {
    try {
      load(tmp.path, {"lora.rank=4", "lora.base=\"" + base + "\"", more});
    } catch (const CheckpointError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  CHECK_THAT(error("bf16"), Contains("tensor 'model.layers.1.mlp.up_proj.weight' holds -3.4e+38 "
                                     "at element 5, beyond bf16's range") &&
                                Contains("Fix: set lora.base = \"fp32\""));
  CHECK(error("fp32") == "(no error)");
  // An f32 absmax per block of 64 holds it (nested 8-bit absmaxes would not: its group of 256
  // blocks would decode as garbage, as bitsandbytes' would).
  CHECK(error("nf4", "lora.double_quant=false") == "(no error)");
  // The largest value that rounds to bf16's largest finite one loads.
  t["model.layers.1.mlp.up_proj.weight"].data[5] = std::bit_cast<float>(0x7f7f7fffu);
  write_folder(tmp.path, llama_config(s), t);
  CHECK(error("bf16") == "(no error)");
}

TEST_CASE("hf weights: model.safetensors beside an index is what loads, as in transformers",
          "[hf]") {
  // transformers 4.57's from_pretrained looks for model.safetensors before
  // model.safetensors.index.json: the single file is the model, and the index is not read.
  TempDir tmp("hf-both");
  const LlamaShape s{};
  const HfFolder f = llama_folder(s, 17);
  const HfTensors& t = f.tensors;
  write_folder(tmp.path, f.config, t);
  Json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", Json::object()}};
  for (const auto& [name, tensor] : t)
    index["weight_map"][name] = "model-00001-of-00001.safetensors";
  write_file(tmp.path / "model.safetensors.index.json", index.dump());  // its shard is missing
  Loaded l = load(tmp.path);
  check_params(*l.model, f.params);
  CHECK_THAT(l.note, Contains("model.safetensors.index.json beside it not read"));
}

TEST_CASE("hf export: config.json names the architecture transformers builds", "[hf]") {
  ModelConfig m;
  m.kind = ModelKind::Llama;
  m.position = PositionKind::Rope;
  m.n_head = 4;
  m.n_kv_head = 2;
  m.n_embd = 32;
  CHECK(hf::architecture_of(m) == "LlamaForCausalLM");
  m.attention_bias = true;
  CHECK(hf::architecture_of(m) == "Qwen2ForCausalLM");
  m.qk_norm = true;
  CHECK_THROWS_WITH(hf::architecture_of(m), Contains("o_proj"));
  m.attention_bias = false;
  CHECK(hf::architecture_of(m) == "Qwen3ForCausalLM");
  const nlohmann::ordered_json j = hf::config_json(m, 128, "bfloat16", nullptr);
  CHECK(j["head_dim"] == 8);
  CHECK(j["num_key_value_heads"] == 2);
  CHECK(j["max_position_embeddings"] == 128);
  CHECK(j["torch_dtype"] == "bfloat16");
  m.kind = ModelKind::Gpt;
  CHECK_THROWS_WITH(hf::architecture_of(m), Contains("RoPE"));
  m.position = PositionKind::Learned;
  CHECK(hf::architecture_of(m) == "GPT2LMHeadModel");
}

// ---- the binary: --init hf:, export, --model hf: ----

TEST_CASE("hf CLI: --init hf: then export gives the folder back, bit for bit", "[hf]") {
  TempDir tmp("hf-cli");
  struct Case {
    std::string name;
    HfFolder folder;
  };
  std::vector<Case> cases;
  cases.push_back({"llama", llama_folder({}, 11)});
  cases.back().folder.config["rope_scaling"] = {{"rope_type", "llama3"},
                                                {"factor", 8.0},
                                                {"low_freq_factor", 1.0},
                                                {"high_freq_factor", 4.0},
                                                {"original_max_position_embeddings", 16}};
  cases.push_back(
      {"qwen2", llama_folder({.arch = "Qwen2ForCausalLM", .bias = true, .tied = true}, 12)});
  cases.push_back(
      {"qwen3", llama_folder({.arch = "Qwen3ForCausalLM", .HS = 12, .qk_norm = true}, 13)});
  cases.push_back({"gpt2", gpt2_folder({}, 14)});
  for (const Case& c : cases) {
    INFO(c.name);
    const fs::path src = tmp.path / c.name;
    write_folder(src, c.folder.config, c.folder.tensors);
    write_file(src / "tokenizer.json", "{}");
    // lr = 0: the step changes nothing, so the checkpoint holds the imported weights.
    CliResult r = run_binary(fmt::format("train --init hf:{} --set train.lr=0 --steps 1 --set "
                                         "checkpoint.dir={} --set train.seq_len=16 --set "
                                         "train.batch_size=1",
                                         src.string(), (tmp.path / (c.name + "-run")).string()),
                             true);
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Contains("weights from hf:"));
    const fs::path out = tmp.path / (c.name + "-out");
    r = run_binary(fmt::format("export --checkpoint {} --hf {} --dtype fp32",
                               (tmp.path / (c.name + "-run")).string(), out.string()),
                   true);
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Contains("copied tokenizer.json from"));
    const HfTensors back = read_folder(out);
    REQUIRE(back.size() == c.folder.tensors.size());
    for (const auto& [name, tensor] : c.folder.tensors) {
      INFO(name);
      REQUIRE(back.count(name));
      CHECK(same_bits(back.at(name).data, tensor.data));
    }
    // The exported config.json maps to the same [model] as the original.
    const Config a = load_config("hf:" + src.string(), {"train.seq_len=16"});
    const Config b = load_config("hf:" + out.string(), {"train.seq_len=16"});
    CHECK(config_to_toml(a) == config_to_toml(b));
    CHECK(fs::exists(out / "tokenizer.json"));
    // Never over a folder that holds anything.
    r = run_binary(fmt::format("export --checkpoint {} --hf {}",
                               (tmp.path / (c.name + "-run")).string(), out.string()),
                   true);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains("a folder that is not empty") && Contains("never overwrites"));
    // Nor over a file, named as one.
    r = run_binary(fmt::format("export --checkpoint {} --hf {}",
                               (tmp.path / (c.name + "-run")).string(),
                               (out / "config.json").string()),
                   true);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains("config.json: exists and is a file") && Contains("never overwrites"));
  }
}

TEST_CASE("hf CLI: plan and fit read config.json alone, and errors exit 2", "[hf]") {
  TempDir tmp("hf-plan");
  Json j =
      llama_config({.V = 128256, .C = 4096, .L = 32, .NH = 32, .KVH = 8, .HS = 128, .FF = 14336});
  write_file(tmp.path / "config.json", j.dump());
  CliResult r = run_binary(fmt::format("fit --model hf:{} --gpu h200", tmp.str()), true);
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("longest"));
  r = run_binary(fmt::format("plan --model hf:{} --gpu h200 --seq-len 4k", tmp.str()), true);
  INFO(r.out);
  CHECK(r.code == 0);
  j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}};
  write_file(tmp.path / "config.json", j.dump());
  r = run_binary(fmt::format("plan --model hf:{}", tmp.str()), true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("rope_scaling.rope_type = \"longrope\"") &&
                        Contains("use one of linear, dynamic, yarn, llama3"));
  r = run_binary(fmt::format("plan --model {}", tmp.str()), true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("expected hf:DIR"));
  // A tensor missing from the folder: exit 2, the tensor and the folder named.
  const HfFolder f = llama_folder({}, 15);
  HfTensors t = f.tensors;
  t.erase("model.norm.weight");
  write_folder(tmp.path, f.config, t);
  r = run_binary(fmt::format("train --init hf:{} --steps 1", tmp.str()), true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("no tensor 'model.norm.weight'"));
  // --init hf: with a config that names another model.
  write_file(tmp.path / "run.toml", "[model]\nkind = \"llama\"\n");
  r = run_binary(
      fmt::format("train --config {} --init hf:{} --steps 1", tmp / "run.toml", tmp.str()), true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("model.kind: set beside model.from_hf"));
}

// ---- against transformers: the goldens of tests/golden/hf ----

namespace {

// A float tensor of a golden file (any float dtype, as f32).
std::vector<float> golden_f32(const safetensors::Reader& golden, const std::string& n) {
  const safetensors::TensorInfo* t = golden.find(n);
  REQUIRE(t != nullptr);
  std::vector<float> v(static_cast<size_t>(numel(t->shape)));
  REQUIRE(safetensors::to_f32(t->dtype, golden.data(*t), v.size(), v.data()));
  return v;
}

// Every gradient of `l` against the golden's, each within 1e-5 of its tensor's largest entry;
// returns how many were compared (a tied head's is the embedding's).
size_t check_gradients(Loaded& l, const safetensors::Reader& golden) {
  size_t compared = 0;
  hf::for_each_tensor(
      l.cfg.model, [&](const std::string& n) { return param_values(*l.model, n, true); },
      [&](const hf::Piece& pc, const std::vector<float>& ours) {
        const std::vector<float> theirs = golden_f32(golden, pc.name);
        REQUIRE(ours.size() == theirs.size());
        double max_abs = 0, max_diff = 0;
        for (size_t i = 0; i < ours.size(); ++i) {
          max_abs = std::max(max_abs, std::abs(static_cast<double>(theirs[i])));
          max_diff = std::max(max_diff, std::abs(static_cast<double>(ours[i]) - theirs[i]));
        }
        INFO(pc.name << ": max |diff| " << max_diff << " of max |grad| " << max_abs);
        CHECK(max_diff <= 1e-5 * max_abs);
        ++compared;
      });
  return compared;
}

// The golden `name` of tests/golden/hf: imported, exported back bit for bit, its logits through
// the decoder, and one forward/backward of its recorded tokens against transformers' loss and
// every gradient.
void check_golden(const std::string& name) {
  const fs::path dir = fs::path(kGoldenDir) / name;
  const Json meta = read_json(dir / "golden.json");
  safetensors::Reader golden((dir / "golden.safetensors").string());
  auto golden_tensor = [&](const std::string& n) { return golden_f32(golden, n); };
  const int64_t B = meta["B"], T = meta["T"];
  Loaded l = load(dir, {fmt::format("train.seq_len={}", T), fmt::format("train.batch_size={}", B)});
  check_export_round_trip(l, read_folder(dir));
  if (golden.find("rope_inv_freq")) {  // the RoPE the imported config computes is transformers'
    RopeScaling scaling = l.cfg.model.rope_scaling;
    scaling.seq_len = T;  // dynamic NTK: transformers' module holds the run's frequencies
    const RopeAngles ours = rope_angles(l.cfg.model.head_size(), l.cfg.model.rope_theta, scaling);
    const std::vector<float> theirs = golden_tensor("rope_inv_freq");
    REQUIRE(ours.inv_freq.size() == theirs.size());
    double worst = 0;
    for (size_t i = 0; i < theirs.size(); ++i)
      worst = std::max(worst, std::abs(ours.inv_freq[i] - theirs[i]) / theirs[i]);
    INFO(
        fmt::format("{}: inverse frequencies within {:.3g} (relative) of transformers' float32 "
                    "ones",
                    name, worst));
    CHECK(worst <= 1e-6);
    const double factor =
        golden.find("rope_attention_factor") ? golden_tensor("rope_attention_factor")[0] : 1.0;
    INFO(
        fmt::format("attention factor {} against transformers' {}", ours.attention_factor, factor));
    CHECK(std::abs(ours.attention_factor - factor) <= 1e-7 * factor);
  }

  Buffer inputs = make_tensor(*l.be, {B, T}, DType::I32);
  Buffer targets = make_tensor(*l.be, {B, T}, DType::I32);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i) {
      const Json& row = meta["tokens"][static_cast<size_t>(b)];
      inputs.tensor().i32()[b * T + i] = row[static_cast<size_t>(i)].get<int32_t>();
      targets.tensor().i32()[b * T + i] = row[static_cast<size_t>(i + 1)].get<int32_t>();
    }
  // Logits: the imported weights in the KV-cached decoder `sample` runs, token by token, against
  // transformers' logits of the same positions (the loss below checks the training forward).
  auto decoder = make_decoder(
      l.cfg.model,
      [&](const std::string& n, std::vector<int64_t>* shape) {
        for (Param& p : l.model->params())
          if (p.name == n) {
            const Tensor t = p.value.tensor();
            shape->clear();
            for (int d = 0; d < t.ndim(); ++d) shape->push_back(t.dim(d));
          }
        return param_values(*l.model, n);
      },
      T);
  const std::vector<float> want_logits = golden_tensor("logits");
  const int64_t V = decoder->vocab_size();
  double worst_logit = 0, largest_logit = 0;
  for (int64_t b = 0; b < B; ++b) {
    decoder->reset();
    for (int64_t i = 0; i < T; ++i) {
      const std::vector<float> got = decoder->forward(inputs.tensor().i32()[b * T + i]);
      for (int64_t v = 0; v < V; ++v) {
        const double w = want_logits[static_cast<size_t>((b * T + i) * V + v)];
        largest_logit = std::max(largest_logit, std::abs(w));
        worst_logit = std::max(worst_logit, std::abs(got[static_cast<size_t>(v)] - w));
      }
    }
  }
  INFO(fmt::format("{}: logits within {:.3g} of transformers' (largest |logit| {:.3g})", name,
                   worst_logit, largest_logit));
  // Measured (transformers 4.57.6, this CPU): within 8.7e-7 (mistral) to 2.2e-6 (qwen3) of logits
  // up to 3.6; fp32 sums in another order.
  CHECK(worst_logit <= 1e-5 * std::max(1.0, largest_logit));

  for (Param& p : l.model->params()) l.be->fill(p.grad.tensor(), 0.0f);
  const Batch batch{std::move(inputs), std::move(targets), B * T};
  const StepLoss loss =
      forward_backward(*l.be, *l.model, resolve_remat_plan(l.cfg, *l.model), batch);
  const double want_loss = meta["loss"];
  INFO(fmt::format("{}: loss {:.9g} against {:.9g}", name, loss.mean, want_loss));
  CHECK(std::abs(loss.mean - want_loss) <= 1e-6 * std::abs(want_loss));

  // Every gradient transformers recorded was compared (a tied head's is the embedding's).
  CHECK(check_gradients(l, golden) == meta["gradients"].size());
}

// An I64 tensor of a golden file.
std::vector<int64_t> golden_i64(const safetensors::Reader& golden, const std::string& n) {
  const safetensors::TensorInfo* t = golden.find(n);
  REQUIRE(t != nullptr);
  REQUIRE(t->dtype == "I64");
  std::vector<int64_t> v(static_cast<size_t>(numel(t->shape)));
  std::memcpy(v.data(), golden.data(*t), v.size() * sizeof(int64_t));
  return v;
}

// The documents golden of `name` (scripts/hf_golden.py --documents): rows of packed documents,
// which transformers ran with a block-diagonal 4-D mask and positions restarting per document;
// here with the document starts as the batch carries them and untrained targets marked. The loss
// over the trained targets and every gradient.
void check_documents_golden(const std::string& name) {
  const fs::path dir = fs::path(kGoldenDir) / name;
  const Json meta = read_json(dir / "documents.json");
  safetensors::Reader golden((dir / "documents.safetensors").string());
  const int64_t B = meta["B"], T = meta["T"], trained = meta["trained_targets"];
  Loaded l = load(dir, {fmt::format("train.seq_len={}", T), fmt::format("train.batch_size={}", B),
                        "data.attention=\"document\"",
                        fmt::format("data.eot_token={}", meta["eot_token"].get<int64_t>())});
  const std::vector<int64_t> tokens = golden_i64(golden, "tokens"),
                             targets = golden_i64(golden, "targets"),
                             starts = golden_i64(golden, "doc_start");
  std::vector<int32_t> in, tg, ds;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i) {
      in.push_back(static_cast<int32_t>(tokens[static_cast<size_t>(b * (T + 1) + i)]));
      const int64_t t = targets[static_cast<size_t>(b * T + i)];
      tg.push_back(t < 0 ? kIgnoredTarget : static_cast<int32_t>(t));
      ds.push_back(static_cast<int32_t>(starts[static_cast<size_t>(b * T + i)]));
    }
  // The same starts as the data sources mark them (data/documents.h), from the tokens alone.
  std::vector<int32_t> marked_targets(static_cast<size_t>(T)), marked_starts(marked_targets.size());
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int32_t> row(tokens.begin() + b * (T + 1), tokens.begin() + (b + 1) * (T + 1));
    mark_row(row.data(), nullptr, T, meta["eot_token"].get<int64_t>(), marked_targets.data(),
             marked_starts.data());
    CHECK(std::equal(marked_targets.begin(), marked_targets.end(), tg.begin() + b * T));
    CHECK(std::equal(marked_starts.begin(), marked_starts.end(), ds.begin() + b * T));
  }
  for (Param& p : l.model->params()) l.be->fill(p.grad.tensor(), 0.0f);
  Batch batch{make_i32(*l.be, {B, T}, in), make_i32(*l.be, {B, T}, tg), B * T};
  batch.doc_start = make_i32(*l.be, {B, T}, ds);
  batch.trained_targets = batch.step_targets = trained;
  const StepLoss loss =
      forward_backward(*l.be, *l.model, resolve_remat_plan(l.cfg, *l.model), batch);
  const double want_loss = meta["loss"];
  INFO(fmt::format("{} documents: loss {:.9g} against transformers' {:.9g}", name, loss.mean,
                   want_loss));
  CHECK(std::abs(loss.mean - want_loss) <= 1e-6 * std::abs(want_loss));
  // Per position: the untrained ones are exactly 0, the others transformers' cross-entropy.
  const std::vector<float> logits = golden_f32(golden, "logits");
  const int64_t V = static_cast<int64_t>(logits.size()) / (B * T);
  for (int64_t r = 0; r < B * T; ++r) {
    const float got = loss.row_losses[static_cast<size_t>(r)];
    if (tg[static_cast<size_t>(r)] == kIgnoredTarget) {
      CHECK(got == 0.0f);
      continue;
    }
    double mx = -1e30, sum = 0;
    for (int64_t v = 0; v < V; ++v)
      mx = std::max(mx, double(logits[static_cast<size_t>(r * V + v)]));
    for (int64_t v = 0; v < V; ++v) sum += std::exp(logits[static_cast<size_t>(r * V + v)] - mx);
    const double want =
        mx + std::log(sum) - logits[static_cast<size_t>(r * V + tg[static_cast<size_t>(r)])];
    CHECK(std::abs(got - want) <= 1e-5 * std::max(1.0, want));
  }
  CHECK(check_gradients(l, golden) == meta["gradients"].size());
}

}  // namespace

TEST_CASE("hf golden: transformers' loss and every gradient, GPT-2", "[hf][golden]") {
  check_golden("gpt2");
}
TEST_CASE("hf golden: transformers' loss and every gradient, Llama (sharded, llama3 RoPE)",
          "[hf][golden]") {
  check_golden("llama");
}
TEST_CASE("hf golden: transformers' loss and every gradient, Llama tied (MQA)", "[hf][golden]") {
  check_golden("llama-tied");
}
TEST_CASE("hf golden: transformers' loss and every gradient, Qwen2", "[hf][golden]") {
  check_golden("qwen2");
}
TEST_CASE("hf golden: transformers' loss and every gradient, Qwen3", "[hf][golden]") {
  check_golden("qwen3");
}
TEST_CASE("hf golden: transformers' loss and every gradient, Mistral", "[hf][golden]") {
  check_golden("mistral");
}
TEST_CASE("hf golden: packed documents against transformers' block-diagonal mask, GPT-2",
          "[hf][golden][documents]") {
  check_documents_golden("gpt2");
}
TEST_CASE("hf golden: packed documents against transformers' block-diagonal mask, Llama",
          "[hf][golden][documents]") {
  check_documents_golden("llama");
}
TEST_CASE("hf golden: packed documents against transformers' block-diagonal mask, Qwen3",
          "[hf][golden][documents]") {
  check_documents_golden("qwen3");
}
// One small Llama per RoPE scaling type, at T = 40 past the original context of 16: the
// frequencies, yarn's attention factor, the decoder's logits, the loss and every gradient.
TEST_CASE("hf golden: transformers' RoPE scaling, linear", "[hf][golden][rope]") {
  check_golden("rope-linear");
}
TEST_CASE("hf golden: transformers' RoPE scaling, dynamic NTK", "[hf][golden][rope]") {
  check_golden("rope-dynamic");
}
TEST_CASE("hf golden: transformers' RoPE scaling, yarn", "[hf][golden][rope]") {
  check_golden("rope-yarn");
}
TEST_CASE("hf golden: transformers' RoPE scaling, yarn with mscale and every key",
          "[hf][golden][rope]") {
  check_golden("rope-yarn-mscale");
}

}  // namespace remat::test
