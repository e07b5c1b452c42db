// What the KV-cached decoder tests share (tests/test_sample.cpp, tests/test_llama_decoder.cpp):
// a trained-looking model from a fresh one, its weights as a decoder's WeightSource, the
// cross-entropy of one row of logits, and `train` then `sample` end to end on a memorized sentence.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "engine/core/rng.h"
#include "engine/model.h"
#include "engine/training/checkpoint.h"
#include "layers/decoder.h"
#include "temp_dir.h"
#include "tests/cli_util.h"

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

inline double cross_entropy(const std::vector<float>& logits, int32_t target) {
  double mx = logits[0];
  for (float l : logits) mx = std::max(mx, static_cast<double>(l));
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - mx);
  return mx + std::log(sum) - static_cast<double>(logits[static_cast<size_t>(target)]);
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
  std::ofstream(tmp / "fox.toml") << fmt::format(R"([model]
{}
[train]
seq_len = 64
batch_size = 8
steps = 150
lr = 3e-3
warmup_steps = 10
[data]
source = "text"
path = "{}"
[device]
backend = "cpu"
threads = 1
[checkpoint]
dir = "{}"
)",
                                                 model_table, tmp / "fox.txt", tmp / "ckpt");
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
