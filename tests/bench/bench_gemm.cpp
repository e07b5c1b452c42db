// The CPU GEMM (engine/cpu/gemm.cpp: the shape-fixed tile grid, one single-threaded library call
// per tile) on the products of a GPT-2 124M step at 1024 tokens, SmolLM2-135M's frozen base at
// 512 tokens (the LoRA benchmark), the tutorial MLP's, and weight gradients over many tokens on
// the tiles and split as the trainer runs them (gemm_grid.h), on each library it can use: OpenBLAS and, where libdnnl.so.2 loads, oneDNN. Beside them, the same
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
#include <string>
#include <tuple>
#include <vector>

#include "engine/core/cpu_workspace.h"
#include "engine/cpu/blas_kernel.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/gemm.h"
#include "engine/cpu/onednn.h"

using namespace remat;

namespace {

struct Shape {
  std::string name;
  CBLAS_TRANSPOSE ta, tb;
  int64_t M, N, K;
  float beta;
  int64_t k_slabs = 0;  // > 0: sgemm_k_slabs (the LM head's dY W), not the tile grid
  bool split = false;   // sgemm_split on choose_split_grid: a weight gradient as linear.cpp runs it
};

// The products of a Linear with an (out, in) weight at `tokens` rows, row-major C (M, N) =
// op(A) op(B) as linear.cpp and loss.cpp call them: the forward X W^T, the input gradient dY W,
// and the weight gradient dY^T X (added into the gradient: beta 1); each row named by the Linear,
// the product and its (M x N x K).
Shape forward(const std::string& linear, int64_t tokens, int64_t out, int64_t in) {
  const std::string name = fmt::format("{:<8} X W^T   ({} x {} x {})", linear, tokens, out, in);
  return {name, CblasNoTrans, CblasTrans, tokens, out, in, 0};
}
Shape input_grad(const std::string& linear, int64_t tokens, int64_t out, int64_t in,
                 int64_t k_slabs = 0) {
  const std::string what = k_slabs > 0 ? fmt::format("in {} vocabulary slabs", k_slabs)
                                       : fmt::format("({} x {} x {})", tokens, in, out);
  const std::string name = fmt::format("{:<8} dY W    {}", linear, what);
  return {name, CblasNoTrans, CblasNoTrans, tokens, in, out, 0, k_slabs};
}
Shape weight_grad(const std::string& linear, int64_t tokens, int64_t out, int64_t in,
                  bool split = false) {
  const std::string what =
      split ? "split as trained" : fmt::format("({} x {} x {})", out, in, tokens);
  const std::string name = fmt::format("{:<8} dY^T X  {}", linear, what);
  return {name, CblasTrans, CblasNoTrans, out, in, tokens, 1, 0, split};
}

// A GPT-2 124M step at 1024 tokens (C = 768, V = 50257, the LM head on 192 rows), the tutorial
// MLP's (4096 x 512), and weight gradients over many tokens: the 4-layer T = 4096 model's qkv
// (C = 256) and the 64k-token example's attention projection (C = 64), also split as trained.
std::vector<Shape> shapes() {
  std::vector<Shape> s;
  for (const auto& [linear, out, in] : std::vector<std::tuple<std::string, int64_t, int64_t>>{
           {"qkv", 2304, 768}, {"fc", 3072, 768}, {"proj", 768, 3072}, {"attn out", 768, 768}})
    s.insert(s.end(), {forward(linear, 1024, out, in), input_grad(linear, 1024, out, in),
                       weight_grad(linear, 1024, out, in)});
  // SmolLM2-135M at 512 tokens (C = 576, 3 KV heads of 64, MLP 1536, V = 49152): the shapes of
  // the LoRA benchmark (docs/lora.md), where a frozen base runs only X W^T and dY W.
  for (const auto& [linear, out, in] : std::vector<std::tuple<std::string, int64_t, int64_t>>{
           {"q/o 135M", 576, 576}, {"k/v 135M", 192, 576}, {"gate/up", 1536, 576},
           {"down", 576, 1536}})
    s.insert(s.end(), {forward(linear, 512, out, in), input_grad(linear, 512, out, in)});
  s.insert(s.end(), {forward("lm head", 192, 50257, 768), input_grad("lm head", 192, 50257, 768),
                     input_grad("lm head", 192, 50257, 768, cpu::kLmHeadSlabs),
                     weight_grad("lm head", 192, 50257, 768)});
  s.insert(s.end(),
           {forward("mlp4", 4096, 512, 512), input_grad("mlp4", 4096, 512, 512),
            weight_grad("mlp4", 4096, 512, 512), weight_grad("mlp4", 4096, 512, 512, true)});
  for (const auto& [name, tokens, out, in] :
       std::vector<std::tuple<std::string, int64_t, int64_t, int64_t>>{{"T=4096", 4096, 768, 256},
                                                                       {"T=64k", 65536, 64, 64}})
    s.insert(s.end(),
             {weight_grad(name, tokens, out, in), weight_grad(name, tokens, out, in, true)});
  return s;
}

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
  for (const Shape& s : shapes()) {
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
