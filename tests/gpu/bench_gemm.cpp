// Measures the bf16 GEMM rate of the CUDA backend's GEMM engine (cuBLASLt, bf16 in and out,
// fp32 accumulate, the forward's layout): the peak that scripts/device-check.sh divides model
// FLOP/s by to report MFU. Inputs are uniform random (constant or zero inputs run ~13% faster
// on an H200: less switching), and CUDA events time only the GEMMs: no f32->bf16 weight cast and
// no pool allocation, which the backend's linear op adds around each GEMM. Prints one line per
// shape, the last "bf16 GEMM peak: X TFLOP/s (M=N=K=8192, ...)". Exits 77 without a CUDA device.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/core/cuda_workspace.h"
#include "engine/core/rng.h"
#include "engine/cuda/check.h"
#include "engine/cuda/gemm.h"
#include "engine/cuda_api.h"

namespace {

using remat::cuda::GemmEngine;

uint16_t to_bf16_bits(float f) {  // round to nearest even, as __float2bfloat16
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

/// Device buffer of n bf16 values uniform in [-1, 1) (counter-based RNG: same data every run).
void* random_bf16(int64_t n, uint64_t stream) {
  std::vector<uint16_t> host(static_cast<size_t>(n));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const double u = remat::rng_uniform(7, stream, static_cast<uint64_t>(i));
    host[static_cast<size_t>(i)] = to_bf16_bits(static_cast<float>(2.0 * u - 1.0));
  }
  void* d = nullptr;
  REMAT_CUDA_CHECK(cudaMalloc(&d, static_cast<size_t>(n) * 2));
  REMAT_CUDA_CHECK(cudaMemcpy(d, host.data(), static_cast<size_t>(n) * 2, cudaMemcpyHostToDevice));
  return d;
}

/// Best TFLOP/s over 5 timed repetitions of 10 GEMMs (m x k weight^T, k x n input), after warm-up.
double time_gemm(GemmEngine& gemm, cudaStream_t s, int64_t m, int64_t n, int64_t k, void* ws) {
  void* w = random_bf16(m * k, 1);
  void* x = random_bf16(k * n, 2);
  void* y = nullptr;
  REMAT_CUDA_CHECK(cudaMalloc(&y, static_cast<size_t>(m * n) * 2));
  auto run = [&] {
    gemm.matmul(m, n, k, {w, true, k, true}, {x, true, k, false}, y, true, m, 0.0f, ws,
                remat::cuda::kGemmWorkspaceBytes);
  };
  for (int i = 0; i < 3; ++i) run();  // heuristic query, clocks up
  cudaEvent_t t0, t1;
  REMAT_CUDA_CHECK(cudaEventCreate(&t0));
  REMAT_CUDA_CHECK(cudaEventCreate(&t1));
  constexpr int kIters = 10;
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    REMAT_CUDA_CHECK(cudaEventRecord(t0, s));
    for (int i = 0; i < kIters; ++i) run();
    REMAT_CUDA_CHECK(cudaEventRecord(t1, s));
    REMAT_CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    REMAT_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    best = std::max(best, kIters * 2.0 * static_cast<double>(m) * n * k / (ms * 1e-3) / 1e12);
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaFree(w);
  cudaFree(x);
  cudaFree(y);
  return best;
}

}  // namespace

int main() {
  if (remat::cuda::device_count() == 0) {
    fmt::print("skipped: no CUDA device\n");
    return 77;
  }
  cudaStream_t s = nullptr;
  REMAT_CUDA_CHECK(cudaStreamCreate(&s));
  void* ws = nullptr;
  REMAT_CUDA_CHECK(cudaMalloc(&ws, remat::cuda::kGemmWorkspaceBytes));
  double peak = 0;
  {
    GemmEngine gemm(s);
    // GPT-2 124M's MLP GEMM at 32k tokens (C = 768 -> 3072): what a training step gets.
    fmt::print("bf16 GEMM 3072x32768x768: {:.1f} TFLOP/s\n",
               time_gemm(gemm, s, 3072, 32768, 768, ws));
    peak = time_gemm(gemm, s, 8192, 8192, 8192, ws);
  }
  fmt::print("bf16 GEMM peak: {:.1f} TFLOP/s (M=N=K=8192, random data, GEMM only)\n", peak);
  cudaFree(ws);
  cudaStreamDestroy(s);
  return 0;
}
