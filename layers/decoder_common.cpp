// The helpers the KV-cached decoders share (see layers/decoder_common.h).
#include "layers/decoder_common.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "engine/core/error.h"

namespace remat::detail {

std::vector<float> load_decoder_weight(const WeightSource& weights, const std::string& name,
                                       const std::vector<int64_t>& want) {
  int64_t n = 1;
  for (int64_t d : want) n *= d;
  std::vector<int64_t> shape;
  std::vector<float> w = weights(name, &shape);
  if (shape != want || static_cast<int64_t>(w.size()) != n)
    throw CheckpointError(fmt::format(
        "[sample] tensor {} has shape [{}] ({} values), but the model config needs [{}]. Fix: "
        "sample from a checkpoint written by remat-train, whose state.json config matches its "
        "weights",
        name, fmt::join(shape, ", "), w.size(), fmt::join(want, ", ")));
  return w;
}

void decoder_gemv(float* y, const float* base, const float* W, const float* x, int64_t out,
                  int64_t in, int64_t parallel_macs) {
#pragma omp parallel for schedule(static) if (out * in >= parallel_macs)
  for (int64_t o = 0; o < out; ++o) {
    const float* w = W + o * in;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < in; ++i) s += w[i] * x[i];
    y[o] = base ? base[o] + s : s;
  }
}

RopeTable::RopeTable(const RopeAngles& angles, int64_t capacity)
    : half_(static_cast<int64_t>(angles.inv_freq.size())) {
  cos_.resize(static_cast<size_t>(capacity * half_));
  sin_.resize(static_cast<size_t>(capacity * half_));
  for (int64_t t = 0; t < capacity; ++t)
    angles.cos_sin(t, cos_.data() + t * half_, sin_.data() + t * half_);
}

void RopeTable::rotate(float* v, int64_t pos) const {
  const float* cs = cos_.data() + pos * half_;
  const float* sn = sin_.data() + pos * half_;
  for (int64_t i = 0; i < half_; ++i) {
    const float a = v[i], b = v[i + half_];
    v[i] = a * cs[i] - b * sn[i];
    v[i + half_] = a * sn[i] + b * cs[i];
  }
}

void cache_attention(const CacheAttentionArgs& a, int64_t parallel_macs) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(a.HS));
  const int64_t n = a.n_pos, HS = a.HS, group = a.NH / a.KVH, kv_row = a.KVH * a.HS;
  // Query heads are independent (each has its own row of scores), so long caches split across
  // threads.
#pragma omp parallel for schedule(static) if (2 * n * a.NH * HS >= parallel_macs)
  for (int64_t h = 0; h < a.NH; ++h) {
    const float* qh = a.q + h * HS;
    const int64_t kv = (h / group) * HS;
    float* sc = a.scores + h * a.capacity;
    float mx = -INFINITY;
    for (int64_t t = 0; t < n; ++t) {
      const float* k = a.k_cache + t * kv_row + kv;
      float s = 0;
      for (int64_t c = 0; c < HS; ++c) s += qh[c] * k[c];
      sc[t] = s * scale;
      mx = std::max(mx, sc[t]);
    }
    // Subtracting the max keeps exp() in range for any score magnitude.
    float sum = 0;
    for (int64_t t = 0; t < n; ++t) {
      sc[t] = std::exp(sc[t] - mx);
      sum += sc[t];
    }
    float* oh = a.out + h * HS;
    std::fill(oh, oh + HS, 0.0f);
    for (int64_t t = 0; t < n; ++t) {
      const float p = sc[t] / sum;
      const float* v = a.v_cache + t * kv_row + kv;
      for (int64_t c = 0; c < HS; ++c) oh[c] += p * v[c];
    }
  }
}

void check_next_token(int64_t pos, int64_t capacity, int32_t token, int64_t vocab_size) {
  if (pos >= capacity)
    throw Error(fmt::format("[sample] position {} is past the decoder's cache of {} positions", pos,
                            capacity));
  if (token < 0 || token >= vocab_size)
    throw DataError(fmt::format("[sample] token {} is outside the model's vocabulary of {}", token,
                                vocab_size));
}

}  // namespace remat::detail
