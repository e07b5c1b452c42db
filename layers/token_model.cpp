// TokenModel (see layers/token_model.h).
#include "layers/token_model.h"

#include <cmath>

#include "engine/core/error.h"
#include "engine/core/rng.h"

namespace remat::detail {

TokenModel::TokenModel(const ModelShape& s, int64_t n_embd, int64_t vocab_size) : n_embd_(n_embd) {
  B_ = s.batch_size;
  if (s.context_ranks > 1)
    ring_ = std::make_unique<parallel::ContextRing>(s.ring_channel, s.context_ranks, s.context_rank,
                                                    s.seq_len);
  T_ = ring_ ? ring_->positions().tokens() : s.seq_len;  // this rank's tokens of each row
  loss_rows_all_ranks_ = B_ * s.seq_len * s.data_ranks;
  loss_chunk_ = s.loss_chunk > 0 ? s.loss_chunk : default_loss_chunk_rows(B_ * T_, vocab_size);
}

Param* TokenModel::add_param(Backend& be, const ModelShape& s, const std::string& name,
                             const std::vector<int64_t>& shape, ParamInit init) {
  REMAT_ASSERT(params_.size() < params_.capacity(),
               "TokenModel: params_ must be reserved (adding {} would move the others)", name);
  const bool frozen = lora_ && !trainable_base_.count(name);
  const auto stored = stored_dtype_.find(name);
  const DType dtype = stored == stored_dtype_.end() ? DType::F32 : stored->second;
  params_.push_back(
      make_param(be, name, shape, init, s.seed, s.moments, s.weights_on_host, frozen, dtype));
  return &params_.back();
}

void TokenModel::plan_lora(const ModelConfig& m, const ModelShape& s) {
  lora_ = s.lora.enabled();
  if (!lora_) return;
  // The config was validated: the names select linears and whole modules (engine/config/lora.h).
  sites_ = lora::select_sites(m, s.lora.targets).sites;
  for (const lora::SavedModule& mod : lora::select_saved(m, s.lora.modules_to_save).modules)
    trainable_base_.insert(mod.params.begin(), mod.params.end());
  // lora.base below fp32: every linear weight of the blocks (adapted or not; none trains whole)
  // as lora.base says, as transformers' load_in_4bit quantises them; the frozen token table and
  // LM head in bf16, the dtype load_in_4bit keeps them in (with an 8B model's 128K vocabulary
  // they are 2 GiB each in f32). Norms, biases and learned positions stay f32: they are small.
  if (const DType base = lora::base_dtype(s.lora); base != DType::F32) {
    for (const lora::Site& site : lora::all_sites(m)) stored_dtype_[site.base] = base;
    for (const char* table : {"wte", "lm_head.weight"})
      if (!trainable_base_.count(table)) stored_dtype_[table] = DType::BF16;
  }
  lora_shared_.scale = static_cast<float>(lora::scaling(s.lora));
  lora_shared_.dropout = static_cast<float>(s.lora.dropout);
  lora_shared_.seed = s.seed;
  // As the GPT block's dropout: a data-parallel rank draws the masks of its rows of the whole
  // batch, a context rank (whose tokens are not contiguous) a stream of its own.
  lora_shared_.first_row = ring_ ? 0 : s.data_rank * B_ * T_;
  lora_shared_.salt = ring_ ? mix64(0x6c6f7261ull + static_cast<uint64_t>(s.context_rank)) : 0;
}

std::vector<LoraAdapter> TokenModel::add_adapters(Backend& be, const ModelShape& s,
                                                  const std::string& base) {
  std::vector<LoraAdapter> out;
  for (size_t i = 0; i < sites_.size(); ++i) {
    const lora::Site& site = sites_[i];
    if (site.base != base) continue;
    const int64_t r = s.lora.rank;
    const ParamInit kaiming{ParamInit::Uniform, 1.0 / std::sqrt(static_cast<double>(site.in))};
    REMAT_ASSERT(params_.size() + 2 <= params_.capacity(),
                 "TokenModel: params_ must be reserved for the adapters of {}", base);
    params_.push_back(
        make_param(be, site.a_name, {r, site.in}, kaiming, s.seed, s.moments, s.weights_on_host));
    Param* a = &params_.back();
    params_.push_back(make_param(be, site.b_name, {site.rows, r}, ParamInit{}, s.seed, s.moments,
                                 s.weights_on_host));
    out.push_back({a, &params_.back(), site.row0, i});
  }
  return out;
}

Buffer TokenModel::stem_forward(Backend& be, const Batch& batch, MemCategory category) {
  doc_start_ = batch.doc_start.empty() ? Tensor{} : batch.doc_start.tensor();
  Buffer x = be.pool().allocate(stream_shape(), be.act_dtype(), category, "blocks.0.x");
  be.embedding_forward(
      {x, batch.inputs, wte_->value, wpe_ ? wpe_->value.tensor() : Tensor(), doc_start_});
  return x;
}

void TokenModel::stem_backward(Backend& be, const Batch& batch, const Tensor& dx) {
  const Tensor& dwte = wte_->grad;  // empty when frozen (LoRA)
  const Tensor dwpe = wpe_ ? wpe_->grad.tensor() : Tensor();
  if (dwte.empty() && dwpe.empty()) return;  // a frozen stem: no gradient to make
  be.embedding_backward({dwte, dwpe, dx, batch.inputs, doc_start_});
}

void TokenModel::lm_head_loss(Backend& be, const Tensor& normed, Param& head, const Batch& batch,
                              const Tensor& losses, const Tensor& dnormed,
                              const Tensor& predictions) {
  const int64_t N = B_ * T_;
  const int64_t divisor = batch.step_targets > 0 ? batch.step_targets : loss_rows_all_ranks_;
  be.lm_head_loss({losses, dnormed, head.grad, normed, head.value, batch.targets.tensor().view({N}),
                   1.0f / static_cast<float>(divisor), loss_chunk_, predictions});
}

}  // namespace remat::detail
