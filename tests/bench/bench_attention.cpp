// Attention throughput against the machine's SGEMM rate (issue 4: at least half of it at
// T >= 4096, head size 64), with the AVX2 and, where the CPU has it, the AVX-512 tile kernel
// (the same bits, engine/cpu/attention_gemm.h). Prints the best of several runs, since the
// cores may be shared.
//
//   remat_bench_attention [threads]    (default: all cores, as the trainer uses)
//   remat_bench_attention --documents [T] [document tokens] [threads]
//   remat_bench_attention --shape T NH KVH HS [threads]
//
// GFLOP/s count causal FLOPs only, as Backend::attention_forward/backward do: 4*HS per
// (query, key <= query) pair forward, 10*HS backward.
//
// --documents (issue 61): the forward + backward of data.attention = "document" against causal
// attention on the same row, T = 16384 cut into documents of 512 tokens by default (4 heads of
// 64, RoPE), best of 3 runs each; the time ratio is the figure (the kernel skips every key tile
// before a query's document, so it does about (512 + 64) / T of causal's work).
#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/core/rng.h"
#include "engine/cpu/attention_gemm.h"
#include "engine/cpu/cpu_backend.h"

using namespace remat;

namespace {

using Clock = std::chrono::steady_clock;

// Best wall time in seconds of `reps` runs of fn (after one warm-up run).
template <class F>
double best_seconds(int reps, F&& fn) {
  fn();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

void fill_randn(const Buffer& b, uint64_t stream) {
  for (int64_t i = 0; i < b.tensor().numel(); ++i)
    b.f32()[i] = static_cast<float>(rng_normal(1234, stream, static_cast<uint64_t>(i)));
}

double sgemm_gflops(cpu::CpuBackend& be) {
  constexpr int n = 2048;
  Buffer a = be.pool().allocate({n, n}, DType::F32, MemCategory::Transient, "bench.a");
  Buffer b = be.pool().allocate({n, n}, DType::F32, MemCategory::Transient, "bench.b");
  Buffer c = be.pool().allocate({n, n}, DType::F32, MemCategory::Transient, "bench.c");
  fill_randn(a, 1);
  fill_randn(b, 2);
  const double s = best_seconds(3, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.f32(), n, b.f32(), n,
                0.0f, c.f32(), n);
  });
  return 2.0 * n * n * n / s / 1e9;
}

}  // namespace

// Document attention against causal attention on one row of T tokens (see the header).
int bench_documents(int64_t T, int64_t doc_tokens, int threads) {
  cpu::CpuBackend be(64ull << 30, threads);
  double load[1] = {0};
  fmt::print("{} | load average {:.2f}\n", be.describe(),
             getloadavg(load, 1) == 1 ? load[0] : -1.0);
  const int64_t B = 1, NH = 4, HS = 64, C = NH * HS;
  auto alloc = [&](std::vector<int64_t> shape, DType dt = DType::F32) {
    return be.pool().allocate(shape, dt, MemCategory::Transient, "bench");
  };
  Buffer qkv = alloc({B, T, 3 * C}), dout = alloc({B, T, C}), out = alloc({B, T, C});
  Buffer lse = alloc({B, NH, T}), dqkv = alloc({B, T, 3 * C}), docs = alloc({B, T}, DType::I32);
  fill_randn(qkv, 3);
  fill_randn(dout, 4);
  const std::vector<float> kept(qkv.f32(), qkv.f32() + qkv.tensor().numel());
  for (int64_t t = 0; t < T; ++t)
    docs.tensor().i32()[t] = static_cast<int32_t>(t / doc_tokens * doc_tokens);
  auto step = [&](const Tensor& doc_start) {
    std::copy(kept.begin(), kept.end(), qkv.f32());  // the backward clobbers q and k (RoPE)
    be.attention_forward({.out = out,
                          .lse = lse,
                          .qkv = qkv,
                          .n_head = NH,
                          .rope_theta = 10000.0f,
                          .doc_start = doc_start});
    be.attention_backward({.dqkv = dqkv,
                           .dout = dout,
                           .qkv = qkv,
                           .out = out,
                           .lse = lse,
                           .n_head = NH,
                           .rope_theta = 10000.0f,
                           .doc_start = doc_start});
  };
  const double causal_s = best_seconds(3, [&] { step(Tensor{}); });
  const double document_s = best_seconds(3, [&] { step(docs); });
  fmt::print("T = {}, documents of {} tokens, {} heads of {}, RoPE: forward + backward\n", T,
             doc_tokens, NH, HS);
  fmt::print("  causal    {:8.3f} s\n  document  {:8.3f} s\n  ratio     {:8.4f} (1/{:.1f})\n",
             causal_s, document_s, document_s / causal_s, causal_s / document_s);
  return 0;
}

// One model's attention shape with RoPE (e.g. SmolLM2-135M: --shape 512 9 3 64): forward and
// backward apart, best of 11 runs each, against the SGEMM rate measured just before.
int bench_shape(int64_t T, int NH, int KVH, int64_t HS, int threads) {
  cpu::CpuBackend be(64ull << 30, threads);
  double load[1] = {0};
  fmt::print("{} | load average {:.2f}\n", be.describe(),
             getloadavg(load, 1) == 1 ? load[0] : -1.0);
  const int64_t B = 1, width = (NH + 2 * KVH) * HS;
  auto alloc = [&](std::vector<int64_t> shape) {
    return be.pool().allocate(shape, DType::F32, MemCategory::Transient, "bench");
  };
  Buffer qkv = alloc({B, T, width}), dout = alloc({B, T, NH * HS}), out = alloc({B, T, NH * HS});
  Buffer lse = alloc({B, NH, T}), dqkv = alloc({B, T, width});
  fill_randn(qkv, 3);
  fill_randn(dout, 4);
  const std::vector<float> kept(qkv.f32(), qkv.f32() + qkv.tensor().numel());
  const AttentionForwardArgs fa{
      .out = out, .lse = lse, .qkv = qkv, .n_head = NH, .rope_theta = 10000.0f, .n_kv_head = KVH};
  const AttentionBackwardArgs ba{.dqkv = dqkv,
                                 .dout = dout,
                                 .qkv = qkv,
                                 .out = out,
                                 .lse = lse,
                                 .n_head = NH,
                                 .rope_theta = 10000.0f,
                                 .n_kv_head = KVH};
  const double peak = sgemm_gflops(be);
  const double fwd_s = best_seconds(11, [&] { be.attention_forward(fa); });
  // The backward clobbers q and k (RoPE): each run starts from the forward's inputs.
  const double bwd_s = best_seconds(11, [&] {
    std::copy(kept.begin(), kept.end(), qkv.f32());
    be.attention_backward(ba);
  });
  const double pairs = static_cast<double>(B * NH) * T * (T + 1) / 2;
  fmt::print("T {} NH {} KVH {} HS {}, RoPE; sgemm {:.1f} GFLOP/s\n", T, NH, KVH, HS, peak);
  fmt::print("  forward  {:8.3f} ms {:7.1f} GFLOP/s {:4.0f}%\n", 1e3 * fwd_s,
             4.0 * HS * pairs / fwd_s / 1e9, 100 * 4.0 * HS * pairs / fwd_s / 1e9 / peak);
  fmt::print("  backward {:8.3f} ms {:7.1f} GFLOP/s {:4.0f}% (with a copy of qkv)\n", 1e3 * bwd_s,
             10.0 * HS * pairs / bwd_s / 1e9, 100 * 10.0 * HS * pairs / bwd_s / 1e9 / peak);
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 5 && std::string(argv[1]) == "--shape")
    return bench_shape(std::atoll(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]),
                       std::atoll(argv[5]), argc > 6 ? std::atoi(argv[6]) : 0);
  if (argc > 1 && std::string(argv[1]) == "--documents")
    return bench_documents(argc > 2 ? std::atoll(argv[2]) : 16384,
                           argc > 3 ? std::atoll(argv[3]) : 512, argc > 4 ? std::atoi(argv[4]) : 0);
  const int threads = argc > 1 ? std::atoi(argv[1]) : 0;
  cpu::CpuBackend be(64ull << 30, threads);
  double load[1] = {0};
  fmt::print("{} | load average {:.2f}\n", be.describe(),
             getloadavg(load, 1) == 1 ? load[0] : -1.0);
  fmt::print("sgemm 2048^3: {:.1f} GFLOP/s\n", sgemm_gflops(be));
  // Each row's percentages are of an SGEMM rate measured just before that row, so that other
  // work on shared cores, which comes and goes, slows both sides of the ratio alike.
  std::vector<cpu::AttentionIsa> isas = {cpu::AttentionIsa::Avx2};
  if (__builtin_cpu_supports("avx512f")) isas.push_back(cpu::AttentionIsa::Avx512);
  fmt::print("{:>6} {:>4} {:>10} {:>7} {:>10} {:>7} {:>10} {:>7}\n", "T", "HS", "sgemm GF/s",
             "kernel", "fwd GF/s", "% sgemm", "bwd GF/s", "% sgemm");
  const int64_t B = 1, NH = 4;
  for (const int64_t T : {1024, 4096, 8192}) {
    for (const int64_t HS : {64, 128}) {
      const int64_t C = NH * HS;
      auto alloc = [&](std::vector<int64_t> shape) {
        return be.pool().allocate(shape, DType::F32, MemCategory::Transient, "bench");
      };
      Buffer qkv = alloc({B, T, 3 * C}), dout = alloc({B, T, C}), out = alloc({B, T, C});
      Buffer lse = alloc({B, NH, T}), dqkv = alloc({B, T, 3 * C});
      fill_randn(qkv, 3);
      fill_randn(dout, 4);
      const AttentionForwardArgs fa{.out = out, .lse = lse, .qkv = qkv, .n_head = NH};
      const AttentionBackwardArgs ba{
          .dqkv = dqkv, .dout = dout, .qkv = qkv, .out = out, .lse = lse, .n_head = NH};
      const double peak = sgemm_gflops(be);
      const int reps = T <= 1024 ? 10 : 3;
      for (cpu::AttentionIsa isa : isas) {
        cpu::force_attention_isa(isa);
        const double fwd_s = best_seconds(reps, [&] { be.attention_forward(fa); });
        const double bwd_s = best_seconds(reps, [&] { be.attention_backward(ba); });
        const double pairs = static_cast<double>(B * NH) * T * (T + 1) / 2;
        const double fwd = 4.0 * HS * pairs / fwd_s / 1e9, bwd = 10.0 * HS * pairs / bwd_s / 1e9;
        fmt::print("{:>6} {:>4} {:>10.1f} {:>7} {:>10.1f} {:>6.0f}% {:>10.1f} {:>6.0f}%\n", T, HS,
                   peak, isa == cpu::AttentionIsa::Avx512 ? "avx512" : "avx2", fwd,
                   100 * fwd / peak, bwd, 100 * bwd / peak);
      }
    }
  }
  return 0;
}
