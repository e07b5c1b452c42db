// CUDA LayerNorm (engine/ops/layernorm.h): launches the kernels of layernorm.cu.
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/op_util.h"

namespace remat::cuda {

void CudaBackend::layernorm_forward_impl(const LayerNormForwardArgs& a) {
  kern::layernorm_forward(a.out.data, a.stats.f32(), a.inp.data, a.weight.f32(), a.bias.f32(),
                          a.inp.rows(), a.inp.dim(-1), is_bf16(a.inp), stream());
  finish_op();
}

void CudaBackend::layernorm_backward_impl(const LayerNormBackwardArgs& a) {
  kern::layernorm_backward(a.dinp.data, a.dweight.f32(), a.dbias.f32(), a.dout.data, a.inp.data,
                           a.weight.f32(), a.stats.f32(), a.inp.rows(), a.inp.dim(-1),
                           is_bf16(a.inp), reduce_, stream());
  finish_op();
}

}  // namespace remat::cuda
