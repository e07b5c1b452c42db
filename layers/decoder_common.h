// What the two KV-cached decoders (layers/gpt_decoder.cpp, layers/llama_decoder.cpp) share: the
// shape-checked weight loading, the matrix-vector product, the RoPE table and rotation, one
// query's attention over the key/value cache, and the checks of a token before it enters the
// cache. Internal to those files: `sample` sees layers/decoder.h only. The GPT is the case
// n_kv_head = n_head of the Llama family's grouped-query cache, so one attention serves both;
// each helper does the arithmetic both decoders did before, in the same order, so the logits
// keep their bits. The norms, activations and block wiring stay in each decoder's own file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "layers/decoder.h"

namespace remat::detail {

/// Weight `name` from `weights`, checked against the shape the model config implies. Throws
/// CheckpointError naming the tensor when the shape or the number of values differs: a
/// checkpoint whose tensors disagree with its own config is corrupt or hand-edited, and reading
/// it anyway would index out of bounds.
std::vector<float> load_decoder_weight(const WeightSource& weights, const std::string& name,
                                       const std::vector<int64_t>& want);

/// y[o] = base[o] + W[o, :] . x for o < out (no base: the dot product alone), W (out, in)
/// row-major. `base` may alias `y`. Each y[o] is one dot product in a fixed order, so the result
/// does not depend on the thread count; products of at least `parallel_macs` multiply-adds run on
/// all OpenMP threads. Plain loops, not cblas_sgemv: see layers/gpt_decoder.cpp's header.
void decoder_gemv(float* y, const float* base, const float* W, const float* x, int64_t out,
                  int64_t in, int64_t parallel_macs);

/// The RoPE angles of a cache's positions, as the training attention's table (engine/cpu/
/// attention.cpp's fill_rope_table) bit for bit: angle t * inv_freq[i] in double, cos and sin
/// times yarn's attention factor, rounded to float. Rotation in the half-split (rotate_half,
/// GPT-NeoX) layout both model families train with: element i of a head pairs with element
/// i + HS/2.
class RopeTable {
 public:
  RopeTable() = default;
  /// `angles`: a head's frequencies and attention factor (engine/core/ops/rope.h's rope_angles).
  RopeTable(const RopeAngles& angles, int64_t capacity);
  /// Rotates one head's q or k (HS values) in place by the angles of position `pos`.
  void rotate(float* head, int64_t pos) const;

 private:
  int64_t half_ = 0;              // HS / 2
  std::vector<float> cos_, sin_;  // (capacity, HS/2)
};

/// One new position's queries against the keys and values cached at positions 0..n_pos-1 (the
/// new one included): causal by construction, since later positions are not in the cache yet.
/// Query head h reads key/value head h / (NH / KVH), transformers' repeat_kv order; a GPT passes
/// KVH = NH.
struct CacheAttentionArgs {
  float* out;            // (NH, HS): softmax(q k^T / sqrt(HS)) v per head [=]
  float* scores;         // (NH, capacity): scratch, one row of attention weights per head
  const float* q;        // (NH, HS): the new position's queries, rotated
  const float* k_cache;  // (capacity, KVH, HS): keys, rotated
  const float* v_cache;  // (capacity, KVH, HS)
  int64_t n_pos = 0;     // cached positions attended to
  int64_t NH = 0, KVH = 0, HS = 0, capacity = 0;
};
void cache_attention(const CacheAttentionArgs& a, int64_t parallel_macs);

/// What Decoder::forward promises of its input: Error when the cache of `capacity` positions is
/// full at `pos`, DataError for a token outside the vocabulary.
void check_next_token(int64_t pos, int64_t capacity, int32_t token, int64_t vocab_size);

}  // namespace remat::detail
