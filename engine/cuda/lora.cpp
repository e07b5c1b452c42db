// CUDA LoRA adapters of a linear (engine/core/ops/lora.h), run by linear.cpp after its base GEMM,
// one adapter after the other: cuBLASLt GEMMs (gemm.cpp), the adapter's columns of a wider output
// addressed by their leading dimension, the scale s as the GEMM's alpha.
// bf16 GEMMs read bf16 copies of A and B made in the op's workspace (cuBLASLt takes one dtype for
// both operands); h and dh are in the activations' dtype, the weight gradients accumulate in f32.
// The dropout is the backend's own kernel, so its mask is the CPU's bit for bit.
#include "engine/core/cuda_workspace.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/gemm.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/op_util.h"

namespace remat::cuda {

// Row-major (R, Cc) is column-major (Cc, R) with ld Cc (see linear.cpp), so with x (N, C),
// A (r, C), B (n, r) and g = dout's columns [col0, col0 + n) (ld OC):
//   h (N, r)   = s x A^T   ->  D (r x N)  = A^T[cm (C x r), T] . x[cm (C x N)]      (alpha s)
//   out += h B^T           ->  D (n x N, ld OC) = B^T[cm (r x n), T] . h[cm (r x N)]
//   dB (n, r) += g^T h     ->  D (r x n)  = h[cm (r x N)] . g[cm (n x N, ld OC), T]
//   dh (N, r)  = s g B     ->  D (r x N)  = B[cm (r x n)] . g[cm (n x N, ld OC)]    (alpha s)
//   dA (r, C) += dh^T x    ->  D (C x r)  = x[cm (C x N)] . dh[cm (r x N), T]
//   dinp += dh A           ->  D (C x N)  = A[cm (C x r)] . dh[cm (r x N)]
CudaBackend::LoraOperands CudaBackend::lora_operands(const Tensor& inp, const Tensor& a,
                                                     const Tensor& b, float scale,
                                                     const LoraDropout& d, const OpWorkspace& ws) {
  const int64_t N = inp.rows(), C = inp.dim(-1), r = a.dim(0);
  LoraOperands o;
  o.bf = is_bf16(inp);
  o.a = a.data;
  o.b = b.data;
  if (o.bf) {
    const Tensor& a16 = ws.at("lora.a_bf16").tensor();
    const Tensor& b16 = ws.at("lora.b_bf16").tensor();
    kern::cast(a16.data, true, a.data, false, a.numel(), stream());
    kern::cast(b16.data, true, b.data, false, b.numel(), stream());
    o.a = a16.data;
    o.b = b16.data;
  }
  o.x = inp.data;
  if (d.p > 0) {
    const Tensor& dropped = ws.at("lora.dropped").tensor();
    dropout_impl({dropped, inp, d.p, d.seed, d.stream, d.first_index});
    o.x = dropped.data;
  }
  o.h = ws.at("lora.h").tensor().data;
  o.wsp = ws.at("gemm.workspace").tensor().data;
  gemm_->matmul(r, N, C, {o.a, o.bf, C, true}, {o.x, o.bf, C, false}, o.h, o.bf, r, 0.0f, o.wsp,
                kGemmWorkspaceBytes, nullptr, scale);
  return o;
}

void CudaBackend::lora_forward_terms(const LinearLora& l, const Tensor& out, const Tensor& inp,
                                     const OpWorkspace& ws) {
  const int64_t N = inp.rows(), OC = out.dim(-1), r = l.rank();
  for (const LoraAdapterArgs& ad : l.list()) {
    const int64_t n = ad.b.dim(0);
    const LoraOperands o = lora_operands(inp, ad.a, ad.b, l.scale, ad.dropout, ws);
    gemm_->matmul(n, N, r, {o.b, o.bf, r, true}, {o.h, o.bf, r, false}, byte_ptr(out, ad.col0),
                  is_bf16(out), OC, 1.0f, o.wsp, kGemmWorkspaceBytes);
  }
}

void CudaBackend::lora_backward_terms(const LinearBackwardArgs& a, const OpWorkspace& ws) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), OC = a.dout.dim(-1), r = a.lora.rank();
  void* dh = ws.at("lora.dh").tensor().data;
  for (const LoraAdapterArgs& ad : a.lora.list()) {
    const int64_t n = ad.b.dim(0);
    const LoraOperands o = lora_operands(a.inp, ad.a, ad.b, a.lora.scale, ad.dropout, ws);
    const void* g = byte_ptr(a.dout, ad.col0);
    gemm_->matmul(r, n, N, {o.h, o.bf, r, false}, {g, o.bf, OC, true}, ad.db.data, false, r, 1.0f,
                  o.wsp, kGemmWorkspaceBytes);
    gemm_->matmul(r, N, n, {o.b, o.bf, r, false}, {g, o.bf, OC, false}, dh, o.bf, r, 0.0f, o.wsp,
                  kGemmWorkspaceBytes, nullptr, a.lora.scale);
    gemm_->matmul(C, r, N, {o.x, o.bf, C, false}, {dh, o.bf, r, true}, ad.da.data, false, C, 1.0f,
                  o.wsp, kGemmWorkspaceBytes);
    if (a.dinp.empty()) continue;
    if (ad.dropout.p == 0) {
      gemm_->matmul(C, N, r, {o.a, o.bf, C, false}, {dh, o.bf, r, false}, a.dinp.data,
                    is_bf16(a.dinp), C, 1.0f, o.wsp, kGemmWorkspaceBytes);
    } else {  // dh A into the dropped input's buffer, masked as the input was, then added
      const Tensor& t = ws.at("lora.dropped").tensor();
      gemm_->matmul(C, N, r, {o.a, o.bf, C, false}, {dh, o.bf, r, false}, t.data, o.bf, C, 0.0f,
                    o.wsp, kGemmWorkspaceBytes);
      const LoraDropout& d = ad.dropout;
      dropout_impl({t, t, d.p, d.seed, d.stream, d.first_index});
      add_impl(a.dinp, a.dinp, t);
    }
  }
}

}  // namespace remat::cuda
