// CPU backend: construction, BLAS detection and data movement. Each op's kernel lives in the
// file named after its engine/core/ops header: linear.cpp, layernorm.cpp, attention.cpp,
// activation.cpp (with the residual add and dropout), embedding.cpp, loss.cpp, adamw.cpp; the
// GEMM tile grid they share is gemm.cpp.
#include "engine/cpu/cpu_backend.h"

#include <cblas.h>
#include <fmt/format.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "engine/core/rng.h"
#include "engine/cpu/attention_gemm.h"
#include "engine/cpu/blas_kernel.h"
#include "engine/cpu/gemm.h"
#include "engine/cpu/host_allocator.h"

extern "C" {
// OpenBLAS extensions (declared in its cblas.h as well; repeated so other BLAS builds fail loudly
// at link time rather than silently losing the kernel report).
char* openblas_get_config(void);
void openblas_set_num_threads(int);
}

namespace remat::cpu {

int default_threads() {
  return omp_get_num_procs();
}

std::unique_ptr<DeviceAllocator> make_host_allocator() {
  return std::make_unique<HostAllocator>();
}

BlasInfo blas_info() {
  const BlasKernelChoice& kernel = select_blas_kernel();
  BlasInfo info;
  std::string config = openblas_get_config();
  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY USE_OPENMP Zen MAX_THREADS=64"
  auto sp = config.find(' ', config.find(' ') + 1);
  info.library = config.substr(0, sp);
  if (config.find("USE_OPENMP") != std::string::npos) info.library += " (OpenMP)";
  info.core = kernel.core;
  info.chosen_by = kernel.chosen_by;
  const GemmRoute& route = gemm_route();
  info.gemm = route.describe;
  info.gemm_chosen_by = route.chosen_by;
  info.gemm_warning = route.warning;
  // Where every GEMM tile runs on oneDNN, a slow OpenBLAS kernel slows only ring attention: the
  // warning says which products it slows.
  if (kernel.below_cpu())
    info.warning = fmt::format(
        "BELOW THIS CPU: the {} kernel does not use the CPU's wider vectors (~2-5x slower {}); "
        "unset OPENBLAS_CORETYPE",
        kernel.core,
        route.all_onednn() ? "ring attention; the GEMM tiles run on oneDNN and are not slowed"
                           : "GEMMs");
  return info;
}

CpuBackend::CpuBackend(uint64_t budget_bytes, int threads, uint64_t host_budget_bytes)
    : Backend(std::make_unique<MemoryPool>(make_host_allocator(), budget_bytes),
              std::make_unique<MemoryPool>(make_host_allocator(), host_budget_bytes,
                                           MemoryPool::kHostSpace)) {
  select_blas_kernel();  // before the first BLAS call
  attention_isa();       // a bad REMAT_ATTENTION_ISA fails here, not inside a parallel region
  gemm_route();          // likewise a bad REMAT_GEMM
  threads_ = threads > 0 ? threads : default_threads();
  omp_set_num_threads(threads_);
  openblas_set_num_threads(threads_);
}

std::string CpuBackend::describe() const {
  const BlasInfo b = blas_info();
  return fmt::format("cpu, {} threads, {} {} kernel{}, GEMM tiles on {}{}, attention on {}",
                     threads_, b.library, b.core, b.warning.empty() ? "" : " (" + b.warning + ")",
                     b.gemm, b.gemm_warning.empty() ? "" : " (" + b.gemm_warning + ")",
                     attention_isa() == AttentionIsa::Avx512 ? "AVX-512" : "AVX2");
}

std::string CpuBackend::describe_brief() const {
  return fmt::format("cpu, {} threads", threads_);
}

void CpuBackend::upload(const Tensor& dst, const void* host) {
  std::memcpy(dst.data, host, dst.bytes());
}

void CpuBackend::download(void* host, const Tensor& src) {
  std::memcpy(host, src.data, src.bytes());
}

namespace {

// Twice a core's L2 on the Intel VM: a smaller fill is more likely read back while still cached.
constexpr uint64_t kStreamingFillBytes = 4ull << 20;

// p[0, n) = value with non-temporal stores past the first 32-byte boundary.
void fill_streaming(float* p, int64_t n, float value) {
  int64_t i = 0;
  for (; i < n && reinterpret_cast<uintptr_t>(p + i) % 32 != 0; ++i) p[i] = value;
  const __m256 v = _mm256_set1_ps(value);
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(p + i, v);
  for (; i < n; ++i) p[i] = value;
  _mm_sfence();  // the streamed lines are visible before the threads' barrier
}

}  // namespace

void CpuBackend::fill_impl(const Tensor& t, float value) {
  const int64_t n = t.numel();
  if (t.dtype == DType::I32) {
    int32_t* p = t.i32();
    std::fill(p, p + n, static_cast<int32_t>(value));
    return;
  }
  float* p = t.f32();
  // A large fill is mostly the gradients, zeroed at the start of a step and next touched in the
  // backward, long after they left the caches: streaming stores skip reading each line before
  // writing it. Measured on GPT-2 124M (2 threads, Intel VM, 2026-12-02): the step's fills 30.5 ->
  // 14.0 ms, and the backward ops that next touch the gradients no slower. A large fill read back
  // at once (the last LayerNorm's dx at a batch of 4 and more) pays one trip to memory more.
  if (static_cast<uint64_t>(n) * sizeof(float) >= kStreamingFillBytes) {
#pragma omp parallel
    {
      const int64_t parts = omp_get_num_threads(), part = omp_get_thread_num();
      const int64_t begin = n * part / parts, end = n * (part + 1) / parts;
      fill_streaming(p + begin, end - begin, value);
    }
    return;
  }
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

void CpuBackend::copy_impl(const Tensor& dst, const Tensor& src) {
  std::memcpy(dst.data, src.data, src.bytes());
}

}  // namespace remat::cpu
