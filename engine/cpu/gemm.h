// The one GEMM of the CPU backend, used by the linear layer (linear.cpp) and the LM-head loss
// (loss.cpp): row-major C (M, N) = A (M, K) B (K, N) + beta C, with optional transposes, on a
// tile grid fixed by the shape (see gemm.cpp), so its results are the same bits for any thread
// count. Internal to engine/cpu.
#pragma once

#include <cblas.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "engine/cpu/blas_kernel.h"
#include "engine/cpu/gemm_grid.h"

namespace remat::cpu {

class OneDnn;  // engine/cpu/onednn.h

/// Which library multiplies the tiles of which products. One library for every tile of a
/// product, chosen from the product's kind alone (never from the thread count or a timing), so
/// the result is still the same bits for every thread count.
///
/// The default, from measurements of whole training steps (alternated runs of `remat-train
/// bench`, docs/performance.md, "The GEMM library"): where oneDNN 2.6 dispatches to AVX-512 (an
/// Intel Xeon with AMX) every product on oneDNN made the MLP's step 6-12% and GPT-2's 1-4% faster
/// than with the weight gradients dY^T X on OpenBLAS's SkylakeX kernel. Where it dispatches only to
/// AVX2 (an AMD EPYC Zen 3) its dY^T X ran at 45-90% of OpenBLAS's rate, and the MLP's step was
/// faster all on OpenBLAS, except a product with a long K (the LM head's dY W, K = the
/// vocabulary), where oneDNN was ~20% faster. So: every product on oneDNN where it dispatches to
/// AVX-512; on AVX2 oneDNN for the untransposed-A products with K >= kOneDnnLongK, OpenBLAS for
/// everything else. REMAT_GEMM=openblas|onednn puts every product on one library.
struct GemmRoute {
  static constexpr int64_t kOneDnnLongK = 8192;
  bool onednn_untransposed = false;  // X W^T and dY W (A not transposed) on oneDNN ...
  int64_t onednn_min_k = 0;          // ... when K is at least this
  bool onednn_transposed = false;    // dY^T X (A transposed) on oneDNN
  std::string describe;              // "oneDNN 2.6.3 (avx512_core_amx)", "OpenBLAS", ...
  std::string warning;               // non-empty when oneDNN runs below what this CPU supports
  std::string chosen_by;             // "remat-train (...)" or "REMAT_GEMM"

  bool onednn_for(CBLAS_TRANSPOSE ta, int64_t K) const {
    return ta == CblasNoTrans ? onednn_untransposed && K >= onednn_min_k : onednn_transposed;
  }
  bool uses_onednn() const { return onednn_untransposed || onednn_transposed; }
  /// Every product on oneDNN: OpenBLAS then multiplies only ring attention's blocks.
  bool all_onednn() const { return onednn_untransposed && onednn_min_k == 0 && onednn_transposed; }
};
/// The rule above: `want` is REMAT_GEMM ("", "openblas" or "onednn"), `dnn` the loaded oneDNN
/// (null when it is missing, for `missing_reason`), `cpu` this CPU's widest vector ISA. Throws
/// ConfigError for a `want` it does not know or oneDNN asked for and missing.
GemmRoute decide_gemm_route(std::string_view want, const OneDnn* dnn,
                            const std::string& missing_reason, VectorIsa cpu);
/// decide_gemm_route for this process (REMAT_GEMM, onednn(), detect_cpu_isa()), decided once;
/// the CPU backend asks at construction, outside any parallel region.
const GemmRoute& gemm_route();

/// A dimension as BLAS's int; asserts that it fits.
int blas_int(int64_t v);

/// Runs on each finished tile of C, rows [row0, row0 + m) and columns [col0, col0 + n), on the
/// thread that computed it and while the tile is still in its cache: a fused epilogue.
using TileEpilogue = std::function<void(int64_t row0, int64_t col0, int64_t m, int64_t n)>;

/// One product on the calling thread, on the library gemm_route() chose for its kind: for a tile
/// epilogue that multiplies more into its own tile (inside sgemm's parallel region both libraries
/// run on the calling thread). Returns oneDNN's status, 0 when done: an exception must not leave
/// the parallel region, so the caller throws after it (throw_if_gemm_failed).
int sgemm_on_this_thread(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t K,
                         const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                         float* c, int64_t ldc);
/// Throws the BackendError of a failed oneDNN product (status != 0) of M x N x K.
void throw_if_gemm_failed(int status, int64_t M, int64_t N, int64_t K);

/// On the library gemm_route() chose for a product of this kind.
void sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
           const TileEpilogue& epilogue = {});

/// The same on a given library (the GEMM benchmark compares them); `onednn` needs onednn().
void sgemm_on(bool onednn, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,
              const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
              int64_t ldc, const TileEpilogue& epilogue = {});

/// The product on a split grid (gemm_grid.h): each tile's slab 0 goes into C with `beta`, its
/// other slabs into `partials` (split_partial_floats(grid, M, N) floats, unused when the grid has
/// one slab), every call single-threaded and the calls shared by the threads; then C gets the
/// partial sums added in slab order. The same bits for every thread count.
void sgemm_split(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,
                 const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                 int64_t ldc, float* partials, const SplitGrid& grid);
/// The same on a given library (the GEMM benchmark compares them); `onednn` needs onednn().
void sgemm_split_on(bool onednn, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N,
                    int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                    float* C, int64_t ldc, float* partials, const SplitGrid& grid);

/// C (M, N) = A (M, K) B (K, N), both untransposed, for a long K and a small C (the LM head's
/// dY W, K = the vocabulary): the split of one tile into `slabs` (sgemm_split), so each operand is
/// packed once, where a tile grid over C packs A once per column of tiles and B once per row;
/// `partials` holds (slabs - 1) M N floats.
void sgemm_k_slabs(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                   int64_t ldb, float* C, int64_t ldc, float* partials, int64_t slabs);
/// The same on a given library (the GEMM benchmark compares them); `onednn` needs onednn().
void sgemm_k_slabs_on(bool onednn, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float* C, int64_t ldc, float* partials,
                      int64_t slabs);

}  // namespace remat::cpu
