// Hugging Face model folders, the config side (docs/hf.md): what a config.json means as [model]
// keys, and the config.json transformers needs for a [model]. Which tensors make up each of our
// parameters is engine/model_files/hf_names; engine/model_files/hf_weights moves the bytes.
//
// Families: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM become
// model.kind = "llama"; GPT2LMHeadModel becomes "gpt" with learned positions. Whatever a
// config.json asks for that our blocks do not compute (another activation, o_proj or MLP biases,
// partial rotary, a RoPE scaling type other than linear, dynamic, yarn and llama3, a sliding window
// the run would reach) is refused with the key and its value, never approximated.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/config/config.h"

namespace remat::hf {

/// What DIR/config.json says, as the body of a [model] table ("kind = \"llama\"\nn_layer = 16\n").
struct ModelKeys {
  std::string architecture;  // "LlamaForCausalLM", ...
  std::string toml;
  /// A sliding window the checkpoint attends within: a run whose train.seq_len is at most this
  /// never reaches it (every key it has is inside the window), so full causal attention is exact.
  /// 0: the checkpoint attends over the whole sequence.
  int64_t attention_window = 0;
  std::string window_key;  // the config.json key that set it ("sliding_window")
};

/// Reads and maps DIR/config.json. Throws ConfigError naming the file, the key and its value.
ModelKeys read_model_keys(const std::string& dir);

/// The transformers architecture that computes what `m` computes: Qwen3ForCausalLM (q/k norms),
/// Qwen2ForCausalLM (q/k/v biases), LlamaForCausalLM, GPT2LMHeadModel (learned positions).
/// Throws ConfigError when transformers has none (a GPT with RoPE, the MLP, q/k norms with biases).
std::string architecture_of(const ModelConfig& m);

/// config.json for `m` as transformers reads it. `torch_dtype` is "float32" or "bfloat16";
/// `seq_len` is written as max_position_embeddings when `source` (the config.json the run
/// started from, or null) gives none; token ids come from `source` only.
nlohmann::ordered_json config_json(const ModelConfig& m, int64_t seq_len,
                                   const std::string& torch_dtype, const nlohmann::json* source);

}  // namespace remat::hf
