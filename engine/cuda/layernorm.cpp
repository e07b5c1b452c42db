// CUDA LayerNorm (engine/core/ops/layernorm.h): launches the kernels of layernorm.cu.
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/op_util.h"

namespace remat::cuda {

void CudaBackend::layernorm_forward_impl(const LayerNormForwardArgs& a) {
  kern::layernorm_forward({.out = a.out.data,
                           .stats = a.stats.f32(),
                           .inp = a.inp.data,
                           .weight = a.weight.f32(),
                           .bias = a.bias.f32(),
                           .N = a.inp.rows(),
                           .C = a.inp.dim(-1),
                           .bf16 = is_bf16(a.inp)},
                          stream());
  finish_op();
}

void CudaBackend::layernorm_backward_impl(const LayerNormBackwardArgs& a) {
  kern::layernorm_backward({.dinp = a.dinp.data,
                            .dweight = a.dweight.f32(),
                            .dbias = a.dbias.f32(),
                            .dout = a.dout.data,
                            .inp = a.inp.data,
                            .weight = a.weight.f32(),
                            .stats = a.stats.f32(),
                            .N = a.inp.rows(),
                            .C = a.inp.dim(-1),
                            .bf16 = is_bf16(a.inp)},
                           reduce_, stream());
  finish_op();
}

}  // namespace remat::cuda
