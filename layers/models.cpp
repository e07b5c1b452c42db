// GptModel and MlpModel (see layers/models.h).
#include "layers/models.h"

#include <fmt/format.h>

#include <cmath>
#include <utility>

#include "engine/core/rng.h"
#include "engine/core/units.h"
#include "layers/gpt_block.h"
#include "layers/layer.h"
#include "layers/mlp_block.h"
#include "layers/token_model.h"

namespace remat {
namespace {

// The rows, the stem and the LM head's call are layers/token_model.h's, shared with the Llama
// family's model.
class GptModel : public detail::TokenModel {
 public:
  GptModel(const ModelConfig& model, const ModelShape& s, Backend& be)
      : TokenModel(s, model.n_embd, model.vocab_size), m_(model) {
    const int64_t C = m_.n_embd, V = m_.vocab_size, FF = m_.ff(), L = m_.n_layer;
    const uint64_t seed = s.seed;
    // GPT-2 initialization: N(0, 0.02); residual projections scaled by 1/sqrt(2L).
    const ParamInit normal{ParamInit::Normal, 0.02};
    const ParamInit resid{ParamInit::Normal, 0.02 / std::sqrt(2.0 * static_cast<double>(L))};
    const ParamInit ones{ParamInit::Ones}, zeros{ParamInit::Zeros};
    plan_lora(m_, s);
    params_.reserve(static_cast<size_t>(3 + 12 * L + 2) + lora_param_count());
    auto add = [&](const std::string& name, const std::vector<int64_t>& shape, ParamInit init) {
      return add_param(be, s, name, shape, init);
    };
    wte_ = add("wte", {V, C}, normal);
    if (m_.position == PositionKind::Learned)
      wpe_ = add("wpe", {m_.n_ctx, C}, ParamInit{ParamInit::Normal, 0.01});
    GptBlockShape shape{B_, T_, C, m_.n_head, FF};
    shape.ring = ring_.get();
    // Dropout masks: a data-parallel rank draws those of its rows of the whole batch; a context
    // rank (whose tokens are not contiguous) its own stream.
    shape.first_row = ring_ ? 0 : s.data_rank * B_ * T_;
    shape.dropout_salt = ring_ ? mix64(0x72696e67ull + static_cast<uint64_t>(s.context_rank)) : 0;
    shape.rope_theta = m_.position == PositionKind::Rope ? static_cast<float>(m_.rope_theta) : 0.0f;
    shape.dropout = static_cast<float>(m_.dropout);
    shape.seed = seed;
    shape.tile_tokens = s.tile_tokens;
    shape.attention_chunk = s.attention_chunk;
    shape.doc_start = &doc_start_;
    shape.mean_doc_tokens = s.mean_doc_tokens;
    shape.lora = lora_shared_;
    for (int64_t l = 0; l < L; ++l) {
      const std::string p = fmt::format("blocks.{}.", l);
      GptBlockParams bp{};
      bp.ln1_weight = add(p + "ln1.weight", {C}, ones);
      bp.ln1_bias = add(p + "ln1.bias", {C}, zeros);
      bp.attn_qkv_weight = add(p + "attn.qkv.weight", {3 * C, C}, normal);
      bp.attn_qkv_bias = add(p + "attn.qkv.bias", {3 * C}, zeros);
      bp.attn_proj_weight = add(p + "attn.proj.weight", {C, C}, resid);
      bp.attn_proj_bias = add(p + "attn.proj.bias", {C}, zeros);
      bp.ln2_weight = add(p + "ln2.weight", {C}, ones);
      bp.ln2_bias = add(p + "ln2.bias", {C}, zeros);
      bp.mlp_fc_weight = add(p + "mlp.fc.weight", {FF, C}, normal);
      bp.mlp_fc_bias = add(p + "mlp.fc.bias", {FF}, zeros);
      bp.mlp_proj_weight = add(p + "mlp.proj.weight", {C, FF}, resid);
      bp.mlp_proj_bias = add(p + "mlp.proj.bias", {C}, zeros);
      bp.lora_qkv = add_adapters(be, s, p + "attn.qkv.weight");
      bp.lora_proj = add_adapters(be, s, p + "attn.proj.weight");
      bp.lora_fc = add_adapters(be, s, p + "mlp.fc.weight");
      bp.lora_mlp_proj = add_adapters(be, s, p + "mlp.proj.weight");
      blocks_.push_back(std::make_unique<GptBlock>(std::move(bp), shape, l));
    }
    lnf_weight_ = add("lnf.weight", {C}, ones);
    lnf_bias_ = add("lnf.bias", {C}, zeros);
    stem_params_ = {wte_};
    if (wpe_) stem_params_.push_back(wpe_);
    head_params_ = {lnf_weight_, lnf_bias_, wte_};  // the LM head is the tied embedding
  }

  std::string describe() const override {
    return fmt::format("gpt L={} H={} C={} V={} ({} positions)", m_.n_layer, m_.n_head, m_.n_embd,
                       m_.vocab_size, m_.position);
  }
  // lnf -> fused LM head + cross-entropy (which yields d lnf_out) -> lnf backward.
  void head_forward_backward(Backend& be, const Tensor& x, const Batch& batch, const Tensor& losses,
                             const Tensor& dx, const Tensor& predictions) override {
    MemoryPool& pool = be.pool();
    const int64_t N = B_ * T_, C = m_.n_embd;
    Buffer lnf = pool.allocate({N, C}, be.act_dtype(), MemCategory::Transient, "lnf");
    Buffer stats = pool.allocate({N, 2}, DType::F32, MemCategory::Transient, "lnf.stats");
    be.layernorm_forward({lnf, stats, x, lnf_weight_->value, lnf_bias_->value});
    Buffer dlnf = pool.allocate({N, C}, be.act_dtype(), MemCategory::Transient, "grad.lnf");
    lm_head_loss(be, lnf, *wte_, batch, losses, dlnf, predictions);  // the tied embedding
    lnf.reset();
    be.fill(dx, 0.0f);
    be.layernorm_backward(
        {dx, lnf_weight_->grad, lnf_bias_->grad, dlnf, x, lnf_weight_->value, stats});
  }

 private:
  ModelConfig m_;
  Param* lnf_weight_ = nullptr;
  Param* lnf_bias_ = nullptr;
};

class MlpModel : public Model {
 public:
  MlpModel(const ModelConfig& model, const ModelShape& s, Backend& be)
      : L_(model.n_layer), D_(model.n_embd) {
    B_ = s.batch_size;
    rows_all_ranks_ = B_ * s.data_ranks;
    params_.reserve(static_cast<size_t>(2 * L_));
    // He initialization keeps the relu stack's activations at unit scale.
    const ParamInit he{ParamInit::Normal, std::sqrt(2.0 / static_cast<double>(D_))};
    for (int64_t l = 0; l < L_; ++l) {
      params_.push_back(make_param(be, fmt::format("blocks.{}.fc.weight", l), {D_, D_}, he, s.seed,
                                   s.moments, s.weights_on_host));
      Param* w = &params_.back();
      params_.push_back(make_param(be, fmt::format("blocks.{}.fc.bias", l), {D_}, ParamInit{},
                                   s.seed, s.moments, s.weights_on_host));
      // Block 0's input is the data: stem_backward reads no gradient of it.
      blocks_.push_back(std::make_unique<MlpBlock>(w, &params_.back(), B_, D_, l > 0));
    }
  }
  std::string describe() const override { return fmt::format("mlp L={} D={}", L_, D_); }
  std::vector<int64_t> stream_shape() const override { return {B_, D_}; }
  int64_t loss_rows() const override { return B_; }
  int64_t loss_rows_all_ranks() const override { return rows_all_ranks_; }

  Buffer stem_forward(Backend& be, const Batch& batch, MemCategory category) override {
    Buffer x = be.pool().allocate(stream_shape(), be.act_dtype(), category, "blocks.0.x");
    be.copy(x, batch.inputs);
    return x;
  }
  // The stem is a copy of the data: no parameter, so block 0 computes no input gradient.
  void stem_backward(Backend&, const Batch&, const Tensor&) override {}
  void head_forward_backward(Backend& be, const Tensor& x, const Batch& batch, const Tensor& losses,
                             const Tensor& dx, const Tensor& predictions) override {
    REMAT_ASSERT(predictions.empty(), "the MLP's regression head predicts no tokens");
    const int64_t divisor = batch.step_targets > 0 ? batch.step_targets : rows_all_ranks_;
    be.mse_loss({losses, dx, x, batch.targets, 1.0f / static_cast<float>(divisor)});
  }

 private:
  int64_t L_, D_, B_ = 0;
  int64_t rows_all_ranks_ = 0;  // the mean's divisor (see detail::TokenModel)
};

}  // namespace

int64_t Model::n_params() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.value.tensor().numel();
  return n;
}

int64_t Model::n_trainable_params() const {
  int64_t n = 0;
  for (const auto& p : params_)
    if (p.trainable()) n += p.value.tensor().numel();
  return n;
}

std::vector<Param*> Model::block_params(size_t i) {
  const std::string prefix = fmt::format("blocks.{}.", i);
  std::vector<Param*> out;
  for (Param& p : params_)
    if (p.name.compare(0, prefix.size(), prefix) == 0) out.push_back(&p);
  return out;
}

std::unique_ptr<Model> make_model(const Config& cfg, Backend& be,
                                  parallel::RingChannel* ring_channel) {
  ModelShape shape = model_shape(cfg.train);
  shape.batch_size = local_batch_size(cfg);
  shape.data_ranks = cfg.parallel.data_ranks();
  shape.data_rank = cfg.parallel.data_rank();
  shape.context_ranks = static_cast<int>(cfg.parallel.context);
  shape.context_rank = cfg.parallel.context_rank();
  shape.ring_channel = ring_channel;
  shape.tile_tokens = cfg.remat.tile_tokens;
  shape.attention_chunk = cfg.remat.attention_chunk;
  if (cfg.parallel.shards_optimizer())
    shape.moments = MomentHome::Sharded;
  else if (cfg.remat.offloads_optimizer())
    shape.moments = MomentHome::Host;
  shape.weights_on_host = cfg.remat.offloads_weights();
  shape.mean_doc_tokens = cfg.data.documents() ? cfg.data.mean_document_tokens : 0;
  shape.lora = cfg.lora;
  return make_model(cfg.model, shape, be);
}

ModelShape model_shape(const TrainConfig& train) {
  ModelShape shape;
  shape.batch_size = train.batch_size;
  shape.seq_len = train.seq_len;
  shape.seed = train.seed;
  shape.loss_chunk = train.loss_chunk;
  return shape;
}

std::unique_ptr<Model> make_model(const ModelConfig& model, const ModelShape& shape, Backend& be) {
  if (model.kind == ModelKind::Mlp) return std::make_unique<MlpModel>(model, shape, be);
  if (model.kind == ModelKind::Llama) return make_llama_model(model, shape, be);
  return std::make_unique<GptModel>(model, shape, be);
}

}  // namespace remat
