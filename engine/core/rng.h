// Counter-based random numbers: value = f(seed, stream, index), no state. The same numbers on
// every machine, thread count and order of evaluation — what deterministic initialization,
// synthetic data and (later) dropout masks that survive recomputation need.
#pragma once

#include <cmath>
#include <cstdint>

// Usable in CUDA kernels too, so the CUDA backend draws bitwise the same dropout masks.
#ifdef __CUDACC__
#define REMAT_HOST_DEVICE __host__ __device__
#else
#define REMAT_HOST_DEVICE
#endif

namespace remat {

/// splitmix64 finalizer: a bijective 64-bit mix with good avalanche.
REMAT_HOST_DEVICE inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

REMAT_HOST_DEVICE inline uint64_t rng_bits(uint64_t seed, uint64_t stream, uint64_t index) {
  return mix64(mix64(seed ^ mix64(stream)) + index);
}

/// Uniform in (0, 1).
REMAT_HOST_DEVICE inline double rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return (static_cast<double>(rng_bits(seed, stream, index) >> 11) + 0.5) *
         (1.0 / 9007199254740992.0);
}

/// Standard normal (Box-Muller on two uniforms of the same counter).
inline double rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  const double u1 = rng_uniform(seed, stream, 2 * index);
  const double u2 = rng_uniform(seed, stream, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

/// Stable 64-bit hash of a name, to derive a stream per parameter.
inline uint64_t hash_name(const char* s) {
  uint64_t h = 1469598103934665603ull;
  while (*s) h = (h ^ static_cast<unsigned char>(*s++)) * 1099511628211ull;
  return h;
}

}  // namespace remat
