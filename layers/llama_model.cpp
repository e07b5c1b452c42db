// LlamaModel (see layers/models.h): token embedding, L Llama-family blocks, final RMSNorm, LM head
// (tied to the embedding or its own weight), mean next-token cross-entropy (fused and chunked).
// Positions come from RoPE inside attention; there is no position table and no dropout. The
// rows, the stem and the LM head's call are layers/token_model.h's, shared with the GPT.
#include <fmt/format.h>

#include <utility>

#include "layers/layer.h"
#include "layers/llama_block.h"
#include "layers/models.h"
#include "layers/token_model.h"

namespace remat {
namespace {

class LlamaModel : public detail::TokenModel {
 public:
  LlamaModel(const ModelConfig& model, const ModelShape& s, Backend& be)
      : TokenModel(s, model.n_embd, model.vocab_size), m_(model) {
    const int64_t C = m_.n_embd, V = m_.vocab_size, L = m_.n_layer;
    const int64_t NH = m_.n_head, KVH = m_.kv_heads(), HS = m_.head_size(), FF = m_.ff();
    // transformers' _init_weights for these models: N(0, initializer_range = 0.02) for every
    // matrix, ones for the norms, zeros for biases. Fine-tuning starts from --init hf:DIR instead.
    const ParamInit normal{ParamInit::Normal, 0.02};
    const ParamInit ones{ParamInit::Ones}, zeros{ParamInit::Zeros};
    plan_lora(m_, s);
    // pointers into it stay valid
    params_.reserve(static_cast<size_t>(3 + 11 * L) + lora_param_count());
    auto add = [&](const std::string& name, const std::vector<int64_t>& shape, ParamInit init) {
      return add_param(be, s, name, shape, init);
    };
    wte_ = add("wte", {V, C}, normal);
    LlamaBlockShape shape{.B = B_, .T = T_, .C = C, .NH = NH, .KVH = KVH, .HS = HS, .FF = FF};
    shape.rope_theta = static_cast<float>(m_.rope_theta);
    shape.rope_scaling = m_.rope_scaling;
    shape.rope_scaling.seq_len = s.seq_len;  // dynamic NTK: the base of the run's whole rows
    shape.norm_eps = static_cast<float>(m_.norm_eps);
    shape.tile_tokens = s.tile_tokens;
    shape.attention_chunk = s.attention_chunk;
    shape.ring = ring_.get();
    shape.doc_start = &doc_start_;
    shape.mean_doc_tokens = s.mean_doc_tokens;
    shape.lora = lora_shared_;
    const int64_t W = (NH + 2 * KVH) * HS;
    for (int64_t l = 0; l < L; ++l) {
      const std::string p = fmt::format("blocks.{}.", l);
      LlamaBlockParams bp{};
      bp.norm1_weight = add(p + "norm1.weight", {C}, ones);
      bp.qkv_weight = add(p + "attn.qkv.weight", {W, C}, normal);
      bp.qkv_bias = m_.attention_bias ? add(p + "attn.qkv.bias", {W}, zeros) : nullptr;
      if (m_.qk_norm) {
        bp.q_norm_weight = add(p + "attn.q_norm.weight", {HS}, ones);
        bp.k_norm_weight = add(p + "attn.k_norm.weight", {HS}, ones);
      }
      bp.proj_weight = add(p + "attn.proj.weight", {C, NH * HS}, normal);
      bp.norm2_weight = add(p + "norm2.weight", {C}, ones);
      bp.gate_weight = add(p + "mlp.gate.weight", {FF, C}, normal);
      bp.up_weight = add(p + "mlp.up.weight", {FF, C}, normal);
      bp.down_weight = add(p + "mlp.down.weight", {C, FF}, normal);
      bp.lora_qkv = add_adapters(be, s, p + "attn.qkv.weight");
      bp.lora_proj = add_adapters(be, s, p + "attn.proj.weight");
      bp.lora_gate = add_adapters(be, s, p + "mlp.gate.weight");
      bp.lora_up = add_adapters(be, s, p + "mlp.up.weight");
      bp.lora_down = add_adapters(be, s, p + "mlp.down.weight");
      blocks_.push_back(std::make_unique<LlamaBlock>(std::move(bp), shape, l));
    }
    normf_weight_ = add("normf.weight", {C}, ones);
    lm_head_ = m_.tie_embeddings ? wte_ : add("lm_head.weight", {V, C}, normal);
    stem_params_ = {wte_};
    head_params_ = {normf_weight_, lm_head_};
  }

  std::string describe() const override {
    return fmt::format("llama L={} H={}/{} C={} HS={} FF={} V={}{}", m_.n_layer, m_.n_head,
                       m_.kv_heads(), m_.n_embd, m_.head_size(), m_.ff(), m_.vocab_size,
                       m_.tie_embeddings ? " (tied head)" : "");
  }
  // normf -> fused LM head + cross-entropy (which yields d normf_out) -> normf backward.
  void head_forward_backward(Backend& be, const Tensor& x, const Batch& batch, const Tensor& losses,
                             const Tensor& dx, const Tensor& predictions) override {
    MemoryPool& pool = be.pool();
    const int64_t N = B_ * T_, C = m_.n_embd;
    Buffer normf = pool.allocate({N, C}, be.act_dtype(), MemCategory::Transient, "normf");
    Buffer rstd = pool.allocate({N}, DType::F32, MemCategory::Transient, "normf.rstd");
    be.rmsnorm_forward({normf, rstd, x, normf_weight_->value, static_cast<float>(m_.norm_eps)});
    Buffer dnormf = pool.allocate({N, C}, be.act_dtype(), MemCategory::Transient, "grad.normf");
    lm_head_loss(be, normf, *lm_head_, batch, losses, dnormf, predictions);
    normf.reset();
    be.fill(dx, 0.0f);
    be.rmsnorm_backward({dx, normf_weight_->grad, dnormf, x, normf_weight_->value, rstd});
  }

 private:
  ModelConfig m_;
  Param* normf_weight_ = nullptr;
  Param* lm_head_ = nullptr;  // wte_ when tied
};

}  // namespace

std::unique_ptr<Model> make_llama_model(const ModelConfig& model, const ModelShape& shape,
                                        Backend& be) {
  return std::make_unique<LlamaModel>(model, shape, be);
}

}  // namespace remat
