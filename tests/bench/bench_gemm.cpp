// The CPU GEMM (engine/cpu/gemm.cpp: the shape-fixed tile grid, one single-threaded library call
// per tile) on the products of a GPT-2 124M step at 1024 tokens, the tutorial MLP's, and weight
// gradients over many tokens on the tiles and split as the trainer runs them (gemm_grid.h), on
// each library it can use: OpenBLAS and, where libdnnl.so.2 loads, oneDNN. Beside them, the same
// product as one call with the library's own threading, whose bits depend on the thread count
// (so the trainer never runs it): what the fixed grid costs, or gains, against the library's own
// split. Per shape the best of 4 calls (after a warm-up), every variant alternated, in GFLOP/s;
// then the machine's SGEMM floor. Timings, not a test.
//
//   remat_bench_gemm_cpu [threads]    (default: all cores, as the trainer uses)
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "engine/core/cpu_workspace.h"
#include "engine/cpu/blas_kernel.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/gemm.h"
#include "engine/cpu/onednn.h"

using namespace remat;

namespace {

struct Shape {
  const char* name;
  CBLAS_TRANSPOSE ta, tb;
  int64_t M, N, K;
  float beta;
  int64_t k_slabs = 0;  // > 0: sgemm_k_slabs (the LM head's dY W), not the tile grid
  bool split = false;   // sgemm_split on choose_split_grid: a weight gradient as linear.cpp runs it
};

// Row-major C (M, N) = op(A) op(B), as linear.cpp and loss.cpp call it.
const std::vector<Shape> kShapes = {
    {"qkv      X W^T   (1024 x 2304 x 768)", CblasNoTrans, CblasTrans, 1024, 2304, 768, 0},
    {"fc       X W^T   (1024 x 3072 x 768)", CblasNoTrans, CblasTrans, 1024, 3072, 768, 0},
    {"proj     X W^T   (1024 x 768 x 3072)", CblasNoTrans, CblasTrans, 1024, 768, 3072, 0},
    {"qkv      dY W    (1024 x 768 x 2304)", CblasNoTrans, CblasNoTrans, 1024, 768, 2304, 0},
    {"fc       dY^T X  (3072 x 768 x 1024)", CblasTrans, CblasNoTrans, 3072, 768, 1024, 1},
    {"proj     dY^T X  (768 x 3072 x 1024)", CblasTrans, CblasNoTrans, 768, 3072, 1024, 1},
    {"lm head  X W^T   (192 x 50257 x 768)", CblasNoTrans, CblasTrans, 192, 50257, 768, 0},
    {"lm head  dY W    (192 x 768 x 50257)", CblasNoTrans, CblasNoTrans, 192, 768, 50257, 0},
    {"lm head  dY W    in 8 vocabulary slabs", CblasNoTrans, CblasNoTrans, 192, 768, 50257, 0,
     cpu::kLmHeadSlabs},
    {"lm head  dY^T X  (50257 x 768 x 192)", CblasTrans, CblasNoTrans, 50257, 768, 192, 1},
    {"qkv      dY^T X  (2304 x 768 x 1024)", CblasTrans, CblasNoTrans, 2304, 768, 1024, 1},
    {"attn out X W^T   (1024 x 768 x 768)", CblasNoTrans, CblasTrans, 1024, 768, 768, 0},
    {"attn out dY W    (1024 x 768 x 768)", CblasNoTrans, CblasNoTrans, 1024, 768, 768, 0},
    {"attn out dY^T X  (768 x 768 x 1024)", CblasTrans, CblasNoTrans, 768, 768, 1024, 1},
    {"mlp4     X W^T   (4096 x 512 x 512)", CblasNoTrans, CblasTrans, 4096, 512, 512, 0},
    {"mlp4     dY W    (4096 x 512 x 512)", CblasNoTrans, CblasNoTrans, 4096, 512, 512, 0},
    {"mlp4     dY^T X  (512 x 512 x 4096)", CblasTrans, CblasNoTrans, 512, 512, 4096, 1},
    {"mlp4     dY^T X  split as trained", CblasTrans, CblasNoTrans, 512, 512, 4096, 1, 0, true},
    // The 4-layer T = 4096 model's qkv weight gradient, and the 64k-token example's attention
    // projection's (C = 64).
    {"T=4096   dY^T X  (768 x 256 x 4096)", CblasTrans, CblasNoTrans, 768, 256, 4096, 1},
    {"T=4096   dY^T X  split as trained", CblasTrans, CblasNoTrans, 768, 256, 4096, 1, 0, true},
    {"T=64k    dY^T X  (64 x 64 x 65536)", CblasTrans, CblasNoTrans, 64, 64, 65536, 1},
    {"T=64k    dY^T X  split as trained", CblasTrans, CblasNoTrans, 64, 64, 65536, 1, 0, true},
};

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 0;
  cpu::select_blas_kernel();                             // before any BLAS call, as the binary does
  const cpu::CpuBackend be(uint64_t{1} << 30, threads);  // sets the thread counts
  const bool have_onednn = cpu::onednn() != nullptr;     // compared whatever REMAT_GEMM says
  const std::string dnn_name = have_onednn ? cpu::onednn()->version() : "oneDNN: -";
  fmt::print("{}\n{:<38} {:^25}  {:^25}\n{:<38} {:>12} {:>12}  {:>12} {:>12}\n", be.describe(), "",
             "tiles, as trained", "one call, its own threads", "product (M x N x K)", "OpenBLAS",
             dnn_name, "OpenBLAS", dnn_name);
  for (const Shape& s : kShapes) {
    const int64_t lda = s.ta == CblasNoTrans ? s.K : s.M, ldb = s.tb == CblasNoTrans ? s.N : s.K;
    const cpu::SplitGrid split = cpu::choose_split_grid(s.M, s.N, s.K);
    std::vector<float> a(static_cast<size_t>(s.M * s.K), 0.5f),
        b(static_cast<size_t>(s.K * s.N), 0.25f), c(static_cast<size_t>(s.M * s.N), 0.0f),
        partials(static_cast<size_t>(std::max<int64_t>(s.k_slabs - 1, 0) * s.M * s.N +
                                     (s.split ? cpu::split_partial_floats(split, s.M, s.N) : 0)));
    // Variants: 0, 1 the tiles on OpenBLAS, oneDNN; 2, 3 one call with its own threads.
    const int n_variants = have_onednn ? 4 : 3;
    double best[4] = {1e30, 1e30, 1e30, 1e30};
    for (int rep = 0; rep < 5; ++rep)
      for (int v = 0; v < n_variants; ++v) {
        if (v == 1 && !have_onednn) continue;
        const bool dnn = v == 1 || v == 3;
        const auto t0 = std::chrono::steady_clock::now();
        if (v >= 2 && dnn) {
          if (const int status = cpu::onednn()->sgemm_threaded(
                  s.ta == CblasNoTrans ? 'N' : 'T', s.tb == CblasNoTrans ? 'N' : 'T', s.M, s.N, s.K,
                  1.0f, a.data(), lda, b.data(), ldb, s.beta, c.data(), s.N)) {
            fmt::print(stderr, "{}: oneDNN's threaded dnnl_sgemm failed (status {})\n", s.name,
                       status);
            return 1;
          }
        } else if (v >= 2)  // outside a parallel region: OpenBLAS's own threads
          cblas_sgemm(CblasRowMajor, s.ta, s.tb, static_cast<int>(s.M), static_cast<int>(s.N),
                      static_cast<int>(s.K), 1.0f, a.data(), static_cast<int>(lda), b.data(),
                      static_cast<int>(ldb), s.beta, c.data(), static_cast<int>(s.N));
        else if (s.k_slabs > 0)
          cpu::sgemm_k_slabs_on(dnn, s.M, s.N, s.K, a.data(), lda, b.data(), ldb, c.data(), s.N,
                                partials.data(), s.k_slabs);
        else if (s.split)
          cpu::sgemm_split_on(dnn, s.ta, s.tb, s.M, s.N, s.K, a.data(), lda, b.data(), ldb, s.beta,
                              c.data(), s.N, partials.data(), split);
        else
          cpu::sgemm_on(dnn, s.ta, s.tb, s.M, s.N, s.K, a.data(), lda, b.data(), ldb, s.beta,
                        c.data(), s.N);
        const double t =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (rep > 0) best[v] = std::min(best[v], t);
      }
    const double flop = 2.0 * static_cast<double>(s.M * s.N * s.K);
    auto rate = [&](int v) {
      return v < n_variants && best[v] < 1e30 ? fmt::format("{:.1f}", flop / best[v] / 1e9)
                                              : std::string("-");
    };
    fmt::print("{:<38} {:>12} {:>12}  {:>12} {:>12}\n", s.name, rate(0), rate(1), rate(2), rate(3));
  }
  fmt::print("floor: SGEMM 2048^3 {:.1f} GFLOP/s (the tiles' library, its own threading)\n",
             cpu::measure_sgemm_flops(be.threads(), 2048) / 1e9);
}
