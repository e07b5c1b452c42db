// The one GEMM of the CPU backend, used by the linear layer (linear.cpp) and the LM-head loss
// (loss.cpp): row-major C (M, N) = A (M, K) B (K, N) + beta C, with optional transposes, on a
// tile grid fixed by the shape (see gemm.cpp), so its results are the same bits for any thread
// count. Internal to engine/cpu.
#pragma once

#include <cblas.h>

#include <cstdint>
#include <functional>
#include <string>

namespace remat::cpu {

/// Which library multiplies the tiles: oneDNN where libdnnl.so.2 loads (engine/cpu/onednn.h),
/// else OpenBLAS; REMAT_GEMM=openblas|onednn chooses. One library for every tile of every
/// product, so the result is still the same bits for every thread count.
struct GemmRoute {
  bool onednn = false;
  std::string describe;   // "oneDNN 2.6.3 (avx512_core_amx)" or "OpenBLAS"
  std::string warning;    // non-empty when oneDNN dispatches below what this CPU supports
  std::string chosen_by;  // "remat-train (...)" or "REMAT_GEMM"
};
/// Decided once per process; throws ConfigError for a REMAT_GEMM it does not know (the CPU
/// backend asks at construction, outside any parallel region).
const GemmRoute& gemm_route();

/// A dimension as BLAS's int; asserts that it fits.
int blas_int(int64_t v);

/// Runs on each finished tile of C, rows [row0, row0 + m) and columns [col0, col0 + n), on the
/// thread that computed it and while the tile is still in its cache: a fused epilogue.
using TileEpilogue = std::function<void(int64_t row0, int64_t col0, int64_t m, int64_t n)>;

/// On the library gemm_route() chose.
void sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
           const TileEpilogue& epilogue = {});

/// The same on a given library (the GEMM benchmark compares them); `onednn` needs onednn().
void sgemm_on(bool onednn, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,
              const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
              int64_t ldc, const TileEpilogue& epilogue = {});

}  // namespace remat::cpu
