// LayerNorm over the last dimension (eps 1e-5, biased variance): arguments, shape checks, FLOPs
// and bytes. Kernels: engine/cpu/layernorm.cpp, engine/cuda/layernorm.cpp (+ layernorm.cu);
// tests: tests/ops/test_layernorm.cpp.
#pragma once

#include "engine/core/error.h"
#include "engine/core/ops/op.h"
#include "engine/core/tensor.h"

namespace remat {

struct LayerNormForwardArgs {
  Tensor out;     // (N, C) act
  Tensor stats;   // (N, 2) f32: mean, rstd per row
  Tensor inp;     // (N, C) act
  Tensor weight;  // (C) f32
  Tensor bias;    // (C) f32
};

struct LayerNormBackwardArgs {
  Tensor dinp;     // (N, C) act [+=] residual stream
  Tensor dweight;  // (C) f32 [+=]; empty with dbias: a frozen LayerNorm, no parameter gradients
  Tensor dbias;    // (C) f32 [+=]
  Tensor dout;     // (N, C) act
  Tensor inp;      // (N, C) act
  Tensor weight;   // (C) f32
  Tensor stats;    // (N, 2) f32
};

inline void check(const LayerNormForwardArgs& a) {
  check_rows(a.out, a.inp, "layernorm_forward");
  REMAT_ASSERT(a.stats.numel() == a.inp.rows() * 2, "layernorm_forward: stats {}",
               a.stats.shape_str());
}
inline OpCost cost(const LayerNormForwardArgs& a) {
  return {8.0 * static_cast<double>(a.inp.numel()),
          act_bytes(a.inp) + act_bytes(a.out) + act_bytes(a.stats)};
}

inline void check(const LayerNormBackwardArgs& a) {
  check_rows(a.dinp, a.inp, "layernorm_backward");
  check_rows(a.dout, a.inp, "layernorm_backward");
  REMAT_ASSERT(a.dweight.empty() == a.dbias.empty(),
               "layernorm_backward: dweight {} and dbias {} are both given or both empty",
               a.dweight.shape_str(), a.dbias.shape_str());
}
// 14 FLOPs per element, 4 of them the parameter gradients (dout x^, and the two row sums).
inline OpCost cost(const LayerNormBackwardArgs& a) {
  OpCost c{14.0 * static_cast<double>(a.inp.numel()),
           act_bytes(a.inp) + act_bytes(a.dout) + 2 * act_bytes(a.dinp)};
  if (a.dweight.empty()) {
    c.flops -= 4.0 * static_cast<double>(a.inp.numel());
    c.skipped_flops = 4.0 * static_cast<double>(a.inp.numel());
  }
  return c;
}

}  // namespace remat
