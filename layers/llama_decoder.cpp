// LlamaDecoder (see layers/llama_decoder.h), and make_decoder (layers/decoder.h). One token is a
// column vector through the model: every Linear is a matrix-vector product (y = W x, as the
// training forward computes x W^T), attention is one query per head against the cached keys of
// the key/value head it shares. The products are plain loops for the reason
// layers/gpt_decoder.cpp gives (a threaded BLAS call per token costs more in barriers than the
// arithmetic of a small model); a product runs on several threads only when it is large enough.
#include "layers/llama_decoder.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "engine/error.h"
#include "engine/ops/rope.h"
#include "layers/gpt_decoder.h"

namespace remat {
namespace {

// y[o] = W[o, :] . x for o < out, W (out, in) row-major, plus bias[o] when given. Each y[o] is
// one dot product in a fixed order, so the result does not depend on the thread count.
void gemv(float* y, const float* W, const float* x, const float* bias, int64_t out, int64_t in,
          int64_t parallel_macs) {
#pragma omp parallel for schedule(static) if (out * in >= parallel_macs)
  for (int64_t o = 0; o < out; ++o) {
    const float* w = W + o * in;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < in; ++i) s += w[i] * x[i];
    y[o] = bias ? s + bias[o] : s;
  }
}

// As engine/cpu/rmsnorm.cpp: the statistic in float, then x * rstd * w.
void rmsnorm(float* y, const float* x, const float* w, int64_t n, float eps) {
  float ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float rstd = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * rstd * w[i];
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
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
  fill_rope_table();
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
  // A checkpoint whose tensors disagree with its own config is corrupt or hand-edited; reading it
  // anyway would index out of bounds, so every shape is checked before use.
  auto get = [&](const std::string& name, std::vector<int64_t> want) {
    std::vector<int64_t> shape;
    std::vector<float> w = weights(name, &shape);
    if (shape != want || static_cast<int64_t>(w.size()) != numel(want))
      throw CheckpointError(fmt::format(
          "[sample] tensor {} has shape [{}] ({} values), but the model config needs [{}]. Fix: "
          "sample from a checkpoint written by remat-train, whose state.json config matches its "
          "weights",
          name, fmt::join(shape, ", "), w.size(), fmt::join(want, ", ")));
    return w;
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

// The training attention's table: theta rounded to float (the block passes it so), the scaled
// frequencies of engine/ops/rope.h, angles in double, cos and sin rounded to float.
void LlamaDecoder::fill_rope_table() {
  const int64_t half = HS_ / 2;
  const std::vector<double> inv_freq =
      rope_inv_freq(HS_, static_cast<double>(static_cast<float>(m_.rope_theta)), m_.rope_scaling);
  rope_cos_.resize(static_cast<size_t>(capacity_ * half));
  rope_sin_.resize(static_cast<size_t>(capacity_ * half));
  for (int64_t t = 0; t < capacity_; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double ang = static_cast<double>(t) * inv_freq[static_cast<size_t>(i)];
      rope_cos_[static_cast<size_t>(t * half + i)] = static_cast<float>(std::cos(ang));
      rope_sin_[static_cast<size_t>(t * half + i)] = static_cast<float>(std::sin(ang));
    }
}

// rotate_half layout: element i pairs with i + HS/2.
void LlamaDecoder::rope(float* v) const {
  const int64_t half = HS_ / 2;
  const float* cs = rope_cos_.data() + pos_ * half;
  const float* sn = rope_sin_.data() + pos_ * half;
  for (int64_t i = 0; i < half; ++i) {
    const float a = v[i], b = v[i + half];
    v[i] = a * cs[i] - b * sn[i];
    v[i + half] = a * sn[i] + b * cs[i];
  }
}

// One query per head against cached positions 0..pos_ (the current one included): causal by
// construction. Query head h reads key/value head h / (NH / KVH), transformers' repeat_kv order.
void LlamaDecoder::attention(const Layer& l, const float* q, float* out) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS_));
  const int64_t n = pos_ + 1, group = NH_ / KVH_, kv_row = KVH_ * HS_;
  // Query heads are independent (each has its own row of scores), so long caches split across
  // threads.
#pragma omp parallel for schedule(static) if (2 * n * NH_ * HS_ >= parallel_macs_)
  for (int64_t h = 0; h < NH_; ++h) {
    const float* qh = q + h * HS_;
    const int64_t kv = (h / group) * HS_;
    float* sc = scores_.data() + h * capacity_;
    float mx = -INFINITY;
    for (int64_t t = 0; t < n; ++t) {
      const float* k = l.k_cache.data() + t * kv_row + kv;
      float s = 0;
      for (int64_t c = 0; c < HS_; ++c) s += qh[c] * k[c];
      sc[t] = s * scale;
      mx = std::max(mx, sc[t]);
    }
    // Subtracting the max keeps exp() in range for any score magnitude.
    float sum = 0;
    for (int64_t t = 0; t < n; ++t) {
      sc[t] = std::exp(sc[t] - mx);
      sum += sc[t];
    }
    float* oh = out + h * HS_;
    std::fill(oh, oh + HS_, 0.0f);
    for (int64_t t = 0; t < n; ++t) {
      const float p = sc[t] / sum;
      const float* v = l.v_cache.data() + t * kv_row + kv;
      for (int64_t c = 0; c < HS_; ++c) oh[c] += p * v[c];
    }
  }
}

// x += o_proj(attention(rope(qk_norm(qkv(rmsnorm1 x))))); x += down(silu(gate n) * up n),
// n = rmsnorm2 x. The new position's k (normed, rotated) and v enter the cache on the way.
void LlamaDecoder::block(Layer& l, std::vector<float>& x) {
  rmsnorm(h_.data(), x.data(), l.norm1_w.data(), C_, eps_);
  const int64_t W = (NH_ + 2 * KVH_) * HS_;
  gemv(qkv_.data(), l.qkv_w.data(), h_.data(), l.qkv_b.empty() ? nullptr : l.qkv_b.data(), W, C_,
       parallel_macs_);
  float* q = qkv_.data();
  float* k = q + NH_ * HS_;
  const float* v = k + KVH_ * HS_;
  for (int64_t h = 0; h < NH_ + KVH_; ++h) {  // q heads, then k heads: contiguous in the row
    float* head = q + h * HS_;
    if (m_.qk_norm)  // in place: each element reads only itself after the statistic
      rmsnorm(head, head, (h < NH_ ? l.q_norm_w : l.k_norm_w).data(), HS_, eps_);
    rope(head);
  }
  std::copy(k, k + KVH_ * HS_, l.k_cache.begin() + pos_ * KVH_ * HS_);
  std::copy(v, v + KVH_ * HS_, l.v_cache.begin() + pos_ * KVH_ * HS_);
  attention(l, q, att_.data());
  gemv(delta_.data(), l.proj_w.data(), att_.data(), nullptr, C_, NH_ * HS_, parallel_macs_);
  for (int64_t c = 0; c < C_; ++c) x[static_cast<size_t>(c)] += delta_[static_cast<size_t>(c)];
  rmsnorm(h_.data(), x.data(), l.norm2_w.data(), C_, eps_);
  gemv(gate_.data(), l.gate_w.data(), h_.data(), nullptr, FF_, C_, parallel_macs_);
  gemv(up_.data(), l.up_w.data(), h_.data(), nullptr, FF_, C_, parallel_macs_);
  for (int64_t i = 0; i < FF_; ++i) {  // as engine/cpu/swiglu.cpp: g * sigmoid(g) * u
    const float g = gate_[static_cast<size_t>(i)];
    const float s = 1.0f / (1.0f + std::exp(-g));
    gate_[static_cast<size_t>(i)] = g * s * up_[static_cast<size_t>(i)];
  }
  gemv(delta_.data(), l.down_w.data(), gate_.data(), nullptr, C_, FF_, parallel_macs_);
  for (int64_t c = 0; c < C_; ++c) x[static_cast<size_t>(c)] += delta_[static_cast<size_t>(c)];
}

std::vector<float> LlamaDecoder::forward(int32_t token) {
  if (pos_ >= capacity_)
    throw Error(fmt::format("[sample] position {} is past the decoder's cache of {} positions",
                            pos_, capacity_));
  if (token < 0 || token >= V_)
    throw DataError(
        fmt::format("[sample] token {} is outside the model's vocabulary of {}", token, V_));
  std::vector<float> x(wte_.begin() + token * C_, wte_.begin() + (token + 1) * C_);
  for (Layer& l : layers_) block(l, x);
  ++pos_;
  rmsnorm(h_.data(), x.data(), normf_w_.data(), C_, eps_);
  std::vector<float> logits(static_cast<size_t>(V_));
  gemv(logits.data(), (lm_head_.empty() ? wte_ : lm_head_).data(), h_.data(), nullptr, V_, C_,
       parallel_macs_);
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
