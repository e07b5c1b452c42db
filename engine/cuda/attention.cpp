// CUDA attention (engine/core/ops/attention.h): RoPE and dtype staging around cuDNN's fused flash
// attention (the AttentionEngine of cudnn_attention.cpp), in the op's workspace; documents
// (doc_start) as one call per document.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "engine/core/cuda_workspace.h"
#include "engine/core/error.h"
#include "engine/cuda/check.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cudnn_attention.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/op_util.h"

namespace remat::cuda {

// ---- attention ----
// cuDNN reads q, k, v straight from a bf16 (B, T, W) buffer, W = (NH + 2 KVH) HS: NH query heads,
// then KVH key and KVH value heads, which cuDNN's grouped-query support reads as they are (no
// head is repeated). With bf16 activations and no RoPE that is qkv itself; otherwise a staging
// copy in the workspace holds bf16 q, k (rotated) and v. The backward rotates again (the same
// bits as the forward) -- with bf16 activations in place, since it is qkv's last reader -- and
// maps the gradients with respect to rotated q, k back through R^T (and to f32 if needed)
// afterwards. The rotation's frequencies are engine/core/ops/rope.h's, its scaling applied.
//
// Attention over chunks (engine/core/ops/attention.h's schedule, chunks from attention_chunks in
// engine/core/cuda_workspace.h): one batch row at a time, each (query chunk i, key chunk j <= i)
// pair is one cuDNN call on views of the same bf16 qkv (causal on the diagonal, unmasked
// elsewhere). The forward merges each pair's bf16 output and lse into the query chunk's f32 output
// and the global lse (kern::attention_merge), then casts the output once; the backward gives every
// pair the global O, dO and its query chunk's lse (copied to a packed (NH, L) tensor), so cuDNN's
// recomputed probabilities and D are the whole sequence's, and sums the pair's bf16 dq and dk | dv
// in f32 (one of them over the whole row, the other per chunk: backward_chunked) before one cast
// into dqkv.

namespace {

// Pointers into the one "attn.workspace" part, in AttentionWorkspaceLayout's order.
struct AttnScratch {
  void *qkv = nullptr, *out = nullptr, *dout = nullptr, *dqkv = nullptr;
  float *dq_accum = nullptr, *softmax_sum = nullptr;
  void* pair_out = nullptr;  // chunked: see AttentionWorkspaceLayout
  float *pair_lse = nullptr, *out_sum = nullptr;
  void* pair_dqkv = nullptr;
  float *dq_sum = nullptr, *dkv_sum = nullptr;
  void* cudnn_plan = nullptr;  // cuDNN's plan: cudnn_plan_reserve_bytes of the largest call
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
  s.pair_out = take(w.pair_out);
  s.pair_lse = static_cast<float*>(take(w.pair_lse));
  s.out_sum = static_cast<float*>(take(w.out_sum));
  s.pair_dqkv = take(w.pair_dqkv);
  s.dq_sum = static_cast<float*>(take(w.dq_sum));
  s.dkv_sum = static_cast<float*>(take(w.dkv_sum));
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
    freq = rope_frequencies(shape.HS, theta, scaling, "[attention]");
  }
  /// dst = src with q, k rotated (inverse: by R^T), or copied when there is no RoPE.
  kern::RopeParams rope(void* dst, bool dst_bf16, const void* src, bool src_bf16,
                        bool inverse) const {
    return rope_rows(dst, dst_bf16, src, src_bf16, inverse, shape.B * shape.T, shape.T);
  }
  /// The same over `rows` rows whose positions are row % T.
  kern::RopeParams rope_rows(void* dst, bool dst_bf16, const void* src, bool src_bf16, bool inverse,
                             int64_t rows, int64_t T) const {
    return {dst, dst_bf16, src, src_bf16, rows, T, shape.NH, shape.KVH, shape.HS, inverse, freq};
  }
};

// The q|k|v cuDNN reads: qkv itself (bf16, no RoPE), else the workspace's bf16 copy, rotated.
const void* staged_qkv(const AttnScratch& s, const Tensor& qkv, const Heads& h,
                       cudaStream_t stream) {
  if (!s.qkv) return qkv.data;
  kern::rope_apply(h.rope(s.qkv, true, qkv.data, is_bf16(qkv), false), stream);
  return s.qkv;
}

// Rows [from, to) of a scratch of `row_bytes`-byte rows set to zero.
void zero_tail(void* base, int64_t from, int64_t to, int64_t row_bytes, cudaStream_t stream) {
  if (to > from)
    REMAT_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(base) + from * row_bytes, 0,
                                     static_cast<size_t>((to - from) * row_bytes), stream));
}

// Byte address of row r of a (rows, width) tensor of `elem`-byte elements.
const char* row_at(const void* base, int64_t r, int64_t width, int64_t elem) {
  return static_cast<const char*>(base) + r * width * elem;
}
char* row_at(void* base, int64_t r, int64_t width, int64_t elem) {
  return static_cast<char*>(base) + r * width * elem;
}

// The pair (query chunk i, key chunk j) of batch row b as one cuDNN call's shape.
AttentionShape pair_shape(const Heads& h, const AttentionChunks& ch, int64_t i, int64_t j) {
  return {1, h.shape.NH, ch.length(i), h.shape.HS, h.shape.KVH, ch.length(j), i == j};
}

// Forward over chunks: qkv is the bf16 (B, T, W) cuDNN reads (rotated).
void forward_chunked(AttentionEngine& attn, const AttentionForwardArgs& a, const Heads& h,
                     const AttnScratch& s, const AttentionChunks& ch, const void* qkv,
                     cudaStream_t stream) {
  const int64_t T = h.shape.T, W = h.shape.W(), C = h.shape.C(), NH = h.shape.NH;
  const int64_t out_elem = is_bf16(a.out) ? 2 : 4;
  for (int64_t b = 0; b < h.shape.B; ++b)
    for (int64_t i = 0; i < ch.count(); ++i) {
      const int64_t qs = b * T + ch.start(i), qn = ch.length(i);
      float* lse = a.lse.f32() + b * NH * T + ch.start(i);  // head rows T apart
      for (int64_t j = 0; j <= i; ++j) {
        const int64_t ks = b * T + ch.start(j);
        attn.forward(pair_shape(h, ch, i, j),
                     {row_at(qkv, qs, W, 2), s.pair_out, s.pair_lse, row_at(qkv, ks, W, 2)},
                     s.cudnn_plan);
        kern::attention_merge(s.out_sum, lse, T, s.pair_out, s.pair_lse, qn, NH, h.shape.HS, j == 0,
                              stream);
      }
      kern::cast(row_at(a.out.data, qs, C, out_elem), is_bf16(a.out), s.out_sum, false, qn * C,
                 stream);
    }
}

// Backward over chunks: qkv, out, dout are the bf16 tensors cuDNN reads (q, k rotated). Writes
// dqkv with respect to the rotated q, k, in the activations' dtype. One of dq (C per row) and
// dk | dv (KV per row) is summed over the whole row, the other per chunk: the narrower one over
// the row (chunk_key_outer), so multi-head attention loops key chunks outside and grouped-query
// attention query chunks. Either way dq_i sums its key chunks j ascending and dk_j, dv_j their
// query chunks i ascending: the same bits in both orders.
void backward_chunked(AttentionEngine& attn, const AttentionBackwardArgs& a, const Heads& h,
                      const AttnScratch& s, const AttentionChunks& ch, const void* qkv,
                      const void* out, const void* dout, cudaStream_t stream) {
  const int64_t T = h.shape.T, W = h.shape.W(), C = h.shape.C(), NH = h.shape.NH;
  const int64_t KV = W - C;  // dk | dv per row
  const bool key_outer = chunk_key_outer(C, KV);
  const bool dqkv_bf16 = is_bf16(a.dqkv);
  const int64_t elem = dqkv_bf16 ? 2 : 4, n = ch.count();
  auto zero = [stream](float* p, int64_t floats) {
    REMAT_CUDA_CHECK(cudaMemsetAsync(p, 0, static_cast<size_t>(floats) * sizeof(float), stream));
  };
  for (int64_t b = 0; b < h.shape.B; ++b) {
    const int64_t row0 = b * T;
    if (key_outer)
      zero(s.dq_sum, T * C);
    else
      zero(s.dkv_sum, T * KV);
    for (int64_t o = 0; o < n; ++o) {  // the outer chunk: keys (key_outer) or queries
      if (key_outer)
        zero(s.dkv_sum, ch.length(o) * KV);
      else
        zero(s.dq_sum, ch.length(o) * C);
      for (int64_t x = key_outer ? o : 0; key_outer ? x < n : x <= o; ++x) {
        const int64_t i = key_outer ? x : o, j = key_outer ? o : x;
        const int64_t qs = row0 + ch.start(i), qn = ch.length(i);
        const int64_t ks = row0 + ch.start(j), kn = ch.length(j);
        // The query chunk's lse, packed (NH, qn): cuDNN reads its statistics 16-byte aligned.
        if (key_outer || x == 0)
          REMAT_CUDA_CHECK(cudaMemcpy2DAsync(
              s.pair_lse, static_cast<size_t>(qn) * 4, a.lse.f32() + b * NH * T + ch.start(i),
              static_cast<size_t>(T) * 4, static_cast<size_t>(qn) * 4, static_cast<size_t>(NH),
              cudaMemcpyDeviceToDevice, stream));
        attn.backward(pair_shape(h, ch, i, j),
                      {row_at(qkv, qs, W, 2), row_at(out, qs, C, 2), row_at(dout, qs, C, 2),
                       s.pair_lse, s.pair_dqkv, s.dq_accum, s.softmax_sum, row_at(qkv, ks, W, 2)},
                      s.cudnn_plan);
        float* dq = key_outer ? s.dq_sum + ch.start(i) * C : s.dq_sum;
        float* dkv = key_outer ? s.dkv_sum : s.dkv_sum + ch.start(j) * KV;
        kern::add_rows(dq, C, s.pair_dqkv, W, qn, C, stream);
        // dk | dv: columns [C, W) of the pair's rows
        kern::add_rows(dkv, KV, static_cast<char*>(s.pair_dqkv) + C * 2, W, kn, KV, stream);
      }
      const int64_t os = row0 + ch.start(o), on = ch.length(o);
      if (key_outer)
        kern::cast_rows(row_at(a.dqkv.data, os, W, elem) + C * elem, dqkv_bf16, W, s.dkv_sum, KV,
                        on, KV, stream);
      else
        kern::cast_rows(row_at(a.dqkv.data, os, W, elem), dqkv_bf16, W, s.dq_sum, C, on, C, stream);
    }
    if (key_outer)
      kern::cast_rows(row_at(a.dqkv.data, row0, W, elem), dqkv_bf16, W, s.dq_sum, C, T, C, stream);
    else
      kern::cast_rows(row_at(a.dqkv.data, row0, W, elem) + C * elem, dqkv_bf16, W, s.dkv_sum, KV, T,
                      KV, stream);
  }
}

// ---- documents ----
// Document attention (doc_start given): every document of every batch row is one causal cuDNN
// call of one row, the graphs and calls of the unchunked path, on a scratch of
// L = document_call_rows(n, T) rows (engine/core/cuda_workspace.h): the document's n rows of
// q | k | v, q and k rotated at positions 0 .. n-1 (RoPE restarts in each document), then L - n
// zero rows. The causal mask keeps each of the n real queries on its own document's keys, so
// their outputs and lse are exactly the document's alone; the padded queries' are dropped. In the
// backward the padded rows have q = 0, O = 0, dO = 0 and lse = 0: their P is 1 (finite), D = 0
// and dS = P (dO V^T - D) scale = 0, so they add nothing to any dk, dv and get dq = 0. Documents
// partition each row (a packed row's padding is one-token documents), so every output row is
// written. cuDNN has no arbitrary segment mask; its ragged (THD) layout and padding masks would
// need graphs this backend has never run, while these calls are the shapes the unchunked and
// chunked paths run already (docs/gpu.md).

// The documents of the call's rows, read from the device (a synchronous copy of B T ints).
std::vector<DocumentRun> documents_of(CudaBackend& be, const Tensor& doc_start, const Heads& h) {
  REMAT_ASSERT(doc_start.numel() == h.shape.B * h.shape.T, "attention: doc_start {} for B={} T={}",
               doc_start.shape_str(), h.shape.B, h.shape.T);
  std::vector<int32_t> host(static_cast<size_t>(doc_start.numel()));
  be.download(host.data(), doc_start);
  return document_runs(host.data(), h.shape.B, h.shape.T);
}

// One document's call shape, refused past cuDNN's 32-bit offsets (its q view spans L W elements).
AttentionShape document_shape(const Heads& h, const DocumentRun& d) {
  const int64_t L = document_call_rows(d.length, h.shape.T);
  if (L * h.shape.W() > kCudnnMaxSpan)
    throw BackendError(fmt::format(
        "[attention] a document of {} tokens spans {} x {} elements on CUDA, past cuDNN's 2^31 "
        "(docs/gpu.md). Fix: shorter documents (prepare_data.py), or train on the CPU",
        d.length, L, h.shape.W()));
  return {1, h.shape.NH, L, h.shape.HS, h.shape.KVH, L, true};
}

// The document's rows of `src` (q | k | v in the activations' dtype) into the bf16 scratch, q and
// k rotated from position 0, then zero rows up to the call's.
void stage_document(const Heads& h, const AttentionShape& call, const DocumentRun& d,
                    const Tensor& qkv, void* scratch, cudaStream_t stream) {
  const int64_t W = h.shape.W(), first = d.row * h.shape.T + d.start;
  kern::rope_apply(h.rope_rows(scratch, true, row_at(qkv.data, first, W, is_bf16(qkv) ? 2 : 4),
                               is_bf16(qkv), false, d.length, d.length),
                   stream);
  zero_tail(scratch, d.length, call.T, W * 2, stream);
}

void forward_documents(AttentionEngine& attn, const AttentionForwardArgs& a, const Heads& h,
                       const AttnScratch& s, const std::vector<DocumentRun>& docs,
                       cudaStream_t stream) {
  const int64_t T = h.shape.T, C = h.shape.C(), NH = h.shape.NH;
  const int64_t out_elem = is_bf16(a.out) ? 2 : 4;
  for (const DocumentRun& d : docs) {
    const AttentionShape call = document_shape(h, d);
    stage_document(h, call, d, a.qkv, s.qkv, stream);
    attn.forward(call, {s.qkv, s.pair_out, s.pair_lse}, s.cudnn_plan);
    const int64_t first = d.row * T + d.start;
    kern::cast(row_at(a.out.data, first, C, out_elem), is_bf16(a.out), s.pair_out, true,
               d.length * C, stream);
    // lse: the call's (NH, L) rows into the op's (B, NH, T), head rows T apart
    REMAT_CUDA_CHECK(cudaMemcpy2DAsync(
        a.lse.f32() + d.row * NH * T + d.start, static_cast<size_t>(T) * 4, s.pair_lse,
        static_cast<size_t>(call.T) * 4, static_cast<size_t>(d.length) * 4, static_cast<size_t>(NH),
        cudaMemcpyDeviceToDevice, stream));
  }
}

void backward_documents(AttentionEngine& attn, const AttentionBackwardArgs& a, const Heads& h,
                        const AttnScratch& s, const std::vector<DocumentRun>& docs,
                        cudaStream_t stream) {
  const int64_t T = h.shape.T, C = h.shape.C(), W = h.shape.W(), NH = h.shape.NH;
  const int64_t act_elem = is_bf16(a.out) ? 2 : 4, dqkv_elem = is_bf16(a.dqkv) ? 2 : 4;
  for (const DocumentRun& d : docs) {
    const AttentionShape call = document_shape(h, d);
    const int64_t first = d.row * T + d.start, n = d.length, L = call.T;
    stage_document(h, call, d, a.qkv, s.qkv, stream);
    kern::cast(s.out, true, row_at(a.out.data, first, C, act_elem), is_bf16(a.out), n * C, stream);
    zero_tail(s.out, n, L, C * 2, stream);
    kern::cast(s.dout, true, row_at(a.dout.data, first, C, act_elem), is_bf16(a.dout), n * C,
               stream);
    zero_tail(s.dout, n, L, C * 2, stream);
    REMAT_CUDA_CHECK(cudaMemsetAsync(s.pair_lse, 0, static_cast<size_t>(NH * L) * 4, stream));
    REMAT_CUDA_CHECK(cudaMemcpy2DAsync(s.pair_lse, static_cast<size_t>(L) * 4,
                                       a.lse.f32() + d.row * NH * T + d.start,
                                       static_cast<size_t>(T) * 4, static_cast<size_t>(n) * 4,
                                       static_cast<size_t>(NH), cudaMemcpyDeviceToDevice, stream));
    attn.backward(call, {s.qkv, s.out, s.dout, s.pair_lse, s.pair_dqkv, s.dq_accum, s.softmax_sum},
                  s.cudnn_plan);
    // dq, dk with respect to the rotated q, k: R^T from position 0, into dqkv's own rows
    kern::rope_apply(h.rope_rows(row_at(a.dqkv.data, first, W, dqkv_elem), is_bf16(a.dqkv),
                                 s.pair_dqkv, true, true, n, n),
                     stream);
  }
}

}  // namespace

void CudaBackend::attention_forward_impl(const AttentionForwardArgs& a, const OpWorkspace& ws) {
  const Heads h(a.qkv, a.n_head, a.n_kv_head, a.rope_theta, a.rope_scaling);
  const int64_t n_out = a.out.numel();
  const bool documents = !a.doc_start.empty();
  const AttnScratch s =
      carve(ws, attention_workspace_layout(a.qkv, a.n_head, a.n_kv_head, a.rope_theta > 0, false,
                                           a.chunk_tokens, documents));
  if (documents) {
    forward_documents(*attn_, a, h, s, documents_of(*this, a.doc_start, h), stream());
    finish_op();
    return;
  }
  const void* qkv = staged_qkv(s, a.qkv, h, stream());
  if (const AttentionChunks ch = attention_chunks(a.qkv, a.chunk_tokens); ch.chunked()) {
    forward_chunked(*attn_, a, h, s, ch, qkv, stream());
    finish_op();
    return;
  }
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
  const bool documents = !a.doc_start.empty();
  const AttnScratch s = carve(ws, attention_workspace_layout(a.qkv, a.n_head, a.n_kv_head, rope,
                                                             true, a.chunk_tokens, documents));
  if (documents) {  // qkv is left as it is (the op may clobber it; this path need not)
    backward_documents(*attn_, a, h, s, documents_of(*this, a.doc_start, h), stream());
    finish_op();
    return;
  }
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
  if (const AttentionChunks ch = attention_chunks(a.qkv, a.chunk_tokens); ch.chunked()) {
    backward_chunked(*attn_, a, h, s, ch, qkv, out, dout, stream());
    // dq, dk with respect to the rotated q, k: R^T in place, in the activations' dtype.
    if (rope)
      kern::rope_apply(h.rope(a.dqkv.data, is_bf16(a.dqkv), a.dqkv.data, is_bf16(a.dqkv), true),
                       stream());
    finish_op();
    return;
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
