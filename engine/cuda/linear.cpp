// CUDA linear layer (engine/core/ops/linear.h): cuBLASLt GEMMs (gemm.cpp), the bias in the forward
// GEMM's epilogue, LoRA's adapters after the base GEMM (lora.cpp); bf16 GEMMs read the bf16 weight
// copy of the op's workspace.
#include <algorithm>
#include <iterator>

#include "engine/core/cuda_workspace.h"
#include "engine/core/nf4.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/gemm.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/op_util.h"

namespace remat::cuda {

// ---- GEMM-based ops ----
// Row-major (R, Cc) is column-major (Cc, R) with ld Cc, so with W (OC, C):
//   out (N, OC) = inp W^T  ->  D (OC x N) = W^T[cm (C x OC), T] . inp[cm (C x N)]
//   dinp (N, C) = dout W   ->  D (C x N)  = W[cm (C x OC)] . dout[cm (OC x N)]
//   dW (OC, C) += dout^T inp -> D (C x OC) = inp[cm (C x N)] . dout[cm (OC x N), T]

const void* CudaBackend::gemm_weight(const Tensor& weight, const OpWorkspace& ws) {
  const Buffer* copy = ws.find("gemm.weight_bf16");
  if (!copy) copy = ws.find("gemm.weight_f32");
  if (!copy) return weight.data;  // already in the GEMM's dtype
  const Tensor& c = copy->tensor();
  if (is_nf4(weight.dtype))
    nf4_dequantize(c, weight);
  else
    kern::cast(c.data, is_bf16(c), weight.data, is_bf16(weight), weight.numel(), stream());
  return c.data;
}

void CudaBackend::nf4_dequantize(const Tensor& dst, const Tensor& weight) {
  static const kern::Nf4Tables tables = [] {
    kern::Nf4Tables t{};
    std::copy(std::begin(nf4::kCode), std::end(nf4::kCode), t.code);
    std::copy(std::begin(nf4::kDynamic), std::end(nf4::kDynamic), t.dynamic);
    return t;
  }();
  const bool dq = weight.dtype == DType::NF4DQ;
  const nf4::Layout l = nf4::layout(weight.numel(), dq);
  kern::nf4_dequantize(dst.data, is_bf16(dst), weight.data, weight.numel(), tables,
                       {l.codes, l.absmax, l.offset, l.absmax2, dq}, stream());
}

void CudaBackend::linear_forward_impl(const LinearForwardArgs& a, const OpWorkspace& ws) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), OC = a.weight.dim(0);
  const bool bf = is_bf16(a.inp);
  const void* w = gemm_weight(a.weight, ws);
  void* wsp = ws.at("gemm.workspace").tensor().data;
  // The bias rides in the GEMM's epilogue (gemm.h): no pass of its own over out.
  gemm_->matmul(OC, N, C, {w, bf, C, true}, {a.inp.data, bf, C, false}, a.out.data, is_bf16(a.out),
                OC, a.accumulate ? 1.0f : 0.0f, wsp, kGemmWorkspaceBytes,
                a.bias.empty() ? nullptr : a.bias.f32());
  lora_forward_terms(a.lora, a.out, a.inp, ws);
  finish_op();
  // The fused activation is the activation op after the GEMM here (one more pass over out).
  if (!a.act_out.empty()) activation_forward_impl({a.act_out, a.out, a.act});
}

void CudaBackend::linear_backward_impl(const LinearBackwardArgs& a, const OpWorkspace& ws) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), OC = a.weight.dim(0);
  const bool bf = is_bf16(a.dout);
  void* wsp = ws.at("gemm.workspace").tensor().data;
  if (!a.dinp.empty()) {  // the weight's GEMM copy exists only then (a packed weight has none else)
    const void* w = gemm_weight(a.weight, ws);
    gemm_->matmul(C, N, OC, {w, bf, C, false}, {a.dout.data, bf, OC, false}, a.dinp.data,
                  is_bf16(a.dinp), C, 0.0f, wsp, kGemmWorkspaceBytes);
  }
  // The adapters' gradients, and their share of dinp before the activation's derivative.
  if (!a.lora.empty()) lora_backward_terms(a, ws);
  if (!a.dinp.empty() && !a.inp_pre_act.empty())  // through the activation, in place
    activation_backward_impl({a.dinp, a.dinp, a.inp_pre_act, a.act});
  // f32 output, beta 1: the weight gradient accumulates in fp32 straight from bf16 operands (none
  // for a frozen weight).
  if (!a.dweight.empty())
    gemm_->matmul(C, OC, N, {a.inp.data, bf, C, false}, {a.dout.data, bf, OC, true}, a.dweight.data,
                  false, C, 1.0f, wsp, kGemmWorkspaceBytes);
  if (!a.dbias.empty())
    kern::column_sum_add(a.dbias.f32(), a.dout.data, N, OC, bf, reduce_, stream());
  finish_op();
}

}  // namespace remat::cuda
