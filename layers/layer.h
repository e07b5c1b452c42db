// Shared vocabulary of the layers.
//
// Shape letters (as in llm.c):
//   B batch, T time (sequence length), C channels (n_embd), NH heads, HS head size (C / NH),
//   FF MLP hidden size (d_ff), V vocabulary, N rows of a matrix view (B*T), L layers.
//
// Saved activations (names, kinds, shapes, and what needs each one): each block's one slot table,
// kSlots in layers/gpt_block.cpp (x ln1 ln1.stats qkv attn attn.lse res ln2 ln2.stats fc gelu)
// and layers/mlp_block.cpp (x (B,D), fc (B,D) pre-activation).
#pragma once

#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "engine/model.h"

namespace remat {

struct ParamInit {
  enum Kind { Zeros, Ones, Normal, Uniform } kind = Zeros;
  double std = 0.0;  // Normal: the standard deviation; Uniform: the bound b of U(-b, b)
};

/// Allocates a parameter with its gradient and AdamW moments, initialized deterministically
/// from (seed, name). 2-D weights get weight decay. `moments`: where the AdamW moments live (none
/// are allocated here when they are sharded over ranks). `on_host`: the value, gradient and
/// moments all live in the host pool (remat.offload = "checkpoints+optimizer+weights"; `moments`
/// must then be Host). `frozen`: the value alone, in the device pool (engine/model.h, Param).
/// `dtype`: the value's storage, F32 or, frozen only, a frozen base's BF16, NF4 or NF4DQ
/// (lora.base), its initial values drawn in f32 and encoded (engine/core/nf4.h).
Param make_param(Backend& be, const std::string& name, const std::vector<int64_t>& shape,
                 ParamInit init, uint64_t seed, MomentHome moments = MomentHome::Device,
                 bool on_host = false, bool frozen = false, DType dtype = DType::F32);

}  // namespace remat
