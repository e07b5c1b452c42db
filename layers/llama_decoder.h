// LlamaDecoder: the trained Llama-family model (layers/llama_model.cpp, layers/llama_block.cpp)
// run on the host for generation, a prompt in blocks of rows and then one token at a time, with a
// key/value cache per layer. The cache holds the KVH key/value heads only, not one per query
// head: grouped-query attention's saving, NH / KVH times less cache than multi-head attention of
// the same width. It reproduces the training forward in structure (RMSNorm pre-norm blocks, the
// fused q | k | v projection with its optional biases, the per-head q/k RMSNorm before RoPE, RoPE
// in the rotate_half layout with engine/core/ops/rope.h's scaled frequencies and the attention
// kernel's angle table, SwiGLU, the final RMSNorm and the tied or untied head), so its
// per-position losses equal the trainer's within float rounding (tests/test_llama_decoder.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "layers/decoder.h"
#include "layers/decoder_common.h"

namespace remat {

class LlamaDecoder : public Decoder {
 public:
  /// Loads every weight of `model` (kind "llama") from `weights`, checking each shape against
  /// the config (CheckpointError naming the tensor when one differs). `max_positions` is the KV
  /// cache's capacity. Products of at least `parallel_macs` multiply-adds run on all OpenMP
  /// threads (tests pass 0 to exercise the threaded paths); results do not depend on the thread
  /// count.
  LlamaDecoder(const ModelConfig& model, const WeightSource& weights, int64_t max_positions,
               int64_t parallel_macs = kDefaultParallelMacs);

  std::vector<float> forward(int32_t token) override;
  std::vector<float> prefill(const std::vector<int32_t>& tokens) override;
  void reset() override { pos_ = 0; }
  int64_t position() const override { return pos_; }
  int64_t capacity() const override { return capacity_; }
  int64_t vocab_size() const override { return V_; }

 private:
  struct Layer {
    std::vector<float> norm1_w, qkv_w, qkv_b, q_norm_w, k_norm_w, proj_w;  // qkv_b, q/k: optional
    std::vector<float> norm2_w, gate_w, up_w, down_w;
    std::vector<float> k_cache, v_cache;  // (capacity, KVH HS): keys normed and rotated, values
  };

  void load(const WeightSource& weights);
  /// `rows` checked tokens at positions pos_.., through every layer; the logits after the last.
  std::vector<float> run(const int32_t* tokens, int64_t rows);
  /// The block's rows `x` (rows, C) through layer `l`, their keys and values into its cache.
  void block(Layer& l, float* x, int64_t rows);

  ModelConfig m_;
  int64_t C_ = 0, NH_ = 0, KVH_ = 0, HS_ = 0, FF_ = 0, V_ = 0;
  int64_t capacity_ = 0, pos_ = 0;
  int64_t parallel_macs_ = kDefaultParallelMacs;
  float eps_ = 1e-5f;
  std::vector<float> wte_, normf_w_, lm_head_;  // lm_head_ empty when tied to wte_
  std::vector<Layer> layers_;
  detail::RopeTable rope_;
  // Scratch of one block of up to kDecoderBlockRows rows, kept to avoid allocating per token.
  std::vector<float> x_, h_, qkv_, att_, gate_, up_;
  std::vector<float> scores_;  // (scratch_threads_, capacity): one row of scores per thread
  int scratch_threads_ = 1;
};

}  // namespace remat
