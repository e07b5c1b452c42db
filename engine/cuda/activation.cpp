// CUDA pointwise ops (engine/core/ops/activation.h): the residual add, GELU / ReLU forward and
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

namespace {

// The launchers' view of an activation op: `out` is the forward output or the backward's dinp.
kern::ActivationParams activation_params(const Tensor& out, const Tensor& dout, const Tensor& inp,
                                         Activation kind) {
  return {.out = out.data,
          .dout = dout.empty() ? nullptr : dout.data,
          .inp = inp.data,
          .n = inp.numel(),
          .gelu = kind == Activation::Gelu,
          .bf16 = is_bf16(inp)};
}

}  // namespace

void CudaBackend::activation_forward_impl(const ActivationForwardArgs& a) {
  kern::activation_forward(activation_params(a.out, Tensor(), a.inp, a.kind), stream());
  finish_op();
}

void CudaBackend::activation_backward_impl(const ActivationBackwardArgs& a) {
  kern::activation_backward(activation_params(a.dinp, a.dout, a.inp, a.kind), stream());
  finish_op();
}

void CudaBackend::dropout_impl(const DropoutArgs& a) {
  kern::dropout({.out = a.out.data,
                 .inp = a.inp.data,
                 .n = a.inp.numel(),
                 .p = a.p,
                 .seed = a.seed,
                 .stream = a.stream,
                 .first_index = a.first_index,
                 .bf16 = is_bf16(a.inp)},
                stream());
  finish_op();
}

// Deterministic: a fixed grid per tensor writes double partials straight into pinned host
// memory; after one sync the host adds them in order.

}  // namespace remat::cuda
