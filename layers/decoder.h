// What `remat-train sample` needs of a trained model: a prompt or one token in, the next token's
// logits out, with a key/value cache so each token costs one pass, not a re-run of the prefix. One
// implementation per model family (layers/gpt_decoder.h, layers/llama_decoder.h); make_decoder
// picks it from model.kind, so the command never names a family.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/config/config.h"

namespace remat {

/// Supplies one named weight as host f32 and writes its shape (e.g. Checkpoint::weight). Throws
/// (CheckpointError) when the weight does not exist.
using WeightSource =
    std::function<std::vector<float>(const std::string& name, std::vector<int64_t>* shape)>;

class Decoder {
 public:
  /// A product of at least this many multiply-adds runs on all OpenMP threads, smaller ones on
  /// one: ~0.1 ms of work, below which waking threads costs more than it saves.
  static constexpr int64_t kDefaultParallelMacs = 1 << 20;

  virtual ~Decoder() = default;
  /// Appends `token` at the next position and returns the logits (vocab_size) that predict the
  /// token after it. Throws Error past the capacity, DataError for a token outside the vocabulary.
  virtual std::vector<float> forward(int32_t token) = 0;
  /// Appends `tokens` (a prompt) at the next positions and returns the logits after the last
  /// (empty for no token): the bits forward() gives token by token, computed in blocks of rows
  /// that read each weight once per block. Throws as forward() does, before any token enters.
  virtual std::vector<float> prefill(const std::vector<int32_t>& tokens) = 0;
  /// Empties the cache: the next forward() is position 0 again.
  virtual void reset() = 0;
  virtual int64_t position() const = 0;  // tokens in the cache
  virtual int64_t capacity() const = 0;  // positions the cache holds
  virtual int64_t vocab_size() const = 0;
};

/// The decoder of model.kind (gpt or llama) with its weights loaded from `weights` and a cache of
/// `max_positions` (capped by a GPT's learned positions). ConfigError for a kind that has no
/// decoder (the tutorial MLP). Defined in layers/llama_decoder.cpp.
std::unique_ptr<Decoder> make_decoder(const ModelConfig& model, const WeightSource& weights,
                                      int64_t max_positions,
                                      int64_t parallel_macs = Decoder::kDefaultParallelMacs);

}  // namespace remat
