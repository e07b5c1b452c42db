#include "engine/cpu/blas_kernel.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "engine/cpu/gemm.h"
#include "engine/cpu/onednn.h"

extern "C" {
char* openblas_get_corename(void);
// OpenBLAS DYNAMIC_ARCH entry points: forget the selected kernel, and select again (reading
// OPENBLAS_CORETYPE). Weak, so a BLAS build without them links and keeps its own choice.
void gotoblas_dynamic_quit(void) __attribute__((weak));
void gotoblas_dynamic_init(void) __attribute__((weak));
}

namespace remat::cpu {

namespace {

const char* isa_name(VectorIsa isa) {
  switch (isa) {
    case VectorIsa::Avx512:
      return "AVX-512";
    case VectorIsa::Avx2:
      return "AVX2";
    case VectorIsa::Sse:
      break;
  }
  return "SSE";
}

// The OpenBLAS core to ask for per ISA: the kernels measured fastest for SGEMM on such CPUs.
const char* core_for(VectorIsa isa) {
  return isa == VectorIsa::Avx512 ? "SkylakeX" : isa == VectorIsa::Avx2 ? "Haswell" : nullptr;
}

BlasKernelChoice select_once() {
  BlasKernelChoice c;
  c.cpu_isa = detect_cpu_isa();
  c.core = openblas_get_corename();
  c.kernel_isa = kernel_isa(c.core);
  c.chosen_by = "OpenBLAS (CPU model)";
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE"); forced && *forced) {
    c.chosen_by = "OPENBLAS_CORETYPE";
    return c;
  }
  const char* want = core_for(c.cpu_isa);
  if (!want || !c.below_cpu() || !gotoblas_dynamic_quit || !gotoblas_dynamic_init) return c;
  // The variable is read by gotoblas_dynamic_init only; it is removed again so that child
  // processes (sweep trials) make their own choice, and a user-set one stays distinguishable.
  setenv("OPENBLAS_CORETYPE", want, 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  unsetenv("OPENBLAS_CORETYPE");
  c.core = openblas_get_corename();
  c.kernel_isa = kernel_isa(c.core);
  c.chosen_by = std::string("remat-train (cpuid: ") + isa_name(c.cpu_isa) + ")";
  return c;
}

}  // namespace

VectorIsa detect_cpu_isa() {
  // GCC's __builtin_cpu_supports checks the cpuid bits and, through XGETBV, that the OS saves
  // the YMM/ZMM state: a CPU with AVX-512 under an OS that does not save it reports AVX2.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return VectorIsa::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return VectorIsa::Avx2;
  return VectorIsa::Sse;
}

VectorIsa kernel_isa(const std::string& core) {
  for (const char* c : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    if (core == c) return VectorIsa::Avx512;
  for (const char* c : {"Haswell", "Zen", "Excavator", "Zen3"})
    if (core == c) return VectorIsa::Avx2;
  return VectorIsa::Sse;
}

const BlasKernelChoice& select_blas_kernel() {
  static std::once_flag once;
  static BlasKernelChoice choice;
  std::call_once(once, [] { choice = select_once(); });
  return choice;
}

double measure_sgemm_flops(int threads, int n) {
  openblas_set_num_threads(threads);
  omp_set_num_threads(threads);
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size(), 0.0f);
  // The library the model's X W^T and dY W tiles run on (most of its GEMM FLOPs), with its own
  // threading.
  const GemmRoute& route = gemm_route();
  const OneDnn* dnn = route.onednn_untransposed && route.onednn_min_k == 0 ? onednn() : nullptr;
  double best_s = 1e30;
  for (int rep = 0; rep < 4; ++rep) {  // the first one warms up threads and caches
    const auto t0 = std::chrono::steady_clock::now();
    if (dnn)
      dnn->sgemm_threaded('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    else
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(),
                  n, 0.0f, c.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best_s = std::min(best_s, s);
  }
  return 2.0 * n * n * n / best_s;
}

}  // namespace remat::cpu
