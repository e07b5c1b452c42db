// The optimizer's two passes on the host's cores, over tensors in host memory: what the CPU
// backend's sum_squares and adamw_update run, and what the trainer runs on any backend for
// parameters whose weights, gradients and moments live in the host pool (remat.offload =
// "checkpoints+optimizer+weights"). Vectorised and threaded (OpenMP) in a fixed order: the same
// bits for any thread count, and on the CPU backend the same bits as without the offload.
#pragma once

#include <span>

#include "engine/core/ops/adamw.h"
#include "engine/core/tensor.h"

namespace remat::cpu {

/// Sum of squares of every element of every f32 tensor, in double, in a fixed order.
double host_sum_squares(std::span<const Tensor> tensors);
/// One AdamW update of a.param from a.grad, a.m and a.v (engine/core/ops/adamw.h), in place.
void host_adamw_update(const AdamWArgs& a);

}  // namespace remat::cpu
