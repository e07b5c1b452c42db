// CUDA pointwise ops (engine/ops/activation.h): the residual add, GELU / ReLU forward and
// backward and dropout; kernels in elementwise.cu.
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/op_util.h"

namespace remat::cuda {

void CudaBackend::add_impl(const Tensor& out, const Tensor& a, const Tensor& b) {
  REMAT_ASSERT(out.dtype == a.dtype && a.dtype == b.dtype, "add: mixed dtypes");
  kern::add(out.data, a.data, b.data, out.numel(), is_bf16(out), stream());
  finish_op();
}

void CudaBackend::activation_forward_impl(const ActivationForwardArgs& a) {
  kern::activation_forward(a.out.data, a.inp.data, a.inp.numel(), a.kind == Activation::Gelu,
                           is_bf16(a.inp), stream());
  finish_op();
}

void CudaBackend::activation_backward_impl(const ActivationBackwardArgs& a) {
  kern::activation_backward(a.dinp.data, a.dout.data, a.inp.data, a.inp.numel(),
                            a.kind == Activation::Gelu, is_bf16(a.inp), stream());
  finish_op();
}

void CudaBackend::dropout_impl(const DropoutArgs& a) {
  kern::dropout(a.out.data, a.inp.data, a.inp.numel(), a.p, a.seed, a.stream, is_bf16(a.inp),
                stream());
  finish_op();
}

// Deterministic: a fixed grid per tensor writes double partials straight into pinned host
// memory; after one sync the host adds them in order.

}  // namespace remat::cuda
