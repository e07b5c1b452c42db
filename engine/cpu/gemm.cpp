// The CPU GEMM (see engine/cpu/gemm.h).

#include "engine/cpu/gemm.h"

#include <algorithm>

#include "engine/error.h"

namespace remat::cpu {

int blas_int(int64_t v) {
  REMAT_ASSERT(v >= 0 && v <= INT32_MAX, "GEMM dimension {} exceeds the BLAS int range", v);
  return static_cast<int>(v);
}

// Every GEMM goes through here. OpenBLAS's own threading splits the work by the thread count,
// and its results then differ in the last bits between 1 and 2 threads (measured: dW-shaped
// products with a long K, and every shape with the Haswell kernel). So the output is cut into a
// grid of tiles that depends on the shape only, each tile is one single-threaded cblas_sgemm
// (OpenBLAS runs single-threaded inside an OpenMP region), and the threads share the tiles:
// every thread count computes every element by the same call, bit for bit. Measured on 2 threads
// (SkylakeX kernel) the tiles are as fast as OpenBLAS's own split, or faster, on the model's
// shapes. Tiles shrink (to 64) until there are 8 of them, so a small output with a long K
// (a weight gradient) still keeps every thread busy.
void sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
           const TileEpilogue& epilogue) {
  int64_t tile = 256;
  auto tiles = [&](int64_t t) { return ((M + t - 1) / t) * ((N + t - 1) / t); };
  while (tile > 64 && tiles(tile) < 8) tile /= 2;
  const int64_t n_cols = (N + tile - 1) / tile;
  const int64_t n_tiles = tiles(tile);
  // Always a parallel region, even for one tile: inside an active region OpenBLAS runs
  // single-threaded, which is what makes the result independent of the thread count.
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < n_tiles; ++t) {
    const int64_t i0 = (t / n_cols) * tile, j0 = (t % n_cols) * tile;
    const int64_t m = std::min(tile, M - i0), n = std::min(tile, N - j0);
    const float* a = ta == CblasNoTrans ? A + i0 * lda : A + i0;
    const float* b = tb == CblasNoTrans ? B + j0 : B + j0 * ldb;
    cblas_sgemm(CblasRowMajor, ta, tb, blas_int(m), blas_int(n), blas_int(K), 1.0f, a,
                blas_int(lda), b, blas_int(ldb), beta, C + i0 * ldc + j0, blas_int(ldc));
    if (epilogue) epilogue(i0, j0, m, n);
  }
}

}  // namespace remat::cpu
