// Measures the bf16 GEMM rate of the CUDA backend's own linear op (cuBLASLt, fp32 accumulate):
// the peak that scripts/device-check.sh divides model FLOP/s by to report MFU. Prints one line,
// "bf16 GEMM peak: X TFLOP/s (M=N=K=8192)". Exits 77 without a CUDA device.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "engine/config.h"
#include "engine/cuda_api.h"

int main() {
  using namespace remat;
  if (cuda::device_count() == 0) {
    std::puts("skipped: no CUDA device");
    return 77;
  }
  DeviceConfig dc;
  dc.backend = "cuda";
  dc.precision = "bf16";
  auto be = cuda::make_backend(dc);
  const int64_t n = 8192;
  Buffer x = be->pool().allocate({n, n}, DType::BF16, MemCategory::Transient, "bench.x");
  Buffer w = be->pool().allocate({n, n}, DType::F32, MemCategory::Weights, "bench.w");
  Buffer y = be->pool().allocate({n, n}, DType::BF16, MemCategory::Transient, "bench.y");
  be->fill(x, 0.01f);
  be->fill(w, 0.01f);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    be->synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    constexpr int kIters = 10;
    for (int i = 0; i < kIters; ++i) be->linear_forward({y, x, w, Tensor()});
    be->synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, kIters * 2.0 * static_cast<double>(n) * n * n / s / 1e12);
  }
  fmt::print("bf16 GEMM peak: {:.1f} TFLOP/s (M=N=K={})\n", best, n);
  return 0;
}
