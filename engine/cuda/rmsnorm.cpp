// CUDA RMSNorm and the per-head q/k RMSNorm (engine/ops/rmsnorm.h). PLACEHOLDER until the kernels
// land: refuses with a clear error.
#include "engine/cuda/cuda_backend.h"
#include "engine/error.h"

namespace remat::cuda {

void CudaBackend::rmsnorm_forward_impl(const RmsNormForwardArgs&) {
  throw Error("rmsnorm_forward: not available on CUDA in this build");
}
void CudaBackend::rmsnorm_backward_impl(const RmsNormBackwardArgs&) {
  throw Error("rmsnorm_backward: not available on CUDA in this build");
}
void CudaBackend::qk_norm_forward_impl(const QkNormForwardArgs&) {
  throw Error("qk_norm_forward: not available on CUDA in this build");
}
void CudaBackend::qk_norm_backward_impl(const QkNormBackwardArgs&) {
  throw Error("qk_norm_backward: not available on CUDA in this build");
}
void CudaBackend::swiglu_forward_impl(const SwiGluForwardArgs&) {
  throw Error("swiglu_forward: not available on CUDA in this build");
}
void CudaBackend::swiglu_backward_impl(const SwiGluBackwardArgs&) {
  throw Error("swiglu_backward: not available on CUDA in this build");
}

}  // namespace remat::cuda
