// CUDA attention (engine/ops/attention.h): RoPE and dtype staging around cuDNN's fused flash
// attention (the AttentionEngine of cudnn_attention.cpp), in the op's workspace.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cudnn_attention.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/op_util.h"
#include "engine/cuda/workspace.h"
#include "engine/error.h"

namespace remat::cuda {

// ---- attention ----
// cuDNN reads q, k, v straight from a bf16 (B, T, W) buffer, W = (NH + 2 KVH) HS: NH query heads,
// then KVH key and KVH value heads, which cuDNN's grouped-query support reads as they are (no
// head is repeated). With bf16 activations and no RoPE that is qkv itself; otherwise a staging
// copy in the workspace holds bf16 q, k (rotated) and v. The backward rotates again (the same
// bits as the forward) -- with bf16 activations in place, since it is qkv's last reader -- and
// maps the gradients with respect to rotated q, k back through R^T (and to f32 if needed)
// afterwards. The rotation's frequencies are engine/ops/rope.h's, its scaling applied.

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

// The heads of one attention call: shape for cuDNN, and RoPE's frequencies (none when theta is 0).
struct Heads {
  AttentionShape shape;
  kern::RopeFrequencies freq;
  Heads(const Tensor& qkv, int n_head, int n_kv_head, float theta, const RopeScaling& scaling) {
    const int64_t KVH = kv_heads(n_head, n_kv_head);
    shape = {qkv.dim(0), n_head, qkv.dim(1), qkv.dim(2) / (n_head + 2 * KVH), KVH};
    if (theta <= 0) return;
    if (shape.HS / 2 > kern::kMaxRopePairs)
      throw BackendError(
          fmt::format("[attention] RoPE on CUDA takes head sizes up to {}, got {}. Fix: more heads "
                      "(model.n_head) for the same width",
                      2 * kern::kMaxRopePairs, shape.HS));
    const std::vector<double> f = rope_inv_freq(shape.HS, static_cast<double>(theta), scaling);
    freq.n = static_cast<int>(f.size());
    std::copy(f.begin(), f.end(), freq.inv_freq);
  }
  /// dst = src with q, k rotated (inverse: by R^T), or copied when there is no RoPE.
  kern::RopeParams rope(void* dst, bool dst_bf16, const void* src, bool src_bf16,
                        bool inverse) const {
    return {dst,       dst_bf16, src,     src_bf16, shape.B * shape.T, shape.T, shape.NH,
            shape.KVH, shape.HS, inverse, freq};
  }
};

// The q|k|v cuDNN reads: qkv itself (bf16, no RoPE), else the workspace's bf16 copy, rotated.
const void* staged_qkv(const AttnScratch& s, const Tensor& qkv, const Heads& h,
                       cudaStream_t stream) {
  if (!s.qkv) return qkv.data;
  kern::rope_apply(h.rope(s.qkv, true, qkv.data, is_bf16(qkv), false), stream);
  return s.qkv;
}

}  // namespace

void CudaBackend::attention_forward_impl(const AttentionForwardArgs& a, const OpWorkspace& ws) {
  const Heads h(a.qkv, a.n_head, a.n_kv_head, a.rope_theta, a.rope_scaling);
  const int64_t n_out = a.out.numel();
  const AttnScratch s =
      carve(ws, attention_workspace_layout(a.qkv, a.n_head, a.n_kv_head, a.rope_theta > 0, false));
  const void* qkv = staged_qkv(s, a.qkv, h, stream());
  void* out = s.out ? s.out : a.out.data;
  attn_->forward(h.shape, {qkv, out, a.lse.f32()}, s.cudnn_plan);
  if (s.out) kern::cast(a.out.data, is_bf16(a.out), s.out, true, n_out, stream());
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
  const Heads h(a.qkv, a.n_head, a.n_kv_head, a.rope_theta, a.rope_scaling);
  const int64_t n_out = a.out.numel();
  const bool rope = a.rope_theta > 0;
  const AttnScratch s =
      carve(ws, attention_workspace_layout(a.qkv, a.n_head, a.n_kv_head, rope, true));
  const void* qkv = nullptr;
  if (rope && !s.qkv) {  // bf16: rotate q, k in place (the op's contract clobbers qkv)
    kern::rope_apply(h.rope(a.qkv.data, true, a.qkv.data, true, false), stream());
    qkv = a.qkv.data;
  } else {
    qkv = staged_qkv(s, a.qkv, h, stream());
  }
  const void* out = a.out.data;
  const void* dout = a.dout.data;
  if (s.out) {
    kern::cast(s.out, true, a.out.data, is_bf16(a.out), n_out, stream());
    out = s.out;
  }
  if (s.dout) {
    kern::cast(s.dout, true, a.dout.data, is_bf16(a.dout), n_out, stream());
    dout = s.dout;
  }
  void* dqkv = s.dqkv ? s.dqkv : a.dqkv.data;
  attn_->backward(h.shape, {qkv, out, dout, a.lse.f32(), dqkv, s.dq_accum, s.softmax_sum},
                  s.cudnn_plan);
  // dq, dk are gradients with respect to the rotated q, k: apply R^T (in place when dqkv is
  // bf16); with f32 activations this is also the cast out of the bf16 staging buffer.
  if (rope || s.dqkv)
    kern::rope_apply(h.rope(a.dqkv.data, is_bf16(a.dqkv), dqkv, true, true), stream());
  finish_op();
}

}  // namespace remat::cuda
