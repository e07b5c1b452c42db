// Loading oneDNN and calling it with signals held back (see engine/cpu/onednn.h).
#include "engine/cpu/onednn.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <omp.h>
#include <pthread.h>

#include <csignal>
#include <memory>
#include <vector>

namespace remat::cpu {

namespace {

// dnnl_version() returns this (dnnl_version_t in dnnl_types.h).
struct DnnlVersion {
  int major, minor, patch;
  const char* hash;
  unsigned cpu_runtime, gpu_runtime;
};

// dnnl_cpu_isa_t (dnnl_types.h) as oneDNN names it, and the vector class of its SGEMM kernels.
struct IsaName {
  int value;
  const char* name;
  VectorIsa isa_class;
};
constexpr IsaName kIsas[] = {
    {0x1, "sse41", VectorIsa::Sse},
    {0x3, "avx", VectorIsa::Sse},
    {0x7, "avx2", VectorIsa::Avx2},
    {0x407, "avx2_vnni", VectorIsa::Avx2},
    {0xf, "avx512_mic", VectorIsa::Avx512},
    {0x1f, "avx512_mic_4ops", VectorIsa::Avx512},
    {0x27, "avx512_core", VectorIsa::Avx512},
    {0x67, "avx512_core_vnni", VectorIsa::Avx512},
    {0xe7, "avx512_core_bf16", VectorIsa::Avx512},
    {0x3e7, "avx512_core_amx", VectorIsa::Avx512},
};

// Loaded once; the library then stays loaded for the process.
std::unique_ptr<OneDnn> load() {
  void* lib = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return nullptr;
  const auto sgemm = reinterpret_cast<DnnlSgemm>(dlsym(lib, "dnnl_sgemm"));
  if (sgemm == nullptr) {
    dlclose(lib);
    return nullptr;
  }
  using VersionFn = const DnnlVersion* (*)();
  const auto version = reinterpret_cast<VersionFn>(dlsym(lib, "dnnl_version"));
  const DnnlVersion* v = version ? version() : nullptr;
  using IsaFn = int (*)();
  const auto effective_isa = reinterpret_cast<IsaFn>(dlsym(lib, "dnnl_get_effective_cpu_isa"));
  const int isa = effective_isa ? effective_isa() : -1;
  std::string isa_name = isa >= 0 ? fmt::format("ISA 0x{:x}", isa) : "ISA not reported";
  // An ISA newer than this table (a later oneDNN) is wider than any in it, never a fallback.
  VectorIsa isa_class = VectorIsa::Avx512;
  for (const IsaName& i : kIsas)
    if (i.value == isa) {
      isa_name = i.name;
      isa_class = i.isa_class;
    }
  return std::make_unique<OneDnn>(
      sgemm, v ? fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch) : "oneDNN", isa_name,
      isa_class);
}

// Every signal but the synchronous ones a fault in the code itself raises: those must still
// reach their handler (a sanitizer's report) or kill the process, and cannot be held anyway.
sigset_t asynchronous_signals() {
  sigset_t set;
  sigfillset(&set);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT}) sigdelset(&set, sig);
  return set;
}

// Holds the asynchronous signals back on this thread while it lives; restores the mask after.
class SignalsHeldBack {
 public:
  SignalsHeldBack() {
    static const sigset_t held = asynchronous_signals();
    pthread_sigmask(SIG_BLOCK, &held, &saved_);
  }
  ~SignalsHeldBack() { pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }
  SignalsHeldBack(const SignalsHeldBack&) = delete;
  SignalsHeldBack& operator=(const SignalsHeldBack&) = delete;

 private:
  sigset_t saved_;
};

}  // namespace

int OneDnn::sgemm(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                  int64_t ldc) const {
  const auto call = [&] {
    return sgemm_(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  };
  if (omp_in_parallel()) {
    const SignalsHeldBack held;  // only this thread runs the call
    return call();
  }
  // oneDNN threads the call over the OpenMP pool (Debian's build uses the same libgomp): hold the
  // signals on every thread of the pool, run it, then release them on every thread.
  const int threads = omp_get_max_threads();
  std::vector<sigset_t> saved(static_cast<size_t>(threads));
  const sigset_t held = asynchronous_signals();
#pragma omp parallel num_threads(threads)
  pthread_sigmask(SIG_BLOCK, &held, &saved[static_cast<size_t>(omp_get_thread_num())]);
  const int status = call();
#pragma omp parallel num_threads(threads)
  pthread_sigmask(SIG_SETMASK, &saved[static_cast<size_t>(omp_get_thread_num())], nullptr);
  return status;
}

const OneDnn* onednn() {
  static const std::unique_ptr<OneDnn> loaded = load();
  return loaded.get();
}

}  // namespace remat::cpu
