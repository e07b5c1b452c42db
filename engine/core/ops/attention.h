// Causal multi-head self-attention with the flash contract: arguments, shape checks, FLOPs and
// bytes. Kernels: engine/cpu/attention.cpp, engine/cuda/attention.cpp (cuDNN, through
// cudnn_attention.cpp); workspaces: engine/{cpu,cuda}/workspace.h; tests:
// tests/ops/test_attention.cpp.
//
// Documents (data.attention = "document", issue 61): a row may hold several documents, given as
// data, doc_start: for each token the row position of its document's first token. A query at t
// sees the keys [doc_start[t], t] (a block-diagonal causal mask) and RoPE rotates at
// t - doc_start[t]. Per-token starts rather than per-row segment lists keep the arguments one
// fixed-shape tensor, which a dry run allocates like any other, which context-parallel ranks
// slice like the tokens (the ring passes the query side's starts with each block), and from
// which a backend that wants segments (cuDNN's ragged layout) reads them off: a document starts
// where doc_start[t] == t. The CUDA backend reads them so: one cuDNN call per document
// (engine/cuda/attention.cpp).
//
// Attention over chunks (remat.attention_chunk; issue 49): cuDNN's fused attention takes tensors
// that it addresses with 32-bit offsets, so past a length some tensor of one call passes 2^31
// elements (Llama-3.1-8B's qkv view at 349,525 tokens). The causal attention of a sequence then
// runs as (query chunk i, key chunk j <= i) pairs of L tokens (the last chunk shorter when L does
// not divide T): the diagonal pair i == i is ordinary causal attention of the chunk (a square,
// top-left causal mask), every other pair is unmasked (all its keys precede all its queries).
// Forward: each pair gives O_ij and lse_ij, merged per query chunk in f32 over j ascending, the
// context ring's online merge (m = max, lse = m + log(exp(lse - m) + exp(lse_ij - m)),
// O = exp(lse_old - lse) O + exp(lse_ij - lse) O_ij), which is O = sum_j exp(lse_ij - lse) O_ij.
// Backward: each pair recomputes its probabilities from the global lse and D = rowsum(dO * O)
// (the flash backward restricted to the pair), dQ_i summed over key chunks j and dK_j, dV_j over
// query chunks i, in f32. Why pairs and not query chunks against every earlier key (one call per
// query chunk, bottom-right causal alignment, no forward merge): with query chunks alone K and V
// stay whole and pass the limit themselves at about 4x the length (GQA) -- short of 8B's 1.2M --
// and a bottom-right diagonal is a graph pattern our raw cuDNN graphs (no cudnn-frontend) would
// have to spell out and cuDNN's fused engines to recognize, which cannot be checked without a
// GPU; pairs need only the two patterns already in use (causal square, and no mask). Every call
// of a pair touches at most L rows of each tensor, whatever T is.
#pragma once

#include <algorithm>

#include "engine/core/error.h"
#include "engine/core/ops/op.h"
#include "engine/core/ops/rope.h"
#include "engine/core/tensor.h"

namespace remat {

/// Causal multi-head self-attention with the flash contract: the forward saves only its output
/// and the per-row log-sum-exp, never a T x T matrix. With rope_theta > 0, rotary position
/// embedding is applied to q and k inside the op (qkv is saved unrotated), with the frequencies
/// of engine/core/ops/rope.h.
/// Grouped-query attention: NH query heads share KVH key/value heads (NH a multiple of KVH), key
/// and value head j serving query heads j*g .. j*g+g-1 (g = NH / KVH), as transformers' repeat_kv
/// lays them out; n_kv_head = 0 means KVH = NH (multi-head). The head size HS is out's width over
/// NH (not necessarily C / NH: Qwen3 sets it apart), and qkv's width is (NH + 2 KVH) HS.
struct AttentionForwardArgs {
  Tensor out;  // (B, T, NH HS) act
  Tensor lse;  // (B, NH, T) f32: log-sum-exp of each row of scaled scores
  Tensor qkv;  // (B, T, (NH + 2 KVH) HS) act: q | k | v, heads contiguous inside each
  int n_head = 1;
  float rope_theta = 0;  // 0: no rotary embedding
  int n_kv_head = 0;     // 0: n_head
  RopeScaling rope_scaling{};
  int64_t chunk_tokens = 0;  // remat.attention_chunk: tokens per chunk; 0: where a backend needs
  // Documents (data.attention = "document"): per token, the position in its row of the first
  // token of its document. A query attends to the keys from there to itself, and RoPE rotates q
  // and k at t - doc_start (positions restart at 0 in every document). Non-decreasing along a
  // row. Empty: one document per row (causal attention at positions t).
  Tensor doc_start{};  // (B, T) i32
  // The FLOP count only (no kernel reads it): with documents, their mean length, so that the
  // count is T (L + 1) / 2 pairs a row and head instead of the causal T (T + 1) / 2 (the data's
  // documents are not known before a step, and not at all in a dry run); 0: the causal bound.
  double mean_doc_tokens = 0;
};

/// KVH of an attention op's arguments (n_kv_head = 0 means one per query head).
inline int kv_heads(int n_head, int n_kv_head) {
  return n_kv_head > 0 ? n_kv_head : n_head;
}

struct AttentionBackwardArgs {
  Tensor dqkv;  // (B, T, (NH + 2 KVH) HS) act [=]
  Tensor dout;  // (B, T, NH HS) act
  // qkv: (B, T, (NH + 2 KVH) HS) act; CLOBBERED: the backward is its last reader (CUDA, bf16
  // with RoPE, rotates q and k in place instead of staging a rotated copy of them)
  Tensor qkv;
  Tensor out;  // (B, T, NH HS) act; may be empty when `delta` is given (backends that read D)
  Tensor lse;  // (B, NH, T) f32
  int n_head = 1;
  float rope_theta = 0;
  Tensor delta{};  // (B, NH, T) f32 from attention_delta, or empty: then D comes from out and dout
  int n_kv_head = 0;  // 0: n_head
  RopeScaling rope_scaling{};
  int64_t chunk_tokens = 0;    // as in AttentionForwardArgs
  Tensor doc_start{};          // (B, T) i32, as in AttentionForwardArgs
  double mean_doc_tokens = 0;  // as in AttentionForwardArgs
};

/// The chunks of chunked attention: [i L, min((i + 1) L, T)) for i < count(); L = 0 or L >= T is
/// one chunk (unchunked).
struct AttentionChunks {
  int64_t T = 0, L = 0;
  bool chunked() const { return L > 0 && L < T; }
  int64_t count() const { return chunked() ? (T + L - 1) / L : 1; }
  int64_t start(int64_t i) const { return chunked() ? i * L : 0; }
  int64_t length(int64_t i) const { return chunked() ? std::min(L, T - i * L) : T; }
};

/// D = rowsum(dO * O) per row and head: the one term of attention's backward that reads the
/// forward output O. Computed ahead of attention_backward (which then takes `delta` and no `out`)
/// on backends whose backward accepts it (Backend::attention_backward_needs_out() false), so that
/// O is freed before the backward, the block's peak.
struct AttentionDeltaArgs {
  Tensor delta;  // (B, NH, T) f32 [=]
  Tensor dout;   // (B, T, C) act
  Tensor out;    // (B, T, C) act
  int n_head = 1;
};

/// Document starts (AttentionForwardArgs::doc_start) are empty or one i32 per token of (B, T).
inline void check_doc_start(const Tensor& doc_start, int64_t B, int64_t T, const char* op) {
  REMAT_ASSERT(doc_start.empty() || (doc_start.dtype == DType::I32 && doc_start.numel() == B * T),
               "{}: doc_start {} for (B, T) = ({}, {})", op, doc_start.shape_str(), B, T);
}

// Causal attention does 2*HS FLOPs per (query, key) pair for each of its GEMM-like products:
// S = QK^T and O = PV forward (2 products); S again, dV, dP, dQ, dK backward (5 products).
inline double causal_pairs(const Tensor& qkv, int n_head) {
  const double B = static_cast<double>(qkv.dim(0)), T = static_cast<double>(qkv.dim(1));
  return B * n_head * T * (T + 1) / 2;
}

inline void check(const AttentionForwardArgs& a) {
  REMAT_ASSERT(a.qkv.ndim() == 3 && a.out.ndim() == 3, "attention_forward: qkv {} out {}",
               a.qkv.shape_str(), a.out.shape_str());
  const int64_t B = a.qkv.dim(0), T = a.qkv.dim(1), C = a.out.dim(2);
  const int KVH = kv_heads(a.n_head, a.n_kv_head);
  REMAT_ASSERT(a.n_head > 0 && C % a.n_head == 0 && a.n_head % KVH == 0,
               "attention_forward: {} query heads, {} key/value heads, out width {}", a.n_head, KVH,
               C);
  REMAT_ASSERT(
      a.qkv.dim(2) == C / a.n_head * (a.n_head + 2 * KVH) && a.out.dim(0) == B && a.out.dim(1) == T,
      "attention_forward: qkv {} vs out {} ({} query, {} key/value heads)", a.qkv.shape_str(),
      a.out.shape_str(), a.n_head, KVH);
  REMAT_ASSERT(a.lse.numel() == B * a.n_head * T, "attention_forward: lse {}", a.lse.shape_str());
  check_doc_start(a.doc_start, B, T, "attention_forward");
}
/// The pairs an attention call computes: the causal triangle, or with documents of
/// `mean_doc_tokens` on average (AttentionForwardArgs) T (L + 1) / 2 a row and head.
inline double attention_pairs(const Tensor& qkv, int n_head, const Tensor& doc_start,
                              double mean_doc_tokens) {
  const double T = static_cast<double>(qkv.dim(1));
  if (doc_start.empty() || mean_doc_tokens <= 0 || mean_doc_tokens >= T)
    return causal_pairs(qkv, n_head);
  return static_cast<double>(qkv.dim(0)) * n_head * T * (mean_doc_tokens + 1) / 2;
}

inline OpCost cost(const AttentionForwardArgs& a) {
  const double HS = static_cast<double>(a.out.dim(2) / a.n_head);
  return {2 * 2 * HS * attention_pairs(a.qkv, a.n_head, a.doc_start, a.mean_doc_tokens),
          act_bytes(a.qkv) + act_bytes(a.out) + act_bytes(a.lse)};
}

inline void check(const AttentionBackwardArgs& a) {
  const int KVH = kv_heads(a.n_head, a.n_kv_head);
  REMAT_ASSERT(
      a.n_head > 0 && a.n_head % KVH == 0 && a.dout.ndim() == 3 && a.dout.dim(2) % a.n_head == 0,
      "attention_backward: {} query heads, {} key/value heads, dout {}", a.n_head, KVH,
      a.dout.shape_str());
  REMAT_ASSERT(a.dqkv.numel() == a.qkv.numel() &&
                   a.dout.numel() / a.n_head * (a.n_head + 2 * KVH) == a.qkv.numel() &&
                   (a.out.empty() ? !a.delta.empty() : a.dout.numel() == a.out.numel()),
               "attention_backward: dqkv {} qkv {} dout {} out {}", a.dqkv.shape_str(),
               a.qkv.shape_str(), a.dout.shape_str(), a.out.shape_str());
  REMAT_ASSERT(a.delta.empty() || (a.delta.dtype == DType::F32 && a.delta.numel() == a.lse.numel()),
               "attention_backward: delta {} vs lse {}", a.delta.shape_str(), a.lse.shape_str());
  check_doc_start(a.doc_start, a.dout.dim(0), a.dout.dim(1), "attention_backward");
}
inline OpCost cost(const AttentionBackwardArgs& a) {
  const double HS = static_cast<double>(a.dout.dim(2) / a.n_head);
  return {5 * 2 * HS * attention_pairs(a.qkv, a.n_head, a.doc_start, a.mean_doc_tokens),
          2 * act_bytes(a.qkv) + act_bytes(a.dout) + act_bytes(a.out) + act_bytes(a.delta) +
              act_bytes(a.dqkv) + act_bytes(a.lse)};
}

inline void check(const AttentionDeltaArgs& a) {
  REMAT_ASSERT(a.dout.ndim() == 3 && a.out.numel() == a.dout.numel() && a.n_head > 0 &&
                   a.dout.dim(2) % a.n_head == 0 && a.delta.dtype == DType::F32 &&
                   a.delta.numel() == a.dout.dim(0) * a.dout.dim(1) * a.n_head,
               "attention_delta: delta {} dout {} out {} heads {}", a.delta.shape_str(),
               a.dout.shape_str(), a.out.shape_str(), a.n_head);
}
inline OpCost cost(const AttentionDeltaArgs& a) {
  return {2 * static_cast<double>(a.dout.numel()),
          act_bytes(a.dout) + act_bytes(a.out) + act_bytes(a.delta)};
}

}  // namespace remat
