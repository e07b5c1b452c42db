// GptDecoder (see layers/gpt_decoder.h). A block of rows (a prompt's, up to kDecoderBlockRows;
// one for each generated token) goes through the model layer by layer: every Linear is
// decoder_matmul (y = x W^T + b, as the training forward computes it), attention is each row's
// queries against the cached keys of each head.
//
// The products are decoder_matmul's own loops, not a BLAS: each output is one fixed-order dot
// product, so a prompt's block gives its rows the bits of one token at a time; and at one token,
// where the product is bound by reading the weights, OpenBLAS threads every call, which for a
// small model costs more in OpenMP barriers than the arithmetic (measured: 60 tokens of a C = 64
// model took 6 s instead of 6 ms on a loaded 2-core machine). Here a product runs on several
// threads only when it is large enough to pay for the parallel region. The product, the RoPE table,
// the attention over the cache and the weight loading are layers/decoder_common.h's, shared with
// the Llama family's decoder.
#include "layers/gpt_decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "engine/core/error.h"
#include "engine/core/ops/rope.h"

namespace remat {
namespace {

// As engine/cpu/layernorm.cpp: eps 1e-5, biased variance.
constexpr float kLayerNormEps = 1e-5f;
// As engine/cpu/cpu_backend.cpp: GELU's tanh approximation, sqrt(2/pi).
constexpr float kGeluScale = 0.7978845608028654f;

void layernorm(float* y, const float* x, const std::vector<float>& w, const std::vector<float>& b,
               int64_t C) {
  float sum = 0;
  for (int64_t c = 0; c < C; ++c) sum += x[c];
  const float mean = sum / static_cast<float>(C);
  float var = 0;
  for (int64_t c = 0; c < C; ++c) var += (x[c] - mean) * (x[c] - mean);
  const float rstd = 1.0f / std::sqrt(var / static_cast<float>(C) + kLayerNormEps);
  for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - mean) * rstd * w[c] + b[c];
}

// y {=, +=} x W^T + b for each of `rows` rows: PyTorch's Linear. Accumulating, the bias joins y
// first, then the product.
void linear(float* y, const float* x, const std::vector<float>& W, const std::vector<float>& b,
            int64_t rows, int64_t out, int64_t in, bool accumulate, int64_t parallel_macs) {
  if (accumulate)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o) y[r * out + o] += b[static_cast<size_t>(o)];
  detail::decoder_matmul(y, accumulate ? y : b.data(), accumulate ? out : 0, W.data(), x, rows, out,
                         in, parallel_macs);
}

void gelu(float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = v[i];
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    v[i] = 0.5f * x * (1.0f + std::tanh(u));
  }
}

}  // namespace

GptDecoder::GptDecoder(const ModelConfig& model, const WeightSource& weights, int64_t max_positions,
                       int64_t parallel_macs)
    : m_(model), parallel_macs_(parallel_macs) {
  if (m_.kind != ModelKind::Gpt)
    throw ConfigError(
        fmt::format("[sample] model.kind = \"{}\": only GPT models generate text", m_.kind));
  C_ = m_.n_embd;
  NH_ = m_.n_head;
  HS_ = C_ / NH_;
  FF_ = m_.ff();
  V_ = m_.vocab_size;
  learned_ = m_.position == PositionKind::Learned;
  capacity_ = learned_ ? std::min(max_positions, m_.n_ctx) : max_positions;
  REMAT_ASSERT(capacity_ > 0, "GptDecoder: capacity {} (max_positions {})", capacity_,
               max_positions);
  load(weights);
  // theta rounded to float first, as the training model passes it; no frequency scaling.
  if (!learned_)
    rope_ = detail::RopeTable(
        rope_angles(HS_, static_cast<double>(static_cast<float>(m_.rope_theta))), capacity_);
  for (Layer& l : layers_) {
    l.k_cache.assign(static_cast<size_t>(capacity_ * C_), 0.0f);
    l.v_cache.assign(static_cast<size_t>(capacity_ * C_), 0.0f);
  }
  const auto rows = static_cast<size_t>(std::min(capacity_, detail::kDecoderBlockRows));
  x_.resize(rows * static_cast<size_t>(C_));
  h_.resize(rows * static_cast<size_t>(C_));
  qkv_.resize(rows * static_cast<size_t>(3 * C_));
  att_.resize(rows * static_cast<size_t>(C_));
  fc_.resize(rows * static_cast<size_t>(FF_));
  scratch_threads_ = detail::cache_attention_threads();
  scores_.resize(detail::cache_attention_scratch(scratch_threads_, capacity_));
}

void GptDecoder::load(const WeightSource& weights) {
  auto get = [&](const std::string& name, const std::vector<int64_t>& want) {
    return detail::load_decoder_weight(weights, name, want);
  };
  wte_ = get("wte", {V_, C_});
  if (learned_) wpe_ = get("wpe", {m_.n_ctx, C_});
  for (int64_t i = 0; i < m_.n_layer; ++i) {
    const std::string p = fmt::format("blocks.{}.", i);
    Layer l;
    l.ln1_w = get(p + "ln1.weight", {C_});
    l.ln1_b = get(p + "ln1.bias", {C_});
    l.qkv_w = get(p + "attn.qkv.weight", {3 * C_, C_});
    l.qkv_b = get(p + "attn.qkv.bias", {3 * C_});
    l.proj_w = get(p + "attn.proj.weight", {C_, C_});
    l.proj_b = get(p + "attn.proj.bias", {C_});
    l.ln2_w = get(p + "ln2.weight", {C_});
    l.ln2_b = get(p + "ln2.bias", {C_});
    l.fc_w = get(p + "mlp.fc.weight", {FF_, C_});
    l.fc_b = get(p + "mlp.fc.bias", {FF_});
    l.mlp_proj_w = get(p + "mlp.proj.weight", {C_, FF_});
    l.mlp_proj_b = get(p + "mlp.proj.bias", {C_});
    layers_.push_back(std::move(l));
  }
  lnf_w_ = get("lnf.weight", {C_});
  lnf_b_ = get("lnf.bias", {C_});
}

// Pre-LN block on each of the block's residual rows x (updated in place): x += proj(attn(ln1 x));
// x += proj(gelu(fc(ln2 x))). The rows' k (rotated) and v enter the cache before the attention,
// which lets row p see positions up to pos_ + p only.
void GptDecoder::block(Layer& l, float* x, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) layernorm(&h_[r * C_], x + r * C_, l.ln1_w, l.ln1_b, C_);
  linear(qkv_.data(), h_.data(), l.qkv_w, l.qkv_b, rows, 3 * C_, C_, false, parallel_macs_);
  for (int64_t r = 0; r < rows; ++r) {
    float* q = &qkv_[r * 3 * C_];
    float* k = q + C_;
    const float* v = q + 2 * C_;
    if (!learned_)
      for (int64_t h = 0; h < NH_; ++h) {
        rope_.rotate(q + h * HS_, pos_ + r);
        rope_.rotate(k + h * HS_, pos_ + r);
      }
    std::copy(k, k + C_, l.k_cache.begin() + (pos_ + r) * C_);
    std::copy(v, v + C_, l.v_cache.begin() + (pos_ + r) * C_);
  }
  detail::cache_attention({.out = att_.data(),
                           .scores = scores_.data(),
                           .q = qkv_.data(),
                           .q_stride = 3 * C_,
                           .k_cache = l.k_cache.data(),
                           .v_cache = l.v_cache.data(),
                           .first_pos = pos_,
                           .rows = rows,
                           .NH = NH_,
                           .KVH = NH_,  // one key/value head per query head
                           .HS = HS_,
                           .capacity = capacity_,
                           .scratch_threads = scratch_threads_},
                          parallel_macs_);
  linear(x, att_.data(), l.proj_w, l.proj_b, rows, C_, C_, true, parallel_macs_);
  for (int64_t r = 0; r < rows; ++r) layernorm(&h_[r * C_], x + r * C_, l.ln2_w, l.ln2_b, C_);
  linear(fc_.data(), h_.data(), l.fc_w, l.fc_b, rows, FF_, C_, false, parallel_macs_);
  gelu(fc_.data(), rows * FF_);
  linear(x, fc_.data(), l.mlp_proj_w, l.mlp_proj_b, rows, C_, FF_, true, parallel_macs_);
}

void GptDecoder::check_learned_positions(int64_t rows) const {
  const int64_t last = pos_ + rows - 1;
  if (last >= capacity_ && learned_ && capacity_ == m_.n_ctx)
    throw Error(
        fmt::format("[sample] position {} is past the model's {} learned positions (model.n_ctx). "
                    "Fix: lower --tokens so that prompt + tokens <= {}",
                    std::max(pos_, capacity_), m_.n_ctx, m_.n_ctx));
}

std::vector<float> GptDecoder::run(const int32_t* tokens, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    float* x = &x_[r * C_];
    std::copy(wte_.begin() + tokens[r] * C_, wte_.begin() + (tokens[r] + 1) * C_, x);
    if (learned_)
      for (int64_t c = 0; c < C_; ++c) x[c] += wpe_[static_cast<size_t>((pos_ + r) * C_ + c)];
  }
  for (Layer& l : layers_) block(l, x_.data(), rows);
  pos_ += rows;
  layernorm(h_.data(), &x_[(rows - 1) * C_], lnf_w_, lnf_b_, C_);
  // Tied LM head: logits = wte h, of the last row only.
  std::vector<float> logits(static_cast<size_t>(V_));
  detail::decoder_matmul(logits.data(), nullptr, 0, wte_.data(), h_.data(), 1, V_, C_,
                         parallel_macs_);
  return logits;
}

std::vector<float> GptDecoder::forward(int32_t token) {
  check_learned_positions(1);
  detail::check_next_token(pos_, capacity_, token, V_);
  return run(&token, 1);
}

std::vector<float> GptDecoder::prefill(const std::vector<int32_t>& tokens) {
  check_learned_positions(static_cast<int64_t>(tokens.size()));
  return detail::prefill_in_blocks(tokens, pos_, capacity_, V_,
                                   [this](const int32_t* t, int64_t n) { return run(t, n); });
}

}  // namespace remat
