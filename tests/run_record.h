// What a few steps of training leave behind, for tests that compare two runs bit for bit (the
// Llama family's policies, LoRA's): the losses, every parameter, its gradient and both moments
// copied to the host, and the pools' peaks. Not a trainer: the tests step their own.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "engine/model.h"
#include "tests/test_util.h"

namespace remat::test {

/// `a` with the settings of `b` after its own.
inline std::vector<std::string> with(std::vector<std::string> a,
                                     const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct TrainedState {
  std::vector<double> losses;
  std::vector<std::vector<float>> params, grads, moments;
  uint64_t peak = 0, host_peak = 0;
};

inline std::vector<float> host_copy(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  be.download(v.data(), t);
  return v;
}

/// Copies every parameter, gradient and moment of `params` to the host (an empty one, as a frozen
/// parameter's gradient, as an empty vector) and the backend's pool peaks into `r`.
inline void record_state(Backend& be, std::vector<Param>& params, TrainedState& r) {
  for (Param& p : params) {
    r.params.push_back(host_copy(be, p.value));
    r.grads.push_back(host_copy(be, p.grad));
    for (const Buffer* m : {&p.m, &p.v}) r.moments.push_back(host_copy(be, *m));
  }
  r.peak = be.pool().peak_bytes();
  r.host_peak = be.host_pool().peak_bytes();
}

/// The losses, gradients, parameters and moments of `r` are those of `ref` to the bit.
inline void check_same_bits(const TrainedState& r, const TrainedState& ref) {
  REQUIRE(r.losses.size() == ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i)
    CHECK(std::memcmp(&r.losses[i], &ref.losses[i], sizeof(double)) == 0);
  CHECK(bitwise_equal(r.grads, ref.grads));
  CHECK(bitwise_equal(r.params, ref.params));
  CHECK(bitwise_equal(r.moments, ref.moments));
}

}  // namespace remat::test
