// GptDecoder: the trained GPT (layers/models.cpp, layers/gpt_block.cpp) run on the host for
// generation, a prompt in blocks of rows and then one token at a time, with a key/value cache per
// layer so each new token costs one pass of matrix-vector products plus attention over the cached
// positions — not a re-run of the whole prefix. It reproduces the training forward exactly in
// structure (pre-LN blocks, tanh GELU, LayerNorm eps 1e-5, RoPE in the half-split layout with the
// same angle table, LM head tied to wte), so its per-position losses equal the trainer's within
// float rounding (tests/test_sample.cpp checks this). No dropout: this is inference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "layers/decoder.h"
#include "layers/decoder_common.h"

namespace remat {

class GptDecoder : public Decoder {
 public:
  /// Loads every weight of `model` (kind "gpt") from `weights`, checking each shape against the
  /// config (CheckpointError naming the tensor when one differs). `max_positions` is the KV
  /// cache's capacity; with learned positions it is capped at model.n_ctx. A product of at
  /// least `parallel_macs` multiply-adds runs on all OpenMP threads, smaller ones on one (the
  /// default is ~0.1 ms of work, below which waking threads costs more than it saves; tests pass
  /// 0 to exercise the threaded paths). Results do not depend on the thread count.
  GptDecoder(const ModelConfig& model, const WeightSource& weights, int64_t max_positions,
             int64_t parallel_macs = kDefaultParallelMacs);

  /// Appends `token` at the next position and returns the logits (vocab_size) that predict the
  /// token after it. Throws Error past the capacity, DataError for a token outside the vocabulary.
  std::vector<float> forward(int32_t token) override;
  std::vector<float> prefill(const std::vector<int32_t>& tokens) override;
  /// Empties the cache: the next forward() is position 0 again.
  void reset() override { pos_ = 0; }

  int64_t position() const override { return pos_; }       // tokens in the cache
  int64_t capacity() const override { return capacity_; }  // positions the cache holds
  int64_t vocab_size() const override { return V_; }

 private:
  struct Layer {
    std::vector<float> ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b;
    std::vector<float> ln2_w, ln2_b, fc_w, fc_b, mlp_proj_w, mlp_proj_b;
    std::vector<float> k_cache, v_cache;  // (capacity, C): keys after RoPE, values
  };

  void load(const WeightSource& weights);
  /// `rows` checked tokens at positions pos_.., through every layer; the logits after the last.
  std::vector<float> run(const int32_t* tokens, int64_t rows);
  /// The block's rows `x` (rows, C) through layer `l`, their keys and values into its cache.
  void block(Layer& l, float* x, int64_t rows);
  /// Error when a learned position table ends before position pos_ + rows - 1.
  void check_learned_positions(int64_t rows) const;

  ModelConfig m_;
  int64_t C_ = 0, NH_ = 0, HS_ = 0, FF_ = 0, V_ = 0;
  int64_t capacity_ = 0, pos_ = 0;
  int64_t parallel_macs_ = kDefaultParallelMacs;
  bool learned_ = true;
  std::vector<float> wte_, wpe_, lnf_w_, lnf_b_;
  std::vector<Layer> layers_;
  detail::RopeTable rope_;  // empty with learned positions
  // Scratch of one block of up to kDecoderBlockRows rows, kept to avoid allocating per token.
  std::vector<float> x_, h_, qkv_, att_, fc_;
  std::vector<float> scores_;  // (scratch_threads_, capacity): one row of scores per thread
  int scratch_threads_ = 1;
};

}  // namespace remat
