// Status checks for CUDA, cuBLAS(Lt) and cuDNN calls: each failing call becomes a BackendError
// naming the expression, file:line and the library's own error string.
// After such an error the CUDA context may be unusable: callers report and exit, never retry.
// Internal header of engine/cuda (host code only; .cu files use kernels.cuh instead).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

#include "engine/core/error.h"

namespace remat::cuda::detail {

[[noreturn]] void throw_cuda_error(cudaError_t e, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t s, const char* expr, const char* file,
                                     int line);
/// Includes cudnnGetLastErrorString's reason chain (e.g. "outputGraph.buildDAG()").
[[noreturn]] void throw_cudnn_error(cudnnStatus_t s, const char* expr, const char* file, int line);
/// cuDNN's last error message on this thread, whole (its reason chains can exceed 1 KiB).
std::string cudnn_last_error();

/// True when REMAT_CUDA_SYNC=1: every op is followed by a stream sync and a status check, so an
/// asynchronous fault is reported at the op that caused it.
bool sync_after_each_op();

}  // namespace remat::cuda::detail

#define REMAT_CUDA_CHECK(expr)                                                      \
  do {                                                                              \
    const cudaError_t remat_e_ = (expr);                                            \
    if (remat_e_ != cudaSuccess) [[unlikely]]                                       \
      ::remat::cuda::detail::throw_cuda_error(remat_e_, #expr, __FILE__, __LINE__); \
  } while (0)

#define REMAT_CUBLAS_CHECK(expr)                                                      \
  do {                                                                                \
    const cublasStatus_t remat_s_ = (expr);                                           \
    if (remat_s_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                               \
      ::remat::cuda::detail::throw_cublas_error(remat_s_, #expr, __FILE__, __LINE__); \
  } while (0)

#define REMAT_CUDNN_CHECK(expr)                                                      \
  do {                                                                               \
    const cudnnStatus_t remat_s_ = (expr);                                           \
    if (remat_s_ != CUDNN_STATUS_SUCCESS) [[unlikely]]                               \
      ::remat::cuda::detail::throw_cudnn_error(remat_s_, #expr, __FILE__, __LINE__); \
  } while (0)
