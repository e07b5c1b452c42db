// The CPU GEMM (see engine/cpu/gemm.h).

#include "engine/cpu/gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string_view>

#include "engine/cpu/onednn.h"
#include "engine/error.h"

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

// Each tile is one library call, which packs the tile's rows of A and columns of B into its own
// buffers: a grid of r x c tiles packs A c times and B r times, K (M c + N r) floats. The grid
// packing the least is the one to run, among those with at least kMinTiles tiles (so that up to 8
// threads share a product evenly) of at most kMaxTileElems elements (so that a fused epilogue
// finds its tile in a 1-2 MiB L2, as it did with the square 512 tiles before). Tile sides are
// multiples of 16 (a vector of AVX-512), so column tiles start on whole vectors. Measured on the
// Intel VM (2026-12-02): GPT-2 124M's step 4% faster than with square tiles (3 of 3 alternated
// pairs), the LM head's dY W (192 x 768 x 50257: 8 column tiles spanning all rows, not 12
// squares of 128) 8% faster. A function of (M, N) alone: never of the thread count.
TileGrid choose_tile_grid(int64_t M, int64_t N) {
  constexpr int64_t kMinTiles = 8, kMaxTileElems = 512 * 512, kAlign = 16;
  auto round_up = [](int64_t v, int64_t a) { return (v + a - 1) / a * a; };
  auto cdiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  // One tile for an output too small to split (an empty one included: sides stay positive).
  TileGrid best{std::max(kAlign, round_up(M, kAlign)), std::max(kAlign, round_up(N, kAlign))};
  int64_t best_cost = -1, best_tiles = 0;
  for (int64_t r = 1; r <= cdiv(M, kAlign); ++r) {
    const int64_t tm = round_up(cdiv(M, r), kAlign), rows = cdiv(M, tm);
    if (r > 1 && round_up(cdiv(M, r - 1), kAlign) == tm) continue;  // the same grid as r - 1
    // The fewest column tiles that make kMinTiles in all and keep a tile within kMaxTileElems.
    int64_t c = std::max<int64_t>(1, cdiv(kMinTiles, rows));
    c = std::max(c, cdiv(N, std::max<int64_t>(kAlign, kMaxTileElems / tm / kAlign * kAlign)));
    const int64_t tn = round_up(cdiv(N, std::min(c, cdiv(N, kAlign))), kAlign), cols = cdiv(N, tn);
    const int64_t cost = M * cols + N * rows, n_tiles = rows * cols;
    // A grid short of kMinTiles (its columns ran out) only wins while no grid reaches it.
    const bool enough = n_tiles >= kMinTiles, best_enough = best_tiles >= kMinTiles;
    if (best_cost < 0 || (enough && !best_enough) ||
        (enough == best_enough &&
         (cost < best_cost || (cost == best_cost && n_tiles < best_tiles)))) {
      best = {tm, tn};
      best_cost = cost;
      best_tiles = n_tiles;
    }
  }
  return best;
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
  if (const int s = status.load())
    throw BackendError(
        fmt::format("[cpu] oneDNN's dnnl_sgemm failed (status {}) on a {}x{}x{} "
                    "product. Fix: run with REMAT_GEMM=openblas, and report it",
                    s, M, N, K));
}

const OneDnn* library(bool use_onednn) {
  REMAT_ASSERT(!use_onednn || onednn() != nullptr, "a oneDNN GEMM without oneDNN");
  return use_onednn ? onednn() : nullptr;
}

}  // namespace

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
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < n_tiles; ++t) {
    const int64_t i0 = (t / n_cols) * tm, j0 = (t % n_cols) * tn;
    const int64_t m = std::min(tm, M - i0), n = std::min(tn, N - j0);
    const float* a = ta == CblasNoTrans ? A + i0 * lda : A + i0;
    const float* b = tb == CblasNoTrans ? B + j0 : B + j0 * ldb;
    multiply_on_this_thread(dnnl, ta, tb, m, n, K, a, lda, b, ldb, beta, C + i0 * ldc + j0, ldc,
                            status);
    if (epilogue) epilogue(i0, j0, m, n);
  }
  throw_if_failed(status, M, N, K);
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
  const int64_t S = slabs;
  REMAT_ASSERT(S >= 1 && S <= K, "sgemm_k_slabs: {} slabs of K = {}", S, K);
  const OneDnn* dnnl = library(use_onednn);
  std::atomic<int> status{0};
  auto slab_begin = [&](int64_t s) { return K * s / S; };
#pragma omp parallel for schedule(dynamic)
  for (int64_t s = 0; s < S; ++s) {
    const int64_t k0 = slab_begin(s), k1 = slab_begin(s + 1);
    float* out = s == 0 ? C : partials + (s - 1) * M * N;
    const int64_t ld_out = s == 0 ? ldc : N;
    multiply_on_this_thread(dnnl, CblasNoTrans, CblasNoTrans, M, N, k1 - k0, A + k0, lda,
                            B + k0 * ldb, ldb, 0.0f, out, ld_out, status);
  }
  throw_if_failed(status, M, N, K);
  // C = (((P0 + P1) + P2) + ...): one order for every element, whatever the threads.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < M; ++i)
    for (int64_t s = 1; s < S; ++s) {
      const float* p = partials + (s - 1) * M * N + i * N;
      float* c = C + i * ldc;
#pragma omp simd
      for (int64_t j = 0; j < N; ++j) c[j] += p[j];
    }
}

}  // namespace remat::cpu
