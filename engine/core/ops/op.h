// What every op header (engine/core/ops/<op>.h) shares. An op is its Args struct (named tensors
// with their shapes and the [=] / [+=] contract of engine/core/backend.h), check(args) (shape
// asserts at the op boundary, on in release builds) and cost(args) (its FLOPs and bytes, the same
// on every backend, so the planner's counts are a real run's). Its scratch memory per backend is a
// rule in engine/core/cpu_workspace.h and engine/core/cuda_workspace.h; engine/core/backend.cpp
// runs them in order.
#pragma once

#include "engine/core/error.h"
#include "engine/core/tensor.h"

namespace remat {

struct OpCost {
  double flops = 0;
  double bytes = 0;  // bytes read + written by the op's kernels (a lower bound on traffic)
  // Copies between the device and the host pool (remat.offload): what crosses PCIe/C2C.
  double to_host_bytes = 0;
  double to_device_bytes = 0;
  // Bytes this rank sends to other ranks (context parallel's ring; engine/parallel).
  double ring_bytes = 0;
  // Weight-gradient FLOPs an op did NOT run because its parameter is frozen (an empty dweight):
  // what training that parameter would add. model_flops (engine/core/backend.h) subtracts them, so
  // that MFU counts what a frozen-base (LoRA) step needs; `flops` above never includes them.
  double skipped_flops = 0;
};

/// Bytes of a tensor argument, 0 for an absent (empty) one.
inline double act_bytes(const Tensor& t) {
  return t.empty() ? 0.0 : static_cast<double>(t.bytes());
}

inline void check_rows(const Tensor& a, const Tensor& b, const char* what) {
  REMAT_ASSERT(a.rows() == b.rows(), "{}: row mismatch {} vs {}", what, a.shape_str(),
               b.shape_str());
}

}  // namespace remat
