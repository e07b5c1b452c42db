// CUDA attention (engine/ops/attention.h): RoPE and dtype staging around cuDNN's fused flash
// attention (the AttentionEngine of cudnn_attention.cpp), in the op's workspace.
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cudnn_attention.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/op_util.h"
#include "engine/cuda/workspace.h"

namespace remat::cuda {

// ---- attention ----
// cuDNN reads q, k, v straight from a bf16 (B, T, 3C) buffer. With bf16 activations and no RoPE
// that is qkv itself; otherwise a staging copy in the workspace holds bf16 q, k (rotated) and v.
// The backward rotates again (the same bits as the forward) -- with bf16 activations in place,
// since it is qkv's last reader -- and maps the gradients with respect to rotated q, k back
// through R^T (and to f32 if needed) afterwards.

namespace {

// Pointers into the one "attn.workspace" part, in AttentionWorkspaceLayout's order.
struct AttnScratch {
  void *qkv = nullptr, *out = nullptr, *dout = nullptr, *dqkv = nullptr;
  float *dq_accum = nullptr, *softmax_sum = nullptr;
  void* cudnn_plan = nullptr;  // kCudnnPlanWorkspaceBytes for cuDNN's plan
};

AttnScratch carve(const OpWorkspace& ws, const AttentionWorkspaceLayout& w) {
  AttnScratch s;
  const Buffer& buf = ws.at("attn.workspace");
  REMAT_ASSERT(buf.tensor().bytes() >= w.total(), "attention: workspace of {} bytes, {} needed",
               buf.tensor().bytes(), w.total());
  char* p = static_cast<char*>(buf.tensor().data);
  auto take = [&p](uint64_t bytes) -> void* {
    void* r = bytes ? p : nullptr;
    p += bytes;
    return r;
  };
  s.qkv = take(w.qkv_bf16);
  s.out = take(w.out_bf16);
  s.dout = take(w.dout_bf16);
  s.dqkv = take(w.dqkv_bf16);
  s.dq_accum = static_cast<float*>(take(w.dq_accum));
  s.softmax_sum = static_cast<float*>(take(w.softmax_sum));
  s.cudnn_plan = take(w.cudnn_plan);
  return s;
}

// The q|k|v cuDNN reads: qkv itself (bf16, no RoPE), else the workspace's bf16 copy, rotated.
const void* staged_qkv(const AttnScratch& s, const Tensor& qkv, int64_t NH, float theta,
                       cudaStream_t stream) {
  if (!s.qkv) return qkv.data;
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3;
  kern::rope_apply(s.qkv, true, qkv.data, is_bf16(qkv), B * T, T, C, NH, theta, false, stream);
  return s.qkv;
}

}  // namespace

void CudaBackend::attention_forward_impl(const AttentionForwardArgs& a, const OpWorkspace& ws) {
  const int64_t B = a.qkv.dim(0), T = a.qkv.dim(1), C = a.out.dim(2), NH = a.n_head;
  const AttnScratch s = carve(ws, attention_workspace_layout(a.qkv, NH, a.rope_theta > 0, false));
  const void* qkv = staged_qkv(s, a.qkv, NH, a.rope_theta, stream());
  void* out = s.out ? s.out : a.out.data;
  attn_->forward({B, NH, T, C / NH}, {qkv, out, a.lse.f32()}, s.cudnn_plan);
  if (s.out) kern::cast(a.out.data, is_bf16(a.out), s.out, true, B * T * C, stream());
  finish_op();
}

// Computed for the op's contract and its tests; the CUDA backward itself takes O (cuDNN forms D).
void CudaBackend::attention_delta_impl(const AttentionDeltaArgs& a) {
  kern::attention_delta(a.delta.f32(), a.dout.data, a.out.data, is_bf16(a.dout), a.dout.dim(0),
                        a.dout.dim(1), a.dout.dim(2), a.n_head, stream());
  finish_op();
}

void CudaBackend::attention_backward_impl(const AttentionBackwardArgs& a, const OpWorkspace& ws) {
  REMAT_ASSERT(!a.out.empty(), "cuda attention_backward: cuDNN needs out (it computes D itself)");
  const int64_t B = a.qkv.dim(0), T = a.qkv.dim(1), C = a.out.dim(2), NH = a.n_head;
  const bool rope = a.rope_theta > 0;
  const AttnScratch s = carve(ws, attention_workspace_layout(a.qkv, NH, rope, true));
  const void* qkv = nullptr;
  if (rope && !s.qkv) {  // bf16: rotate q, k in place (the op's contract clobbers qkv)
    kern::rope_apply(a.qkv.data, true, a.qkv.data, true, B * T, T, C, NH, a.rope_theta, false,
                     stream());
    qkv = a.qkv.data;
  } else {
    qkv = staged_qkv(s, a.qkv, NH, a.rope_theta, stream());
  }
  const void* out = a.out.data;
  const void* dout = a.dout.data;
  if (s.out) {
    kern::cast(s.out, true, a.out.data, is_bf16(a.out), B * T * C, stream());
    out = s.out;
  }
  if (s.dout) {
    kern::cast(s.dout, true, a.dout.data, is_bf16(a.dout), B * T * C, stream());
    dout = s.dout;
  }
  void* dqkv = s.dqkv ? s.dqkv : a.dqkv.data;
  attn_->backward({B, NH, T, C / NH},
                  {qkv, out, dout, a.lse.f32(), dqkv, s.dq_accum, s.softmax_sum}, s.cudnn_plan);
  // dq, dk are gradients with respect to the rotated q, k: apply R^T (in place when dqkv is
  // bf16); with f32 activations this is also the cast out of the bf16 staging buffer.
  if (rope || s.dqkv)
    kern::rope_apply(a.dqkv.data, is_bf16(a.dqkv), dqkv, true, B * T, T, C, NH, a.rope_theta, true,
                     stream());
  finish_op();
}

}  // namespace remat::cuda
