// Shared vocabulary of the layers.
//
// Shape letters (as in llm.c):
//   B batch, T time (sequence length), C channels (n_embd), NH heads, HS head size (C / NH),
//   FF MLP hidden size (d_ff), V vocabulary, N rows of a matrix view (B*T), L layers.
//
// Saved-activation names of a GPT block `blocks.i` (stable; configs and plans use them):
//   x          (B,T,C)   block input                      -> ln1 backward
//   ln1        (B,T,C)   LayerNorm 1 output               -> qkv GEMM dW
//   ln1.stats  (B,T,2)   f32 mean, rstd                   -> ln1 backward
//   qkv        (B,T,3C)  fused q|k|v                      -> attention backward
//   attn       (B,T,C)   attention output (pre-proj)      -> proj GEMM dW, attention backward
//   attn.lse   (B,NH,T)  f32 log-sum-exp per query row    -> attention backward
//   res        (B,T,C)   x + proj(attn)                   -> ln2 backward
//   ln2        (B,T,C)   LayerNorm 2 output               -> fc GEMM dW
//   ln2.stats  (B,T,2)   f32                              -> ln2 backward
//   fc         (B,T,FF)  fc GEMM output                   -> gelu backward
//   gelu       (B,T,FF)  GELU output                      -> fc2 (mlp.proj) GEMM dW
// MLP-tutorial block: x (B,D), fc (B,D) pre-activation.
#pragma once

#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/model.h"

namespace remat {

struct ParamInit {
  enum Kind { Zeros, Ones, Normal } kind = Zeros;
  double std = 0.0;
};

/// Allocates a parameter with its gradient and AdamW moments, initialized deterministically
/// from (seed, name). 2-D weights get weight decay.
Param make_param(Backend& be, const std::string& name, const std::vector<int64_t>& shape,
                 ParamInit init, uint64_t seed);

}  // namespace remat
