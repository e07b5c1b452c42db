// Hugging Face state dicts, the name side (docs/hf.md): which tensors of a transformers state
// dict make up each of our parameters, for both families (Llama-kind: q/k/v rows stacked into our
// fused qkv; GPT-2: Conv1D weights transposed). engine/model_files/hf_weights moves the bytes by
// this table; engine/config/hf_config maps config.json itself.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/config/config.h"

namespace remat::hf {

/// Part of one of our parameters in a Hugging Face state dict: rows [row0, row0 + shape[0]) of
/// ours, or (transposed) all of ours with its two dimensions swapped.
struct Piece {
  std::string name;
  std::vector<int64_t> shape;
  int64_t row0 = 0;
};

/// One of our parameters and the Hugging Face tensors it is made of.
struct Mapping {
  std::string ours;  // "blocks.0.attn.qkv.weight"
  std::vector<int64_t> shape;
  bool transposed = false;  // GPT-2's Conv1D stores (in, out): one piece, ours transposed
  bool vocab = false;       // rows are tokens: a file may hold more or fewer (stripped / padded)
  std::vector<Piece> pieces;
};

/// Every parameter of `m`'s model, in model order. `prefix` is the base model's ("model." or
/// "transformer."), or "" for a file saved from the base model alone; lm_head.weight never has
/// one. A tied LM head has no mapping (it is the embedding).
std::vector<Mapping> mappings(const ModelConfig& m, const std::string& prefix);

/// The prefix a state dict with these tensor names uses ("model.", "transformer." or "").
std::string state_dict_prefix(const ModelConfig& m, const std::vector<std::string>& names);

/// Buffers that some files carry beside the weights and that are recomputed, not learned:
/// rotary_emb.inv_freq, GPT-2's attn.bias (the causal mask) and attn.masked_bias.
bool is_buffer(const ModelConfig& m, const std::string& name);

}  // namespace remat::hf
