// What the KV-cached decoder tests share (tests/test_sample.cpp, tests/test_llama_decoder.cpp):
// a trained-looking model from a fresh one, its weights as a decoder's WeightSource, and the
// cross-entropy of one row of logits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/model.h"
#include "engine/rng.h"
#include "layers/decoder.h"

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

}  // namespace remat::test
