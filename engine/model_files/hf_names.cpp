#include "engine/model_files/hf_names.h"

namespace remat::hf {
namespace {

bool starts_with(const std::string& s, const std::string& p) {
  return s.compare(0, p.size(), p) == 0;
}
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

}  // namespace

std::vector<Mapping> mappings(const ModelConfig& m, const std::string& prefix) {
  std::vector<Mapping> out;
  const int64_t C = m.n_embd, V = m.vocab_size, FF = m.ff();
  auto copy = [&](const std::string& ours, std::vector<int64_t> shape, const std::string& theirs,
                  bool vocab = false) {
    out.push_back({ours, shape, false, vocab, {{theirs, shape, 0}}});
  };
  if (m.kind == ModelKind::Gpt) {
    // Conv1D keeps (in, out): the one tensor of a transposed mapping is ours with dims swapped.
    auto conv = [&](const std::string& ours, int64_t rows, int64_t cols,
                    const std::string& theirs) {
      out.push_back({ours, {rows, cols}, true, false, {{theirs, {cols, rows}, 0}}});
    };
    copy("wte", {V, C}, prefix + "wte.weight", true);
    copy("wpe", {m.n_ctx, C}, prefix + "wpe.weight");
    for (int64_t l = 0; l < m.n_layer; ++l) {
      const std::string o = fmt::format("blocks.{}.", l);
      const std::string t = fmt::format("{}h.{}.", prefix, l);
      copy(o + "ln1.weight", {C}, t + "ln_1.weight");
      copy(o + "ln1.bias", {C}, t + "ln_1.bias");
      conv(o + "attn.qkv.weight", 3 * C, C, t + "attn.c_attn.weight");
      copy(o + "attn.qkv.bias", {3 * C}, t + "attn.c_attn.bias");
      conv(o + "attn.proj.weight", C, C, t + "attn.c_proj.weight");
      copy(o + "attn.proj.bias", {C}, t + "attn.c_proj.bias");
      copy(o + "ln2.weight", {C}, t + "ln_2.weight");
      copy(o + "ln2.bias", {C}, t + "ln_2.bias");
      conv(o + "mlp.fc.weight", FF, C, t + "mlp.c_fc.weight");
      copy(o + "mlp.fc.bias", {FF}, t + "mlp.c_fc.bias");
      conv(o + "mlp.proj.weight", C, FF, t + "mlp.c_proj.weight");
      copy(o + "mlp.proj.bias", {C}, t + "mlp.c_proj.bias");
    }
    copy("lnf.weight", {C}, prefix + "ln_f.weight");
    copy("lnf.bias", {C}, prefix + "ln_f.bias");
    return out;
  }
  const int64_t NH = m.n_head, KVH = m.kv_heads(), HS = m.head_size();
  const int64_t Q = NH * HS, KV = KVH * HS;
  copy("wte", {V, C}, prefix + "embed_tokens.weight", true);
  for (int64_t l = 0; l < m.n_layer; ++l) {
    const std::string o = fmt::format("blocks.{}.", l);
    const std::string t = fmt::format("{}layers.{}.", prefix, l);
    copy(o + "norm1.weight", {C}, t + "input_layernorm.weight");
    // q, k and v rows one after the other, each in transformers' head order: the HF layout of
    // rotate_half is ours, so no row is permuted.
    auto qkv = [&](const std::string& what, bool matrix) {
      auto shape = [&](int64_t rows) {
        return matrix ? std::vector<int64_t>{rows, C} : std::vector<int64_t>{rows};
      };
      out.push_back({o + "attn.qkv." + what,
                     shape(Q + 2 * KV),
                     false,
                     false,
                     {{t + "self_attn.q_proj." + what, shape(Q), 0},
                      {t + "self_attn.k_proj." + what, shape(KV), Q},
                      {t + "self_attn.v_proj." + what, shape(KV), Q + KV}}});
    };
    qkv("weight", true);
    if (m.attention_bias) qkv("bias", false);
    if (m.qk_norm) {
      copy(o + "attn.q_norm.weight", {HS}, t + "self_attn.q_norm.weight");
      copy(o + "attn.k_norm.weight", {HS}, t + "self_attn.k_norm.weight");
    }
    copy(o + "attn.proj.weight", {C, Q}, t + "self_attn.o_proj.weight");
    copy(o + "norm2.weight", {C}, t + "post_attention_layernorm.weight");
    copy(o + "mlp.gate.weight", {FF, C}, t + "mlp.gate_proj.weight");
    copy(o + "mlp.up.weight", {FF, C}, t + "mlp.up_proj.weight");
    copy(o + "mlp.down.weight", {C, FF}, t + "mlp.down_proj.weight");
  }
  copy("normf.weight", {C}, prefix + "norm.weight");
  if (!m.tie_embeddings) copy("lm_head.weight", {V, C}, "lm_head.weight", true);
  return out;
}

std::string state_dict_prefix(const ModelConfig& m, const std::vector<std::string>& names) {
  const std::string base = m.kind == ModelKind::Gpt ? "transformer." : "model.";
  for (const std::string& n : names)
    if (starts_with(n, base)) return base;
  return "";
}

bool is_buffer(const ModelConfig& m, const std::string& name) {
  if (m.kind == ModelKind::Gpt)
    return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
  return ends_with(name, "rotary_emb.inv_freq");
}

}  // namespace remat::hf
