// Loading oneDNN and calling it with signals held back (see engine/cpu/onednn.h).
#include "engine/cpu/onednn.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <omp.h>
#include <pthread.h>

#include <csignal>
#include <memory>
#include <optional>
#include <string>

namespace remat::cpu {

namespace {

// dnnl_version() returns this (dnnl_version_t in dnnl_types.h).
struct DnnlVersion {
  int major, minor, patch;
  const char* hash;
  unsigned cpu_runtime, gpu_runtime;
};

// dnnl_cpu_isa_t (dnnl_types.h) as oneDNN names it.
struct IsaName {
  int value;
  const char* name;
};
constexpr IsaName kIsas[] = {
    {0x1, "sse41"},
    {0x3, "avx"},
    {0x7, "avx2"},
    {0x407, "avx2_vnni"},
    {0xf, "avx512_mic"},
    {0x1f, "avx512_mic_4ops"},
    {0x27, "avx512_core"},
    {0x67, "avx512_core_vnni"},
    {0xe7, "avx512_core_bf16"},
    {0x3e7, "avx512_core_amx"},
};

struct Loaded {
  std::unique_ptr<OneDnn> dnn;
  std::string missing_reason;  // why dnn is null
};

// dnnl_get_effective_cpu_isa's value, by its feature bits (dnnl_cpu_isa_t in dnnl_types.h: each
// ISA's value contains the bits of those it extends), so that a value this table does not name
// is still classed.
VectorIsa isa_class_of(int isa) {
  if (isa < 0) return VectorIsa::Avx512;  // not reported: nothing to warn about
  if ((isa & 0x27) == 0x27 || (isa & 0xf) == 0xf) return VectorIsa::Avx512;
  if ((isa & 0x7) == 0x7) return VectorIsa::Avx2;
  return VectorIsa::Sse;
}

// Loaded once; the library then stays loaded for the process.
Loaded load() {
  void* lib = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr)
    return {nullptr, "libdnnl.so.2 is not installed, scripts/install-deps.sh installs it"};
  const auto sgemm = reinterpret_cast<DnnlSgemm>(dlsym(lib, "dnnl_sgemm"));
  // oneDNN decides to thread a call or not from the OpenMP runtime it links: it must be ours, or
  // a tile called from our parallel region would spread over a second pool (other bits per
  // thread count, and oversubscribed cores).
  const void* its_omp = dlsym(lib, "omp_in_parallel");
  const char* problem = sgemm == nullptr ? "libdnnl.so.2 has no dnnl_sgemm"
                        : its_omp != reinterpret_cast<const void*>(&omp_in_parallel)
                            ? "libdnnl.so.2 uses another OpenMP runtime than remat-train"
                            : nullptr;
  if (problem) {
    dlclose(lib);
    return {nullptr, problem};
  }
  using VersionFn = const DnnlVersion* (*)();
  const auto version = reinterpret_cast<VersionFn>(dlsym(lib, "dnnl_version"));
  const DnnlVersion* v = version ? version() : nullptr;
  using IsaFn = int (*)();
  const auto effective_isa = reinterpret_cast<IsaFn>(dlsym(lib, "dnnl_get_effective_cpu_isa"));
  const int isa = effective_isa ? effective_isa() : -1;
  std::string isa_name = isa >= 0 ? fmt::format("ISA 0x{:x}", isa) : "ISA not reported";
  for (const IsaName& i : kIsas)
    if (i.value == isa) isa_name = i.name;
  return {std::make_unique<OneDnn>(
              sgemm, v ? fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch) : "oneDNN",
              isa_name, isa_class_of(isa)),
          ""};
}

const Loaded& loaded() {
  static const Loaded once = load();
  return once;
}

// Every signal but the synchronous ones a fault in the code itself raises: blocked, a fault
// would kill the process at once, before a sanitizer's handler could report it. (glibc's own
// SIGCANCEL and SIGSETXID are never blocked, whatever the set says.)
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

// One per pool thread while a threaded call runs: each thread restores its own mask, and only
// a thread that blocked restores anything.
thread_local std::optional<SignalsHeldBack> t_pool_thread_held;

}  // namespace

int OneDnn::sgemm_on_this_thread(char transa, char transb, int64_t M, int64_t N, int64_t K,
                                 float alpha, const float* A, int64_t lda, const float* B,
                                 int64_t ldb, float beta, float* C, int64_t ldc) const {
  const SignalsHeldBack held;
  return sgemm_(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

int OneDnn::sgemm_threaded(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
                           const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                           float* C, int64_t ldc) const {
  // oneDNN threads the call over the same libgomp pool (load() checks), whose threads persist
  // between regions: hold the signals on each of them, run the call, release them. Dynamic
  // teams could hand oneDNN a thread the first region did not reach, so they are off for it.
  const int dynamic = omp_get_dynamic();
  omp_set_dynamic(0);
  const int threads = omp_get_max_threads();
#pragma omp parallel num_threads(threads)
  t_pool_thread_held.emplace();
  const int status = sgemm_(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#pragma omp parallel num_threads(threads)
  t_pool_thread_held.reset();
  omp_set_dynamic(dynamic);
  return status;
}

const OneDnn* onednn() {
  return loaded().dnn.get();
}

const std::string& onednn_missing_reason() {
  return loaded().missing_reason;
}

}  // namespace remat::cpu
