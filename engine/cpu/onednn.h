// oneDNN's SGEMM for the CPU GEMM's tiles (engine/cpu/gemm.cpp), loaded at run time from Debian's
// libdnnl2 when it is installed. Measured on GPT-2 124M's shapes (2 threads, AVX-512, one
// single-threaded call per 256 x 256 tile, as the tile grid makes them), dnnl_sgemm is ~20-30%
// faster than OpenBLAS's SkylakeX kernel on the products X W^T and dY W and about even on the
// weight gradients dY^T X; a whole training step of that model is ~20% faster with it (README,
// "Performance (CPU)"). BLIS (Debian's 0.9) ran at about half OpenBLAS's rate on the same tiles.
// Loaded rather than linked: the library is 40 MB, and a binary without it (the GPU device's
// bundle) keeps OpenBLAS.
//
// Opt-in (REMAT_GEMM=onednn), not the default: a SIGTERM during training aborted the process
// with glibc's "corrupted size vs. prev_size" inside dnnl_sgemm's own free() in about 1 of 15
// runs (tiny.toml, 1 thread, the signal after the first step; never in 40 runs on OpenBLAS, nor
// in 40 oneDNN runs without the signal). Until that is understood, a Ctrl-C must not risk the
// checkpoint it asks for.
#pragma once

#include <cstdint>
#include <string>

namespace remat::cpu {

/// oneDNN's row-major C = alpha op(A) op(B) + beta C (dnnl_sgemm in dnnl.h; 0 is success).
using DnnlSgemm = int (*)(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
                          const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                          float* C, int64_t ldc);

struct OneDnn {
  DnnlSgemm sgemm = nullptr;
  std::string version;  // "oneDNN 2.6.3"
};

/// oneDNN when libdnnl.so.2 loads and has dnnl_sgemm, else null. Loaded once per process.
const OneDnn* onednn();

}  // namespace remat::cpu
