// The helpers the KV-cached decoders share (see layers/decoder_common.h).
#include "layers/decoder_common.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <immintrin.h>
#include <omp.h>

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

namespace {

// The lanes of one accumulator, then the n % 8 last elements fused into lanes 0.., then the lanes
// in a fixed tree: decoder_dot's tail, shared by every tile so each output rounds alike.
inline float finish_dot(__m256 acc, const float* a, const float* b, int64_t from, int64_t n) {
  alignas(32) float lane[8];
  _mm256_store_ps(lane, acc);
  for (int64_t i = from; i < n; ++i) lane[i - from] = std::fma(a[i], b[i], lane[i - from]);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// Outputs o0..o0+RO-1 of rows r0..r0+RR-1: RO x RR accumulators, each its own chain of fused
// multiply-adds in decoder_dot's order; the weight rows and the input rows are each loaded once
// per 8 elements for all of them.
template <int RO, int RR>
inline void dot_tile(float* Y, const float* base, int64_t base_stride, const float* W,
                     const float* X, int64_t o0, int64_t r0, int64_t out, int64_t in) {
  __m256 acc[RO][RR];
  for (int a = 0; a < RO; ++a)
    for (int b = 0; b < RR; ++b) acc[a][b] = _mm256_setzero_ps();
  const int64_t in8 = in & ~int64_t{7};
  for (int64_t i = 0; i < in8; i += 8) {
    __m256 w[RO], x[RR];
    for (int a = 0; a < RO; ++a) w[a] = _mm256_loadu_ps(W + (o0 + a) * in + i);
    for (int b = 0; b < RR; ++b) x[b] = _mm256_loadu_ps(X + (r0 + b) * in + i);
    for (int a = 0; a < RO; ++a)
      for (int b = 0; b < RR; ++b) acc[a][b] = _mm256_fmadd_ps(w[a], x[b], acc[a][b]);
  }
  for (int a = 0; a < RO; ++a)
    for (int b = 0; b < RR; ++b) {
      const int64_t o = o0 + a, r = r0 + b;
      const float s = finish_dot(acc[a][b], W + o * in, X + r * in, in8, in);
      Y[r * out + o] = base ? base[r * base_stride + o] + s : s;
    }
}

}  // namespace

float decoder_dot(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  const int64_t n8 = n & ~int64_t{7};
  for (int64_t i = 0; i < n8; i += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  return finish_dot(acc, a, b, n8, n);
}

void decoder_matmul(float* Y, const float* base, int64_t base_stride, const float* W,
                    const float* X, int64_t rows, int64_t out, int64_t in, int64_t parallel_macs) {
  // Threads split the outputs in chunks of 8 (each output is one thread's, whatever the split);
  // every chunk takes the rows 4 at a time with 2 outputs (8 chains), then the last rows alone
  // with 4 outputs (4 chains, the one-token case).
  constexpr int64_t kChunk = 8;
  const int64_t chunks = (out + kChunk - 1) / kChunk, rows4 = rows & ~int64_t{3};
#pragma omp parallel for schedule(static) if (rows * out * in >= parallel_macs)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t o_begin = c * kChunk, o_end = std::min(out, o_begin + kChunk);
    for (int64_t r = 0; r < rows4; r += 4) {
      int64_t o = o_begin;
      for (; o + 2 <= o_end; o += 2) dot_tile<2, 4>(Y, base, base_stride, W, X, o, r, out, in);
      for (; o < o_end; ++o) dot_tile<1, 4>(Y, base, base_stride, W, X, o, r, out, in);
    }
    for (int64_t r = rows4; r < rows; ++r) {
      int64_t o = o_begin;
      for (; o + 4 <= o_end; o += 4) dot_tile<4, 1>(Y, base, base_stride, W, X, o, r, out, in);
      for (; o < o_end; ++o) dot_tile<1, 1>(Y, base, base_stride, W, X, o, r, out, in);
    }
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

namespace {

// One query head of one row against the n cached positions: scores, softmax, weighted values.
void attend(const CacheAttentionArgs& a, int64_t row, int64_t h, float* sc) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(a.HS));
  const int64_t n = a.first_pos + row + 1, HS = a.HS, group = a.NH / a.KVH, kv_row = a.KVH * HS;
  const float* qh = a.q + row * a.q_stride + h * HS;
  const int64_t kv = (h / group) * HS;
  float mx = -INFINITY;
  for (int64_t t = 0; t < n; ++t) {
    sc[t] = decoder_dot(qh, a.k_cache + t * kv_row + kv, HS) * scale;
    mx = std::max(mx, sc[t]);
  }
  // Subtracting the max keeps exp() in range for any score magnitude.
  float sum = 0;
  for (int64_t t = 0; t < n; ++t) {
    sc[t] = std::exp(sc[t] - mx);
    sum += sc[t];
  }
  float* oh = a.out + (row * a.NH + h) * HS;
  std::fill(oh, oh + HS, 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    const float p = sc[t] / sum;
    const float* v = a.v_cache + t * kv_row + kv;
    for (int64_t c = 0; c < HS; ++c) oh[c] += p * v[c];
  }
}

}  // namespace

int cache_attention_threads() {
  return omp_get_max_threads();
}

size_t cache_attention_scratch(int threads, int64_t capacity) {
  return static_cast<size_t>(threads) * static_cast<size_t>(capacity);
}

void cache_attention(const CacheAttentionArgs& a, int64_t parallel_macs) {
  // (row, head) pairs are independent (each has its own row of scores): long caches and prompt
  // blocks split across threads, each thread on its own row of the scratch.
  // No more threads than the scratch has rows for, whatever OpenMP's count became since.
  const int64_t pairs = a.rows * a.NH, n_last = a.first_pos + a.rows;
  const int threads = std::min(omp_get_max_threads(), a.scratch_threads);
#pragma omp parallel for schedule(dynamic, 1) \
    num_threads(threads) if (2 * n_last * pairs * a.HS >= parallel_macs)
  for (int64_t i = 0; i < pairs; ++i)
    attend(a, i / a.NH, i % a.NH, a.scores + omp_get_thread_num() * a.capacity);
}

std::vector<float> prefill_in_blocks(
    const std::vector<int32_t>& tokens, int64_t pos, int64_t capacity, int64_t vocab_size,
    const std::function<std::vector<float>(const int32_t*, int64_t)>& run) {
  for (size_t i = 0; i < tokens.size(); ++i)
    check_next_token(pos + static_cast<int64_t>(i), capacity, tokens[i], vocab_size);
  std::vector<float> logits;
  const auto n = static_cast<int64_t>(tokens.size());
  for (int64_t at = 0; at < n; at += kDecoderBlockRows)
    logits = run(tokens.data() + at, std::min(kDecoderBlockRows, n - at));
  return logits;
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
