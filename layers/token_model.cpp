// TokenModel (see layers/token_model.h).
#include "layers/token_model.h"

#include "engine/core/error.h"

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
  params_.push_back(make_param(be, name, shape, init, s.seed, s.moments, s.weights_on_host));
  return &params_.back();
}

Buffer TokenModel::stem_forward(Backend& be, const Batch& batch, MemCategory category) {
  Buffer x = be.pool().allocate(stream_shape(), be.act_dtype(), category, "blocks.0.x");
  be.embedding_forward({x, batch.inputs, wte_->value, wpe_ ? wpe_->value.tensor() : Tensor()});
  return x;
}

void TokenModel::stem_backward(Backend& be, const Batch& batch, const Tensor& dx) {
  be.embedding_backward({wte_->grad, wpe_ ? wpe_->grad.tensor() : Tensor(), dx, batch.inputs});
}

void TokenModel::lm_head_loss(Backend& be, const Tensor& normed, Param& head, const Batch& batch,
                              const Tensor& losses, const Tensor& dnormed,
                              const Tensor& predictions) {
  const int64_t N = B_ * T_;
  be.lm_head_loss({losses, dnormed, head.grad, normed, head.value, batch.targets.tensor().view({N}),
                   1.0f / static_cast<float>(loss_rows_all_ranks_), loss_chunk_, predictions});
}

}  // namespace remat::detail
