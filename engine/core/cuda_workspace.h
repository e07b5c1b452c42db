// The CUDA backend's op workspaces (see engine/core/workspace.h): pure functions of an op's
// arguments, no device code, so the planner evaluates them on any machine (the count backend
// allocates these lists when it stands in for a GPU). Activation tensors carry the activation
// dtype, so bf16-vs-f32 decisions read the arguments' dtypes.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "engine/core/ops/attention.h"
#include "engine/core/ops/embedding.h"
#include "engine/core/ops/linear.h"
#include "engine/core/ops/lora.h"
#include "engine/core/ops/loss.h"
#include "engine/core/workspace.h"

namespace remat::cuda {

/// cuBLASLt workspace, held around every GEMM-based op (32 MiB: the size cuBLAS documents for
/// Hopper; "gemm.workspace").
constexpr uint64_t kGemmWorkspaceBytes = uint64_t{32} << 20;

/// cuDNN's plan workspace for the attention graphs: the base of the reserve below. What a plan
/// needs is known only once it is built on a GPU (the planner has none); for the GPT-2 shapes the
/// H200 run measured it in bytes, not MiB (the dQ accumulator and sum(dO * O) are our own tensors
/// below, not part of it). 32 MiB (the cuBLASLt workspace's size) is orders of magnitude of
/// headroom for those at a negligible cost next to a GPU's memory.
constexpr uint64_t kCudnnPlanWorkspaceBytes = uint64_t{32} << 20;

/// The reserve for cuDNN's plan workspace of one attention call of B rows, NH query and KVH
/// key/value heads of HS, over Tk keys, sized from the shapes (nothing measured yet for
/// grouped-query heads). The grouped-query backward forms each query head's dK and dV before
/// their sum over its group (the graph's per-head bf16 (B, NH, Tk, HS) products, which
/// cudnn-frontend declares virtual): an engine that keeps them in its workspace needs 2 B NH Tk HS
/// bf16 there, 64 MiB for Llama-3.1-8B at 4k keys (32 MiB each, the whole of the former fixed
/// reserve) and 1 GiB at 64k, so the reserve adds exactly that to the base. The CUDA backend
/// reserves this much, the count backend counts it, and AttentionEngine accepts only engine
/// configs whose plan needs at most this much for the call's shape (engine/cuda/
/// cudnn_attention.cpp skips the others and names them if none is left): planned and measured
/// peaks agree to the byte whatever the plan needs. The gpu rows [cudnn_workspace] print what
/// cuDNN asks for at Llama's shapes (4k, 64k, a rectangular chunk pair) and check it against
/// this; a device run's figures are what this should follow.
constexpr uint64_t cudnn_plan_reserve_bytes(int64_t B, int64_t NH, int64_t KVH, int64_t Tk,
                                            int64_t HS, bool backward) {
  const bool grouped = KVH > 0 && KVH < NH;
  const uint64_t partials =
      backward && grouped ? 2 * static_cast<uint64_t>(B * NH * Tk * HS) * 2 : 0;
  return kCudnnPlanWorkspaceBytes + partials;
}

/// The most elements one tensor of a cuDNN attention call may span from its pointer: cuDNN's fused
/// attention addresses its tensors with 32-bit offsets (PyTorch and Paddle refuse cuDNN calls on
/// tensors past 2^31 - 1 elements for the same reason). Our q, k and v are strided views of the
/// (B, T, W) qkv buffer, so a view of T rows reaches T W elements from its pointer, not T NH HS:
/// the bound is taken on that span (Llama-3.1-8B, W = 6144: 349,525 tokens), the safe reading
/// whichever of elements or offsets the kernels count. Every other tensor of a call (out, dq's
/// accumulator: C < W per row; lse: NH per row) spans less.
constexpr int64_t kCudnnMaxSpan = (int64_t{1} << 31) - 1;

/// Automatic chunks are at most this long: a pair's scratch grows with its length (in the
/// backward (L, C) f32 twice and (L, W) bf16: 2.4 GiB for Llama-3.1-8B at 64k), while a pair of
/// 64k x 64k tokens still keeps cuDNN's kernels busy; the calls grow as (T / L)^2 / 2, a few
/// hundred at 2M tokens, each seconds long.
constexpr int64_t kAutoAttentionChunkTokens = 65536;

/// Chunks of length L leave a last chunk of one token when T = k L + 1: its diagonal pair is then
/// a 1 x 1 causal attention, which cuDNN's SDPA backward does not support (cudnn-frontend refuses
/// s_q = s_kv = 1 on every cuDNN version), and its other pairs are 1-query calls. So the length is
/// shortened a token at a time until the last chunk has at least two (T = 129 in chunks of 128:
/// 127 + 2). One step does it unless L - 1 divides k; a run of lengths that all divide T - 1 is
/// short, since T - 1 < lcm(3, ..., 64) for any T there is, so from L >= 64 (config keys are
/// multiples of 64) the loop stops long before 2. The CPU's chunks (engine/core/cpu_workspace.h)
/// keep their 1-token tails: its kernels take any length.
inline AttentionChunks without_one_token_tail(AttentionChunks ch) {
  while (ch.chunked() && ch.L > 2 && ch.T % ch.L == 1) --ch.L;
  return ch;
}

/// The chunks the CUDA backend runs attention in (engine/core/ops/attention.h):
/// remat.attention_chunk when given, else none while the whole call stays within kCudnnMaxSpan,
/// else the fewest chunks of equal length (a multiple of 64, at most kAutoAttentionChunkTokens)
/// whose views stay within it. A chunked call runs each batch row by itself; when only the batch
/// passes the bound (B T W beyond it, T W not), two chunks are taken so that it does. A given chunk
/// longer than the bound allows is shortened to it, and any length that would leave a last chunk
/// of one token is shortened until it does not (without_one_token_tail).
inline AttentionChunks attention_chunks(const Tensor& qkv, int64_t chunk_tokens) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), W = qkv.dim(2);
  const int64_t bound = std::max<int64_t>(64, kCudnnMaxSpan / W / 64 * 64);
  const bool fits = B * T * W <= kCudnnMaxSpan;
  if (const AttentionChunks given{T, std::min(chunk_tokens, bound)};
      chunk_tokens > 0 && (given.chunked() || fits))
    return without_one_token_tail(given);
  if (fits) return {T, 0};
  const int64_t longest = std::min(kAutoAttentionChunkTokens, bound);
  const int64_t n = std::max<int64_t>(2, (T + longest - 1) / longest);
  const int64_t L = ((T + n - 1) / n + 63) / 64 * 64;
  return without_one_token_tail({T, std::min(L, longest)});
}

/// Whether the chunked backward loops key chunks outside (dq summed over the whole row, dk | dv
/// per chunk) rather than query chunks (the reverse): whichever keeps the narrower of dq (C per
/// token) and dk | dv (KV = 2 KVH HS per token) as the whole row's sum. Multi-head attention
/// (KV = 2C) loops keys outside; grouped-query attention with KVH <= NH / 2, queries.
constexpr bool chunk_key_outer(int64_t C, int64_t KV) {
  return KV > C;
}

/// Document attention on CUDA (data.attention = "document"; engine/cuda/attention.cpp) runs each
/// document of a batch row as one causal cuDNN call of one row, its n tokens at the start of a
/// scratch of this many rows, the rest zero: n rounded up to 64, 96, 128, 192, 256, ... (powers of
/// two and one and a half times them), at most T. cuDNN builds a plan per shape (0.1-1 s each):
/// rounding keeps a run's plans to about two per doubling of length whatever its documents'
/// lengths, at the cost of at most 1.5x the rows (2.25x the FLOPs) of a document's call. No call
/// is 1 x 1, which cuDNN's backward refuses (a one-token document is 64 rows, or T below 64).
constexpr int64_t document_call_rows(int64_t n, int64_t T) {
  int64_t L = 64;
  while (L < n) L = (L & (L - 1)) == 0 ? L / 2 * 3 : L / 3 * 4;
  return std::min(L, T);
}

/// One document of a batch row: its tokens [start, start + length) of row `row`.
struct DocumentRun {
  int64_t row = 0, start = 0, length = 0;
};

/// The documents of (B, T) document starts (engine/core/ops/attention.h: each token's document's
/// first position in the row): the runs of equal starts, in order. A run must start where its
/// value says (the data's documents do; a ring's global starts never reach CUDA, which refuses
/// the ring with documents); BackendError otherwise.
inline std::vector<DocumentRun> document_runs(const int32_t* doc_start, int64_t B, int64_t T) {
  std::vector<DocumentRun> runs;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* d = doc_start + b * T;
    for (int64_t t = 0; t < T;) {
      if (d[t] != t)
        throw BackendError(fmt::format(
            "[attention] row {} token {} starts its document at {}: document starts must be "
            "runs, each starting where its value says (engine/core/ops/attention.h)",
            b, t, d[t]));
      int64_t e = t + 1;
      while (e < T && d[e] == d[t]) ++e;
      runs.push_back({b, t, e - t});
      t = e;
    }
  }
  return runs;
}

/// The attention workspace: one pool allocation "attn.workspace" that engine/cuda/cuda_backend.cpp
/// carves into these parts, in this order, each rounded to MemoryPool::kAlignment. cuDNN's fused
/// flash attention takes bf16 q/k/v only and RoPE must rotate q and k before it, hence the bf16
/// staging copies; its backward needs an fp32 dQ accumulator and the per-row sum(dO * O). The
/// last part is cuDNN's own plan workspace, the reserve above for the largest call the op makes
/// (the whole batch unchunked; one pair of L keys over chunks).
/// W = (NH + 2 KVH) HS is qkv's width, C = NH HS out's (engine/core/ops/attention.h).
struct AttentionWorkspaceLayout {
  uint64_t qkv_bf16 = 0;     // (B, T, W) bf16: cast from f32 acts, or q, k rotated (RoPE) in
                             // the forward; the bf16 backward rotates qkv itself in place
  uint64_t out_bf16 = 0;     // (B, T, C) bf16: f32 activations only
  uint64_t dout_bf16 = 0;    // (B, T, C) bf16: backward, f32 activations only
  uint64_t dqkv_bf16 = 0;    // (B, T, W) bf16: backward, f32 activations only
  uint64_t dq_accum = 0;     // (B, NH, T, HS) f32: backward
  uint64_t softmax_sum = 0;  // (B, NH, T) f32: backward
  // Attention over chunks of L tokens: dq_accum and softmax_sum are then one pair's, (L, C) and
  // (NH, L), and out_bf16 / dqkv_bf16 are not used (results go through f32 sums)
  uint64_t pair_out = 0;   // (L, C) bf16: forward, one pair's output
  uint64_t pair_lse = 0;   // (NH, L) f32: one pair's lse (forward), its query chunk's (backward)
  uint64_t out_sum = 0;    // (L, C) f32: forward, the query chunk's output merged over key chunks
  uint64_t pair_dqkv = 0;  // (L, W) bf16: backward, one pair's dq | dk | dv
  // Backward: dq summed over key chunks and dk | dv over query chunks, in f32, one over the
  // whole batch row (T rows) and the other over one chunk (L rows): chunk_key_outer says which.
  uint64_t dq_sum = 0;      // (L or T, C) f32
  uint64_t dkv_sum = 0;     // (T or L, 2 KVH HS) f32
  uint64_t cudnn_plan = 0;  // cudnn_plan_reserve_bytes: the plan's own workspace
  uint64_t total() const {
    return qkv_bf16 + out_bf16 + dout_bf16 + dqkv_bf16 + dq_accum + softmax_sum + pair_out +
           pair_lse + out_sum + pair_dqkv + dq_sum + dkv_sum + cudnn_plan;
  }
};

inline AttentionWorkspaceLayout attention_workspace_layout(const Tensor& qkv, int n_head,
                                                           int n_kv_head, bool use_rope,
                                                           bool backward, int64_t chunk_tokens,
                                                           bool documents = false) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), W = qkv.dim(2);
  const int64_t KVH = kv_heads(n_head, n_kv_head), HS = W / (n_head + 2 * KVH), C = HS * n_head;
  auto bytes = [](int64_t n, size_t elem) {
    return MemoryPool::accounted_bytes(static_cast<size_t>(n) * elem);
  };
  const bool f32_acts = qkv.dtype == DType::F32;
  AttentionWorkspaceLayout w;
  if (documents) {  // one document's call of at most T rows (document_call_rows), any chunking
    w.qkv_bf16 = bytes(T * W, 2);
    w.pair_lse = bytes(n_head * T, 4);
    if (!backward) {
      w.pair_out = bytes(T * C, 2);
    } else {
      w.out_bf16 = bytes(T * C, 2);
      w.dout_bf16 = bytes(T * C, 2);
      w.pair_dqkv = bytes(T * W, 2);
      w.dq_accum = bytes(T * C, 4);
      w.softmax_sum = bytes(n_head * T, 4);
    }
    w.cudnn_plan =
        MemoryPool::accounted_bytes(cudnn_plan_reserve_bytes(1, n_head, KVH, T, HS, backward));
    return w;
  }
  if (const AttentionChunks ch = attention_chunks(qkv, chunk_tokens); ch.chunked()) {
    const int64_t L = ch.L;
    if (f32_acts || (use_rope && !backward)) w.qkv_bf16 = bytes(B * T * W, 2);
    w.pair_lse = bytes(n_head * L, 4);
    if (!backward) {
      w.pair_out = bytes(L * C, 2);
      w.out_sum = bytes(L * C, 4);
    } else {
      if (f32_acts) {
        w.out_bf16 = bytes(B * T * C, 2);
        w.dout_bf16 = bytes(B * T * C, 2);
      }
      w.dq_accum = bytes(L * C, 4);
      w.softmax_sum = bytes(n_head * L, 4);
      w.pair_dqkv = bytes(L * W, 2);
      const bool key_outer = chunk_key_outer(C, W - C);
      w.dq_sum = bytes((key_outer ? T : L) * C, 4);
      w.dkv_sum = bytes((key_outer ? L : T) * (W - C), 4);
    }
    w.cudnn_plan =
        MemoryPool::accounted_bytes(cudnn_plan_reserve_bytes(1, n_head, KVH, L, HS, backward));
    return w;
  }
  // The backward is qkv's last reader, so with bf16 activations it rotates qkv in place: at the
  // block's peak that saves W bf16 per token (6 B/token/channel with the rest of the peak ~30).
  if (f32_acts || (use_rope && !backward)) w.qkv_bf16 = bytes(B * T * W, 2);
  if (f32_acts) w.out_bf16 = bytes(B * T * C, 2);
  if (backward) {
    if (f32_acts) {
      w.dout_bf16 = bytes(B * T * C, 2);
      w.dqkv_bf16 = bytes(B * T * W, 2);
    }
    w.dq_accum = bytes(B * T * C, 4);
    w.softmax_sum = bytes(B * n_head * T, 4);
  }
  w.cudnn_plan =
      MemoryPool::accounted_bytes(cudnn_plan_reserve_bytes(B, n_head, KVH, T, HS, backward));
  return w;
}

/// A GEMM reads its weight in the GEMM's dtype (cuBLASLt takes one dtype for both operands): a
/// weight of another dtype is copied for the duration of the op, cast or (NF4, lora.base = "nf4")
/// dequantised: "gemm.weight_bf16" for a bf16 GEMM, "gemm.weight_f32" for an f32 one, (OC, C). So a
/// bf16 GEMM reads a bf16 weight (lora.base = "bf16") as it is, and an f32 weight through a copy;
/// `reads_weight` false (a backward with no dinp) needs none.
inline WorkspaceList gemm_workspace(const Tensor& weight, bool bf16_gemm,
                                    bool reads_weight = true) {
  WorkspaceList w;
  const DType want = bf16_gemm ? DType::BF16 : DType::F32;
  if (reads_weight && weight.dtype != want)
    w.push_back({bf16_gemm ? "gemm.weight_bf16" : "gemm.weight_f32",
                 want,
                 {weight.dim(0), weight.numel() / weight.dim(0)}});
  w.push_back({"gemm.workspace", DType::BF16, {static_cast<int64_t>(kGemmWorkspaceBytes / 2)}});
  return w;
}

inline WorkspaceList attention_workspace(const Tensor& qkv, int n_head, int n_kv_head,
                                         float rope_theta, bool backward, int64_t chunk_tokens,
                                         bool documents) {
  const uint64_t bytes = attention_workspace_layout(qkv, n_head, n_kv_head, rope_theta > 0,
                                                    backward, chunk_tokens, documents)
                             .total();
  return {{"attn.workspace", DType::BF16, {static_cast<int64_t>(bytes / 2)}}};
}

// ---- the rules, one per op that has a workspace on any backend ----
/// A linear's LoRA adapters (engine/cuda/lora.cpp), one after the other through the same parts:
/// h (N, r) in the activations' dtype (s drop(x) A^T, then dh in the backward), the dropped input
/// (N, C) with dropout, and a bf16 copy of A and B for bf16 GEMMs (cuBLASLt takes one dtype for
/// both operands), B's the widest adapter's.
inline void add_lora_workspace(WorkspaceList& w, const LinearLora& l, const Tensor& inp,
                               bool backward) {
  if (l.empty()) return;
  const int64_t N = inp.rows(), C = inp.dim(-1), r = l.rank();
  w.push_back({"lora.h", inp.dtype, {N, r}});
  if (backward) w.push_back({"lora.dh", inp.dtype, {N, r}});
  if (l.any_dropout()) w.push_back({"lora.dropped", inp.dtype, {N, C}});
  if (inp.dtype == DType::BF16) {
    w.push_back({"lora.a_bf16", DType::BF16, {r, C}});
    w.push_back({"lora.b_bf16", DType::BF16, {l.max_cols(), r}});
  }
}
inline WorkspaceList workspace(const LinearForwardArgs& a, const WorkspaceTarget&) {
  WorkspaceList w = gemm_workspace(a.weight, a.inp.dtype == DType::BF16);
  add_lora_workspace(w, a.lora, a.inp, false);
  return w;
}
inline WorkspaceList workspace(const LinearBackwardArgs& a, const WorkspaceTarget&) {
  // Only dinp = dout W reads the weight; dW accumulates in f32 from the activations' operands.
  WorkspaceList w = gemm_workspace(a.weight, a.dout.dtype == DType::BF16, !a.dinp.empty());
  add_lora_workspace(w, a.lora, a.inp, true);
  return w;
}
inline WorkspaceList workspace(const AttentionForwardArgs& a, const WorkspaceTarget&) {
  return attention_workspace(a.qkv, a.n_head, a.n_kv_head, a.rope_theta, false, a.chunk_tokens,
                             !a.doc_start.empty());
}
inline WorkspaceList workspace(const AttentionBackwardArgs& a, const WorkspaceTarget&) {
  return attention_workspace(a.qkv, a.n_head, a.n_kv_head, a.rope_theta, true, a.chunk_tokens,
                             !a.doc_start.empty());
}
/// Tokens bucketed by id (positions (N) i32 + bucket starts (N+1) i32), so the scatter-add is
/// deterministic without atomics ("embedding.buckets").
/// The token rows' buckets (none when the token table is frozen: only position rows add up).
inline WorkspaceList workspace(const EmbeddingBackwardArgs& a, const WorkspaceTarget&) {
  if (a.dwte.empty()) return {};
  return {{"embedding.buckets", DType::I32, {2 * a.tokens.numel() + 1}}};
}
/// The tied weight's bf16 copy and the GEMM workspace, then the logits chunk.
inline WorkspaceList workspace(const LmHeadLossArgs& a, const WorkspaceTarget&) {
  WorkspaceList w = gemm_workspace(a.weight, a.inp.dtype == DType::BF16);
  w.push_back(logits_chunk_part(a));
  return w;
}

}  // namespace remat::cuda
