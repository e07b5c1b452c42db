// GPT-2 pre-LN Transformer block:
//   res = x + proj(attention(ln1(x)))          attention: causal, multi-head, flash contract
//   y   = res + mlp_proj(gelu(fc(ln2(res))))
// Backward runs the chain in reverse; the residual-stream gradient flows through one (B,T,C)
// buffer that each LayerNorm backward adds into (engine/core/backend.h's [+=] exception).
// With dropout p > 0, the attention and MLP branch outputs are dropped (inverted dropout) before
// the residual adds; masks come from a counter-based RNG keyed by (seed, step, block, site), so
// recompute and backward reproduce them without saving anything.
// With remat.tile_tokens = n > 0 the token-wise second half (ln2, fc, gelu, mlp.proj and its
// residual add) runs over chunks of n rows of the (B*T, C) stream, in the forward and again,
// chunk by chunk, inside the backward: ln2, fc and gelu are never stored whole, whatever the
// policy, and the block's slots are only x .. res. Weight gradients add up over the chunks.
// Saved activations and what needs them: layers/layer.h.
#pragma once

#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "engine/model.h"
#include "engine/parallel/context_ring.h"
#include "layers/lora.h"

namespace remat {

struct GptBlockParams {
  Param *ln1_weight, *ln1_bias;
  Param *attn_qkv_weight, *attn_qkv_bias;    // (3C, C), (3C)
  Param *attn_proj_weight, *attn_proj_bias;  // (C, C), (C)
  Param *ln2_weight, *ln2_bias;
  Param *mlp_fc_weight, *mlp_fc_bias;      // (FF, C), (FF)
  Param *mlp_proj_weight, *mlp_proj_bias;  // (C, FF), (C)
  // LoRA adapters of each linear (layers/lora.h; empty without): c_attn, attn.c_proj, c_fc,
  // mlp.c_proj in Hugging Face's names.
  std::vector<LoraAdapter> lora_qkv, lora_proj, lora_fc, lora_mlp_proj;
};

/// A block's sizes and options: [model] and the step's batch and sequence length.
struct GptBlockShape {
  int64_t B = 0, T = 0, C = 0, NH = 0, FF = 0;
  float rope_theta = 0;  // 0: no rotary embedding (learned positions)
  float dropout = 0;
  uint64_t seed = 0;            // train.seed: dropout masks derive from it
  int64_t tile_tokens = 0;      // rows per MLP chunk; 0 = untiled
  int64_t attention_chunk = 0;  // remat.attention_chunk: tokens per attention chunk; 0 = automatic
  // Several ranks (engine/parallel): attention as a ring over the context group when set, and
  // dropout masks as a single rank would draw them for these rows (data parallel: the rows before
  // this rank's) or, with context parallel, from a stream of this rank's own.
  const parallel::ContextRing* ring = nullptr;
  int64_t first_row = 0;
  uint64_t dropout_salt = 0;
  LoraShared lora{};  // the adapters' scale and dropout
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
  /// Slots of a tiled block (tile_tokens > 0): the MLP's (ln2 .. gelu) live per chunk instead.
  static constexpr size_t kNumTiledSlots = Ln2;
  /// Block `index` (blocks.<index>) with parameters `p`.
  GptBlock(GptBlockParams p, const GptBlockShape& s, int64_t index);
  const std::vector<std::string>& act_names() const override;
  const std::vector<ActKind>& act_kinds() const override;
  void forward(Backend& be, ActStore& acts, const Tensor& y) override;
  void backward(Backend& be, ActStore& acts, const Tensor& dresid) override;
  void begin_step(int64_t step) override {
    step_ = step;
    lora_.begin_step(step);
  }
  void set_training(bool training) override {
    training_ = training;
    lora_.set_training(training);
  }

 private:
  enum Site : uint64_t { AttnOut = 1, MlpOut = 2 };
  float active_dropout() const { return training_ ? dropout_ : 0.0f; }
  DropoutArgs dropout_args(const Tensor& out, const Tensor& inp, Site site,
                           int64_t first_row = 0) const;
  // out = base + dropout(inp W^T + b + the adapters' terms): the residual add of one branch.
  // `first_row` places a chunk of rows in the whole stream (its dropout mask).
  void branch_forward(Backend& be, const Tensor& out, const Tensor& base, const Tensor& inp,
                      const Param* w, const Param* b, std::span<const LoraAdapter> adapters,
                      Site site, int64_t first_row = 0);
  // fc and gelu of the rows of ln2 (first_row places them): fused in one op without adapters on
  // c_fc, else the GEMM, its adapters, then the activation.
  void fc_forward(Backend& be, const Tensor& fc, const Tensor& gelu, const Tensor& ln2,
                  int64_t first_row) const;
  // The gradient reaching a branch's projection: rows dres of dresid (from first_row) through
  // the branch's dropout mask, in `scratch` when dropout is on.
  Tensor branch_grad(Backend& be, const Tensor& dres, Site site, int64_t first_row,
                     Buffer& scratch) const;
  bool tiled() const { return tile_tokens_ > 0; }
  // One chunk of the MLP half's activations, allocated once for the largest chunk.
  struct MlpChunk {
    Buffer ln2, ln2_stats, fc, gelu;
  };
  MlpChunk allocate_mlp_chunk(Backend& be) const;
  // ln2, fc and gelu of rows [r0, r0 + n) of res into the chunk's first n rows.
  void mlp_chunk_forward(Backend& be, const MlpChunk& c, const Tensor& res, int64_t r0,
                         int64_t n) const;
  void mlp_forward_tiled(Backend& be, const Tensor& res, const Tensor& y);
  // The MLP half's activations of some rows, and its backward on rows [r0, r0 + n): dresid's
  // rows gain d res through ln2; the weight gradients add.
  struct MlpActs {
    Tensor ln2, ln2_stats, fc, gelu;
  };
  void mlp_backward_rows(Backend& be, const MlpActs& m, const Tensor& res, const Tensor& dresid,
                         int64_t r0, int64_t n);
  void mlp_backward_tiled(Backend& be, const Tensor& res, const Tensor& dresid);
  GptBlockParams p_;
  int64_t B_, T_, C_, NH_, FF_;
  float rope_theta_;
  int64_t index_;
  float dropout_;
  uint64_t seed_;
  int64_t tile_tokens_;
  int64_t attention_chunk_;
  const parallel::ContextRing* ring_;
  int64_t first_row_;
  uint64_t dropout_salt_;
  int64_t step_ = 0;
  bool training_ = true;
  BlockLora lora_;
};

}  // namespace remat
