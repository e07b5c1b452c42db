// What the KV-cached decoder tests share (tests/test_sample.cpp, tests/test_llama_decoder.cpp):
// a trained-looking model from a fresh one, its weights as a decoder's WeightSource (also one with
// a tensor cut short, which a decoder must refuse), the cross-entropy of one row of logits, the
// decoder against the training forward position by position, the TOML of a run through the binary,
// and `train` then `sample` end to end on a memorized sentence.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/core/rng.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/model.h"
#include "engine/remat/executor.h"
#include "engine/training/checkpoint.h"
#include "layers/decoder.h"
#include "layers/models.h"
#include "temp_dir.h"
#include "tests/cli_util.h"
#include "tests/test_util.h"

namespace remat::test {

// Moves every parameter off its initial value (norm weights off 1, biases off 0) by N(0, scale)
// draws keyed by (seed, parameter), so a swapped or misread tensor changes the logits.
inline void perturb(Model& model, double scale, uint64_t seed) {
  uint64_t stream = 1;
  for (Param& p : model.params()) {
    float* v = p.value.f32();
    for (int64_t i = 0; i < p.value.tensor().numel(); ++i)
      v[i] += static_cast<float>(scale * rng_normal(seed, stream, static_cast<uint64_t>(i)));
    ++stream;
  }
}

// The model's parameters as a WeightSource: on the CPU backend they are host memory.
inline WeightSource weights_of(Model& model) {
  return [&model](const std::string& name, std::vector<int64_t>* shape) {
    for (Param& p : model.params())
      if (p.name == name) {
        const Tensor& t = p.value.tensor();
        if (shape) *shape = std::vector<int64_t>(t.shape.begin(), t.shape.end());
        return std::vector<float>(t.f32(), t.f32() + t.numel());
      }
    throw CheckpointError("no tensor " + name);
  };
}

/// A decoder of `model` (make_decoder) refuses its weights when the tensor `name` is one element
/// short in its last dimension, and names the tensor.
inline void check_decoder_refuses_short_tensor(const ModelConfig& m, Model& model,
                                               const std::string& name) {
  const WeightSource inner = weights_of(model);
  const WeightSource bad = [&](const std::string& n, std::vector<int64_t>* shape) {
    std::vector<float> w = inner(n, shape);
    if (n == name) {
      shape->back() -= 1;
      w.pop_back();
    }
    return w;
  };
  CHECK_THROWS_WITH(make_decoder(m, bad, 8), Catch::Matchers::Contains(name));
}

inline double cross_entropy(const std::vector<float>& logits, int32_t target) {
  double mx = logits[0];
  for (float l : logits) mx = std::max(mx, static_cast<double>(l));
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - mx);
  return mx + std::log(sum) - static_cast<double>(logits[static_cast<size_t>(target)]);
}

// The KV-cached decoder of `cfg`'s model (make_decoder) against the training forward of the same
// weights, perturbed by N(0, perturb_scale) draws (perturb_seed), on random tokens: each row, its
// own sequence as in training, gives per-position cross-entropies within `tol` of the forward's
// row losses; the decoder that splits every product across threads (threshold 0) gives the
// serial one's bits; the cache holds the T positions read.
inline void check_decoder_parity(const Config& cfg, double perturb_scale, uint64_t perturb_seed,
                                 Tolerance tol) {
  const int64_t B = cfg.train.batch_size, T = cfg.train.seq_len;
  const auto V = static_cast<int32_t>(cfg.model.vocab_size);
  cpu::CpuBackend be(1ull << 30, kTestThreads);
  auto model = make_model(cfg, be);
  perturb(*model, perturb_scale, perturb_seed);
  Batch batch{make_ids(be, {B, T}, V, 5, 1), make_ids(be, {B, T}, V, 5, 2), B * T};
  const StepLoss want = forward_backward(be, *model, resolve_remat_plan(cfg, *model), batch);
  REQUIRE(static_cast<int64_t>(want.row_losses.size()) == B * T);

  const std::unique_ptr<Decoder> serial = make_decoder(cfg.model, weights_of(*model), T);
  const std::unique_ptr<Decoder> threaded = make_decoder(cfg.model, weights_of(*model), T, 0);
  const int32_t* in = batch.inputs.tensor().i32();
  const int32_t* tgt = batch.targets.tensor().i32();
  for (int64_t b = 0; b < B; ++b) {
    serial->reset();  // each row is its own sequence, as in training
    threaded->reset();
    std::vector<double> got;
    std::vector<std::vector<float>> at;  // the serial decoder's logits at each position
    bool same_bits = true;
    for (int64_t t = 0; t < T; ++t) {
      at.push_back(serial->forward(in[b * T + t]));
      same_bits = same_bits && at.back() == threaded->forward(in[b * T + t]);
      got.push_back(cross_entropy(at.back(), tgt[b * T + t]));
    }
    CHECK(serial->position() == T);
    // A prompt prefilled as one block of rows, then token by token: the same bits throughout.
    for (const int64_t k : {int64_t{1}, T / 2 + 1, T}) {
      const std::unique_ptr<Decoder> prefilled = make_decoder(cfg.model, weights_of(*model), T, 0);
      const std::vector<int32_t> prompt(in + b * T, in + b * T + k);
      bool prefill_bits = prefilled->prefill(prompt) == at[static_cast<size_t>(k - 1)];
      for (int64_t t = k; t < T; ++t)
        prefill_bits =
            prefill_bits && prefilled->forward(in[b * T + t]) == at[static_cast<size_t>(t)];
      INFO("prefill of " << k << " tokens");
      CHECK(prefill_bits);
    }
    const std::vector<float> row(want.row_losses.begin() + b * T,
                                 want.row_losses.begin() + (b + 1) * T);
    CHECK(allclose(got, row, tol, fmt::format("{} row {}", model->describe(), b)));
    CHECK(same_bits);
  }
}

// A prompt of `n` tokens, more than one block of rows (kDecoderBlockRows), prefilled whole or in
// part gives the bits of token-by-token decoding at every position after it; a prompt that does
// not fit the cache, or holds a token outside the vocabulary, is refused before any of it enters.
inline void check_prefill_blocks(const Config& cfg, int64_t n) {
  cpu::CpuBackend be(1ull << 30, kTestThreads);
  auto model = make_model(cfg, be);
  perturb(*model, 0.05, 7);
  const auto V = static_cast<int32_t>(cfg.model.vocab_size);
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < n; ++i) tokens.push_back(static_cast<int32_t>((i * 37 + 11) % V));
  const std::unique_ptr<Decoder> serial = make_decoder(cfg.model, weights_of(*model), n);
  std::vector<std::vector<float>> at;
  for (int32_t t : tokens) at.push_back(serial->forward(t));
  for (const int64_t k : {int64_t{130}, n}) {
    const std::unique_ptr<Decoder> dec = make_decoder(cfg.model, weights_of(*model), n, 0);
    bool same =
        dec->prefill({tokens.begin(), tokens.begin() + k}) == at[static_cast<size_t>(k - 1)];
    for (int64_t t = k; t < n; ++t)
      same = same && dec->forward(tokens[static_cast<size_t>(t)]) == at[static_cast<size_t>(t)];
    INFO("prefill of " << k << " of " << n << " tokens");
    CHECK(same);
  }
  const std::unique_ptr<Decoder> dec = make_decoder(cfg.model, weights_of(*model), n);
  dec->forward(1);
  CHECK_THROWS_WITH(dec->prefill(tokens), Catch::Matchers::Contains("positions"));
  std::vector<int32_t> bad(10, 1);
  bad[5] = V;
  CHECK_THROWS_AS(dec->prefill(bad), DataError);
  CHECK(dec->position() == 1);
  CHECK(dec->prefill({}).empty());
}

/// The TOML of a run through the binary on the CPU with one thread (see below): the bodies of
/// its [model], [train] and [data] tables, its checkpoints in `checkpoint_dir`.
inline std::string cpu_run_toml(const std::string& model_table, const std::string& train_table,
                                const std::string& data_table, const std::string& checkpoint_dir) {
  return fmt::format(R"([model]
{}
[train]
{}
[data]
{}
[device]
backend = "cpu"
threads = 1
[checkpoint]
dir = "{}"
)",
                     model_table, train_table, data_table, checkpoint_dir);
}

// Through the real binary (text data, checkpoints): trains a tiny byte model, whose [model] table
// is `model_table` (without the header), on one repeated sentence, then greedy sampling from the
// sentence's start must continue it. One thread: two OpenMP threads on a loaded 2-core machine
// spend a tiny model's steps in barriers (20x slower); one trains it in ~4 s.
inline void check_sample_continues_memorized_sentence(const std::string& model_table,
                                                      const std::string& tmp_name) {
  TempDir tmp(tmp_name);
  {
    std::ofstream text(tmp / "fox.txt", std::ios::binary);
    for (int i = 0; i < 400; ++i) text << "the quick brown fox jumps over the lazy dog. ";
  }
  std::ofstream(tmp / "fox.toml") << cpu_run_toml(
      model_table, "seq_len = 64\nbatch_size = 8\nsteps = 150\nlr = 3e-3\nwarmup_steps = 10",
      fmt::format("source = \"text\"\npath = \"{}\"", tmp / "fox.txt"), tmp / "ckpt");
  const auto train = run_binary(fmt::format("train --config {} -q", tmp / "fox.toml"), true);
  INFO(train.out);
  REQUIRE(train.code == 0);
  const auto sample = run_binary(
      fmt::format("sample --checkpoint {} --prompt \"the quick brown\" --tokens 40 --temperature 0",
                  tmp / "ckpt"),
      true);
  INFO(sample.out);
  REQUIRE(sample.code == 0);
  CHECK_THAT(sample.out, Catch::Matchers::Contains("the quick brown fox jumps over the lazy dog") &&
                             Catch::Matchers::Contains("sampled 40 tokens"));
}

}  // namespace remat::test
