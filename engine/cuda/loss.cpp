// CUDA losses (engine/core/ops/loss.h): the fused, chunked LM head + cross-entropy (cuBLASLt GEMMs
// around the softmax kernel) and the MLP's MSE; kernels in elementwise.cu.
#include <algorithm>

#include "engine/core/cuda_workspace.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/gemm.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/op_util.h"

namespace remat::cuda {

static_assert(kern::kIgnoredTarget == remat::kIgnoredTarget, "one value marks untrained targets");

// Per chunk of rows: logits (rows, V) f32 = x W^T; the softmax cross-entropy kernel writes the
// losses and overwrites the logits with (softmax - onehot) * scale (bf16 in place at ld 2V when
// the GEMMs are bf16: see kern::softmax_xent); then dinp = dlogits W and dW += dlogits^T x.
void CudaBackend::lm_head_loss_impl(const LmHeadLossArgs& a, const OpWorkspace& ws) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), V = a.weight.dim(0);
  const bool bf = is_bf16(a.inp);
  const void* w = gemm_weight(a.weight, ws);
  const Buffer& chunk = ws.at("lm_head.logits_chunk");
  void* wsp = ws.at("gemm.workspace").tensor().data;
  float* logits = chunk.f32();
  const int64_t R = chunk.tensor().dim(0), ld_grad = bf ? 2 * V : V;
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t rows = std::min(R, N - r0);
    const void* x = byte_ptr(a.inp, r0 * C);
    gemm_->matmul(V, rows, C, {w, bf, C, true}, {x, bf, C, false}, logits, false, V, 0.0f, wsp,
                  kGemmWorkspaceBytes);
    kern::softmax_xent(logits, a.targets.i32() + r0, a.losses.f32() + r0,
                       a.argmax.empty() ? nullptr : a.argmax.i32() + r0, rows, V, a.loss_scale, bf,
                       stream());
    gemm_->matmul(C, rows, V, {w, bf, C, false}, {logits, bf, ld_grad, false},
                  byte_ptr(a.dinp, r0 * C), is_bf16(a.dinp), C, 0.0f, wsp, kGemmWorkspaceBytes);
    if (!a.dweight.empty())  // a frozen head has no weight gradient
      gemm_->matmul(C, V, rows, {x, bf, C, false}, {logits, bf, ld_grad, true}, a.dweight.data,
                    false, C, 1.0f, wsp, kGemmWorkspaceBytes);
  }
  finish_op();
}

void CudaBackend::mse_loss_impl(const MseLossArgs& a) {
  kern::mse_loss({.losses = a.losses.f32(),
                  .dinp = a.dinp.data,
                  .inp = a.inp.data,
                  .target = a.target.f32(),
                  .N = a.inp.rows(),
                  .D = a.inp.dim(-1),
                  .scale = a.loss_scale,
                  .bf16 = is_bf16(a.inp)},
                 stream());
  finish_op();
}

}  // namespace remat::cuda
