// The CPU backend's op workspaces (see engine/core/workspace.h): pure functions of an op's
// arguments and the thread count, no device code. GEMMs and the embedding need none (OpenBLAS keeps
// its own small buffers outside the pool); attention needs one tile block per thread (plus, with
// RoPE, a cos/sin table); the LM-head loss needs one chunk of logits and, for a long
// vocabulary, the partial results of its dinp's slabs.
#pragma once

#include <algorithm>

#include "engine/core/ops/attention.h"
#include "engine/core/ops/embedding.h"
#include "engine/core/ops/linear.h"
#include "engine/core/ops/lora.h"
#include "engine/core/ops/loss.h"
#include "engine/core/workspace.h"

namespace remat::cpu {

/// Flash-attention tile sizes (queries x keys), multiples of 16. 64 x 64 measured as fast as
/// 64 x 128, 128 x 64 and 128 x 128 (tests/bench), with the smallest workspace.
constexpr int64_t kAttnTileQ = 64;
constexpr int64_t kAttnTileK = 64;

/// Row stride of a packed (rows, HS) attention tile: HS rounded up to whole 8-float vectors.
constexpr int64_t attention_padded_hs(int64_t HS) {
  return (HS + 7) / 8 * 8;
}

/// Query tiles one forward task runs side by side, so that each key tile is loaded (and rotated,
/// with RoPE) once for all of them. Two keep the forward's tiles within the backward's block.
constexpr int64_t kAttnForwardGroup = 2;

/// Floats of one thread's attention tiles, the larger of the forward's and the backward's (they
/// share the block). Every piece is a multiple of 8 floats, so every tile starts 32-byte aligned;
/// engine/cpu/attention.cpp carves the pieces in this order.
constexpr int64_t attention_forward_tile_floats(int64_t HS) {
  const int64_t HSp = attention_padded_hs(HS), Tq = kAttnTileQ, Tk = kAttnTileK;
  return kAttnForwardGroup * (HSp * Tq + Tq * HSp + 2 * Tq) + Tk * HSp + Tk * Tq + Tq + HSp;
}
constexpr int64_t attention_backward_tile_floats(int64_t HS) {
  const int64_t HSp = attention_padded_hs(HS), Tq = kAttnTileQ, Tk = kAttnTileK;
  return Tq * HSp + 2 * HSp * Tk + Tk * HSp + 2 * Tq * Tk + 2 * Tk * HSp + HSp;
}
static_assert(attention_forward_tile_floats(8) <= attention_backward_tile_floats(8) &&
                  attention_forward_tile_floats(64) <= attention_backward_tile_floats(64) &&
                  attention_forward_tile_floats(256) <= attention_backward_tile_floats(256),
              "the forward's query-tile group fits in the backward's block: no bigger workspace");
constexpr int64_t attention_thread_floats(int64_t HS) {
  return std::max(attention_forward_tile_floats(HS), attention_backward_tile_floats(HS));
}

/// Floats of attention workspace: [RoPE cos | RoPE sin] (one shared (T, HS) table, RoPE only),
/// then the per-thread tile blocks (independent of T; ~33 K floats per thread at HS = 64).
/// Forward and backward use the same size.
constexpr int64_t attention_workspace_floats(int64_t T, int64_t HS, int threads, bool use_rope) {
  return (use_rope ? T * HS : 0) + static_cast<int64_t>(threads) * attention_thread_floats(HS);
}

/// The chunks the CPU runs attention in: remat.attention_chunk as given; automatic (0) never
/// chunks (the CPU kernel has no size limit).
inline AttentionChunks attention_chunks(const Tensor& qkv, int64_t chunk_tokens) {
  return {qkv.dim(1), chunk_tokens};
}

/// Chunked attention (engine/cpu/attention_chunks.cpp) runs each (query chunk, key chunk) pair on
/// the ring's kernels, so its workspace is theirs instead of the flash tiles: q and kv in f32
/// (rotated; (B, T, C + 2K), C = NH HS, K = KVH HS), and for one pair its output and softmax
/// statistics ((L, C) + 2 (NH, L)); the backward adds dq and dkv in f32 ((B, T, C + 2K)), and
/// reuses the pair part for one query chunk's lse and D (2 (NH, L)), plus D for every row
/// (B, NH, T) when the caller passes none.
inline WorkspaceList attention_chunk_workspace(const Tensor& qkv, int n_head, int n_kv_head,
                                               const AttentionChunks& ch, bool backward,
                                               bool needs_delta) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), W = qkv.dim(2);
  const int64_t HS = W / (n_head + 2 * kv_heads(n_head, n_kv_head)), C = n_head * HS;
  WorkspaceList w{{"attn.chunk_qkv", DType::F32, {B * T * W}}};
  if (!backward) {
    w.push_back({"attn.chunk_pair", DType::F32, {ch.L * C + 2 * n_head * ch.L}});
    return w;
  }
  w.push_back({"attn.chunk_grads", DType::F32, {B * T * W}});
  w.push_back(
      {"attn.chunk_pair", DType::F32, {2 * n_head * ch.L + (needs_delta ? B * n_head * T : 0)}});
  return w;
}

inline WorkspaceList attention_workspace(const Tensor& qkv, int n_head, int n_kv_head,
                                         float rope_theta, int threads) {
  const int64_t T = qkv.dim(1), HS = qkv.dim(2) / (n_head + 2 * kv_heads(n_head, n_kv_head));
  return {
      {"attn.workspace", DType::F32, {attention_workspace_floats(T, HS, threads, rope_theta > 0)}}};
}

// ---- the rules, one per op that has a workspace on any backend ----
/// A frozen weight stored below f32 (lora.base = "bf16", "nf4") is decoded into an f32 copy for the
/// op's GEMMs ("gemm.weight_f32", (OC, C)), which the planner counts as every workspace: OpenBLAS
/// and oneDNN here multiply f32 alone. An f32 weight is read as it is.
inline WorkspaceList weight_copy(const Tensor& weight) {
  if (!is_packed_weight(weight.dtype)) return {};
  return {{"gemm.weight_f32", DType::F32, {weight.dim(0), weight.numel() / weight.dim(0)}}};
}
/// A linear's LoRA adapters (engine/cpu/lora.cpp), R = the sum of their ranks: h = s drop(x) A^T
/// (N, R), in the backward also dh (N, R); with more than one adapter their A's side by side
/// (R, C) where one GEMM reads them all, and dA's (R, C) before it is added to each adapter's;
/// with dropout the dropped input (N, C), which the backward reuses for dh A before its mask.
inline WorkspaceList lora_workspace(const LinearLora& l, const Tensor& inp, bool backward) {
  if (l.empty()) return {};
  const int64_t N = inp.rows(), C = inp.dim(-1), R = l.total_rank();
  const bool drop = l.any_dropout(), stacked = l.count > 1 && !drop;
  WorkspaceList w{{"lora.h", DType::F32, {N, R}}};
  if (backward) w.push_back({"lora.dh", DType::F32, {N, R}});
  if (stacked) w.push_back({"lora.a_stack", DType::F32, {R, C}});
  if (stacked && backward) w.push_back({"lora.da_stack", DType::F32, {R, C}});
  if (drop) w.push_back({"lora.dropped", DType::F32, {N, C}});
  return w;
}
inline WorkspaceList workspace(const LinearForwardArgs& a, const WorkspaceTarget&) {
  WorkspaceList w = weight_copy(a.weight);
  for (const WorkspacePart& p : lora_workspace(a.lora, a.inp, false)) w.push_back(p);
  return w;
}
inline WorkspaceList workspace(const LinearBackwardArgs& a, const WorkspaceTarget&) {
  // Only dinp = dout W reads W.
  WorkspaceList w = a.dinp.empty() ? WorkspaceList{} : weight_copy(a.weight);
  for (const WorkspacePart& p : lora_workspace(a.lora, a.inp, true)) w.push_back(p);
  return w;
}
inline WorkspaceList workspace(const AttentionForwardArgs& a, const WorkspaceTarget& t) {
  if (const AttentionChunks ch = attention_chunks(a.qkv, a.chunk_tokens); ch.chunked())
    return attention_chunk_workspace(a.qkv, a.n_head, a.n_kv_head, ch, false, false);
  return attention_workspace(a.qkv, a.n_head, a.n_kv_head, a.rope_theta, t.threads);
}
inline WorkspaceList workspace(const AttentionBackwardArgs& a, const WorkspaceTarget& t) {
  if (const AttentionChunks ch = attention_chunks(a.qkv, a.chunk_tokens); ch.chunked())
    return attention_chunk_workspace(a.qkv, a.n_head, a.n_kv_head, ch, true, a.delta.empty());
  return attention_workspace(a.qkv, a.n_head, a.n_kv_head, a.rope_theta, t.threads);
}
inline WorkspaceList workspace(const EmbeddingBackwardArgs&, const WorkspaceTarget&) {
  return {};
}
/// The LM head's dinp = dlogits W (K = the vocabulary) runs as vocabulary slabs in parallel, each
/// operand packed once (sgemm_k_slabs in engine/cpu/gemm.h), when the vocabulary is long enough:
/// the slabs but the first need a partial result each, a chunk of rows by the model's width. On
/// the Intel VM (2026-12-02) 8 slabs made GPT-2 124M's whole LM head op 5-10% faster than 8 column
/// tiles called alone (remat_bench_lm_head, 5 of 5 alternated pairs) and 0-8% inside its training
/// step (bench, 3 of 4 pairs), for 3.9 MiB more workspace (7 x 192 x 768 floats).
inline constexpr int64_t kLmHeadSlabs = 8, kLmHeadSlabMinVocab = 8192;
inline int64_t lm_head_dinp_slabs(int64_t vocab) {
  return vocab >= kLmHeadSlabMinVocab ? kLmHeadSlabs : 1;
}
/// A frozen LoRA base's bf16 head is decoded whole, once per call, as a linear's weight is.
inline WorkspaceList workspace(const LmHeadLossArgs& a, const WorkspaceTarget&) {
  WorkspaceList w = weight_copy(a.weight);
  const WorkspacePart logits = logits_chunk_part(a);
  w.push_back(logits);
  const int64_t slabs = lm_head_dinp_slabs(a.weight.dim(0));
  if (slabs == 1) return w;
  const int64_t rows = logits.shape[0], C = a.inp.dim(-1);
  w.push_back({"lm_head.dinp_slabs", DType::F32, {slabs - 1, rows, C}});
  return w;
}

}  // namespace remat::cpu
