// The CPU backend's op workspaces (see engine/workspace.h): pure functions of an op's arguments
// and the thread count, no device code. GEMMs and the embedding need none (OpenBLAS keeps its
// own small buffers outside the pool); attention needs one tile block per thread (plus, with
// RoPE, a cos/sin table); the LM-head loss needs one chunk of logits.
#pragma once

#include <algorithm>

#include "engine/ops/attention.h"
#include "engine/ops/embedding.h"
#include "engine/ops/linear.h"
#include "engine/ops/loss.h"
#include "engine/workspace.h"

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

inline WorkspaceList attention_workspace(const Tensor& qkv, int n_head, float rope_theta,
                                         int threads) {
  const int64_t T = qkv.dim(1), HS = qkv.dim(2) / 3 / n_head;
  return {
      {"attn.workspace", DType::F32, {attention_workspace_floats(T, HS, threads, rope_theta > 0)}}};
}

// ---- the rules, one per op that has a workspace on any backend ----
inline WorkspaceList workspace(const LinearForwardArgs&, const WorkspaceTarget&) {
  return {};
}
inline WorkspaceList workspace(const LinearBackwardArgs&, const WorkspaceTarget&) {
  return {};
}
inline WorkspaceList workspace(const AttentionForwardArgs& a, const WorkspaceTarget& t) {
  return attention_workspace(a.qkv, a.n_head, a.rope_theta, t.threads);
}
inline WorkspaceList workspace(const AttentionBackwardArgs& a, const WorkspaceTarget& t) {
  return attention_workspace(a.qkv, a.n_head, a.rope_theta, t.threads);
}
inline WorkspaceList workspace(const EmbeddingBackwardArgs&, const WorkspaceTarget&) {
  return {};
}
inline WorkspaceList workspace(const LmHeadLossArgs& a, const WorkspaceTarget&) {
  return {logits_chunk_part(a)};
}

}  // namespace remat::cpu
