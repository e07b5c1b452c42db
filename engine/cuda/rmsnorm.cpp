// CUDA RMSNorm and the per-head q/k RMSNorm (engine/core/ops/rmsnorm.h): launches the kernels of
// rmsnorm.cu. The weight gradients go through the backend's column-reduction scratch (reduce_),
// as LayerNorm's do.
#include "engine/core/error.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/norm_kernels.cuh"
#include "engine/cuda/op_util.h"

namespace remat::cuda {
namespace {

// The kernels read every activation pointer as the input's storage type, so a tensor of another
// dtype would be read as garbage rather than fail.
void check_same_dtype(const char* op, const Tensor& inp, const Tensor& a, const Tensor& b) {
  REMAT_ASSERT(a.dtype == inp.dtype && b.dtype == inp.dtype, "{}: activations of mixed dtypes", op);
}

}  // namespace

void CudaBackend::rmsnorm_forward_impl(const RmsNormForwardArgs& a) {
  check_same_dtype("rmsnorm_forward", a.inp, a.out, a.out);
  kern::rmsnorm_forward({.out = a.out.data,
                         .rstd = a.rstd.f32(),
                         .inp = a.inp.data,
                         .weight = a.weight.f32(),
                         .N = a.inp.rows(),
                         .C = a.inp.dim(-1),
                         .eps = a.eps,
                         .bf16 = is_bf16(a.inp)},
                        stream());
  finish_op();
}

void CudaBackend::rmsnorm_backward_impl(const RmsNormBackwardArgs& a) {
  check_same_dtype("rmsnorm_backward", a.inp, a.dinp, a.dout);
  kern::rmsnorm_backward({.dinp = a.dinp.data,
                          .dweight = a.dweight.f32(),
                          .dout = a.dout.data,
                          .inp = a.inp.data,
                          .weight = a.weight.f32(),
                          .rstd = a.rstd.f32(),
                          .N = a.inp.rows(),
                          .C = a.inp.dim(-1),
                          .bf16 = is_bf16(a.inp)},
                         reduce_, stream());
  finish_op();
}

void CudaBackend::qk_norm_forward_impl(const QkNormForwardArgs& a) {
  check_same_dtype("qk_norm_forward", a.inp, a.out, a.out);
  kern::qk_norm_forward({.out = a.out.data,
                         .rstd = a.rstd.f32(),
                         .inp = a.inp.data,
                         .q_weight = a.q_weight.f32(),
                         .k_weight = a.k_weight.f32(),
                         .N = a.inp.rows(),
                         .NH = a.n_head,
                         .KVH = a.n_kv_head,
                         .HS = qkv_head_size(a.inp.dim(-1), a.n_head, a.n_kv_head),
                         .eps = a.eps,
                         .bf16 = is_bf16(a.inp)},
                        stream());
  finish_op();
}

void CudaBackend::qk_norm_backward_impl(const QkNormBackwardArgs& a) {
  check_same_dtype("qk_norm_backward", a.inp, a.dinp, a.dout);
  kern::qk_norm_backward({.dinp = a.dinp.data,
                          .dq_weight = a.dq_weight.f32(),
                          .dk_weight = a.dk_weight.f32(),
                          .dout = a.dout.data,
                          .inp = a.inp.data,
                          .q_weight = a.q_weight.f32(),
                          .k_weight = a.k_weight.f32(),
                          .rstd = a.rstd.f32(),
                          .N = a.inp.rows(),
                          .NH = a.n_head,
                          .KVH = a.n_kv_head,
                          .HS = qkv_head_size(a.inp.dim(-1), a.n_head, a.n_kv_head),
                          .bf16 = is_bf16(a.inp)},
                         reduce_, stream());
  finish_op();
}

}  // namespace remat::cuda
