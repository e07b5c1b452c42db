// GPT-2 pre-LN Transformer block:
//   res = x + proj(attention(ln1(x)))          attention: causal, multi-head, flash contract
//   y   = res + mlp_proj(gelu(fc(ln2(res))))
// Backward runs the chain in reverse; the residual-stream gradient flows through one (B,T,C)
// buffer that each LayerNorm backward adds into (engine/backend.h's [+=] exception).
// With dropout p > 0, the attention and MLP branch outputs are dropped (inverted dropout) before
// the residual adds; masks come from a counter-based RNG keyed by (seed, step, block, site), so
// recompute and backward reproduce them without saving anything.
// Saved activations and what needs them: layers/layer.h.
#pragma once

#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/model.h"

namespace remat {

struct GptBlockParams {
  Param *ln1_weight, *ln1_bias;
  Param *attn_qkv_weight, *attn_qkv_bias;    // (3C, C), (3C)
  Param *attn_proj_weight, *attn_proj_bias;  // (C, C), (C)
  Param *ln2_weight, *ln2_bias;
  Param *mlp_fc_weight, *mlp_fc_bias;      // (FF, C), (FF)
  Param *mlp_proj_weight, *mlp_proj_bias;  // (C, FF), (C)
};

/// A block's sizes and options: [model] and the step's batch and sequence length.
struct GptBlockShape {
  int64_t B = 0, T = 0, C = 0, NH = 0, FF = 0;
  float rope_theta = 0;  // 0: no rotary embedding (learned positions)
  float dropout = 0;
  uint64_t seed = 0;  // train.seed: dropout masks derive from it
};

class GptBlock : public Block {
 public:
  enum Slot : size_t {
    X,
    Ln1,
    Ln1Stats,
    Qkv,
    Attn,
    AttnLse,
    Res,
    Ln2,
    Ln2Stats,
    Fc,
    Gelu,
    kNumSlots
  };
  /// Block `index` (blocks.<index>) with parameters `p`.
  GptBlock(GptBlockParams p, const GptBlockShape& s, int64_t index);
  const std::vector<std::string>& act_names() const override;
  const std::vector<ActKind>& act_kinds() const override;
  void forward(Backend& be, ActStore& acts, const Tensor& y) override;
  void backward(Backend& be, ActStore& acts, const Tensor& dresid) override;
  void begin_step(int64_t step) override { step_ = step; }
  void set_training(bool training) override { training_ = training; }

 private:
  enum Site : uint64_t { AttnOut = 1, MlpOut = 2 };
  float active_dropout() const { return training_ ? dropout_ : 0.0f; }
  DropoutArgs dropout_args(const Tensor& out, const Tensor& inp, Site site) const;
  // out = base + dropout(inp W^T + b): the residual add of one branch.
  void branch_forward(Backend& be, const Tensor& out, const Tensor& base, const Tensor& inp,
                      const Param* w, const Param* b, Site site);
  GptBlockParams p_;
  int64_t B_, T_, C_, NH_, FF_;
  float rope_theta_;
  int64_t index_;
  float dropout_;
  uint64_t seed_;
  int64_t step_ = 0;
  bool training_ = true;
};

}  // namespace remat
