// CUDA optimizer ops (engine/ops/adamw.h): the global sum of squares and AdamW; kernels in
// elementwise.cu.
#include <cuda_runtime.h>

#include "engine/cuda/check.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/op_util.h"

namespace remat::cuda {

double CudaBackend::sum_squares_impl(std::span<const Tensor> tensors) {
  const size_t need = tensors.size() * kern::kSumSquaresBlocks;
  if (need > partials_capacity_) {
    if (partials_) REMAT_CUDA_CHECK(cudaFreeHost(partials_));
    partials_ = nullptr;
    REMAT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&partials_), need * sizeof(double),
                                   cudaHostAllocMapped));
    partials_capacity_ = need;
  }
  double* dev_partials = nullptr;
  REMAT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_partials), partials_, 0));
  for (size_t i = 0; i < tensors.size(); ++i)
    kern::sum_squares_partials(tensors[i].f32(), tensors[i].numel(),
                               dev_partials + i * kern::kSumSquaresBlocks, stream());
  finish_op();
  synchronize();
  double total = 0;
  for (size_t i = 0; i < need; ++i) total += partials_[i];
  return total;
}

void CudaBackend::adamw_update_impl(const AdamWArgs& a) {
  const float bc1 = 1.0f - std::pow(a.beta1, static_cast<float>(a.step));
  const float bc2 = 1.0f - std::pow(a.beta2, static_cast<float>(a.step));
  kern::adamw({.param = a.param.f32(),
               .grad = a.grad.f32(),
               .m = a.m.f32(),
               .v = a.v.f32(),
               .n = a.param.numel(),
               .lr = a.lr,
               .beta1 = a.beta1,
               .beta2 = a.beta2,
               .eps = a.eps,
               .weight_decay = a.weight_decay,
               .grad_scale = a.grad_scale,
               .bias_corr1 = bc1,
               .bias_corr2 = bc2},
              stream());
  finish_op();
}

}  // namespace remat::cuda
