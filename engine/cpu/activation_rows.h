// The per-element activation code of engine/cpu/activation.cpp on one contiguous run of
// elements, single-threaded: the activation ops split tensors into chunks of it, and the linear
// layer's fused epilogues (linear.cpp) apply it to each GEMM tile's rows. Each element's result
// does not depend on where the run starts or ends, so every caller gets the same bits.
// Internal to engine/cpu.
#pragma once

#include <cstdint>

#include "engine/core/ops/activation.h"

namespace remat::cpu {

/// y[i] = act(x[i]) for i in [0, n).
void activation_forward_row(Activation kind, const float* x, float* y, int64_t n);

/// dx[i] = dy[i] act'(x[i]) for i in [0, n); dx may alias dy.
void activation_backward_row(Activation kind, const float* x, const float* dy, float* dx,
                             int64_t n);

}  // namespace remat::cpu
