// cuBLASLt, loaded when the CUDA backend first needs it instead of when the program starts.
// Linked, its initializers ran in every process, CPU runs included: 72-110 ms on a quiet AMD VM
// (up to ~300 beside a build), where `remat-train plan --config configs/tiny.toml` now takes
// 0.018 s (docs/performance.md, "Start-up", has the measurement). Internal header of engine/cuda.
#pragma once

#include <cublasLt.h>

#include <string>

namespace remat::cuda {

/// The cuBLASLt entry points the backend calls, with the library's own types.
struct CublasLtLibrary {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtDestroy) destroy;
  decltype(&cublasLtGetVersion) get_version;
  decltype(&cublasLtGetStatusName) get_status_name;
  decltype(&cublasLtGetStatusString) get_status_string;
  decltype(&cublasLtMatmul) matmul;
  decltype(&cublasLtMatmulAlgoGetHeuristic) matmul_algo_get_heuristic;
  decltype(&cublasLtMatmulDescCreate) matmul_desc_create;
  decltype(&cublasLtMatmulDescDestroy) matmul_desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) matmul_desc_set_attribute;
  decltype(&cublasLtMatmulPreferenceCreate) matmul_preference_create;
  decltype(&cublasLtMatmulPreferenceDestroy) matmul_preference_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) matmul_preference_set_attribute;
  decltype(&cublasLtMatrixLayoutCreate) matrix_layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) matrix_layout_destroy;
};

/// The soname of the cuBLASLt built against ("libcublasLt.so.13").
const char* cublaslt_soname();

/// cuBLASLt, loaded and resolved on the first call (thread-safe); throws BackendError naming the
/// library, the loader's reason and the fix when it cannot be, on this call and every later one.
const CublasLtLibrary& cublaslt();

/// "13.1.0", or why cuBLASLt cannot be loaded: for --version, which must not throw.
std::string cublaslt_version();

}  // namespace remat::cuda
