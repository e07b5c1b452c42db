// oneDNN's SGEMM for the CPU GEMM's tiles (engine/cpu/gemm.cpp), loaded at run time from Debian's
// libdnnl2 when it is installed, for the products gemm.h's GemmRoute gives it. Measured on GPT-2
// 124M's shapes (2 threads, one single-threaded call per 256 x 256 tile, the square grid of
// then): on AVX-512 (an Intel Xeon VM) dnnl_sgemm is 5-20% faster than OpenBLAS's SkylakeX kernel
// on the products X W^T and dY W and about even on the weight gradients dY^T X, and whole steps
// are faster with every product on it; on AVX2 (an AMD EPYC Zen 3 VM, where it dispatches to
// avx2) it is even with OpenBLAS's Zen kernel on the first two and 45-90% of its rate on dY^T X,
// and a whole step is faster on OpenBLAS (docs/performance.md). BLIS (Debian's 0.9) ran
// at about half OpenBLAS's rate on the same tiles; whole products on BLIS's own threads were a
// few percent faster on the AMD VM, but a step on them ran 2x slower beside one busy process
// (docs/performance.md, "The GEMM library").
// Loaded rather than linked: the library is 40 MB, and a binary without it (the GPU device's
// bundle) keeps OpenBLAS.
//
// Signals. oneDNN's JIT GEMM kernels point the stack pointer into their heap workspace while they
// run (upstream issue uxlfoundation/oneDNN#4845, reproduced there on 3.11.1 and fixed by PR #4855,
// backported to the 3.11 branch; Debian has 2.6.3). A signal handler that runs on a thread inside
// such a kernel writes its signal frame into that heap block, and a later free() aborts with
// glibc's "corrupted size vs. prev_size" or "free(): invalid next size". Measured here: a SIGTERM
// during training did it in about 1 run in 15; an ITIMER_PROF timer asking for 5 kHz (the kernel
// delivers ~250 Hz) during tile GEMMs, in 3 of 4 runs within 0.1 s, and never (4 of 4 runs) with
// the frames on an alternate signal stack. So every call below holds back the
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

  /// dnnl_sgemm on the calling thread alone, as the tile grid calls it: from inside its OpenMP
  /// region, or from a team of one (oneDNN then runs single-threaded: it asks the same libgomp,
  /// load() checks). Signals are held back on this thread. Returns oneDNN's status.
  int sgemm_on_this_thread(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
                           const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                           float* C, int64_t ldc) const;
  /// dnnl_sgemm threaded by oneDNN over the OpenMP pool (the SGEMM floor), called outside any
  /// parallel region. Signals are held back on every thread of the pool for the call.
  int sgemm_threaded(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
                     const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                     int64_t ldc) const;

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

/// oneDNN when libdnnl.so.2 loads, has dnnl_sgemm and shares this binary's OpenMP runtime, else
/// null. Loaded once per process.
const OneDnn* onednn();
/// Why onednn() is null ("libdnnl.so.2 is not installed", ...); empty when it is not.
const std::string& onednn_missing_reason();

}  // namespace remat::cpu
