// LoRA's [lora] table against a model (docs/lora.md): which linears of the blocks take adapters
// and which whole modules train beside them, by the Hugging Face module names that peft uses, and
// the names, shapes and scaling of the adapters. One table, read by the config's validation, by
// the layers that build the adapters (layers/), by the PEFT folders in and out
// (engine/model_files/peft) and by the merged export, so that a name means the same module in
// each.
//
// Matching follows peft 0.17 exactly, on the module names of transformers' model (the keys of
// named_modules(): "model.layers.3.self_attn.q_proj", "transformer.h.3.attn.c_attn"):
//   * a target t adapts every module whose name is t or ends in "." + t (GPT-2's "c_proj" is both
//     attn.c_proj and mlp.c_proj; "attn.c_proj" is only the first);
//   * a modules_to_save entry m trains every module whose name ends in m, as plain text ("norm"
//     is input_layernorm, post_attention_layernorm and the final norm alike).
// What peft would do and we do not train is refused here, naming the module: a target that is not
// a linear of a block (an embedding, a norm, a container such as "mlp"), a module to save that
// holds linears, a tied embedding or head (peft trains a copy of embed_tokens while the tied
// lm_head keeps the original: the two would no longer be one matrix), and names that match
// nothing.
//
// Adapters, with r = lora.rank: A (r, in) and B (out, r) per adapted module, named after our base
// weight: "blocks.3.attn.qkv.lora_A.q" / ".lora_B.q" (and .k, .v) for Llama's fused q|k|v, whose
// three Hugging Face projections are row ranges of one weight; "blocks.3.mlp.gate.lora_A" for a
// module that is a whole weight (GPT-2's c_attn is one module: "blocks.3.attn.qkv.lora_A").
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/core/tensor.h"

namespace remat::lora {

/// One linear of a block that can take an adapter.
struct Site {
  std::string module;          // transformers' module name: "model.layers.3.self_attn.q_proj"
  std::string base;            // our base weight: "blocks.3.attn.qkv.weight"
  std::string a_name, b_name;  // "blocks.3.attn.qkv.lora_A.q", "blocks.3.attn.qkv.lora_B.q"
  int64_t block = 0;
  int64_t row0 = 0, rows = 0;  // rows of the base weight (its output features) the module is
  int64_t in = 0;              // input features
  bool conv1d = false;         // GPT-2's Conv1D (peft's fan_in_fan_out)
};

/// Every linear of `m`'s blocks, in model order (block by block; within a block in the order of
/// the base weights, q before k before v).
std::vector<Site> all_sites(const ModelConfig& m);

/// The sites `targets` select ([] = every site: peft's "all-linear" on the blocks), in model order;
/// or a problem ("'mlp' is model.layers.0.mlp, not a linear") when a name matches nothing or
/// something that is not a linear of a block.
struct SiteChoice {
  std::vector<Site> sites;
  std::string problem;  // empty when fine
};
SiteChoice select_sites(const ModelConfig& m, const std::vector<std::string>& targets);

/// A module trained whole beside the adapters (modules_to_save) and our parameters it holds.
struct SavedModule {
  std::string module;                  // "model.norm"
  std::vector<std::string> params;     // {"normf.weight"}
  std::vector<std::string> hf_params;  // their transformers names: {"model.norm.weight"}
};
struct SavedChoice {
  std::vector<SavedModule> modules;  // model order
  std::string problem;
};
SavedChoice select_saved(const ModelConfig& m, const std::vector<std::string>& names);

/// The modules a choice holds, by name: two lists written otherwise (targets = [] and the seven
/// Llama names) are one choice when these are equal (a PEFT folder against the run, a resume).
std::set<std::string> module_names(const std::vector<Site>& sites);
std::set<std::string> module_names(const std::vector<SavedModule>& modules);

/// Whether a LoRA run leaves the LM head frozen: no modules_to_save entry trains it (a tied head
/// never trains under LoRA). False with LoRA off.
bool lm_head_frozen(const ModelConfig& m, const LoraConfig& l);

/// Whether `name` is one of our adapters' parameters ("blocks.3.mlp.up.lora_A").
inline bool is_adapter_name(const std::string& name) {
  return name.find(".lora_A") != std::string::npos || name.find(".lora_B") != std::string::npos;
}

/// The adapters' scale: alpha / rank, or alpha / sqrt(rank) with rslora (peft's `scaling`).
double scaling(const LoraConfig& l);

/// How the blocks' frozen linear weights are stored (lora.base): F32, BF16, or NF4 with its
/// absmaxes in f32 (lora.double_quant = false) or 8-bit (NF4DQ). F32 when LoRA is off.
DType base_dtype(const LoraConfig& l);

/// The names `targets` stands for in adapter_config.json: the distinct last components of the
/// selected modules ("q_proj", ...), sorted, or `targets` itself when it names modules by longer
/// suffixes ("attn.c_proj").
std::vector<std::string> target_names(const ModelConfig& m,
                                      const std::vector<std::string>& targets);

}  // namespace remat::lora
