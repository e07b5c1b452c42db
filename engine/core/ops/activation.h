// Pointwise activations (GELU, tanh approximation; ReLU) and inverted dropout: arguments, shape
// checks, FLOPs and bytes. Kernels: engine/cpu/activation.cpp, engine/cuda/activation.cpp (+
// elementwise.cu); tests: tests/ops/test_activation.cpp.
#pragma once

#include "engine/core/error.h"
#include "engine/core/ops/op.h"
#include "engine/core/tensor.h"

namespace remat {

enum class Activation : uint8_t { Gelu, Relu };

struct ActivationForwardArgs {
  Tensor out;  // (N, D) act
  Tensor inp;  // (N, D) act
  Activation kind = Activation::Gelu;
};

struct ActivationBackwardArgs {
  Tensor dinp;  // (N, D) act [=]; may alias dout
  Tensor dout;  // (N, D) act
  Tensor inp;   // (N, D) act: the pre-activation
  Activation kind = Activation::Gelu;
};

/// Inverted dropout with a counter-based mask: keep element i iff
/// rng_uniform(seed, stream, first_index + i) >= p, scaled by 1/(1-p). first_index lets a chunk
/// of rows draw the mask the whole tensor would (remat.tile_tokens). The mask is a pure function of
/// (seed, stream, i), so a recompute or the backward pass (the same op on dout) reproduces it
/// with no saved state. See engine/core/rng.h.
struct DropoutArgs {
  Tensor out;  // (N, D) act; may alias inp
  Tensor inp;  // (N, D) act
  float p = 0;
  uint64_t seed = 0;
  uint64_t stream = 0;  // derived from (step, block, site)
  uint64_t first_index = 0;
};

inline void check(const ActivationForwardArgs& a) {
  REMAT_ASSERT(a.out.numel() == a.inp.numel(), "activation_forward: {} vs {}", a.out.shape_str(),
               a.inp.shape_str());
}
inline OpCost cost(const ActivationForwardArgs& a) {
  return {(a.kind == Activation::Gelu ? 10.0 : 1.0) * static_cast<double>(a.inp.numel()),
          act_bytes(a.inp) + act_bytes(a.out)};
}

inline void check(const ActivationBackwardArgs& a) {
  REMAT_ASSERT(a.dinp.numel() == a.inp.numel() && a.dout.numel() == a.inp.numel(),
               "activation_backward: shapes {} {} {}", a.dinp.shape_str(), a.dout.shape_str(),
               a.inp.shape_str());
}
inline OpCost cost(const ActivationBackwardArgs& a) {
  return {(a.kind == Activation::Gelu ? 16.0 : 1.0) * static_cast<double>(a.inp.numel()),
          act_bytes(a.inp) + act_bytes(a.dout) + act_bytes(a.dinp)};
}

inline void check(const DropoutArgs& a) {
  REMAT_ASSERT(a.out.numel() == a.inp.numel(), "dropout: {} vs {}", a.out.shape_str(),
               a.inp.shape_str());
  REMAT_ASSERT(a.p >= 0 && a.p < 1, "dropout: p = {}", a.p);
}
inline OpCost cost(const DropoutArgs& a) {
  return {3.0 * static_cast<double>(a.inp.numel()), act_bytes(a.inp) + act_bytes(a.out)};
}

}  // namespace remat
