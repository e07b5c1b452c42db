// Error conversion for engine/cuda/check.h.
#include "engine/cuda/check.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#include "engine/cuda/cublaslt_library.h"

namespace remat::cuda::detail {

void throw_cuda_error(cudaError_t e, const char* expr, const char* file, int line) {
  throw BackendError(fmt::format("[cuda] {} failed at {}:{}: {} ({})", expr, file, line,
                                 cudaGetErrorString(e), cudaGetErrorName(e)));
}

void throw_cublas_error(cublasStatus_t s, const char* expr, const char* file, int line) {
  const CublasLtLibrary& lt = cublaslt();  // loaded: a status comes only from a call into it
  throw BackendError(fmt::format("[cublas] {} failed at {}:{}: {} ({})", expr, file, line,
                                 lt.get_status_string(s), lt.get_status_name(s)));
}

std::string cudnn_last_error() {
  std::string reason(size_t{64} << 10, '\0');
  cudnnGetLastErrorString(reason.data(), reason.size());
  reason.resize(std::strlen(reason.c_str()));
  return reason;
}

void throw_cudnn_error(cudnnStatus_t s, const char* expr, const char* file, int line) {
  const std::string reason = cudnn_last_error();
  throw BackendError(fmt::format(
      "[cudnn] {} failed at {}:{}: {}{}{}. Fix: CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr "
      "logs every cuDNN call",
      expr, file, line, cudnnGetErrorString(s), reason.empty() ? "" : "; ", reason));
}

bool sync_after_each_op() {
  static const bool on = [] {
    const char* v = std::getenv("REMAT_CUDA_SYNC");
    return v && std::strcmp(v, "0") != 0 && v[0] != '\0';
  }();
  return on;
}

}  // namespace remat::cuda::detail
