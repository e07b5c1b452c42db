// The fused LM head + softmax cross-entropy at GPT-2's vocabulary (V = 50257, C = 768) on 1024
// rows: time per call and achieved GFLOP/s against the op's own count (Backend::lm_head_loss:
// three GEMMs of 2NCV FLOPs plus ~5NV for the softmax). Prints the best of several runs, since
// the cores may be shared.
//
//   remat_bench_lm_head [threads]    (default: all cores, as the trainer uses)
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "engine/core/rng.h"
#include "engine/cpu/blas_kernel.h"
#include "engine/cpu/cpu_backend.h"

using namespace remat;

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 0;
  cpu::select_blas_kernel();  // before any BLAS call, as the binary does
  cpu::CpuBackend be(uint64_t{8} << 30, threads);
  constexpr int64_t N = 1024, C = 768, V = 50257;
  MemoryPool& pool = be.pool();
  Buffer inp = pool.allocate({N, C}, DType::F32, MemCategory::Transient, "inp");
  Buffer w = pool.allocate({V, C}, DType::F32, MemCategory::Weights, "wte");
  Buffer dw = pool.allocate({V, C}, DType::F32, MemCategory::Grads, "dwte");
  Buffer dinp = pool.allocate({N, C}, DType::F32, MemCategory::Transient, "dinp");
  Buffer losses = pool.allocate({N}, DType::F32, MemCategory::Transient, "losses");
  Buffer targets = pool.allocate({N}, DType::I32, MemCategory::Transient, "targets");
  for (int64_t i = 0; i < N * C; ++i)
    inp.f32()[i] = static_cast<float>(rng_normal(1, 1, static_cast<uint64_t>(i)));
  for (int64_t i = 0; i < V * C; ++i)
    w.f32()[i] = static_cast<float>(0.02 * rng_normal(1, 2, static_cast<uint64_t>(i)));
  for (int64_t i = 0; i < N; ++i)
    targets.tensor().i32()[i] = static_cast<int32_t>(rng_bits(1, 3, static_cast<uint64_t>(i)) % V);
  const LmHeadLossArgs args{losses, dinp,    dw,       inp,
                            w,      targets, 1.0f / N, default_loss_chunk_rows(N, V)};
  double best = 1e30;
  for (int r = 0; r < 4; ++r) {  // the first is a warm-up
    const auto t0 = std::chrono::steady_clock::now();
    be.lm_head_loss(args);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, s);
  }
  const double flops = 6.0 * N * C * V + 5.0 * N * V;
  fmt::print("lm_head_loss N={} C={} V={} ({} threads): {:.1f} ms, {:.1f} GFLOP/s\n", N, C, V,
             be.threads(), best * 1e3, flops / best / 1e9);
  return 0;
}
