// LoRA's module table and peft's matching rules (see engine/config/lora.h).
#include "engine/config/lora.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace remat::lora {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// One module of transformers' model as named_modules() lists it: a linear of a block (an adapter
// site), a module that can train whole (its parameters), or anything else (containers, the
// rotary embedding, activations, dropouts).
struct Module {
  std::string name;
  std::optional<Site> site;
  std::optional<SavedModule> saved;
  std::string refusal;  // why it cannot be saved whole, when it is an embedding or head that can't
};

// Every module of `m`'s transformers model, in named_modules() order, with peft's own wrappers
// ("base_model", "base_model.model") first: modules_to_save is matched on the PeftModel.
std::vector<Module> modules_of(const ModelConfig& m) {
  std::vector<Module> out;
  auto other = [&](const std::string& name) {
    out.push_back({name, std::nullopt, std::nullopt, ""});
  };
  other("base_model");
  other("base_model.model");
  const bool gpt = m.kind == ModelKind::Gpt;
  const std::string root = gpt ? "transformer" : "model";
  auto saved = [&](const std::string& name, std::vector<std::string> ours,
                   std::vector<std::string> suffixes) {
    SavedModule s{name, std::move(ours), {}};
    for (const auto& x : suffixes) s.hf_params.push_back(name + "." + x);
    out.push_back({name, std::nullopt, s, ""});
  };
  auto tied = [&](const std::string& name, const char* what) {
    out.push_back({name, std::nullopt, std::nullopt,
                   fmt::format("tied to the {} (one matrix here), and peft would train a "
                               "copy of it alone",
                               what)});
  };
  const int64_t C = m.n_embd, FF = m.ff();
  other(root);
  if (gpt) {
    tied(root + ".wte", "LM head");
    if (m.position == PositionKind::Learned) saved(root + ".wpe", {"wpe"}, {"weight"});
    other(root + ".drop");
  } else if (m.tie_embeddings) {
    tied(root + ".embed_tokens", "LM head");
  } else {
    saved(root + ".embed_tokens", {"wte"}, {"weight"});
  }
  const std::string layers = root + (gpt ? ".h" : ".layers");
  other(layers);
  for (int64_t l = 0; l < m.n_layer; ++l) {
    const std::string t = fmt::format("{}.{}", layers, l);
    const std::string o = fmt::format("blocks.{}.", l);
    auto site = [&](const std::string& name, const std::string& ours, const std::string& tag,
                    int64_t row0, int64_t rows, int64_t in) {
      const std::string base = o + ours;
      Site s{
          name, base + ".weight", base + ".lora_A" + tag, base + ".lora_B" + tag, l, row0, rows, in,
          gpt};
      out.push_back({name, s, std::nullopt, ""});
    };
    other(t);
    if (gpt) {
      saved(t + ".ln_1", {o + "ln1.weight", o + "ln1.bias"}, {"weight", "bias"});
      other(t + ".attn");
      site(t + ".attn.c_attn", "attn.qkv", "", 0, 3 * C, C);
      site(t + ".attn.c_proj", "attn.proj", "", 0, C, C);
      other(t + ".attn.attn_dropout");
      other(t + ".attn.resid_dropout");
      saved(t + ".ln_2", {o + "ln2.weight", o + "ln2.bias"}, {"weight", "bias"});
      other(t + ".mlp");
      site(t + ".mlp.c_fc", "mlp.fc", "", 0, FF, C);
      site(t + ".mlp.c_proj", "mlp.proj", "", 0, C, FF);
      other(t + ".mlp.act");
      other(t + ".mlp.dropout");
      continue;
    }
    const int64_t Q = m.n_head * m.head_size(), KV = m.kv_heads() * m.head_size();
    other(t + ".self_attn");
    site(t + ".self_attn.q_proj", "attn.qkv", ".q", 0, Q, C);
    site(t + ".self_attn.k_proj", "attn.qkv", ".k", Q, KV, C);
    site(t + ".self_attn.v_proj", "attn.qkv", ".v", Q + KV, KV, C);
    site(t + ".self_attn.o_proj", "attn.proj", "", 0, C, Q);
    if (m.qk_norm) {
      saved(t + ".self_attn.q_norm", {o + "attn.q_norm.weight"}, {"weight"});
      saved(t + ".self_attn.k_norm", {o + "attn.k_norm.weight"}, {"weight"});
    }
    other(t + ".mlp");
    site(t + ".mlp.gate_proj", "mlp.gate", "", 0, FF, C);
    site(t + ".mlp.up_proj", "mlp.up", "", 0, FF, C);
    site(t + ".mlp.down_proj", "mlp.down", "", 0, C, FF);
    other(t + ".mlp.act_fn");
    saved(t + ".input_layernorm", {o + "norm1.weight"}, {"weight"});
    saved(t + ".post_attention_layernorm", {o + "norm2.weight"}, {"weight"});
  }
  if (gpt) {
    saved(root + ".ln_f", {"lnf.weight", "lnf.bias"}, {"weight", "bias"});
    tied("lm_head", "token embedding");
  } else {
    saved(root + ".norm", {"normf.weight"}, {"weight"});
    other(root + ".rotary_emb");
    if (m.tie_embeddings)
      tied("lm_head", "token embedding");
    else
      saved("lm_head", {"lm_head.weight"}, {"weight"});
  }
  return out;
}

// peft's target rule (tuners_utils.check_target_module_exists, for a list of names).
bool target_matches(const std::string& module, const std::string& t) {
  return module == t || ends_with(module, "." + t);
}

}  // namespace

std::vector<Site> all_sites(const ModelConfig& m) {
  std::vector<Site> out;
  for (const Module& mod : modules_of(m))
    if (mod.site) out.push_back(*mod.site);
  return out;
}

SiteChoice select_sites(const ModelConfig& m, const std::vector<std::string>& targets) {
  if (targets.empty()) return {all_sites(m), ""};
  const std::vector<Module> mods = modules_of(m);
  std::set<std::string> chosen;
  for (const std::string& t : targets) {
    bool any = false;
    for (const Module& mod : mods) {
      if (mod.name.rfind("base_model", 0) == 0 || !target_matches(mod.name, t)) continue;
      if (!mod.site)
        return {{},
                fmt::format("'{}' selects {}, which is not a linear of a block (adapters go on {})",
                            t, mod.name,
                            m.kind == ModelKind::Gpt ? "c_attn, c_proj and c_fc"
                                                     : "q_proj, k_proj, v_proj, o_proj, "
                                                       "gate_proj, up_proj and down_proj")};
      chosen.insert(mod.name);
      any = true;
    }
    if (!any)
      return {{},
              fmt::format("'{}' matches no module of this {} model (adapters go on {})", t,
                          config_name(m.kind),
                          m.kind == ModelKind::Gpt ? "c_attn, c_proj and c_fc"
                                                   : "q_proj, k_proj, v_proj, o_proj, gate_proj, "
                                                     "up_proj and down_proj")};
  }
  SiteChoice out;
  for (const Site& s : all_sites(m))
    if (chosen.count(s.module)) out.sites.push_back(s);
  return out;
}

std::set<std::string> module_names(const std::vector<Site>& sites) {
  std::set<std::string> out;
  for (const Site& s : sites) out.insert(s.module);
  return out;
}
std::set<std::string> module_names(const std::vector<SavedModule>& modules) {
  std::set<std::string> out;
  for (const SavedModule& m : modules) out.insert(m.module);
  return out;
}

SavedChoice select_saved(const ModelConfig& m, const std::vector<std::string>& names) {
  const std::vector<Module> mods = modules_of(m);
  const std::string prefix = "base_model.model.";
  std::set<std::string> chosen;
  for (const std::string& n : names) {
    bool any = false;
    for (const Module& mod : mods) {
      // peft matches modules_to_save on the PeftModel, whose names carry its two wrappers.
      const std::string key = mod.name.rfind("base_model", 0) == 0 ? mod.name : prefix + mod.name;
      if (n.empty() || !ends_with(key, n)) continue;
      if (!mod.refusal.empty())
        return {{}, fmt::format("'{}' selects {}, which is {}", n, mod.name, mod.refusal)};
      if (!mod.saved)
        return {{},
                fmt::format("'{}' selects {}, which is not an embedding, a norm or the LM head "
                            "(the modules that train whole beside adapters here)",
                            n, mod.name)};
      chosen.insert(mod.name);
      any = true;
    }
    if (!any)
      return {{},
              fmt::format("'{}' matches no module of this {} model (whole modules: {})", n,
                          config_name(m.kind),
                          m.kind == ModelKind::Gpt
                              ? "wpe, ln_1, ln_2, ln_f"
                              : "embed_tokens and lm_head (untied), input_layernorm, "
                                "post_attention_layernorm, norm (and q_norm, k_norm)")};
  }
  SavedChoice out;
  for (const Module& mod : mods)
    if (mod.saved && chosen.count(mod.name)) out.modules.push_back(*mod.saved);
  return out;
}

bool lm_head_frozen(const ModelConfig& m, const LoraConfig& l) {
  if (!l.enabled()) return false;
  for (const SavedModule& mod : select_saved(m, l.modules_to_save).modules)
    for (const std::string& p : mod.params)
      if (p == "lm_head.weight") return false;
  return true;
}

DType base_dtype(const LoraConfig& l) {
  if (!l.enabled() || l.base == "fp32") return DType::F32;
  if (l.base == "bf16") return DType::BF16;
  REMAT_ASSERT(l.base == "nf4", "lora.base = \"{}\"", l.base);
  return l.double_quant ? DType::NF4DQ : DType::NF4;
}

double scaling(const LoraConfig& l) {
  const double r = static_cast<double>(l.rank);
  return l.rslora ? l.alpha / std::sqrt(r) : l.alpha / r;
}

std::vector<std::string> target_names(const ModelConfig& m,
                                      const std::vector<std::string>& targets) {
  if (!targets.empty()) return targets;
  std::set<std::string> names;
  for (const Site& s : all_sites(m)) names.insert(s.module.substr(s.module.rfind('.') + 1));
  return {names.begin(), names.end()};
}

}  // namespace remat::lora
