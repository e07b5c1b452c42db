// cuBLASLt GEMMs for the CUDA backend. Internal header of engine/cuda.
// Column-major, as cuBLASLt is: D (m x n, ld ldd) = op(A) (m x k) op(B) (k x n) + beta D, with
// fp32 compute (CUBLAS_COMPUTE_32F: bf16 inputs accumulate in fp32; f32 inputs use true fp32, not
// TF32, so the fp32 mode is a faithful reference). A row-major (R, Cc) matrix is a column-major
// (Cc, R) one with ld Cc; engine/cuda/gemm.cpp maps the row-major Linear ops onto this.
// Descriptors, layouts and the heuristic's algorithm are cached per signature (shape, transposes,
// leading dimensions, dtypes, bias and pointer alignment), so a training step does no heuristic
// work after the first. Alignments enter the signature capped at 16 bytes, the most any kernel
// asks for: where the pool happens to place a buffer then never changes the algorithm, so a run
// repeats its GEMMs' bits from one launch of the program to the next.
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

  /// D = alpha op(A) op(B) + beta D (+ bias, an f32 vector of m broadcast over D's n columns) on
  /// the engine's stream. `workspace` (ws_bytes, from the pool) may be reused by the next call as
  /// soon as this one is enqueued (same stream). The bias rides in cuBLASLt's BIAS epilogue, added
  /// to the fp32 accumulator before D's one rounding; where this cuBLASLt offers no such algorithm
  /// for the signature (f32 bias beside bf16 D is not in every release's tables), a kernel writes
  /// it into D first and the GEMM accumulates onto it, decided once per signature.
  /// `alpha` scales the product in fp32 before D's rounding (LoRA's s); it is no part of the
  /// cached plan's signature.
  void matmul(int64_t m, int64_t n, int64_t k, const GemmOperand& a, const GemmOperand& b, void* d,
              bool d_bf16, int64_t ldd, float beta, void* workspace, size_t ws_bytes,
              const float* bias = nullptr, float alpha = 1.0f);

 private:
  struct Plan;
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int,
                         int, int, int, int, int>;
  struct Shape;
  /// The cached plan of `s`, made on first use; null when `s` has a bias and cuBLASLt has no
  /// algorithm with the BIAS epilogue for it (the caller then adds the bias itself).
  Plan* plan_for(const Shape& s);

  cudaStream_t stream_;
  const CublasLtLibrary& lt_;
  cublasLtHandle_t handle_ = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  bool bias_fallback_noted_ = false;
};

}  // namespace remat::cuda
