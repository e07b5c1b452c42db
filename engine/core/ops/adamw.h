// The optimizer step (AdamW with decoupled weight decay and bias correction) and the global sum of
// squares (gradient clipping): arguments, shape checks, FLOPs and bytes. Kernels:
// engine/cpu/adamw.cpp, engine/cuda/adamw.cpp (+ optimizer.cu); tests: tests/ops/test_adamw.cpp,
// tests/test_training_loop.cpp.
#pragma once

#include "engine/core/error.h"
#include "engine/core/ops/op.h"
#include "engine/core/tensor.h"

namespace remat {

struct AdamWArgs {
  Tensor param;  // (...) f32, updated in place
  Tensor grad;   // (...) f32
  Tensor m;      // (...) f32 first moment
  Tensor v;      // (...) f32 second moment
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0;
  float grad_scale = 1.0f;  // applied to grad first (gradient clipping)
  int64_t step = 1;         // 1-based, for bias correction
};

inline void check(const AdamWArgs& a) {
  REMAT_ASSERT(a.param.numel() == a.grad.numel() && a.m.numel() == a.param.numel() &&
                   a.v.numel() == a.param.numel(),
               "adamw_update: shapes {} {} {} {}", a.param.shape_str(), a.grad.shape_str(),
               a.m.shape_str(), a.v.shape_str());
}
inline OpCost cost(const AdamWArgs& a) {
  return {12.0 * static_cast<double>(a.param.numel()), 7.0 * static_cast<double>(a.param.bytes())};
}

}  // namespace remat
