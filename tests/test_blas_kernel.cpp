// The BLAS kernel is chosen from the CPU's vector ISA, never left at a generic fallback on a CPU
// with AVX2 or AVX-512 (engine/cpu/blas_kernel.h); a kernel forced below the CPU is reported.
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <catch2/catch.hpp>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/cpu/blas_kernel.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/gemm.h"
#include "engine/cpu/onednn.h"
#include "engine/cpu/tile_schedule.h"
#include "tests/cli_util.h"

using namespace remat::cpu;
using Catch::Matchers::Contains;

namespace {
// `env` arguments that unset the variables choosing the GEMM library or holding oneDNN below the
// CPU, for the --version runs that must see the default route. A machine may set them for every
// process.
const std::string kUnsetGemmChoice = "-u REMAT_GEMM -u ONEDNN_MAX_CPU_ISA -u DNNL_MAX_CPU_ISA";
}  // namespace

TEST_CASE("OpenBLAS core names map to the ISA of their SGEMM kernels", "[blas]") {
  CHECK(kernel_isa("SkylakeX") == VectorIsa::Avx512);
  CHECK(kernel_isa("Cooperlake") == VectorIsa::Avx512);
  CHECK(kernel_isa("Haswell") == VectorIsa::Avx2);
  CHECK(kernel_isa("Zen") == VectorIsa::Avx2);
  for (const char* generic : {"Prescott", "Core2", "Nehalem", "Sandybridge", "unknown"})
    CHECK(kernel_isa(generic) == VectorIsa::Sse);
}

TEST_CASE("the kernel in use is as wide as the CPU's vectors unless OPENBLAS_CORETYPE forces it",
          "[blas]") {
  const BlasKernelChoice& k = select_blas_kernel();
  INFO("kernel " << k.core << ", chosen by " << k.chosen_by);
  CHECK(k.cpu_isa == detect_cpu_isa());
  CHECK(k.kernel_isa == kernel_isa(k.core));
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (forced && *forced) {
    CHECK(k.chosen_by == "OPENBLAS_CORETYPE");
  } else {
    CHECK(k.kernel_isa >= k.cpu_isa);
    CHECK_FALSE(k.below_cpu());
    CHECK(blas_info().warning.empty());
  }
}

TEST_CASE(
    "remat-train --version names the kernel and who chose it, and warns of a forced generic kernel",
    "[blas][smoke]") {
  const remat::test::CliResult plain = remat::test::run_binary("--version", true);
  REQUIRE(plain.code == 0);
  CHECK_THAT(plain.out, Contains("CPU kernel ") && Contains("(chosen by "));
  if (detect_cpu_isa() == VectorIsa::Sse) return;  // nothing wider to fall below
  // The variable must reach the binary itself, so run_binary's `cd DIR && BIN` gets `env`.
  const remat::test::CliResult forced =
      remat::test::run_binary("--version", true, kUnsetGemmChoice + " OPENBLAS_CORETYPE=Prescott");
  REQUIRE(forced.code == 0);
  CHECK_THAT(forced.out, Contains("CPU kernel Prescott (chosen by OPENBLAS_CORETYPE)") &&
                             Contains("warning: BELOW THIS CPU"));
  // The warning names what the slow kernel slows: the GEMMs, or (every tile on oneDNN, the
  // default where oneDNN dispatches to AVX-512) only ring attention.
  const bool all_onednn = forced.out.find("CPU GEMM: tiles on oneDNN ") != std::string::npos;
  CHECK_THAT(
      forced.out,
      Contains(all_onednn ? "slower ring attention; the GEMM tiles run on oneDNN and are not slowed"
                          : "slower GEMMs"));
  const remat::test::CliResult on_openblas =
      remat::test::run_binary("--version", true, "REMAT_GEMM=openblas OPENBLAS_CORETYPE=Prescott");
  REQUIRE(on_openblas.code == 0);
  CHECK_THAT(on_openblas.out, Contains("(~2-5x slower GEMMs)"));
}

TEST_CASE("the GEMM route puts each product on the library measured faster for it", "[blas]") {
  const OneDnn avx512(nullptr, "oneDNN 2.6.3", "avx512_core", VectorIsa::Avx512);
  const OneDnn avx2(nullptr, "oneDNN 2.6.3", "avx2", VectorIsa::Avx2);
  // AVX-512: every product on oneDNN, the weight gradients dY^T X too.
  const GemmRoute wide = decide_gemm_route("", &avx512, "", VectorIsa::Avx512);
  CHECK(wide.onednn_for(CblasNoTrans, 768));
  CHECK(wide.onednn_for(CblasTrans, 768));
  CHECK(wide.describe == "oneDNN 2.6.3 (avx512_core)");
  CHECK_THAT(wide.chosen_by, Contains("dispatches to AVX-512"));
  CHECK(wide.warning.empty());
  // oneDNN on AVX2 (the CPU's, or held there on an AVX-512 CPU): OpenBLAS for every product
  // but the untransposed ones with a long K (the LM head's dY W).
  for (VectorIsa cpu : {VectorIsa::Avx2, VectorIsa::Avx512}) {
    const GemmRoute narrow = decide_gemm_route("", &avx2, "", cpu);
    CHECK_FALSE(narrow.onednn_for(CblasNoTrans, 3072));
    CHECK(narrow.onednn_for(CblasNoTrans, 50257));
    CHECK_FALSE(narrow.onednn_for(CblasTrans, 50257));
    CHECK(narrow.describe == "OpenBLAS, oneDNN 2.6.3 (avx2) for X W^T and dY W with K >= 8192");
    CHECK_THAT(narrow.chosen_by, Contains("dispatches only to avx2"));
    // Held below an AVX-512 CPU (ONEDNN_MAX_CPU_ISA), its long-K products are flagged.
    CHECK(narrow.warning.empty() == (cpu == VectorIsa::Avx2));
  }
  // REMAT_GEMM puts every product on one library; a held-back oneDNN asked for is flagged.
  const GemmRoute forced = decide_gemm_route("onednn", &avx2, "", VectorIsa::Avx512);
  CHECK((forced.onednn_for(CblasNoTrans, 1) && forced.onednn_for(CblasTrans, 1)));
  CHECK(forced.describe == "oneDNN 2.6.3 (avx2)");
  CHECK_THAT(forced.warning, Contains("BELOW THIS CPU"));
  CHECK_FALSE(decide_gemm_route("openblas", &avx512, "", VectorIsa::Avx512).uses_onednn());
  const GemmRoute missing =
      decide_gemm_route("", nullptr, "libdnnl.so.2 is not installed", VectorIsa::Avx512);
  CHECK_FALSE(missing.uses_onednn());
  CHECK_THAT(missing.chosen_by, Contains("libdnnl.so.2 is not installed"));
  CHECK_THROWS_WITH(decide_gemm_route("onednn", nullptr, "not installed", VectorIsa::Avx2),
                    Contains("REMAT_GEMM=onednn: not installed") && Contains("Fix:"));
  CHECK_THROWS_WITH(decide_gemm_route("mkl", &avx2, "", VectorIsa::Avx2),
                    Contains("REMAT_GEMM=mkl") && Contains("Fix:"));
}

TEST_CASE("the GEMM's tile grid packs the least among grids that keep 8 threads busy", "[blas]") {
  constexpr int64_t kAlign = 16, kMinTiles = 8, kMaxTileElems = 512 * 512;
  auto cdiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  // Packing cost of a grid: A once per column of tiles, B once per row of tiles (gemm.cpp).
  auto cost = [&](int64_t M, int64_t N, int64_t tm, int64_t tn) {
    return M * cdiv(N, tn) + N * cdiv(M, tm);
  };
  const std::pair<int64_t, int64_t> shapes[] = {
      {1024, 2304}, {1024, 768}, {768, 3072}, {192, 768}, {4096, 512}, {512, 512}, {768, 768},
      {64, 768},    {100, 37},   {7, 13},     {1, 1},     {0, 5},      {300, 1000}};
  for (const auto& [M, N] : shapes) {
    CAPTURE(M, N);
    const TileGrid g = choose_tile_grid(M, N);
    REQUIRE((g.rows > 0 && g.cols > 0));
    CHECK((g.rows % kAlign == 0 && g.cols % kAlign == 0));
    CHECK(g.rows * g.cols <= kMaxTileElems);
    const int64_t tiles = cdiv(M, g.rows) * cdiv(N, g.cols);
    const bool splittable = cdiv(M, kAlign) * cdiv(N, kAlign) >= kMinTiles;
    if (splittable) CHECK(tiles >= kMinTiles);
    if (M == 0 || N == 0) continue;
    // Every grid of 16-multiples that satisfies the same limits packs at least as much.
    for (int64_t tm = kAlign; tm < M + kAlign; tm += kAlign)
      for (int64_t tn = kAlign; tn < N + kAlign; tn += kAlign) {
        const bool valid =
            tm * tn <= kMaxTileElems && (!splittable || cdiv(M, tm) * cdiv(N, tn) >= kMinTiles);
        if (valid) CHECK(cost(M, N, g.rows, g.cols) <= cost(M, N, tm, tn));
      }
  }
  // The LM head's dX (dY W, K = the vocabulary, 192 rows a chunk): 8 column tiles spanning all
  // the rows, not 12 squares of 128 that would pack the 192 x 50257 dY six times and W twice.
  const TileGrid lm = choose_tile_grid(192, 768);
  CHECK((lm.rows == 192 && lm.cols == 96));
}

TEST_CASE("a weight gradient over many rows is cut along them where that moves the least memory",
          "[blas]") {
  constexpr int64_t kAlign = 16, kMinCalls = 8, kMaxTileElems = 512 * 512, kMinSlabK = 1024;
  constexpr int64_t kPartialCost = 2;  // gemm_grid.cpp: packed floats per partial element
  auto cdiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  auto cost = [&](int64_t M, int64_t N, int64_t K, int64_t tm, int64_t tn, int64_t S) {
    return K * (M * cdiv(N, tn) + N * cdiv(M, tm)) + kPartialCost * (S - 1) * M * N;
  };
  // (M, N, K) of dW = dY^T X: the tutorial MLP's, the 4-layer T = 4096 model's, the 64k-token
  // example's, GPT-2 124M's at 1024 tokens and at 8192, and shapes of no tile.
  const std::array<int64_t, 3> shapes[] = {
      {512, 512, 4096}, {768, 256, 4096},  {256, 1024, 4096}, {64, 64, 65536},  {192, 64, 65536},
      {768, 768, 1024}, {2304, 768, 1024}, {768, 3072, 1024}, {768, 768, 8192}, {29, 77, 5000},
      {100, 37, 3000},  {7, 13, 100000},   {300, 300, 1001},  {1, 1, 1}};
  for (const auto& [M, N, K] : shapes) {
    CAPTURE(M, N, K);
    const SplitGrid g = choose_split_grid(M, N, K);
    const TileGrid plain = choose_tile_grid(M, N);
    REQUIRE((g.tiles.rows > 0 && g.tiles.cols > 0 && g.slabs >= 1));
    CHECK((g.tiles.rows % kAlign == 0 && g.tiles.cols % kAlign == 0));
    CHECK(g.tiles.rows * g.tiles.cols <= kMaxTileElems);
    CHECK(split_partial_floats(g, M, N) == (g.slabs - 1) * M * N);
    if (g.slabs == 1) {  // not split: the tile grid itself, so the bits are the tiles' own
      CHECK((g.tiles.rows == plain.rows && g.tiles.cols == plain.cols));
      continue;
    }
    CHECK(K / g.slabs >= kMinSlabK);
    const int64_t calls = cdiv(M, g.tiles.rows) * cdiv(N, g.tiles.cols) * g.slabs;
    CHECK(calls >= kMinCalls);
    // Cheaper than the tile grid (or, for an output too small for 8 tiles, 8 calls where the
    // tiles make fewer), and than any other split of 16-multiples that makes 8 calls.
    const int64_t chosen = cost(M, N, K, g.tiles.rows, g.tiles.cols, g.slabs);
    if (cdiv(M, plain.rows) * cdiv(N, plain.cols) >= kMinCalls)
      CHECK(chosen < cost(M, N, K, plain.rows, plain.cols, 1));
    for (int64_t tm = kAlign; tm < M + kAlign; tm += kAlign)
      for (int64_t tn = kAlign; tn < N + kAlign; tn += kAlign)
        for (int64_t S = 2; S <= 8 && K / S >= kMinSlabK; ++S)
          if (tm * tn <= kMaxTileElems && cdiv(M, tm) * cdiv(N, tn) * S >= kMinCalls)
            CHECK(chosen <= cost(M, N, K, tm, tn, S));
  }
  // GPT-2 at 1024 tokens keeps its tiles (slabs of K = 512 measured slower there); the MLP's
  // weight gradient is 2 tiles of 4 slabs; the long-context one 8 slabs of one tile.
  for (const auto& [M, N] : {std::pair<int64_t, int64_t>{768, 768}, {2304, 768}, {768, 3072}})
    CHECK(choose_split_grid(M, N, 1024).slabs == 1);
  const SplitGrid mlp = choose_split_grid(512, 512, 4096);
  CHECK((mlp.tiles.rows == 512 && mlp.tiles.cols == 256 && mlp.slabs == 4));
  const SplitGrid long_context = choose_split_grid(64, 64, 65536);
  CHECK(
      (long_context.tiles.rows == 64 && long_context.tiles.cols == 64 && long_context.slabs == 8));
}

TEST_CASE(
    "a split product is the product for every transpose, the same bits for 1, 2 and 3 threads",
    "[blas][threads]") {
  const int64_t M = 45, N = 70, K = 3001;  // multiples of no tile; slabs of 1000 and 1001
  const SplitGrid grid{{32, 48}, 3};       // 2 x 2 tiles, 3 slabs
  std::vector<float> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(K * N)),
      c0(static_cast<size_t>(M * N));
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 7919) % 23) / 11.0f - 1.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 104729) % 19) / 9.0f - 1.0f;
  for (size_t i = 0; i < c0.size(); ++i) c0[i] = static_cast<float>(i % 5) - 2.0f;
  std::vector<float> partials(static_cast<size_t>(split_partial_floats(grid, M, N)));
  for (const CBLAS_TRANSPOSE ta : {CblasNoTrans, CblasTrans})
    for (const CBLAS_TRANSPOSE tb : {CblasNoTrans, CblasTrans})
      for (const float beta : {0.0f, 1.0f}) {
        CAPTURE(ta == CblasTrans, tb == CblasTrans, beta);
        // a holds A (M, K) or A^T (K, M); b holds B (K, N) or B^T (N, K): row-major either way.
        const int64_t lda = ta == CblasNoTrans ? K : M, ldb = tb == CblasNoTrans ? N : K;
        auto at = [&](int64_t i, int64_t k) {
          return ta == CblasNoTrans ? a[i * K + k] : a[k * M + i];
        };
        auto bt = [&](int64_t k, int64_t j) {
          return tb == CblasNoTrans ? b[k * N + j] : b[j * K + k];
        };
        std::vector<float> one;
        for (int threads : {1, 2, 3}) {
          CAPTURE(threads);
          const CpuBackend be(1ull << 26, threads);  // sets the OpenMP thread count
          std::vector<float> c = c0;
          sgemm_split_on(false, ta, tb, M, N, K, a.data(), lda, b.data(), ldb, beta, c.data(), N,
                         partials.data(), grid);
          if (threads == 1) {
            for (int64_t i = 0; i < M; ++i)
              for (int64_t j = 0; j < N; ++j) {
                double want = beta * c0[static_cast<size_t>(i * N + j)];
                for (int64_t k = 0; k < K; ++k) want += static_cast<double>(at(i, k)) * bt(k, j);
                REQUIRE(c[static_cast<size_t>(i * N + j)] == Approx(want).margin(1e-3));
              }
            one = c;
          } else {
            CHECK(std::memcmp(c.data(), one.data(), c.size() * sizeof(float)) == 0);
          }
        }
      }
}

TEST_CASE("the product's calls run once each, their own share first, whatever team runs them",
          "[blas][threads]") {
  for (int threads : {1, 2, 3, 8}) {
    const CpuBackend be(1ull << 20, threads);  // sets the OpenMP thread count
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1001}) {
      CAPTURE(threads, n);
      std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
      for_each_call_own_share_first(n, [&](int64_t i) { ++runs[static_cast<size_t>(i)]; });
      for (int64_t i = 0; i < n; ++i) REQUIRE(runs[static_cast<size_t>(i)] == 1);
      // Inside a parallel region of its own the team is one thread: it runs every share.
      std::vector<std::atomic<int>> nested(static_cast<size_t>(n));
#pragma omp parallel num_threads(2)
#pragma omp single
      for_each_call_own_share_first(n, [&](int64_t i) { ++nested[static_cast<size_t>(i)]; });
      for (int64_t i = 0; i < n; ++i) REQUIRE(nested[static_cast<size_t>(i)] == 1);
    }
  }
}

TEST_CASE(
    "version output names oneDNN's ISA and warns when ONEDNN_MAX_CPU_ISA holds it below the CPU",
    "[blas][smoke]") {
  // The variables that hold a library below the CPU, and so warn, are unset: a machine may set
  // them for every process (one development VM sets OPENBLAS_CORETYPE=Haswell).
  const remat::test::CliResult plain =
      remat::test::run_binary("--version", true, kUnsetGemmChoice + " -u OPENBLAS_CORETYPE");
  REQUIRE(plain.code == 0);
  const VectorIsa cpu = detect_cpu_isa();
  // By default oneDNN runs only where it dispatches to AVX-512; elsewhere the line says why not.
  const std::string line = cpu == VectorIsa::Avx512 ? "CPU GEMM: tiles on oneDNN "
                           : cpu == VectorIsa::Avx2 ? "CPU GEMM: tiles on OpenBLAS, oneDNN "
                                                    : "CPU GEMM: tiles on ";
  const std::string widest = cpu == VectorIsa::Avx512 ? "(avx512_core"
                             : cpu == VectorIsa::Avx2 ? "only to avx2 on this CPU"
                                                      : "";
  CHECK_THAT(plain.out, Contains(line) && Contains(widest));
  CHECK_THAT(plain.out, !Contains("warning"));
  if (cpu == VectorIsa::Sse) return;  // nothing wider to fall below
  const remat::test::CliResult held =
      remat::test::run_binary("--version", true, "REMAT_GEMM=onednn ONEDNN_MAX_CPU_ISA=SSE41");
  REQUIRE(held.code == 0);
  CHECK_THAT(held.out, Contains("tiles on oneDNN") && Contains("(sse41)") &&
                           Contains("warning: BELOW THIS CPU: oneDNN dispatches only up to sse41"));
}

namespace {
std::atomic<int> g_profile_ticks{0};
extern "C" void count_profile_tick(int) {
  ++g_profile_ticks;
}
}  // namespace

// oneDNN 2.6's JIT GEMM points the stack pointer into its heap workspace (engine/cpu/onednn.h): a
// signal handler running inside it writes its frame into the heap, and a later free() aborts
// or deadlocks. With either guard removed (mutants 77, 78), this child aborted or hung in each
// of 3 runs.
// Hidden: the next test runs it in a process of its own, so a corrupted heap cannot take the
// test runner down with it or hang it.
TEST_CASE("child: oneDNN GEMM calls under a storm of profiling signals", "[.][blas-child]") {
  const OneDnn* dnn = onednn();
  REQUIRE(dnn != nullptr);
  const CpuBackend be(uint64_t{1} << 28, 2);
  const int64_t M = 512, N = 384, K = 768;
  std::vector<float> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(K * N));
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 7919) % 1000) / 1000.f - .5f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 104729) % 997) / 997.f - .5f;
  // The reference bits of both call forms, before any signal.
  std::vector<float> tiled_ref(static_cast<size_t>(M * N)), threaded_ref(tiled_ref.size());
  sgemm_on(true, CblasNoTrans, CblasNoTrans, M, N, K, a.data(), K, b.data(), N, 0.f,
           tiled_ref.data(), N);
  REQUIRE(dnn->sgemm_threaded('N', 'N', M, N, K, 1.f, a.data(), K, b.data(), N, 0.f,
                              threaded_ref.data(), N) == 0);

  struct sigaction tick = {};
  tick.sa_handler = count_profile_tick;
  REQUIRE(sigaction(SIGPROF, &tick, nullptr) == 0);
  itimerval every_tick = {}, stopped = {};  // as often as the kernel's timer allows (~250 Hz)
  every_tick.it_interval.tv_usec = every_tick.it_value.tv_usec = 200;
  REQUIRE(setitimer(ITIMER_PROF, &every_tick, nullptr) == 0);
  int tiled_differ = 0, threaded_differ = 0, threaded_failed = 0;
  std::vector<float> c(tiled_ref.size());
  // At least 40 calls of each form, and on until 40 signals came: a fast CPU (an AMD EPYC Zen 5,
  // ~430 GFLOP/s on 2 cores) did 40 of each in 17 ticks.
  for (int rep = 0; rep < 40 || (g_profile_ticks.load() < 40 && rep < 4000); ++rep) {
    sgemm_on(true, CblasNoTrans, CblasNoTrans, M, N, K, a.data(), K, b.data(), N, 0.f, c.data(), N);
    tiled_differ += c != tiled_ref;
    std::fill(c.begin(), c.end(), 0.0f);  // a call that wrote nothing cannot pass as equal
    threaded_failed += dnn->sgemm_threaded('N', 'N', M, N, K, 1.f, a.data(), K, b.data(), N, 0.f,
                                           c.data(), N) != 0;
    threaded_differ += c != threaded_ref;
  }
  setitimer(ITIMER_PROF, &stopped, nullptr);
  // Held back, the signals are handled as each call returns; 20 of them mean the timer fired
  // throughout the calls (unguarded, they land inside oneDNN's kernels).
  INFO(g_profile_ticks.load() << " profiling signals while the calls ran");
  CHECK(g_profile_ticks.load() >= 20);
  CHECK(threaded_failed == 0);
  CHECK(tiled_differ == 0);
  CHECK(threaded_differ == 0);
}

TEST_CASE("oneDNN's GEMM survives signal handlers firing during its calls, tiled and threaded",
          "[blas]") {
  // The sanitizer build keeps oneDNN out (tests/CMakeLists.txt: LeakSanitizer's exit crashes
  // once it is loaded).
  if (const char* gemm = std::getenv("REMAT_GEMM"); gemm && std::string(gemm) == "openblas") {
    WARN("REMAT_GEMM=openblas: oneDNN is not loaded in this run");
    return;
  }
  if (onednn() == nullptr)
    FAIL("libdnnl.so.2 does not load: scripts/install-deps.sh installs libdnnl2");
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  REQUIRE(n > 0);
  self[n] = 0;
  const remat::test::CliResult child = remat::test::run_command(
      fmt::format("timeout -s KILL 60 '{}' 'child: oneDNN GEMM calls under a storm of profiling "
                  "signals' -s",
                  self));
  INFO(child.out);
  CHECK(child.code == 0);
  CHECK_THAT(child.out,
             Contains("profiling signals while the calls ran") && Contains("All tests passed"));
}
