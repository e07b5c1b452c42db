// CPU attention over chunks: the schedule of engine/core/ops/attention.h's header, (query chunk i,
// key chunk j <= i) pairs, each run on the context ring's kernels (engine/cpu/ring_attention.cpp),
// which take queries and keys at any global positions: on a diagonal pair the causal mask falls
// inside the pair, on the others it masks nothing. The forward gives each pair its own output
// and lse (a fresh online softmax finished by ring_finish) and merges them into out and lse in
// f32, key chunks ascending, with the formula the CUDA path uses; the backward runs each pair's
// flash backward from the global lse and D, dq summed over key chunks and dk, dv over query
// chunks in f32, then rotates them back (ring_merge_grad). Every sum has a fixed order, so the
// results are bitwise reproducible for any thread count. Slower than the flash kernel of
// attention.cpp (BLAS calls per 64 x 64 tile pair): on the CPU chunking is a choice
// (remat.attention_chunk), never automatic, and exists so that the schedule runs and is tested
// where there is no GPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "engine/core/cpu_workspace.h"
#include "engine/cpu/cpu_backend.h"

namespace remat::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Query or key rows [start, start + n) of batch row b of a (B, T, cols) f32 tensor, as (1, n,
// cols).
Tensor rows(float* base, int64_t T, int64_t cols, int64_t b, int64_t start, int64_t n) {
  return Tensor(base + (b * T + start) * cols, {1, n, cols}, DType::F32);
}

TokenPositions range(int64_t start, int64_t n) {
  TokenPositions p;
  p.ranges.push_back({start, n});
  return p;
}

// Documents: the query chunk's document starts, (1, n) of batch row b from `start` (empty without
// documents), and whether key chunk [ks, ks + kn) lies wholly before all of them: then the pair
// has nothing to compute (starts do not decrease, so the chunk's first query has the least).
Tensor doc_rows(const Tensor& doc_start, int64_t b, int64_t start, int64_t n) {
  if (doc_start.empty()) return Tensor{};
  return Tensor(doc_start.i32() + b * doc_start.dim(1) + start, {1, n}, DType::I32);
}
bool before_documents(const Tensor& q_doc_start, int64_t ks, int64_t kn) {
  return !q_doc_start.empty() && q_doc_start.i32()[0] >= ks + kn;
}

// Folds one pair's (O_ij, lse_ij) into the running (O, lse) of its query rows: with m the larger
// lse, lse' = m + log(e^(lse - m) + e^(lse_ij - m)) and O' = e^(lse - lse') O + e^(lse_ij - lse')
// O_ij. From lse = -inf (the first key chunk) that is exactly (O_ij, lse_ij). o: rows of C with
// head h at h HS; lse: head h's row at h * lse_stride.
void merge_pair(float* o, float* lse, int64_t lse_stride, const float* o_ij, const float* lse_ij,
                int64_t n, int64_t NH, int64_t HS, int threads) {
  const int64_t C = NH * HS;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t ht = 0; ht < NH * n; ++ht) {
    const int64_t h = ht / n, t = ht % n;
    const float a = lse[h * lse_stride + t], b = lse_ij[h * n + t];
    if (b == kNegInf) continue;  // no visible key (documents: all before the row's start)
    const float m = std::max(a, b);
    const float l = m + std::log(std::exp(a - m) + std::exp(b - m));
    const float wa = std::exp(a - l), wb = std::exp(b - l);
    float* d = o + t * C + h * HS;
    const float* s = o_ij + t * C + h * HS;
    for (int64_t c = 0; c < HS; ++c) d[c] = wa * d[c] + wb * s[c];
    lse[h * lse_stride + t] = l;
  }
}

// Head rows [start, start + n) of a (B, NH, T) f32 tensor's batch row b, into (NH, n) dst.
void copy_head_rows(float* dst, const float* src, int64_t NH, int64_t T, int64_t b, int64_t start,
                    int64_t n) {
  for (int64_t h = 0; h < NH; ++h)
    std::memcpy(dst + h * n, src + (b * NH + h) * T + start, static_cast<size_t>(n) * 4);
}

}  // namespace

void CpuBackend::attention_forward_chunked(const AttentionForwardArgs& a, const OpWorkspace& ws,
                                           const AttentionChunks& ch) {
  const int64_t B = a.qkv.dim(0), T = a.qkv.dim(1), C = a.out.dim(2), NH = a.n_head;
  const int64_t HS = C / NH, K = kv_heads(a.n_head, a.n_kv_head) * HS, L = ch.L;
  float* q = ws.at("attn.chunk_qkv").f32();
  float* kv = q + B * T * C;
  float* pair = ws.at("attn.chunk_pair").f32();
  float *pair_o = pair, *pair_m = pair + L * C, *pair_l = pair_m + NH * L;
  ring_split_impl({Tensor(q, {B, T, C}, DType::F32), Tensor(kv, {B, T, 2 * K}, DType::F32), a.qkv,
                   a.n_head, a.rope_theta, range(0, T), a.n_kv_head, a.rope_scaling, a.doc_start});
  std::fill_n(a.out.f32(), a.out.numel(), 0.0f);
  std::fill_n(a.lse.f32(), a.lse.numel(), kNegInf);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < ch.count(); ++i) {
      const int64_t qs = ch.start(i), qn = ch.length(i);
      const Tensor q_docs = doc_rows(a.doc_start, b, qs, qn);
      for (int64_t j = 0; j <= i; ++j) {
        const int64_t ks = ch.start(j), kn = ch.length(j);
        if (before_documents(q_docs, ks, kn)) continue;
        const Tensor o_ij(pair_o, {1, qn, C}, DType::F32);
        const Tensor m_ij(pair_m, {1, NH, qn}, DType::F32), l_ij(pair_l, {1, NH, qn}, DType::F32);
        std::fill_n(pair_o, qn * C, 0.0f);
        std::fill_n(pair_m, NH * qn, kNegInf);
        std::fill_n(pair_l, NH * qn, 0.0f);
        ring_block_forward_impl({o_ij, m_ij, l_ij, rows(q, T, C, b, qs, qn),
                                 rows(kv, T, 2 * K, b, ks, kn), a.n_head, range(qs, qn),
                                 range(ks, kn), a.n_kv_head, q_docs});
        ring_finish_impl({o_ij, o_ij, m_ij, m_ij, l_ij, a.n_head});  // m_ij becomes lse_ij
        merge_pair(a.out.f32() + (b * T + qs) * C, a.lse.f32() + b * NH * T + qs, T, pair_o, pair_m,
                   qn, NH, HS, threads_);
      }
    }
}

void CpuBackend::attention_backward_chunked(const AttentionBackwardArgs& a, const OpWorkspace& ws,
                                            const AttentionChunks& ch) {
  const int64_t B = a.qkv.dim(0), T = a.qkv.dim(1), C = a.dout.dim(2), NH = a.n_head;
  const int64_t K = kv_heads(a.n_head, a.n_kv_head) * (C / NH), L = ch.L;
  float* q = ws.at("attn.chunk_qkv").f32();
  float* kv = q + B * T * C;
  float* dq = ws.at("attn.chunk_grads").f32();
  float* dkv = dq + B * T * C;
  float* pair = ws.at("attn.chunk_pair").f32();
  float *lse_i = pair, *delta_i = pair + NH * L;
  const float* delta = a.delta.empty() ? nullptr : a.delta.f32();
  if (!delta) {  // D for every row from O, as the unchunked backward forms it
    float* d = pair + 2 * NH * L;
    attention_delta_impl({Tensor(d, {B, NH, T}, DType::F32), a.dout, a.out, a.n_head});
    delta = d;
  }
  ring_split_impl({Tensor(q, {B, T, C}, DType::F32), Tensor(kv, {B, T, 2 * K}, DType::F32), a.qkv,
                   a.n_head, a.rope_theta, range(0, T), a.n_kv_head, a.rope_scaling, a.doc_start});
  std::fill_n(dq, B * T * (C + 2 * K), 0.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < ch.count(); ++i) {
      const int64_t qs = ch.start(i), qn = ch.length(i);
      copy_head_rows(lse_i, a.lse.f32(), NH, T, b, qs, qn);
      copy_head_rows(delta_i, delta, NH, T, b, qs, qn);
      const Tensor dout_i(a.dout.f32() + (b * T + qs) * C, {1, qn, C}, DType::F32);
      const Tensor q_docs = doc_rows(a.doc_start, b, qs, qn);
      for (int64_t j = 0; j <= i; ++j) {
        const int64_t ks = ch.start(j), kn = ch.length(j);
        if (before_documents(q_docs, ks, kn)) continue;
        ring_block_backward_impl({rows(dq, T, C, b, qs, qn), rows(dkv, T, 2 * K, b, ks, kn),
                                  rows(q, T, C, b, qs, qn), rows(kv, T, 2 * K, b, ks, kn), dout_i,
                                  Tensor(lse_i, {1, NH, qn}, DType::F32),
                                  Tensor(delta_i, {1, NH, qn}, DType::F32), a.n_head, range(qs, qn),
                                  range(ks, kn), a.n_kv_head, q_docs});
      }
    }
  ring_merge_grad_impl({a.dqkv, Tensor(dq, {B, T, C}, DType::F32),
                        Tensor(dkv, {B, T, 2 * K}, DType::F32), a.n_head, a.rope_theta, range(0, T),
                        a.n_kv_head, a.rope_scaling, a.doc_start});
}

}  // namespace remat::cpu
