// CUDA SwiGLU's gate (engine/core/ops/swiglu.h): launches the kernels of swiglu.cu.
#include "engine/core/error.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/norm_kernels.cuh"
#include "engine/cuda/op_util.h"

namespace remat::cuda {

// The kernels read every activation pointer as the gate's storage type.
void CudaBackend::swiglu_forward_impl(const SwiGluForwardArgs& a) {
  REMAT_ASSERT(a.out.dtype == a.gate.dtype && a.up.dtype == a.gate.dtype,
               "swiglu_forward: activations of mixed dtypes");
  kern::swiglu_forward({.out = a.out.data,
                        .gate = a.gate.data,
                        .up = a.up.data,
                        .n = a.gate.numel(),
                        .bf16 = is_bf16(a.gate)},
                       stream());
  finish_op();
}

void CudaBackend::swiglu_backward_impl(const SwiGluBackwardArgs& a) {
  REMAT_ASSERT(a.dgate.dtype == a.gate.dtype && a.dup.dtype == a.gate.dtype &&
                   a.dout.dtype == a.gate.dtype && a.up.dtype == a.gate.dtype,
               "swiglu_backward: activations of mixed dtypes");
  kern::swiglu_backward({.dgate = a.dgate.data,
                         .dup = a.dup.data,
                         .dout = a.dout.data,
                         .gate = a.gate.data,
                         .up = a.up.data,
                         .n = a.gate.numel(),
                         .bf16 = is_bf16(a.gate)},
                        stream());
  finish_op();
}

}  // namespace remat::cuda
