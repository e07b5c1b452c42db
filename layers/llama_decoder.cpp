// LlamaDecoder (see layers/llama_decoder.h), and make_decoder (layers/decoder.h). A block of rows
// (a prompt's, up to kDecoderBlockRows; one for each generated token) goes through the model
// layer by layer: every Linear is decoder_matmul (y = x W^T, as the training forward computes
// it, each output one fixed-order dot product), attention is each row's queries against the
// cached keys of the key/value head they share. The products are plain loops for the reason
// layers/gpt_decoder.cpp gives (a threaded BLAS call per token costs more in barriers than the
// arithmetic of a small model); a product runs on several threads only when it is large enough.
// The products, the RoPE table, the attention over the cache and the weight loading are
// layers/decoder_common.h's, shared with the GPT's decoder.
#include "layers/llama_decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "engine/core/error.h"
#include "engine/core/ops/rope.h"
#include "layers/gpt_decoder.h"

namespace remat {
namespace {

using detail::decoder_matmul;

// As engine/cpu/rmsnorm.cpp: the statistic in float, then x * rstd * w.
void rmsnorm(float* y, const float* x, const float* w, int64_t n, float eps) {
  float ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float rstd = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * rstd * w[i];
}

}  // namespace

LlamaDecoder::LlamaDecoder(const ModelConfig& model, const WeightSource& weights,
                           int64_t max_positions, int64_t parallel_macs)
    : m_(model), capacity_(max_positions), parallel_macs_(parallel_macs) {
  if (m_.kind != ModelKind::Llama)
    throw ConfigError(fmt::format(
        "[sample] model.kind = \"{}\": LlamaDecoder runs model.kind = \"llama\"", m_.kind));
  C_ = m_.n_embd;
  NH_ = m_.n_head;
  KVH_ = m_.kv_heads();
  HS_ = m_.head_size();
  FF_ = m_.ff();
  V_ = m_.vocab_size;
  eps_ = static_cast<float>(m_.norm_eps);  // the model's ops take it as float
  REMAT_ASSERT(capacity_ > 0 && NH_ % KVH_ == 0 && HS_ % 2 == 0,
               "LlamaDecoder: capacity {}, {} query heads on {} key/value heads of size {}",
               capacity_, NH_, KVH_, HS_);
  load(weights);
  // The training attention's frequencies: theta rounded to float (the block passes it so), then
  // engine/core/ops/rope.h's scaling. Dynamic NTK scales its base for the whole cache, as a
  // training forward of that length does (transformers' generate grows it with the text instead).
  RopeScaling scaling = m_.rope_scaling;
  scaling.seq_len = capacity_;
  rope_ = detail::RopeTable(
      rope_angles(HS_, static_cast<double>(static_cast<float>(m_.rope_theta)), scaling), capacity_);
  for (Layer& l : layers_) {
    l.k_cache.assign(static_cast<size_t>(capacity_ * KVH_ * HS_), 0.0f);
    l.v_cache.assign(static_cast<size_t>(capacity_ * KVH_ * HS_), 0.0f);
  }
  const auto rows = static_cast<size_t>(std::min(capacity_, detail::kDecoderBlockRows));
  x_.resize(rows * static_cast<size_t>(C_));
  h_.resize(rows * static_cast<size_t>(C_));
  qkv_.resize(rows * static_cast<size_t>((NH_ + 2 * KVH_) * HS_));
  att_.resize(rows * static_cast<size_t>(NH_ * HS_));
  gate_.resize(rows * static_cast<size_t>(FF_));
  up_.resize(rows * static_cast<size_t>(FF_));
  scratch_threads_ = detail::cache_attention_threads();
  scores_.resize(detail::cache_attention_scratch(scratch_threads_, capacity_));
}

void LlamaDecoder::load(const WeightSource& weights) {
  auto get = [&](const std::string& name, const std::vector<int64_t>& want) {
    return detail::load_decoder_weight(weights, name, want);
  };
  const int64_t W = (NH_ + 2 * KVH_) * HS_;
  wte_ = get("wte", {V_, C_});
  for (int64_t i = 0; i < m_.n_layer; ++i) {
    const std::string p = fmt::format("blocks.{}.", i);
    Layer l;
    l.norm1_w = get(p + "norm1.weight", {C_});
    l.qkv_w = get(p + "attn.qkv.weight", {W, C_});
    if (m_.attention_bias) l.qkv_b = get(p + "attn.qkv.bias", {W});
    if (m_.qk_norm) {
      l.q_norm_w = get(p + "attn.q_norm.weight", {HS_});
      l.k_norm_w = get(p + "attn.k_norm.weight", {HS_});
    }
    l.proj_w = get(p + "attn.proj.weight", {C_, NH_ * HS_});
    l.norm2_w = get(p + "norm2.weight", {C_});
    l.gate_w = get(p + "mlp.gate.weight", {FF_, C_});
    l.up_w = get(p + "mlp.up.weight", {FF_, C_});
    l.down_w = get(p + "mlp.down.weight", {C_, FF_});
    layers_.push_back(std::move(l));
  }
  normf_w_ = get("normf.weight", {C_});
  if (!m_.tie_embeddings) lm_head_ = get("lm_head.weight", {V_, C_});
}

// x += o_proj(attention(rope(qk_norm(qkv(rmsnorm1 x))))); x += down(silu(gate n) * up n),
// n = rmsnorm2 x, for each of the block's rows. The rows' k (normed, rotated) and v enter the
// cache before the attention, which lets row p see positions up to pos_ + p only.
void LlamaDecoder::block(Layer& l, float* x, int64_t rows) {
  const int64_t W = (NH_ + 2 * KVH_) * HS_;
  for (int64_t r = 0; r < rows; ++r) rmsnorm(&h_[r * C_], x + r * C_, l.norm1_w.data(), C_, eps_);
  decoder_matmul(qkv_.data(), l.qkv_b.empty() ? nullptr : l.qkv_b.data(), 0, l.qkv_w.data(),
                 h_.data(), rows, W, C_, parallel_macs_);
  for (int64_t r = 0; r < rows; ++r) {
    float* q = &qkv_[r * W];
    float* k = q + NH_ * HS_;
    const float* v = k + KVH_ * HS_;
    for (int64_t h = 0; h < NH_ + KVH_; ++h) {  // q heads, then k heads: contiguous in the row
      float* head = q + h * HS_;
      if (m_.qk_norm)  // in place: each element reads only itself after the statistic
        rmsnorm(head, head, (h < NH_ ? l.q_norm_w : l.k_norm_w).data(), HS_, eps_);
      rope_.rotate(head, pos_ + r);
    }
    std::copy(k, k + KVH_ * HS_, l.k_cache.begin() + (pos_ + r) * KVH_ * HS_);
    std::copy(v, v + KVH_ * HS_, l.v_cache.begin() + (pos_ + r) * KVH_ * HS_);
  }
  detail::cache_attention({.out = att_.data(),
                           .scores = scores_.data(),
                           .q = qkv_.data(),
                           .q_stride = W,
                           .k_cache = l.k_cache.data(),
                           .v_cache = l.v_cache.data(),
                           .first_pos = pos_,
                           .rows = rows,
                           .NH = NH_,
                           .KVH = KVH_,
                           .HS = HS_,
                           .capacity = capacity_,
                           .scratch_threads = scratch_threads_},
                          parallel_macs_);
  // x += o_proj(att): the sum's base is the residual itself.
  decoder_matmul(x, x, C_, l.proj_w.data(), att_.data(), rows, C_, NH_ * HS_, parallel_macs_);
  for (int64_t r = 0; r < rows; ++r) rmsnorm(&h_[r * C_], x + r * C_, l.norm2_w.data(), C_, eps_);
  decoder_matmul(gate_.data(), nullptr, 0, l.gate_w.data(), h_.data(), rows, FF_, C_,
                 parallel_macs_);
  decoder_matmul(up_.data(), nullptr, 0, l.up_w.data(), h_.data(), rows, FF_, C_, parallel_macs_);
  for (int64_t i = 0; i < rows * FF_; ++i) {  // as engine/cpu/swiglu.cpp: g * sigmoid(g) * u
    const float g = gate_[static_cast<size_t>(i)];
    const float s = 1.0f / (1.0f + std::exp(-g));
    gate_[static_cast<size_t>(i)] = g * s * up_[static_cast<size_t>(i)];
  }
  decoder_matmul(x, x, C_, l.down_w.data(), gate_.data(), rows, C_, FF_, parallel_macs_);
}

std::vector<float> LlamaDecoder::run(const int32_t* tokens, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r)
    std::copy(wte_.begin() + tokens[r] * C_, wte_.begin() + (tokens[r] + 1) * C_,
              x_.begin() + r * C_);
  for (Layer& l : layers_) block(l, x_.data(), rows);
  pos_ += rows;
  // The head of the last row only: the logits after the block.
  rmsnorm(h_.data(), &x_[(rows - 1) * C_], normf_w_.data(), C_, eps_);
  std::vector<float> logits(static_cast<size_t>(V_));
  decoder_matmul(logits.data(), nullptr, 0, (lm_head_.empty() ? wte_ : lm_head_).data(), h_.data(),
                 1, V_, C_, parallel_macs_);
  return logits;
}

std::vector<float> LlamaDecoder::forward(int32_t token) {
  detail::check_next_token(pos_, capacity_, token, V_);
  return run(&token, 1);
}

std::vector<float> LlamaDecoder::prefill(const std::vector<int32_t>& tokens) {
  return detail::prefill_in_blocks(tokens, pos_, capacity_, V_,
                                   [this](const int32_t* t, int64_t n) { return run(t, n); });
}

std::unique_ptr<Decoder> make_decoder(const ModelConfig& model, const WeightSource& weights,
                                      int64_t max_positions, int64_t parallel_macs) {
  if (model.kind == ModelKind::Gpt)
    return std::make_unique<GptDecoder>(model, weights, max_positions, parallel_macs);
  if (model.kind == ModelKind::Llama)
    return std::make_unique<LlamaDecoder>(model, weights, max_positions, parallel_macs);
  throw ConfigError(fmt::format(
      "[sample] model.kind = \"{}\" has no decoder: only gpt and llama models generate text",
      model.kind));
}

}  // namespace remat
