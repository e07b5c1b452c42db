// Launchers of the Llama family's kernels: RMSNorm and the per-head q/k RMSNorm (rmsnorm.cu) and
// SwiGLU's gate (swiglu.cu). Internal header of engine/cuda, plain C++ like kernels.cuh and with
// its conventions: each launcher enqueues on `stream` and returns at once (the caller checks
// cudaGetLastError() in CudaBackend::finish_op); `bf16` selects the storage type of the void*
// activation pointers (__nv_bfloat16 or float); parameters, their gradients and the statistics
// are float; math is float and every reduction runs in a fixed order (no atomics), so results
// repeat bit for bit run to run.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/kernels.cuh"

namespace remat::cuda::kern {

// ---- RMSNorm (rmsnorm.cu): engine/core/ops/rmsnorm.h's Args as raw pointers ----
struct RmsNormForwardParams {
  void* out;
  float* rstd;
  const void* inp;
  const float* weight;
  int64_t N, C;
  float eps;
  bool bf16;
};
void rmsnorm_forward(const RmsNormForwardParams& p, cudaStream_t s);
/// dinp += ... (the residual stream); dweight += sum over rows (through r's two passes).
struct RmsNormBackwardParams {
  void* dinp;
  float* dweight;
  const void* dout;
  const void* inp;
  const float* weight;
  const float* rstd;
  int64_t N, C;
  bool bf16;
};
void rmsnorm_backward(const RmsNormBackwardParams& p, const ColumnReduce& r, cudaStream_t s);

/// Rows (N, (NH + 2 KVH) HS): NH query heads normalized by q_weight, KVH key heads by k_weight,
/// KVH value heads copied; rstd (N, NH + KVH).
struct QkNormForwardParams {
  void* out;
  float* rstd;
  const void* inp;
  const float* q_weight;
  const float* k_weight;
  int64_t N, NH, KVH, HS;
  float eps;
  bool bf16;
};
void qk_norm_forward(const QkNormForwardParams& p, cudaStream_t s);
/// dinp = ... (value heads: dout); dq_weight, dk_weight += sums over every row's heads of the kind.
struct QkNormBackwardParams {
  void* dinp;
  float* dq_weight;
  float* dk_weight;
  const void* dout;
  const void* inp;
  const float* q_weight;
  const float* k_weight;
  const float* rstd;
  int64_t N, NH, KVH, HS;
  bool bf16;
};
void qk_norm_backward(const QkNormBackwardParams& p, const ColumnReduce& r, cudaStream_t s);

// ---- SwiGLU (swiglu.cu): out = silu(gate) up over n elements ----
struct SwiGluForwardParams {
  void* out;
  const void* gate;
  const void* up;
  int64_t n;
  bool bf16;
};
void swiglu_forward(const SwiGluForwardParams& p, cudaStream_t s);
/// dgate, dup = ... (overwritten). Each element reads its inputs before writing, so a gradient
/// may alias an input of its own element.
struct SwiGluBackwardParams {
  void* dgate;
  void* dup;
  const void* dout;
  const void* gate;
  const void* up;
  int64_t n;
  bool bf16;
};
void swiglu_backward(const SwiGluBackwardParams& p, cudaStream_t s);

}  // namespace remat::cuda::kern
