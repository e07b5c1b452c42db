// Llama-family pre-norm Transformer block (Llama 2/3, Qwen2/2.5/3, Mistral, SmolLM2):
//   res = x + o_proj(attention(qkv(rmsnorm1(x))))    attention: causal, grouped-query, RoPE
//   y   = res + down(silu(gate(n2)) * up(n2)),  n2 = rmsnorm2(res)
// q, k and v come from one fused projection (q | k | v rows of one weight, as the importer lays
// out Hugging Face's q_proj, k_proj, v_proj), with biases for Qwen2 (attention_bias) and a
// per-head RMSNorm of q and k before RoPE for Qwen3 (qk_norm). No dropout, no biases elsewhere.
// The residual-stream gradient flows through one (B,T,C) buffer that each RMSNorm backward adds
// into, as in the GPT block. With remat.tile_tokens = n > 0 the MLP half (rmsnorm2, gate, up,
// the SwiGLU product, down and its residual add) runs over chunks of n rows, forward and again
// inside the backward, so its activations are never stored whole and the slots end at res.
#pragma once

#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "engine/model.h"
#include "engine/parallel/context_ring.h"
#include "layers/lora.h"

namespace remat {

struct LlamaBlockParams {
  Param* norm1_weight;                   // (C)
  Param* qkv_weight;                     // ((NH + 2 KVH) HS, C)
  Param* qkv_bias;                       // ((NH + 2 KVH) HS), or null (attention_bias off)
  Param *q_norm_weight, *k_norm_weight;  // (HS) each, or null (qk_norm off)
  Param* proj_weight;                    // (C, NH HS)
  Param* norm2_weight;                   // (C)
  Param *gate_weight, *up_weight;        // (FF, C) each
  Param* down_weight;                    // (C, FF)
  // LoRA adapters of each linear (layers/lora.h; empty without): q_proj, k_proj and v_proj on
  // the fused qkv's row ranges, o_proj, gate_proj, up_proj, down_proj.
  std::vector<LoraAdapter> lora_qkv, lora_proj, lora_gate, lora_up, lora_down;
};

/// A block's sizes and options: [model] and the step's batch and sequence length.
struct LlamaBlockShape {
  int64_t B = 0, T = 0, C = 0, NH = 0, KVH = 0, HS = 0, FF = 0;
  float rope_theta = 10000;
  RopeScaling rope_scaling{};
  float norm_eps = 1e-5f;
  int64_t tile_tokens = 0;      // rows per MLP chunk; 0 = untiled
  int64_t attention_chunk = 0;  // remat.attention_chunk: tokens per attention chunk; 0 = automatic
  const parallel::ContextRing* ring = nullptr;  // context parallel: attention as a ring
  LoraShared lora{};                            // the adapters' scale and dropout
};

class LlamaBlock : public Block {
 public:
  // Every slot a block can have, in computation order. The q/k norm's two slots exist only with
  // qk_norm; a tiled block's slots end before Norm2. slot() maps these to ActStore indices.
  enum Slot : size_t {
    X,
    Norm1,
    Norm1Rstd,
    Qkv,
    QkvNormed,
    QkvRstd,
    Attn,
    AttnLse,
    Res,
    Norm2,
    Norm2Rstd,
    Gate,
    Up,
    Act,
    kNumSlots
  };
  LlamaBlock(LlamaBlockParams p, const LlamaBlockShape& s, int64_t index);
  const std::vector<std::string>& act_names() const override { return names_; }
  const std::vector<ActKind>& act_kinds() const override { return kinds_; }
  void forward(Backend& be, ActStore& acts, const Tensor& y) override;
  void backward(Backend& be, ActStore& acts, const Tensor& dresid) override;
  void begin_step(int64_t step) override { lora_.begin_step(step); }
  void set_training(bool training) override { lora_.set_training(training); }

 private:
  bool tiled() const { return s_.tile_tokens > 0; }
  bool qk_norm() const { return p_.q_norm_weight != nullptr; }
  // The ActStore index of a slot this block has.
  size_t slot(Slot s) const { return qk_norm() || s < QkvNormed ? s : s - 2; }
  int64_t qkv_width() const { return (s_.NH + 2 * s_.KVH) * s_.HS; }
  AttentionForwardArgs attention_args(const Tensor& out, const Tensor& lse,
                                      const Tensor& qkv) const;
  // One chunk of the MLP half's activations, allocated once for the largest chunk.
  struct MlpActs {
    Tensor norm2, norm2_rstd, gate, up, act;
  };
  struct MlpChunk {
    Buffer norm2, norm2_rstd, gate, up, act;
    MlpActs rows(int64_t n) const;
  };
  MlpChunk allocate_mlp_chunk(Backend& be) const;
  // norm2 .. act of rows [r0, r0 + n) of res into m.
  void mlp_acts_forward(Backend& be, const MlpActs& m, const Tensor& res, int64_t r0) const;
  // y rows = res rows + down(act); r0 places the rows in the block's (adapters' dropout).
  void mlp_out_forward(Backend& be, const Tensor& y, const Tensor& res, const Tensor& act,
                       int64_t r0) const;
  void mlp_forward_tiled(Backend& be, const Tensor& res, const Tensor& y) const;
  // The MLP half's backward on rows [r0, r0 + n): dresid's rows gain d res through rmsnorm2; the
  // weight gradients add. With `store` (the untiled block), act, gate and up are freed as soon as
  // their last reader is done.
  void mlp_backward_rows(Backend& be, const MlpActs& m, const Tensor& res, const Tensor& dresid,
                         int64_t r0, ActStore* store = nullptr) const;
  void mlp_backward_tiled(Backend& be, const Tensor& res, const Tensor& dresid) const;
  void attention_backward(Backend& be, ActStore& a, const Tensor& dresid) const;
  LlamaBlockParams p_;
  LlamaBlockShape s_;
  int64_t index_;
  std::vector<std::string> names_;
  std::vector<ActKind> kinds_;
  BlockLora lora_;
};

}  // namespace remat
