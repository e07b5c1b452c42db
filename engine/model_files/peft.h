// PEFT LoRA adapter folders in and out (docs/lora.md): `train --init-adapter DIR` reads one into a
// LoRA model, `export --adapter OUT` writes one that peft.PeftModel.from_pretrained(base, OUT)
// loads, and `export --hf` merges one into its base. A folder is adapter_config.json plus
// adapter_model.safetensors, as peft 0.17 writes them:
//   * each adapted module M (transformers' name, engine/config/lora.h) holds
//     "base_model.model.M.lora_A.weight" (r, in) and "...lora_B.weight" (out, r), the same for
//     GPT-2's Conv1D (peft's lora_A and lora_B are nn.Linear there too; fan_in_fan_out only
//     changes how a merge transposes);
//   * each module trained whole holds its parameters under "base_model.model.<its name>.weight";
//   * the scale is lora_alpha / r (lora_alpha / sqrt(r) with use_rslora).
// Reading checks the folder against the run's [model] and [lora] before any byte is used, and
// refuses, naming the file and the key or tensor: another rank, alpha, scaling or set of adapted
// modules; the PEFT features this build does not train (DoRA, biases, per-module ranks or alphas,
// layer subsets, trainable tokens, ...), by name; missing, extra or mis-shaped tensors. Keys it
// does not know are ignored, as peft's own reader does.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/config/lora.h"
#include "engine/model_files/hf_weights.h"

namespace remat::peft {

inline constexpr const char* kConfigFile = "adapter_config.json";
inline constexpr const char* kWeightsFile = "adapter_model.safetensors";

/// One tensor of an adapter folder of `m` under `l`: our parameter, its name in the file, its
/// shape (the same in both: no transposes).
struct AdapterTensor {
  std::string ours;    // "blocks.0.attn.qkv.lora_A.q", "normf.weight"
  std::string theirs;  // "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
  std::vector<int64_t> shape;
};
/// Every tensor of the folder, adapters first (model order), then the modules trained whole.
std::vector<AdapterTensor> adapter_tensors(const ModelConfig& m, const LoraConfig& l);

/// Reads the adapter folder `dir` for a run of (m, l): our parameter name -> f32 values. Throws
/// CheckpointError ("[peft] FILE: problem. Fix: ...") for anything the run would not load as is.
/// `base_note` receives adapter_config.json's base_model_name_or_path ("" when absent).
std::map<std::string, std::vector<float>> read_adapter(const std::string& dir, const ModelConfig& m,
                                                       const LoraConfig& l,
                                                       std::string* base_note = nullptr);

/// Writes adapter_config.json and adapter_model.safetensors (f32, fsync'd) into the existing
/// folder `dir`, the tensors from `source` (by our names), base_model_name_or_path = `base`.
void write_adapter(const std::string& dir, const ModelConfig& m, const LoraConfig& l,
                   const std::string& base, const hf::ParamSource& source);

/// Adds the adapter of `site` to the base weight `w` (our layout, the whole (rows, in) weight of
/// site.base): w[site.row0 + i, :] += scale (B A)[i, :], as peft's merge (W += scaling B A; for
/// a Conv1D the transpose of the same update on transformers' (in, out) layout).
void merge(std::vector<float>& w, const lora::Site& site, const std::vector<float>& a,
           const std::vector<float>& b, int64_t rank, double scale);

}  // namespace remat::peft
