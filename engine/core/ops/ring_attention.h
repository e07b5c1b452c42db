// Ring attention's local pieces (context parallel, engine/parallel/context_ring.h): the causal
// attention of one rank's queries against one rank's keys and values, where each side holds
// tokens at known global positions (two chunks per rank in the load-balanced layout), with the
// same online-softmax / log-sum-exp contract as attention_forward. The ring orchestration calls
// them once per ring step; the kernels never communicate. Kernels: engine/cpu/ring_attention.cpp
// and engine/cuda/ring_attention.cu; tests: tests/ops/test_ring_attention.cpp.
//
// What travels and what accumulates is f32 on every backend (q, kv, the running softmax, dq, dkv);
// the tensors the rest of the block sees (qkv, the output, dout, dqkv) are activations, bf16 on a
// CUDA backend that stores them so.
//
// Grouped-query attention (engine/core/ops/attention.h): NH query heads of HS, KVH key/value heads
// (n_kv_head = 0: KVH = NH), query head h reading key/value head h / (NH / KVH). C = NH HS is q's
// width and out's, K = KVH HS the keys' and the values': kv is (B, T, 2K), so what travels around
// the ring per token is 2 KVH HS floats, NH / KVH times less than multi-head attention's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/ops/attention.h"
#include "engine/core/ops/op.h"
#include "engine/core/ops/rope.h"
#include "engine/core/tensor.h"
#include "engine/core/token_positions.h"

namespace remat {

/// (query, key) pairs with key position <= query position: what causal attention computes.
inline double causal_pairs(const TokenPositions& q, const TokenPositions& k) {
  // A query at p sees the keys [ks, min(ke, p + 1)) of a key range [ks, ke): none before ks,
  // p - ks + 1 while p < ke, all of them after.
  double n = 0;
  for (const auto& [qs, ql] : q.ranges)
    for (const auto& [ks, kl] : k.ranges) {
      const int64_t qe = qs + ql, ke = ks + kl;
      const int64_t a = std::max(qs, ks), b = std::min(qe, ke);
      if (b > a) {
        const double m = static_cast<double>(b - a);
        n += m * static_cast<double>(a - ks + 1) + m * (m - 1) / 2;
      }
      if (qe > std::max(qs, ke))
        n += static_cast<double>(qe - std::max(qs, ke)) * static_cast<double>(kl);
    }
  return n;
}

/// qkv (B, T, C + 2K) -> q (B, T, C) and kv (B, T, 2K) = k | v, q and k rotated (RoPE, with
/// its scaling: engine/core/ops/rope.h) at their global positions when rope_theta > 0: what travels
/// around the ring is kv.
struct RingSplitArgs {
  Tensor q;    // (B, T, C) f32 [=]
  Tensor kv;   // (B, T, 2K) f32 [=]
  Tensor qkv;  // (B, T, C + 2K) act
  int n_head = 1;
  float rope_theta = 0;
  TokenPositions pos;
  int n_kv_head = 0;  // 0: n_head
  RopeScaling rope_scaling{};
  // Documents (AttentionForwardArgs::doc_start, in global positions): RoPE rotates the token at
  // global position p by p - doc_start. Empty: at p.
  Tensor doc_start{};  // (B, T) i32
};

/// The gradient back through RingSplitArgs: dqkv = the inverse rotation of dq and dk, and dv.
struct RingMergeGradArgs {
  Tensor dqkv;  // (B, T, C + 2K) act [=]
  Tensor dq;    // (B, T, C) f32
  Tensor dkv;   // (B, T, 2K) f32
  int n_head = 1;
  float rope_theta = 0;
  TokenPositions pos;
  int n_kv_head = 0;  // 0: n_head
  RopeScaling rope_scaling{};
  Tensor doc_start{};  // (B, T) i32, as in RingSplitArgs
};

/// One ring step forward: queries q (at q_pos) against keys and values kv (at k_pos), folded into
/// the running online softmax of each query row and head: row_max m, row_sum l and the
/// unnormalized output acc = sum over keys of exp(s - m) v.
struct RingBlockForwardArgs {
  Tensor acc;      // (B, Tq, C) f32 [+=, rescaled]
  Tensor row_max;  // (B, NH, Tq) f32, -inf before the first step
  Tensor row_sum;  // (B, NH, Tq) f32, 0 before the first step
  Tensor q;        // (B, Tq, C) f32 (rotated)
  Tensor kv;       // (B, Tk, 2K) f32 (k rotated | v)
  int n_head = 1;
  TokenPositions q_pos, k_pos;
  int n_kv_head = 0;  // 0: n_head
  // Documents: each query's document start (a global position); keys before it are masked as
  // keys after the query are. Empty: causal only.
  Tensor q_doc_start{};  // (B, Tq) i32
};

/// After the last ring step: out = acc / l, lse = m + log(l).
struct RingFinishArgs {
  Tensor out;      // (B, Tq, C) act [=] (may be acc itself when f32)
  Tensor acc;      // (B, Tq, C) f32, the running sum of RingBlockForwardArgs
  Tensor lse;      // (B, NH, Tq) f32 [=] (may be row_max itself)
  Tensor row_max;  // (B, NH, Tq) f32
  Tensor row_sum;  // (B, NH, Tq) f32
  int n_head = 1;
};

/// One ring step backward, with the flash backward's recomputation from lse and
/// D = rowsum(dO * O) (attention_delta): dq and dkv = dk | dv accumulate (dk and dv of a
/// key/value head summed over its query heads).
struct RingBlockBackwardArgs {
  Tensor dq;     // (B, Tq, C) f32 [+=]
  Tensor dkv;    // (B, Tk, 2K) f32 [+=]
  Tensor q;      // (B, Tq, C) f32 (rotated)
  Tensor kv;     // (B, Tk, 2K) f32
  Tensor dout;   // (B, Tq, C) act
  Tensor lse;    // (B, NH, Tq) f32
  Tensor delta;  // (B, NH, Tq) f32
  int n_head = 1;
  TokenPositions q_pos, k_pos;
  int n_kv_head = 0;  // 0: n_head
  // Documents: each query's document start (a global position); keys before it are masked as
  // keys after the query are. Empty: causal only.
  Tensor q_doc_start{};  // (B, Tq) i32
};

/// Whether NH query heads over `n_kv_head` key/value heads fit q of width C and kv of width
/// `kv_width` = 2 KVH HS (HS = C / NH).
inline bool ring_heads_fit(int64_t C, int64_t kv_width, int n_head, int n_kv_head) {
  const int KVH = kv_heads(n_head, n_kv_head);
  return n_head > 0 && C % n_head == 0 && n_head % KVH == 0 && kv_width == 2 * KVH * (C / n_head);
}

inline void check(const RingSplitArgs& a) {
  const int64_t C = a.q.dim(-1), K2 = a.kv.dim(-1);
  REMAT_ASSERT(a.qkv.ndim() == 3 && a.qkv.dim(2) == C + K2 && a.q.rows() == a.qkv.rows() &&
                   a.kv.rows() == a.qkv.rows() && a.pos.tokens() == a.qkv.dim(1) &&
                   ring_heads_fit(C, K2, a.n_head, a.n_kv_head),
               "ring_split: q {} kv {} qkv {} positions {} ({} query, {} key/value heads)",
               a.q.shape_str(), a.kv.shape_str(), a.qkv.shape_str(), a.pos.tokens(), a.n_head,
               kv_heads(a.n_head, a.n_kv_head));
  check_doc_start(a.doc_start, a.qkv.dim(0), a.qkv.dim(1), "ring_split");
}
inline OpCost cost(const RingSplitArgs& a) {
  return {6 * static_cast<double>(a.q.numel()),
          act_bytes(a.qkv) + act_bytes(a.q) + act_bytes(a.kv)};
}

inline void check(const RingMergeGradArgs& a) {
  const int64_t C = a.dq.dim(-1), K2 = a.dkv.dim(-1);
  REMAT_ASSERT(a.dqkv.ndim() == 3 && a.dqkv.dim(2) == C + K2 && a.dq.rows() == a.dqkv.rows() &&
                   a.dkv.rows() == a.dqkv.rows() && a.pos.tokens() == a.dqkv.dim(1) &&
                   ring_heads_fit(C, K2, a.n_head, a.n_kv_head),
               "ring_merge_grad: dq {} dkv {} dqkv {}", a.dq.shape_str(), a.dkv.shape_str(),
               a.dqkv.shape_str());
  check_doc_start(a.doc_start, a.dqkv.dim(0), a.dqkv.dim(1), "ring_merge_grad");
}
inline OpCost cost(const RingMergeGradArgs& a) {
  return {6 * static_cast<double>(a.dq.numel()),
          act_bytes(a.dqkv) + act_bytes(a.dq) + act_bytes(a.dkv)};
}

inline void check(const RingBlockForwardArgs& a) {
  const int64_t B = a.q.dim(0), Tq = a.q.dim(1), C = a.q.dim(2);
  REMAT_ASSERT(a.kv.ndim() == 3 && a.kv.dim(0) == B &&
                   ring_heads_fit(C, a.kv.dim(2), a.n_head, a.n_kv_head) &&
                   a.acc.numel() == a.q.numel() && a.row_max.numel() == B * a.n_head * Tq &&
                   a.row_sum.numel() == a.row_max.numel() && a.q_pos.tokens() == Tq &&
                   a.k_pos.tokens() == a.kv.dim(1),
               "ring_block_forward: q {} kv {} acc {} row_max {}", a.q.shape_str(),
               a.kv.shape_str(), a.acc.shape_str(), a.row_max.shape_str());
  check_doc_start(a.q_doc_start, B, Tq, "ring_block_forward");
}
inline OpCost cost(const RingBlockForwardArgs& a) {
  const double HS = static_cast<double>(a.q.dim(2) / a.n_head);
  const double pairs = static_cast<double>(a.q.dim(0)) * a.n_head * causal_pairs(a.q_pos, a.k_pos);
  return {2 * 2 * HS * pairs, act_bytes(a.q) + act_bytes(a.kv) + 2 * act_bytes(a.acc)};
}

inline void check(const RingFinishArgs& a) {
  REMAT_ASSERT(a.out.ndim() == 3 && a.acc.numel() == a.out.numel() && a.acc.dtype == DType::F32 &&
                   a.lse.numel() == a.out.dim(0) * a.n_head * a.out.dim(1) &&
                   a.row_max.numel() == a.lse.numel() && a.row_sum.numel() == a.lse.numel(),
               "ring_finish: out {} lse {}", a.out.shape_str(), a.lse.shape_str());
}
inline OpCost cost(const RingFinishArgs& a) {
  return {static_cast<double>(a.out.numel()),
          act_bytes(a.acc) + act_bytes(a.out) + 3 * act_bytes(a.lse)};
}

inline void check(const RingBlockBackwardArgs& a) {
  const int64_t B = a.q.dim(0), Tq = a.q.dim(1), C = a.q.dim(2);
  REMAT_ASSERT(a.dq.numel() == a.q.numel() && a.dkv.numel() == a.kv.numel() &&
                   a.dout.numel() == a.q.numel() &&
                   ring_heads_fit(C, a.kv.dim(2), a.n_head, a.n_kv_head) &&
                   a.lse.numel() == B * a.n_head * Tq && a.delta.numel() == a.lse.numel() &&
                   a.q_pos.tokens() == Tq && a.k_pos.tokens() == a.kv.dim(1),
               "ring_block_backward: q {} kv {} dq {} dkv {}", a.q.shape_str(), a.kv.shape_str(),
               a.dq.shape_str(), a.dkv.shape_str());
  check_doc_start(a.q_doc_start, B, Tq, "ring_block_backward");
}
inline OpCost cost(const RingBlockBackwardArgs& a) {
  const double HS = static_cast<double>(a.q.dim(2) / a.n_head);
  const double pairs = static_cast<double>(a.q.dim(0)) * a.n_head * causal_pairs(a.q_pos, a.k_pos);
  return {5 * 2 * HS * pairs, 2 * act_bytes(a.q) + 2 * act_bytes(a.kv) + act_bytes(a.dout) +
                                  act_bytes(a.dkv) + act_bytes(a.dq)};
}

}  // namespace remat
