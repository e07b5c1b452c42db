// Standard normal floats in bulk, for the synthetic regression inputs: ~1 ns a number instead
// of the ~25 ns of rng_normal (a double log, sqrt and cos per number, one normal per pair of
// uniforms), which made data generation a quarter of a configs/mlp4.toml step.
//
// Each pair (out[2p], out[2p+1]) is the Box-Muller pair r (cos t, sin t) of one 64-bit counter
// draw rng_bits(seed, stream, first_pair + p), split into two 24-bit uniforms u1, u2 in (0, 1):
// r = sqrt(-2 ln u1), t = 2 pi u2. ln, sin and cos are float polynomials evaluated with explicit
// FMAs in a fixed order, so the numbers are the same bits on every x86-64-v3 machine, thread
// count and block size. Accuracy against the double formula on the same uniforms: < 3e-6
// absolute (tests/test_data.cpp). |out| <= 5.9 (u1 >= 2^-25); a true normal exceeds that once
// in ~3e8 draws.
#pragma once

#include <cstdint>
#include <span>

namespace remat {

/// out[i] ~ N(0, 1) for the pairs first_pair, first_pair + 1, ... (an odd tail drops the sine).
void fill_normal(std::span<float> out, uint64_t seed, uint64_t stream, uint64_t first_pair);
/// The same stream read from its number `first` on (number 2p is pair p's cosine, 2p + 1 its
/// sine), so an odd `first` starts at a sine: a data-parallel rank's rows may begin mid-pair.
void fill_normal_from(std::span<float> out, uint64_t seed, uint64_t stream, uint64_t first);

/// The two uniforms of pair `index` (exact floats in (0, 1)); for the accuracy test.
void normal_pair_uniforms(uint64_t seed, uint64_t stream, uint64_t index, float& u1, float& u2);

}  // namespace remat
