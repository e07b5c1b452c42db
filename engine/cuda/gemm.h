// cuBLASLt GEMMs for the CUDA backend. Internal header of engine/cuda.
// Column-major, as cuBLASLt is: D (m x n, ld ldd) = op(A) (m x k) op(B) (k x n) + beta D, with
// fp32 compute (CUBLAS_COMPUTE_32F: bf16 inputs accumulate in fp32; f32 inputs use true fp32, not
// TF32, so the fp32 mode is a faithful reference). A row-major (R, Cc) matrix is a column-major
// (Cc, R) one with ld Cc; engine/cuda/gemm.cpp maps the row-major Linear ops onto this.
// Descriptors, layouts and the heuristic's algorithm are cached per signature (shape, transposes,
// leading dimensions, dtypes and pointer alignment), so a training step does no heuristic work
// after the first.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "engine/cuda/cublaslt_library.h"

namespace remat::cuda {

/// One GEMM operand as cuBLASLt sees it (column-major). A and B must have the same dtype.
struct GemmOperand {
  const void* ptr = nullptr;
  bool bf16 = false;
  int64_t ld = 0;      // leading dimension of the stored (un-transposed) matrix
  bool trans = false;  // op = transpose
};

class GemmEngine {
 public:
  /// Creates the cuBLASLt handle (needs a device), loading cuBLASLt on the first call.
  explicit GemmEngine(cudaStream_t stream);
  ~GemmEngine();
  GemmEngine(const GemmEngine&) = delete;
  GemmEngine& operator=(const GemmEngine&) = delete;

  /// D = op(A) op(B) + beta D on the engine's stream. `workspace` (ws_bytes, from the pool) may
  /// be reused by the next call as soon as this one is enqueued (same stream).
  void matmul(int64_t m, int64_t n, int64_t k, const GemmOperand& a, const GemmOperand& b, void* d,
              bool d_bf16, int64_t ldd, float beta, void* workspace, size_t ws_bytes);

 private:
  struct Plan;
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int,
                         int, int, int, int>;
  Plan& plan_for(const Key& key, int64_t m, int64_t n, int64_t k, const GemmOperand& a,
                 const GemmOperand& b, bool d_bf16, int64_t ldd, size_t ws_bytes, int align_a,
                 int align_b, int align_d);

  cudaStream_t stream_;
  const CublasLtLibrary& lt_;
  cublasLtHandle_t handle_ = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace remat::cuda
