// LlamaDecoder (see layers/llama_decoder.h), and make_decoder (layers/decoder.h). One token is a
// column vector through the model: every Linear is a matrix-vector product (y = W x, as the
// training forward computes x W^T), attention is one query per head against the cached keys of
// the key/value head it shares. The products are plain loops for the reason
// layers/gpt_decoder.cpp gives (a threaded BLAS call per token costs more in barriers than the
// arithmetic of a small model); a product runs on several threads only when it is large enough.
// The product, the RoPE table, the attention over the cache and the weight loading are
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

using detail::decoder_gemv;

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
  h_.resize(static_cast<size_t>(C_));
  qkv_.resize(static_cast<size_t>((NH_ + 2 * KVH_) * HS_));
  att_.resize(static_cast<size_t>(NH_ * HS_));
  gate_.resize(static_cast<size_t>(FF_));
  up_.resize(static_cast<size_t>(FF_));
  delta_.resize(static_cast<size_t>(C_));
  scores_.resize(static_cast<size_t>(NH_ * capacity_));
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
// n = rmsnorm2 x. The new position's k (normed, rotated) and v enter the cache on the way.
void LlamaDecoder::block(Layer& l, std::vector<float>& x) {
  rmsnorm(h_.data(), x.data(), l.norm1_w.data(), C_, eps_);
  const int64_t W = (NH_ + 2 * KVH_) * HS_;
  decoder_gemv(qkv_.data(), l.qkv_b.empty() ? nullptr : l.qkv_b.data(), l.qkv_w.data(), h_.data(),
               W, C_, parallel_macs_);
  float* q = qkv_.data();
  float* k = q + NH_ * HS_;
  const float* v = k + KVH_ * HS_;
  for (int64_t h = 0; h < NH_ + KVH_; ++h) {  // q heads, then k heads: contiguous in the row
    float* head = q + h * HS_;
    if (m_.qk_norm)  // in place: each element reads only itself after the statistic
      rmsnorm(head, head, (h < NH_ ? l.q_norm_w : l.k_norm_w).data(), HS_, eps_);
    rope_.rotate(head, pos_);
  }
  std::copy(k, k + KVH_ * HS_, l.k_cache.begin() + pos_ * KVH_ * HS_);
  std::copy(v, v + KVH_ * HS_, l.v_cache.begin() + pos_ * KVH_ * HS_);
  detail::cache_attention({.out = att_.data(),
                           .scores = scores_.data(),
                           .q = q,
                           .k_cache = l.k_cache.data(),
                           .v_cache = l.v_cache.data(),
                           .n_pos = pos_ + 1,
                           .NH = NH_,
                           .KVH = KVH_,
                           .HS = HS_,
                           .capacity = capacity_},
                          parallel_macs_);
  decoder_gemv(delta_.data(), nullptr, l.proj_w.data(), att_.data(), C_, NH_ * HS_, parallel_macs_);
  for (int64_t c = 0; c < C_; ++c) x[static_cast<size_t>(c)] += delta_[static_cast<size_t>(c)];
  rmsnorm(h_.data(), x.data(), l.norm2_w.data(), C_, eps_);
  decoder_gemv(gate_.data(), nullptr, l.gate_w.data(), h_.data(), FF_, C_, parallel_macs_);
  decoder_gemv(up_.data(), nullptr, l.up_w.data(), h_.data(), FF_, C_, parallel_macs_);
  for (int64_t i = 0; i < FF_; ++i) {  // as engine/cpu/swiglu.cpp: g * sigmoid(g) * u
    const float g = gate_[static_cast<size_t>(i)];
    const float s = 1.0f / (1.0f + std::exp(-g));
    gate_[static_cast<size_t>(i)] = g * s * up_[static_cast<size_t>(i)];
  }
  decoder_gemv(delta_.data(), nullptr, l.down_w.data(), gate_.data(), C_, FF_, parallel_macs_);
  for (int64_t c = 0; c < C_; ++c) x[static_cast<size_t>(c)] += delta_[static_cast<size_t>(c)];
}

std::vector<float> LlamaDecoder::forward(int32_t token) {
  detail::check_next_token(pos_, capacity_, token, V_);
  std::vector<float> x(wte_.begin() + token * C_, wte_.begin() + (token + 1) * C_);
  for (Layer& l : layers_) block(l, x);
  ++pos_;
  rmsnorm(h_.data(), x.data(), normf_w_.data(), C_, eps_);
  std::vector<float> logits(static_cast<size_t>(V_));
  decoder_gemv(logits.data(), nullptr, (lm_head_.empty() ? wte_ : lm_head_).data(), h_.data(), V_,
               C_, parallel_macs_);
  return logits;
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
