// oneDNN's SGEMM for the CPU GEMM's tiles (engine/cpu/gemm.cpp), loaded at run time from Debian's
// libdnnl2 when it is installed. Measured on GPT-2 124M's shapes (2 threads, AVX-512, one
// single-threaded call per 256 x 256 tile, as the tile grid makes them), dnnl_sgemm is ~20-30%
// faster than OpenBLAS's SkylakeX kernel on the products X W^T and dY W and about even on the
// weight gradients dY^T X; a whole training step of that model is ~20% faster with it (README,
// "Performance (CPU)"). BLIS (Debian's 0.9) ran at about half OpenBLAS's rate on the same tiles.
// Loaded rather than linked: the library is 40 MB, and a binary without it (the GPU device's
// bundle) keeps OpenBLAS.
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
