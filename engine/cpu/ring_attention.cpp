// CPU ring attention pieces (engine/core/ops/ring_attention.h). Plain tiles of 64 queries x 64 keys
// on single-threaded OpenBLAS calls inside OpenMP tasks: each output element is computed by one
// task in one fixed order, so the results do not depend on the thread count. The tiles skip key
// tiles that lie wholly after their queries (positions are global, so the mask compares them,
// not local indices). With grouped-query heads a query head reads its key/value head's columns
// of kv in place, and the backward's task owns a key/value head, whose dk and dv it sums over the
// group's query heads in order.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/gemm.h"

namespace remat::cpu {

namespace {

constexpr int64_t kTile = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One head's row rotated (forward) or rotated back (the gradient: the transpose rotation).
void rotate(float* d, const float* s, int64_t HS, const float* cs, const float* sn, bool back) {
  const int64_t half = HS / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = s[i], b = s[i + half];
    if (back) {
      d[i] = a * cs[i] + b * sn[i];
      d[i + half] = b * cs[i] - a * sn[i];
    } else {
      d[i] = a * cs[i] - b * sn[i];
      d[i + half] = a * sn[i] + b * cs[i];
    }
  }
}

struct TileRange {
  int64_t lo, hi;  // smallest and largest position in the tile
};
TileRange range_of(const std::vector<int64_t>& pos, int64_t i0, int64_t n) {
  const auto [lo, hi] = std::minmax_element(pos.begin() + i0, pos.begin() + i0 + n);
  return {*lo, *hi};
}

// A query tile's global positions and, with documents, its queries' document starts: which keys
// it sees. A key at p is visible to query i when doc_start_i <= p <= pos_i.
struct QueryTile {
  TileRange pos;
  const int32_t* first = nullptr;  // (n) document starts of the tile's queries, or null
  TileRange docs{0, 0};            // their smallest and largest

  QueryTile(const std::vector<int64_t>& qp, const Tensor& q_doc_start, int64_t b, int64_t Tq,
            int64_t i0, int64_t n)
      : pos(range_of(qp, i0, n)) {
    if (q_doc_start.empty()) return;
    first = q_doc_start.i32() + b * Tq + i0;
    const auto [lo, hi] = std::minmax_element(first, first + n);
    docs = {*lo, *hi};
  }
  /// No query of the tile sees any key of `k`.
  bool skips(const TileRange& k) const { return k.lo > pos.hi || k.hi < docs.lo; }
  /// Some key of `k` is hidden from some query (the element test is needed).
  bool masks(const TileRange& k) const { return k.hi > pos.lo || k.lo < docs.hi; }
  bool hidden(int64_t i, int64_t q_pos, int64_t k_pos) const {
    return k_pos > q_pos || (first && k_pos < first[i]);
  }
};

// Every (row, token) of a (B, T) layout with the cos and sin of RoPE at the token's global position
// (when theta > 0), less its document start with documents (doc_start, else null), one token per
// task: what split and merge-grad share.
template <class PerToken>
void for_each_token(int64_t B, int64_t T, int64_t HS, const TokenPositions& positions,
                    const int32_t* doc_start, float theta, const RopeScaling& scaling, int threads,
                    PerToken&& per_token) {
  const std::vector<int64_t> pos = positions.list();
  // cos and sin at the token's global position, as the self-attention kernel's table has them
  const RopeAngles angles =
      theta > 0 ? rope_angles(HS, static_cast<double>(theta), scaling) : RopeAngles{};
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> cs(static_cast<size_t>(HS / 2)), sn(cs.size());
    const int64_t p = pos[static_cast<size_t>(t)];
    if (theta > 0 && !doc_start) angles.cos_sin(p, cs.data(), sn.data());
    for (int64_t b = 0; b < B; ++b) {
      if (theta > 0 && doc_start) angles.cos_sin(p - doc_start[b * T + t], cs.data(), sn.data());
      per_token(b * T + t, cs.data(), sn.data());
    }
  }
}

const int32_t* doc_starts(const Tensor& t) {
  return t.empty() ? nullptr : t.i32();
}

// One token's n heads of HS from `x` into `d`: rotated, rotated back, or copied without RoPE.
void move_heads(const float* x, float* d, int64_t n, int64_t HS, const float* cs, const float* sn,
                bool rope, bool back) {
  for (int64_t h = 0; h < n; ++h) {
    if (rope)
      rotate(d + h * HS, x + h * HS, HS, cs, sn, back);
    else
      std::copy_n(x + h * HS, HS, d + h * HS);
  }
}

// The widths of an op's heads: C = NH HS of q, K = KVH HS of k and of v.
struct RingHeads {
  int64_t NH, KVH, G, HS, C, K;
  RingHeads(int64_t q_width, int n_head, int n_kv_head)
      : NH(n_head),
        KVH(kv_heads(n_head, n_kv_head)),
        G(NH / KVH),
        HS(q_width / n_head),
        C(q_width),
        K(KVH * HS) {}
};

}  // namespace

void CpuBackend::ring_split_impl(const RingSplitArgs& a) {
  const RingHeads h(a.q.dim(-1), a.n_head, a.n_kv_head);
  const int64_t W = h.C + 2 * h.K;
  const float* qkv = a.qkv.f32();
  float *q = a.q.f32(), *kv = a.kv.f32();
  const bool rope = a.rope_theta > 0;
  for_each_token(a.qkv.dim(0), a.qkv.dim(1), h.HS, a.pos, doc_starts(a.doc_start), a.rope_theta,
                 a.rope_scaling, threads_, [&](int64_t r, const float* cs, const float* sn) {
                   const float* src = qkv + r * W;
                   float* dkv = kv + r * 2 * h.K;
                   move_heads(src, q + r * h.C, h.NH, h.HS, cs, sn, rope, false);
                   move_heads(src + h.C, dkv, h.KVH, h.HS, cs, sn, rope, false);
                   std::copy_n(src + h.C + h.K, h.K, dkv + h.K);
                 });
}

void CpuBackend::ring_merge_grad_impl(const RingMergeGradArgs& a) {
  const RingHeads h(a.dq.dim(-1), a.n_head, a.n_kv_head);
  const int64_t W = h.C + 2 * h.K;
  const float *dq = a.dq.f32(), *dkv = a.dkv.f32();
  float* dqkv = a.dqkv.f32();
  const bool rope = a.rope_theta > 0;
  for_each_token(a.dqkv.dim(0), a.dqkv.dim(1), h.HS, a.pos, doc_starts(a.doc_start), a.rope_theta,
                 a.rope_scaling, threads_, [&](int64_t r, const float* cs, const float* sn) {
                   const float* g = dkv + r * 2 * h.K;
                   float* d = dqkv + r * W;
                   move_heads(dq + r * h.C, d, h.NH, h.HS, cs, sn, rope, true);
                   move_heads(g, d + h.C, h.KVH, h.HS, cs, sn, rope, true);
                   std::copy_n(g + h.K, h.K, d + h.C + h.K);
                 });
}

// Per (batch, head, query tile): for each visible key tile, S = scale Q K^T with the causal mask
// on global positions, the online softmax update of (m, l), acc rescaled, then acc += P V.
void CpuBackend::ring_block_forward_impl(const RingBlockForwardArgs& a) {
  const RingHeads hs(a.q.dim(2), a.n_head, a.n_kv_head);
  const int64_t B = a.q.dim(0), Tq = a.q.dim(1), C = hs.C, Tk = a.kv.dim(1), K = hs.K;
  const int64_t NH = hs.NH, HS = hs.HS;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const std::vector<int64_t> qp = a.q_pos.list(), kp = a.k_pos.list();
  const int64_t n_qt = (Tq + kTile - 1) / kTile, n_kt = (Tk + kTile - 1) / kTile;
  const float *q = a.q.f32(), *kv = a.kv.f32();
  float *acc = a.acc.f32(), *row_max = a.row_max.f32(), *row_sum = a.row_sum.f32();
#pragma omp parallel num_threads(threads_)
  {
    std::vector<float> S(static_cast<size_t>(kTile * kTile));
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < B * NH * n_qt; ++task) {
      const int64_t b = task / (NH * n_qt), h = (task / n_qt) % NH, i0 = (task % n_qt) * kTile;
      const int64_t qn = std::min(kTile, Tq - i0);
      const QueryTile qt(qp, a.q_doc_start, b, Tq, i0, qn);
      const float* Q = q + (b * Tq + i0) * C + h * HS;
      float* A = acc + (b * Tq + i0) * C + h * HS;
      float* M = row_max + (b * NH + h) * Tq + i0;
      float* L = row_sum + (b * NH + h) * Tq + i0;
      for (int64_t kt = 0; kt < n_kt; ++kt) {
        const int64_t j0 = kt * kTile, kn = std::min(kTile, Tk - j0);
        const TileRange kr = range_of(kp, j0, kn);
        if (qt.skips(kr)) continue;  // every key after every query, or before its document
        const float* Kt = kv + (b * Tk + j0) * 2 * K + h / hs.G * HS;
        const float* V = Kt + K;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(qn), blas_int(kn),
                    blas_int(HS), scale, Q, blas_int(C), Kt, blas_int(2 * K), 0.0f, S.data(),
                    blas_int(kn));
        const bool masked = qt.masks(kr);
        for (int64_t i = 0; i < qn; ++i) {
          float* row = S.data() + i * kn;
          if (masked)
            for (int64_t j = 0; j < kn; ++j)
              if (qt.hidden(i, qp[static_cast<size_t>(i0 + i)], kp[static_cast<size_t>(j0 + j)]))
                row[j] = kNegInf;
          const float mt = *std::max_element(row, row + kn);
          if (mt == kNegInf) {  // no key of this tile is visible to this query
            std::fill(row, row + kn, 0.0f);
            continue;
          }
          const float m_new = std::max(M[i], mt);
          const float corr = std::exp(M[i] - m_new);  // 0 when M was -inf
          float sum = 0;
          for (int64_t j = 0; j < kn; ++j) {
            row[j] = std::exp(row[j] - m_new);
            sum += row[j];
          }
          L[i] = L[i] * corr + sum;
          M[i] = m_new;
          for (int64_t c = 0; c < HS; ++c) A[i * C + c] *= corr;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(qn), blas_int(HS),
                    blas_int(kn), 1.0f, S.data(), blas_int(kn), V, blas_int(2 * K), 1.0f, A,
                    blas_int(C));
      }
    }
  }
}

void CpuBackend::ring_finish_impl(const RingFinishArgs& a) {
  const int64_t B = a.out.dim(0), T = a.out.dim(1), C = a.out.dim(2), NH = a.n_head, HS = C / NH;
  float* out = a.out.f32();  // may be acc itself
  const float* acc = a.acc.f32();
  const float *m = a.row_max.f32(), *l = a.row_sum.f32();
  float* lse = a.lse.f32();
#pragma omp parallel for schedule(static) num_threads(threads_)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t s = bh * T + t;
      const float inv = 1.0f / l[s];
      const int64_t at = (b * T + t) * C + h * HS;
      for (int64_t c = 0; c < HS; ++c) out[at + c] = acc[at + c] * inv;
      lse[s] = m[s] + std::log(l[s]);  // may overwrite m[s] itself: read first
    }
  }
}

// Per (batch, key/value head): the flash backward of each of its query heads in turn over the
// visible (query tile, key tile) pairs in a fixed order. dK and dV of a key/value head are
// written by this task alone, summed over its query heads in order.
void CpuBackend::ring_block_backward_impl(const RingBlockBackwardArgs& a) {
  const RingHeads hs(a.q.dim(2), a.n_head, a.n_kv_head);
  const int64_t B = a.q.dim(0), Tq = a.q.dim(1), C = hs.C, Tk = a.kv.dim(1), K = hs.K;
  const int64_t NH = hs.NH, KVH = hs.KVH, HS = hs.HS;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const std::vector<int64_t> qp = a.q_pos.list(), kp = a.k_pos.list();
  const int64_t n_qt = (Tq + kTile - 1) / kTile, n_kt = (Tk + kTile - 1) / kTile;
  const float *q = a.q.f32(), *kv = a.kv.f32(), *dout = a.dout.f32(), *lse = a.lse.f32(),
              *delta = a.delta.f32();
  float *dq = a.dq.f32(), *dkv = a.dkv.f32();
#pragma omp parallel num_threads(threads_)
  {
    std::vector<float> P(static_cast<size_t>(kTile * kTile)), dP(P.size());
#pragma omp for schedule(dynamic)
    for (int64_t bkv = 0; bkv < B * KVH; ++bkv) {
      const int64_t b = bkv / KVH, kvh = bkv % KVH;
      for (int64_t h = kvh * hs.G; h < (kvh + 1) * hs.G; ++h) {
        const int64_t bh = b * NH + h;
        for (int64_t qt = 0; qt < n_qt; ++qt) {
          const int64_t i0 = qt * kTile, qn = std::min(kTile, Tq - i0);
          const QueryTile tile(qp, a.q_doc_start, b, Tq, i0, qn);
          const float* Q = q + (b * Tq + i0) * C + h * HS;
          const float* dO = dout + (b * Tq + i0) * C + h * HS;
          float* dQ = dq + (b * Tq + i0) * C + h * HS;
          const float* LSE = lse + bh * Tq + i0;
          const float* D = delta + bh * Tq + i0;
          for (int64_t kt = 0; kt < n_kt; ++kt) {
            const int64_t j0 = kt * kTile, kn = std::min(kTile, Tk - j0);
            const TileRange kr = range_of(kp, j0, kn);
            if (tile.skips(kr)) continue;
            const float* Kt = kv + (b * Tk + j0) * 2 * K + kvh * HS;
            const float* V = Kt + K;
            float* dK = dkv + (b * Tk + j0) * 2 * K + kvh * HS;
            float* dV = dK + K;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(qn), blas_int(kn),
                        blas_int(HS), scale, Q, blas_int(C), Kt, blas_int(2 * K), 0.0f, P.data(),
                        blas_int(kn));
            for (int64_t i = 0; i < qn; ++i)
              for (int64_t j = 0; j < kn; ++j) {
                float& p = P[static_cast<size_t>(i * kn + j)];
                p = tile.hidden(i, qp[static_cast<size_t>(i0 + i)], kp[static_cast<size_t>(j0 + j)])
                        ? 0.0f
                        : std::exp(p - LSE[i]);
              }
            // dV += P^T dO; dP = dO V^T; dS = P (dP - D) in P; dQ += scale dS K;
            // dK += scale dS^T Q
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_int(kn), blas_int(HS),
                        blas_int(qn), 1.0f, P.data(), blas_int(kn), dO, blas_int(C), 1.0f, dV,
                        blas_int(2 * K));
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(qn), blas_int(kn),
                        blas_int(HS), 1.0f, dO, blas_int(C), V, blas_int(2 * K), 0.0f, dP.data(),
                        blas_int(kn));
            for (int64_t i = 0; i < qn; ++i)
              for (int64_t j = 0; j < kn; ++j) {
                const size_t e = static_cast<size_t>(i * kn + j);
                P[e] *= dP[e] - D[i];
              }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(qn), blas_int(HS),
                        blas_int(kn), scale, P.data(), blas_int(kn), Kt, blas_int(2 * K), 1.0f, dQ,
                        blas_int(C));
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_int(kn), blas_int(HS),
                        blas_int(qn), scale, P.data(), blas_int(kn), Q, blas_int(C), 1.0f, dK,
                        blas_int(2 * K));
          }
        }
      }
    }
  }
}

}  // namespace remat::cpu
