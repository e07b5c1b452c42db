// oneDNN's SGEMM for the CPU GEMM's tiles (engine/cpu/gemm.cpp), loaded at run time from Debian's
// libdnnl2 when it is installed. Measured on GPT-2 124M's shapes (2 threads, AVX-512, one
// single-threaded call per 256 x 256 tile, as the tile grid makes them), dnnl_sgemm is ~20-30%
// faster than OpenBLAS's SkylakeX kernel on the products X W^T and dY W and about even on the
// weight gradients dY^T X; a whole training step of that model is ~10-20% faster with it (README,
// "Performance (CPU)"). BLIS (Debian's 0.9) ran at about half OpenBLAS's rate on the same tiles.
// Loaded rather than linked: the library is 40 MB, and a binary without it (the GPU device's
// bundle) keeps OpenBLAS.
//
// Signals. oneDNN's JIT GEMM kernels before 3.11 point the stack pointer into their heap
// workspace while they run (upstream issue uxlfoundation/oneDNN#4845, fixed by PR #4855, not in
// Debian's 2.6.3). A signal handler that runs on a thread inside such a kernel writes its signal
// frame into that heap block, and a later free() aborts with glibc's "corrupted size vs.
// prev_size" or "free(): invalid next size". Measured here: a SIGTERM during training did it in
// about 1 run in 15; a 5 kHz SIGPROF timer during tile GEMMs in nearly every run within 0.1 s,
// and never with the frames on an alternate signal stack. So every call below holds back the
// asynchronous signals on the threads that run oneDNN's code for its duration: a signal that
// arrives then is delivered to another thread, or on return, and its handler never runs on
// oneDNN's stack. Synchronous fault signals (SIGSEGV, ...) stay deliverable.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "engine/cpu/blas_kernel.h"

namespace remat::cpu {

/// oneDNN's row-major C = alpha op(A) op(B) + beta C (dnnl_sgemm in dnnl.h; 0 is success).
using DnnlSgemm = int (*)(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
                          const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                          float* C, int64_t ldc);

class OneDnn {
 public:
  OneDnn(DnnlSgemm dnnl_sgemm, std::string version, std::string isa, VectorIsa isa_class)
      : sgemm_(dnnl_sgemm),
        version_(std::move(version)),
        isa_(std::move(isa)),
        isa_class_(isa_class) {}

  /// dnnl_sgemm on the calling thread's share of the work: single-threaded inside an OpenMP
  /// parallel region (as the tile grid calls it), threaded by oneDNN outside one. Signals are
  /// held back on every thread that may run it (see above). Returns oneDNN's status.
  int sgemm(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
            int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) const;

  /// "oneDNN 2.6.3".
  const std::string& version() const { return version_; }
  /// The widest ISA oneDNN dispatches to on this CPU, in oneDNN's words ("avx512_core_amx"):
  /// dnnl_get_effective_cpu_isa, which ONEDNN_MAX_CPU_ISA can lower.
  const std::string& isa() const { return isa_; }
  VectorIsa isa_class() const { return isa_class_; }

 private:
  DnnlSgemm sgemm_;
  std::string version_;
  std::string isa_;
  VectorIsa isa_class_;
};

/// oneDNN when libdnnl.so.2 loads and has dnnl_sgemm, else null. Loaded once per process.
const OneDnn* onednn();

}  // namespace remat::cpu
