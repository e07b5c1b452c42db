// The CPU GEMM (see engine/cpu/gemm.h).

#include "engine/cpu/gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string_view>

#include "engine/core/error.h"
#include "engine/cpu/onednn.h"
#include "engine/cpu/tile_schedule.h"

namespace remat::cpu {

GemmRoute decide_gemm_route(std::string_view want, const OneDnn* dnn,
                            const std::string& missing_reason, VectorIsa cpu) {
  if (!want.empty() && want != "openblas" && want != "onednn")
    throw ConfigError(
        fmt::format("REMAT_GEMM={}: unknown GEMM library. Fix: unset it (the library measured "
                    "faster for each product on this CPU), or set REMAT_GEMM=onednn or "
                    "REMAT_GEMM=openblas",
                    want));
  if (want == "onednn" && !dnn)
    throw ConfigError(fmt::format(
        "REMAT_GEMM=onednn: {}. Fix: install Debian's libdnnl2 (scripts/install-deps.sh does), "
        "or set REMAT_GEMM=openblas",
        missing_reason));
  GemmRoute r;
  if (want == "onednn") {
    r.onednn_untransposed = r.onednn_transposed = true;
    r.chosen_by = "REMAT_GEMM";
  } else if (want == "openblas") {
    r.chosen_by = "REMAT_GEMM";
  } else if (!dnn) {
    r.chosen_by = "remat-train: " + missing_reason;
  } else if (dnn->isa_class() == VectorIsa::Avx512) {
    r.onednn_untransposed = r.onednn_transposed = true;
    r.chosen_by =
        "remat-train (default: oneDNN dispatches to AVX-512 here, where whole steps were faster "
        "on it; REMAT_GEMM=openblas for OpenBLAS)";
  } else {
    r.onednn_untransposed = true;
    r.onednn_min_k = GemmRoute::kOneDnnLongK;
    r.chosen_by = fmt::format(
        "remat-train (default: {} dispatches only to {} on this CPU, where OpenBLAS is faster "
        "but for a long K; REMAT_GEMM=onednn or openblas for one library)",
        dnn->version(), dnn->isa());
  }
  const std::string dnn_name = dnn ? fmt::format("{} ({})", dnn->version(), dnn->isa()) : "";
  if (r.onednn_transposed)
    r.describe = dnn_name;
  else if (r.onednn_untransposed)
    r.describe =
        fmt::format("OpenBLAS, {} for X W^T and dY W with K >= {}", dnn_name, r.onednn_min_k);
  else
    r.describe = "OpenBLAS";
  // As for OpenBLAS's kernel (blas_kernel.h): narrower vectors than the CPU has are a mistake to
  // show, never a silent fallback. Only the user can cause it here (ONEDNN_MAX_CPU_ISA).
  if (r.uses_onednn() && dnn->isa_class() < cpu)
    r.warning = fmt::format(
        "BELOW THIS CPU: oneDNN dispatches only up to {} (slower GEMMs); unset "
        "ONEDNN_MAX_CPU_ISA and DNNL_MAX_CPU_ISA",
        dnn->isa());
  return r;
}

const GemmRoute& gemm_route() {
  static const GemmRoute route = [] {
    const char* env = std::getenv("REMAT_GEMM");
    const std::string_view want = env ? env : "";
    // REMAT_GEMM=openblas never loads oneDNN.
    const OneDnn* dnn = want == "openblas" ? nullptr : onednn();
    return decide_gemm_route(want, dnn, onednn_missing_reason(), detect_cpu_isa());
  }();
  return route;
}

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
// shapes. The grid (choose_tile_grid) has 8 tiles or more wherever the output allows, so a small
// output with a long K (a weight gradient) still keeps every thread busy.
void sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
           const TileEpilogue& epilogue) {
  sgemm_on(gemm_route().onednn_for(ta, K), ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, epilogue);
}

namespace {

// One single-threaded library call (inside a parallel region, or a team of one, oneDNN and
// OpenBLAS both run on the calling thread only). A oneDNN failure is kept in `status`: an
// exception must not leave a parallel region.
void multiply_on_this_thread(const OneDnn* dnnl, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m,
                             int64_t n, int64_t K, const float* a, int64_t lda, const float* b,
                             int64_t ldb, float beta, float* c, int64_t ldc,
                             std::atomic<int>& status) {
  if (dnnl) {
    if (const int s = dnnl->sgemm_on_this_thread(ta == CblasNoTrans ? 'N' : 'T',
                                                 tb == CblasNoTrans ? 'N' : 'T', m, n, K, 1.0f, a,
                                                 lda, b, ldb, beta, c, ldc))
      status = s;
  } else {
    cblas_sgemm(CblasRowMajor, ta, tb, blas_int(m), blas_int(n), blas_int(K), 1.0f, a,
                blas_int(lda), b, blas_int(ldb), beta, c, blas_int(ldc));
  }
}

void throw_if_failed(const std::atomic<int>& status, int64_t M, int64_t N, int64_t K) {
  throw_if_gemm_failed(status.load(), M, N, K);
}

const OneDnn* library(bool use_onednn) {
  REMAT_ASSERT(!use_onednn || onednn() != nullptr, "a oneDNN GEMM without oneDNN");
  return use_onednn ? onednn() : nullptr;
}

}  // namespace

void throw_if_gemm_failed(int status, int64_t M, int64_t N, int64_t K) {
  if (status)
    throw BackendError(
        fmt::format("[cpu] oneDNN's dnnl_sgemm failed (status {}) on a {}x{}x{} "
                    "product. Fix: run with REMAT_GEMM=openblas, and report it",
                    status, M, N, K));
}

int sgemm_on_this_thread(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t K,
                         const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                         float* c, int64_t ldc) {
  std::atomic<int> status{0};
  multiply_on_this_thread(library(gemm_route().onednn_for(ta, K)), ta, tb, m, n, K, a, lda, b, ldb,
                          beta, c, ldc, status);
  return status.load();
}

void sgemm_on(bool use_onednn, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N,
              int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
              float* C, int64_t ldc, const TileEpilogue& epilogue) {
  const TileGrid grid = choose_tile_grid(M, N);
  const int64_t tm = grid.rows, tn = grid.cols;
  const int64_t n_cols = (N + tn - 1) / tn;
  const int64_t n_tiles = n_cols * ((M + tm - 1) / tm);
  const OneDnn* dnnl = library(use_onednn);
  std::atomic<int> status{0};
  // Always a parallel region, even for one tile: inside an active region OpenBLAS runs
  // single-threaded, which is what makes the result independent of the thread count.
  for_each_call_own_share_first(n_tiles, [&](int64_t t) {
    const int64_t i0 = (t / n_cols) * tm, j0 = (t % n_cols) * tn;
    const int64_t m = std::min(tm, M - i0), n = std::min(tn, N - j0);
    const float* a = ta == CblasNoTrans ? A + i0 * lda : A + i0;
    const float* b = tb == CblasNoTrans ? B + j0 : B + j0 * ldb;
    multiply_on_this_thread(dnnl, ta, tb, m, n, K, a, lda, b, ldb, beta, C + i0 * ldc + j0, ldc,
                            status);
    if (epilogue) epilogue(i0, j0, m, n);
  });
  throw_if_failed(status, M, N, K);
}

void sgemm_split(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,
                 const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                 int64_t ldc, float* partials, const SplitGrid& grid) {
  sgemm_split_on(gemm_route().onednn_for(ta, K), ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc,
                 partials, grid);
}

void sgemm_split_on(bool use_onednn, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N,
                    int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                    float* C, int64_t ldc, float* partials, const SplitGrid& grid) {
  const int64_t S = grid.slabs, tm = grid.tiles.rows, tn = grid.tiles.cols;
  REMAT_ASSERT(S >= 1 && S <= std::max<int64_t>(K, 1), "sgemm_split: {} slabs of K = {}", S, K);
  // With one slab, the calls of sgemm_on's loop over the same tiles: the same bits.
  const int64_t n_cols = (N + tn - 1) / tn;
  const int64_t n_tiles = n_cols * ((M + tm - 1) / tm);
  const OneDnn* dnnl = library(use_onednn);
  std::atomic<int> status{0};
  auto slab_begin = [&](int64_t s) { return K * s / S; };
  // Call u is slab u % S of tile u / S. Slab s of every tile writes the same partial matrix
  // (s - 1), at the tile's place in it.
  for_each_call_own_share_first(n_tiles * S, [&](int64_t u) {
    const int64_t t = u / S, s = u % S, k0 = slab_begin(s), k1 = slab_begin(s + 1);
    const int64_t i0 = (t / n_cols) * tm, j0 = (t % n_cols) * tn;
    const int64_t m = std::min(tm, M - i0), n = std::min(tn, N - j0);
    const float* a = ta == CblasNoTrans ? A + i0 * lda + k0 : A + k0 * lda + i0;
    const float* b = tb == CblasNoTrans ? B + k0 * ldb + j0 : B + j0 * ldb + k0;
    float* out = s == 0 ? C + i0 * ldc + j0 : partials + (s - 1) * M * N + i0 * N + j0;
    multiply_on_this_thread(dnnl, ta, tb, m, n, k1 - k0, a, lda, b, ldb, s == 0 ? beta : 0.0f, out,
                            s == 0 ? ldc : N, status);
  });
  throw_if_failed(status, M, N, K);
  // C = ((C' + P1) + P2) + ...: one order for every element, whatever the threads.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < M; ++i)
    for (int64_t s = 1; s < S; ++s) {
      const float* p = partials + (s - 1) * M * N + i * N;
      float* c = C + i * ldc;
#pragma omp simd
      for (int64_t j = 0; j < N; ++j) c[j] += p[j];
    }
}

void sgemm_k_slabs(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                   int64_t ldb, float* C, int64_t ldc, float* partials, int64_t slabs) {
  // The library of the whole product's kind: a slab's K is shorter than the product's.
  sgemm_k_slabs_on(gemm_route().onednn_for(CblasNoTrans, K), M, N, K, A, lda, B, ldb, C, ldc,
                   partials, slabs);
}

void sgemm_k_slabs_on(bool use_onednn, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float* C, int64_t ldc, float* partials,
                      int64_t slabs) {
  // One tile spanning C: the slabs are the only split.
  const SplitGrid one_tile{{std::max<int64_t>(M, 1), std::max<int64_t>(N, 1)}, slabs};
  sgemm_split_on(use_onednn, CblasNoTrans, CblasNoTrans, M, N, K, A, lda, B, ldb, 0.0f, C, ldc,
                 partials, one_tile);
}

}  // namespace remat::cpu
