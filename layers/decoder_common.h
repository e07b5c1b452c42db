// What the two KV-cached decoders (layers/gpt_decoder.cpp, layers/llama_decoder.cpp) share: the
// shape-checked weight loading, the products (one token's or a prompt block's rows, the same
// bits either way), the RoPE table and rotation, the queries' attention over the key/value
// cache, and the checks of a token before it enters the cache. Internal to those files: `sample`
// sees layers/decoder.h only. The GPT is the case n_kv_head = n_head of the Llama family's
// grouped-query cache, so one attention serves both. The norms, activations and block wiring stay
// in each decoder's own file.
#pragma once

#include <cstdint>
#include <functional>
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

/// The dot product every decoder product and attention score is made of, in one fixed order:
/// 8 lanes, lane l summing elements l, l + 8, ... with fused multiply-adds, the n % 8 last
/// elements fused into lanes 0.., then the lanes added as ((0+1)+(2+3))+((4+5)+(6+7)). Written
/// with intrinsics, so the compiler cannot reorder it: decoder_matmul computes each of its outputs
/// exactly so, in whatever tile and on whichever thread, and a prompt prefilled as a block of rows
/// gives each row the bits it gets one token at a time.
float decoder_dot(const float* a, const float* b, int64_t n);

/// Y[r, o] = base[r * base_stride + o] + W[o, :] . X[r, :] for r < rows, o < out (no base: the
/// dot product alone), W (out, in), X (rows, in) and Y (rows, out) row-major. `base` may alias
/// `Y` (base_stride = out), or be a bias (base_stride = 0). Each output is decoder_dot's, so the
/// result depends neither on `rows` nor on the thread count; several rows share each weight row
/// while it is in cache (a prompt's rows: compute-bound, where one token's product is bound by
/// reading the weights). Products of at least `parallel_macs` multiply-adds run on all OpenMP
/// threads. Intrinsics, not cblas_sgemm: a BLAS sums in an order of its own that changes with the
/// number of rows (and threads one token's product at a cost above its arithmetic, as
/// layers/gpt_decoder.cpp's header says), so a prompt's block would not give its rows the bits of
/// one token at a time.
void decoder_matmul(float* Y, const float* base, int64_t base_stride, const float* W,
                    const float* X, int64_t rows, int64_t out, int64_t in, int64_t parallel_macs);

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

/// The queries of `rows` new positions (first_pos, first_pos + 1, ...) against the keys and values
/// cached at positions 0..first_pos + row (each row's own included): causal by construction, the
/// rows' keys and values being in the cache already. Query head h reads key/value head
/// h / (NH / KVH), transformers' repeat_kv order; a GPT passes KVH = NH. Each (row, head) is the
/// same arithmetic for any number of rows and threads.
struct CacheAttentionArgs {
  float* out;             // (rows, NH, HS): softmax(q k^T / sqrt(HS)) v per row and head [=]
  float* scores;          // (scratch_threads, capacity): one row of scores per thread
  const float* q;         // (rows, q_stride): each row's queries (NH, HS), rotated
  int64_t q_stride = 0;   // floats from one row's queries to the next
  const float* k_cache;   // (capacity, KVH, HS): keys, rotated
  const float* v_cache;   // (capacity, KVH, HS)
  int64_t first_pos = 0;  // the first row's position
  int64_t rows = 1;
  int64_t NH = 0, KVH = 0, HS = 0, capacity = 0;
  int scratch_threads = 1;  // threads `scores` has rows for: the most cache_attention uses
};
void cache_attention(const CacheAttentionArgs& a, int64_t parallel_macs);
/// The threads cache_attention may use from now on (OpenMP's count when the decoder is made),
/// and the scratch they need for `capacity` positions: one row of scores each.
int cache_attention_threads();
size_t cache_attention_scratch(int threads, int64_t capacity);

/// What Decoder::forward promises of its input: Error when the cache of `capacity` positions is
/// full at `pos`, DataError for a token outside the vocabulary.
void check_next_token(int64_t pos, int64_t capacity, int32_t token, int64_t vocab_size);

/// Rows a decoder runs through its layers at once: a prompt goes in blocks of this many (a
/// block's activations stay in cache while each weight row is read once for all of them).
constexpr int64_t kDecoderBlockRows = 128;

/// `tokens` through `run` (a decoder's block: its tokens at the next positions, the logits after
/// the last) in blocks of kDecoderBlockRows; the last block's logits. Every token is checked
/// (check_next_token) before any enters the cache.
std::vector<float> prefill_in_blocks(
    const std::vector<int32_t>& tokens, int64_t pos, int64_t capacity, int64_t vocab_size,
    const std::function<std::vector<float>(const int32_t*, int64_t)>& run);

}  // namespace remat::detail
