// CUDA optimizer ops (engine/core/ops/adamw.h): the global sum of squares, AdamW, and the zeroing
// of a step's gradients; kernels in optimizer.cu. The batched forms hand every tensor to one
// multi-tensor launcher: a few launches a step instead of one per parameter.
#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "engine/cuda/check.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/kernels.cuh"

namespace remat::cuda {
namespace {

kern::AdamWParams adamw_params(const AdamWArgs& a) {
  const float bc1 = 1.0f - std::pow(a.beta1, static_cast<float>(a.step));
  const float bc2 = 1.0f - std::pow(a.beta2, static_cast<float>(a.step));
  return {.param = a.param.f32(),
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
          .bias_corr2 = bc2};
}

std::vector<kern::DeviceFloats> device_floats(std::span<const Tensor> tensors) {
  std::vector<kern::DeviceFloats> out;
  out.reserve(tensors.size());
  for (const Tensor& t : tensors) out.push_back({t.f32(), t.numel()});
  return out;
}

}  // namespace

// Every tensor's kSumSquaresBlocks partials into pinned, device-mapped memory, then one sync and
// an in-order sum on the host: the same bits however the launches group the tensors.
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
  const std::vector<kern::DeviceFloats> spans = device_floats(tensors);
  kern::sum_squares_partials(spans.data(), static_cast<int64_t>(spans.size()), dev_partials,
                             stream());
  finish_op();
  synchronize();
  double total = 0;
  for (size_t i = 0; i < need; ++i) total += partials_[i];
  return total;
}

void CudaBackend::adamw_update_impl(const AdamWArgs& a) {
  kern::adamw(adamw_params(a), stream());
  finish_op();
}

void CudaBackend::adamw_updates_impl(std::span<const AdamWArgs> all) {
  std::vector<kern::AdamWParams> updates;
  updates.reserve(all.size());
  for (const AdamWArgs& a : all) updates.push_back(adamw_params(a));
  kern::adamw_multi(updates.data(), static_cast<int64_t>(updates.size()), stream());
  finish_op();
}

void CudaBackend::fill_zero_impl(std::span<const Tensor> tensors) {
  for (const Tensor& t : tensors) forget_tokens_if_overlapping(t.data, t.bytes());
  const std::vector<kern::DeviceFloats> spans = device_floats(tensors);
  kern::zero_multi(spans.data(), static_cast<int64_t>(spans.size()), stream());
  finish_op();
}

}  // namespace remat::cuda
