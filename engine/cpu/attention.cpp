// CPU causal self-attention with the flash contract (Dao et al. 2022): tiles of queries against
// tiles of keys with an online softmax; the forward saves only the output and the per-row
// log-sum-exp; the backward recomputes each score tile from Q, K and the log-sum-exp, with
// D_i = rowsum(dO_i * O_i). Tiles above the diagonal are skipped. No T x T matrix exists.
// Optional RoPE (half-split / GPT-NeoX layout) rotates q and k as the forward loads its tiles;
// the backward rotates them in place once (qkv is CLOBBERED there) and rotates dq, dk back.
// Documents (doc_start, engine/core/ops/attention.h): a query tile's keys start at its first
// document start, key tiles wholly before a query unit's document are skipped (forward) and a key
// tile's query tiles end where their documents start past it (backward); inside a tile that
// straddles a start the keys before it are masked (-inf forward; zero probabilities and score
// gradients backward), and RoPE rotates at the position within the document. Without documents
// nothing of this runs: causal attention keeps its bits.
//
// Every product is a small GEMM on one tile pair, done by a register-blocked AVX2/FMA kernel
// (6 rows x 16 columns of accumulators), with a portable scalar fallback. Tile layouts are
// chosen so that no tile is transposed per tile pair: the forward computes S^T = K Q^T (Q^T
// packed once per query tile; K and V read in place, or K rotated into a tile with RoPE), so
// the online softmax runs down columns and needs no horizontal reductions; the backward packs
// K^T and V^T once per key tile and loops over the query tiles below it. Scores are kept in
// base 2 (the scale 1/sqrt(HS) and log2(e) are folded into the packed Q^T or K^T) and
// exponentiated with a polynomial exp2, see exp2_ps. No BLAS call: on one 64x64x64 tile
// product OpenBLAS measured ~49 GFLOP/s per core here, less than this whole kernel reaches
// (tests/bench/bench_attention.cpp), and its call overhead and packing are per tile pair.
//
// Grouped-query attention (NH query heads over KVH key/value heads) reads each key/value head in
// place or packs it once per task for the G = NH / KVH query heads it serves, never a copy per
// query head. Thread mapping: forward, one (batch, key/value head, pair of (query head, query
// tile) units) per task, largest first; backward, one (batch, key/value head) per task, which
// owns dk, dv and its query heads' dq. Every output element is summed in a fixed order that does
// not depend on the thread that computes it, so results are bitwise reproducible for any thread
// count.
#include <omp.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "engine/cpu/attention_gemm.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/vector_math.h"

namespace remat::cpu {

namespace {

std::atomic<int> g_forced_isa{-1};  // force_attention_isa's choice; -1: none

// REMAT_ATTENTION_ISA (avx2 | avx512), for A/B comparisons of the two kernels; unset: cpuid.
AttentionIsa isa_from_environment() {
  const bool has_avx512 = __builtin_cpu_supports("avx512f");
  const char* env = std::getenv("REMAT_ATTENTION_ISA");
  if (!env || !*env) return has_avx512 ? AttentionIsa::Avx512 : AttentionIsa::Avx2;
  const std::string v = env;
  if (v == "avx2") return AttentionIsa::Avx2;
  if (v == "avx512" && has_avx512) return AttentionIsa::Avx512;
  throw ConfigError(fmt::format(
      "REMAT_ATTENTION_ISA={}: {}. Fix: unset it (the CPU's best is chosen), or set avx2", v,
      v == "avx512" ? "this CPU has no AVX-512F" : "not avx2 or avx512"));
}

}  // namespace

AttentionIsa attention_isa() {
  static const AttentionIsa from_environment = isa_from_environment();
  const int forced = g_forced_isa.load(std::memory_order_relaxed);
  return forced >= 0 ? static_cast<AttentionIsa>(forced) : from_environment;
}

const char* attention_isa_chosen_by() {
  const char* env = std::getenv("REMAT_ATTENTION_ISA");
  return env && *env ? "REMAT_ATTENTION_ISA" : "cpuid";
}

void force_attention_isa(AttentionIsa isa) {
  REMAT_ASSERT(isa != AttentionIsa::Avx512 || __builtin_cpu_supports("avx512f"),
               "attention: AVX-512 forced on a CPU without it");
  g_forced_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
}

namespace {

constexpr int64_t kTq = kAttnTileQ;
constexpr int64_t kTk = kAttnTileK;
static_assert(kTq % 16 == 0 && kTk % 16 == 0, "tiles are whole 16-float vectors");

constexpr float kLog2e = std::numbers::log2e_v<float>;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Row stride of a packed (rows, HS) tile: HS rounded up to whole 8-float vectors.
int64_t padded(int64_t HS) {
  return attention_padded_hs(HS);
}

// ---- kernels: C (M, N) {=, +=} A (M, K) B (K, N) and the softmax element loops ----
//
// A's element (r, k) is a[r * ars + k * aks]: a row-major tile (ars = ld, aks = 1) or the
// transpose of one (ars = 1, aks = ld). B and C are row-major with leading dimensions ldb, ldc.
// Each C element is one chain of FMAs over k = 0..K-1, in order.

#if defined(__AVX2__) && defined(__FMA__)

// One MR x (8 NV) block of C. kMasked: one vector wide, the lanes set in `mask` only.
template <int MR, int NV, bool kMasked, bool kAccumulate>
inline void gemm_block(int64_t K, const float* a, int64_t ars, int64_t aks, const float* b,
                       int64_t ldb, float* c, int64_t ldc, __m256i mask) {
  static_assert(!kMasked || NV == 1);
  __m256 acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      if constexpr (!kAccumulate)
        acc[r][v] = _mm256_setzero_ps();
      else if constexpr (kMasked)
        acc[r][v] = _mm256_maskload_ps(c + r * ldc, mask);
      else
        acc[r][v] = _mm256_loadu_ps(c + r * ldc + 8 * v);
    }
  for (int64_t k = 0; k < K; ++k) {
    __m256 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      bv[v] =
          kMasked ? _mm256_maskload_ps(b + k * ldb, mask) : _mm256_loadu_ps(b + k * ldb + 8 * v);
    const float* ak = a + k * aks;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 ar = _mm256_broadcast_ss(ak + r * ars);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(ar, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      if constexpr (kMasked)
        _mm256_maskstore_ps(c + r * ldc, mask, acc[r][v]);
      else
        _mm256_storeu_ps(c + r * ldc + 8 * v, acc[r][v]);
    }
}

constexpr int kMr = 6;  // rows per block: 12 accumulators + 2 of B + 1 of A = 15 of 16 registers

template <int NV, bool kMasked, bool kAccumulate>
void gemm_panel(int64_t M, int64_t K, const float* a, int64_t ars, int64_t aks, const float* b,
                int64_t ldb, float* c, int64_t ldc, __m256i mask) {
  int64_t i = 0;
  for (; i + kMr <= M; i += kMr)
    gemm_block<kMr, NV, kMasked, kAccumulate>(K, a + i * ars, ars, aks, b, ldb, c + i * ldc, ldc,
                                              mask);
  a += i * ars;
  c += i * ldc;
  switch (M - i) {
    case 5:
      gemm_block<5, NV, kMasked, kAccumulate>(K, a, ars, aks, b, ldb, c, ldc, mask);
      break;
    case 4:
      gemm_block<4, NV, kMasked, kAccumulate>(K, a, ars, aks, b, ldb, c, ldc, mask);
      break;
    case 3:
      gemm_block<3, NV, kMasked, kAccumulate>(K, a, ars, aks, b, ldb, c, ldc, mask);
      break;
    case 2:
      gemm_block<2, NV, kMasked, kAccumulate>(K, a, ars, aks, b, ldb, c, ldc, mask);
      break;
    case 1:
      gemm_block<1, NV, kMasked, kAccumulate>(K, a, ars, aks, b, ldb, c, ldc, mask);
      break;
    default:
      break;
  }
}

template <bool kAccumulate>
void gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t ars, int64_t aks, const float* b,
          int64_t ldb, float* c, int64_t ldc) {
  if (attention_isa() == AttentionIsa::Avx512) {  // the same FMA chains, 16 lanes at a time
    attention_gemm_avx512(kAccumulate, M, N, K, a, ars, aks, b, ldb, c, ldc);
    return;
  }
  const __m256i all = _mm256_set1_epi32(-1);
  int64_t j = 0;
  for (; j + 16 <= N; j += 16)
    gemm_panel<2, false, kAccumulate>(M, K, a, ars, aks, b + j, ldb, c + j, ldc, all);
  if (j + 8 <= N) {
    gemm_panel<1, false, kAccumulate>(M, K, a, ars, aks, b + j, ldb, c + j, ldc, all);
    j += 8;
  }
  if (j < N) {
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(N - j)),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    gemm_panel<1, true, kAccumulate>(M, K, a, ars, aks, b + j, ldb, c + j, ldc, mask);
  }
}

// Online-softmax step on a tile of base-2 scores stored transposed, s (nk keys, kTq queries):
// per query column i, m_new = max(m_i, max_j s_ji); s_ji = 2^(s_ji - m_new);
// l_i = l_i 2^(m_i - m_new) + sum_j s_ji (j in order); corr_i = 2^(m_i - m_new).
// A column that has seen only masked keys so far (documents: a key tile before the query's
// document start) keeps m_new = -inf; its exponentials are taken against 0 instead, so that they
// are 0 and not NaN. Any other column subtracts m_new itself.
void softmax_update_columns(float* s, int64_t nk, float* m, float* l, float* corr) {
  if (attention_isa() == AttentionIsa::Avx512)
    return attention_softmax_update_columns_avx512(s, nk, kTq, m, l, corr);
  const __m256 neg_inf = _mm256_set1_ps(kNegInf);
  for (int64_t i = 0; i < kTq; i += 8) {
    const __m256 m_old = _mm256_loadu_ps(m + i);
    __m256 mx = m_old;
    for (int64_t j = 0; j < nk; ++j) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j * kTq + i));
    const __m256 shift =
        _mm256_blendv_ps(mx, _mm256_setzero_ps(), _mm256_cmp_ps(mx, neg_inf, _CMP_EQ_OQ));
    __m256 sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < nk; ++j) {
      const __m256 p = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j * kTq + i), shift));
      _mm256_storeu_ps(s + j * kTq + i, p);
      sum = _mm256_add_ps(sum, p);
    }
    const __m256 c = exp2_ps(_mm256_sub_ps(m_old, shift));
    _mm256_storeu_ps(corr + i, c);
    _mm256_storeu_ps(l + i, _mm256_fmadd_ps(_mm256_loadu_ps(l + i), c, sum));
    _mm256_storeu_ps(m + i, mx);
  }
}

// Backward element step on one query row of kTk base-2 scores: p_j = 2^(s_j - lse2) for
// j < n_valid, else 0; ds_j = scale p_j (dp_j - d). `s` becomes p, `ds` holds dp on entry.
void softmax_grad_row(float* s, float* ds, int64_t n_valid, float lse2, float d, float scale) {
  if (attention_isa() == AttentionIsa::Avx512)
    return attention_softmax_grad_row_avx512(s, ds, kTk, n_valid, lse2, d, scale);
  const __m256 vl = _mm256_set1_ps(lse2), vd = _mm256_set1_ps(d), vs = _mm256_set1_ps(scale);
  const __m256 nv = _mm256_set1_ps(static_cast<float>(n_valid));
  __m256 idx = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t j = 0; j < kTk; j += 8) {
    __m256 p = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), vl));
    p = _mm256_and_ps(p, _mm256_cmp_ps(idx, nv, _CMP_LT_OQ));
    _mm256_storeu_ps(s + j, p);
    const __m256 dp = _mm256_sub_ps(_mm256_loadu_ps(ds + j), vd);
    _mm256_storeu_ps(ds + j, _mm256_mul_ps(_mm256_mul_ps(p, dp), vs));
    idx = _mm256_add_ps(idx, _mm256_set1_ps(8.0f));
  }
}

// The same step on a transposed tile, as the query-tile pass of the backward holds it: s, ds
// (nk keys, kTq queries); column i is query i0 + i, row j key j0 + j, valid when j0 + j <= i0 + i
// and i < nq; lse2 and d per column. Every element gets the operations of softmax_grad_row, in
// the same order, so both give the same bits.
void softmax_grad_columns(float* s, float* ds, int64_t nk, int64_t key_minus_query, int64_t nq,
                          const float* lse2, const float* d, float scale) {
  if (attention_isa() == AttentionIsa::Avx512)
    return attention_softmax_grad_columns_avx512(s, ds, nk, kTq, key_minus_query, nq, lse2, d,
                                                 scale);
  const __m256 vs = _mm256_set1_ps(scale);
  const __m256 n_queries = _mm256_set1_ps(static_cast<float>(nq));
  for (int64_t j = 0; j < nk; ++j) {
    const __m256 first = _mm256_set1_ps(static_cast<float>(j + key_minus_query));
    __m256 idx = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t i = 0; i < kTq; i += 8) {
      float* sj = s + j * kTq + i;
      float* dsj = ds + j * kTq + i;
      __m256 p = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(sj), _mm256_loadu_ps(lse2 + i)));
      const __m256 valid = _mm256_and_ps(_mm256_cmp_ps(idx, first, _CMP_GE_OQ),
                                         _mm256_cmp_ps(idx, n_queries, _CMP_LT_OQ));
      p = _mm256_and_ps(p, valid);
      _mm256_storeu_ps(sj, p);
      const __m256 dp = _mm256_sub_ps(_mm256_loadu_ps(dsj), _mm256_loadu_ps(d + i));
      _mm256_storeu_ps(dsj, _mm256_mul_ps(_mm256_mul_ps(p, dp), vs));
      idx = _mm256_add_ps(idx, _mm256_set1_ps(8.0f));
    }
  }
}

#else  // portable fallback: the same arithmetic, one element at a time

template <bool kAccumulate>
void gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t ars, int64_t aks, const float* b,
          int64_t ldb, float* c, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float acc = kAccumulate ? c[i * ldc + j] : 0.0f;
      for (int64_t k = 0; k < K; ++k) acc = std::fma(a[i * ars + k * aks], b[k * ldb + j], acc);
      c[i * ldc + j] = acc;
    }
}

float exp2_scalar(float x) {
  return x >= -126.0f ? std::exp2(x) : 0.0f;
}

void softmax_update_columns(float* s, int64_t nk, float* m, float* l, float* corr) {
  for (int64_t i = 0; i < kTq; ++i) {
    float mx = m[i];
    for (int64_t j = 0; j < nk; ++j) mx = std::max(mx, s[j * kTq + i]);
    const float shift = mx == kNegInf ? 0.0f : mx;
    float sum = 0;
    for (int64_t j = 0; j < nk; ++j) {
      s[j * kTq + i] = exp2_scalar(s[j * kTq + i] - shift);
      sum += s[j * kTq + i];
    }
    corr[i] = exp2_scalar(m[i] - shift);
    l[i] = std::fma(l[i], corr[i], sum);
    m[i] = mx;
  }
}

void softmax_grad_row(float* s, float* ds, int64_t n_valid, float lse2, float d, float scale) {
  for (int64_t j = 0; j < kTk; ++j) {
    const float p = j < n_valid ? exp2_scalar(s[j] - lse2) : 0.0f;
    s[j] = p;
    ds[j] = p * (ds[j] - d) * scale;
  }
}

void softmax_grad_columns(float* s, float* ds, int64_t nk, int64_t key_minus_query, int64_t nq,
                          const float* lse2, const float* d, float scale) {
  for (int64_t j = 0; j < nk; ++j)
    for (int64_t i = 0; i < kTq; ++i) {
      const bool valid = i >= j + key_minus_query && i < nq;
      const float p = valid ? exp2_scalar(s[j * kTq + i] - lse2[i]) : 0.0f;
      s[j * kTq + i] = p;
      ds[j * kTq + i] = p * (ds[j * kTq + i] - d[i]) * scale;
    }
}

#endif

// x . y as one FMA chain in the order gemm uses (c = 0, 1, ...). Computing D_i = dO_i . O_i this
// way makes dP_ij - D_i exactly 0 when O_i equals V_j (a query that sees only one key).
float dot_in_gemm_order(const float* x, const float* y, int64_t len) {
  float acc = 0;
  for (int64_t c = 0; c < len; ++c) acc = std::fma(x[c], y[c], acc);
  return acc;
}

// ---- geometry, RoPE and tile packing ----

struct Heads {
  int64_t B, T, NH, HS, HSp;
  int64_t KVH, G;  // key/value heads; query heads per key/value head (NH / KVH)
  int64_t row;     // qkv's row stride, (NH + 2 KVH) HS
  int64_t k_off;   // where a qkv row's keys start (NH HS), and its values (k_off + KVH HS)
  int64_t v_off;
  int64_t out_row;  // the row stride of out and dout, NH HS
  float scale;
  const float* rope_cos = nullptr;  // (T, HS/2), null without RoPE
  const float* rope_sin = nullptr;
  const int32_t* doc_start = nullptr;  // (B, T): each token's document start; null: causal

  Heads(const Tensor& qkv, int n_head, int n_kv_head) {
    B = qkv.dim(0);
    T = qkv.dim(1);
    NH = n_head;
    KVH = kv_heads(n_head, n_kv_head);
    G = NH / KVH;
    HS = qkv.dim(2) / (NH + 2 * KVH);
    HSp = padded(HS);
    row = qkv.dim(2);
    out_row = NH * HS;
    k_off = NH * HS;
    v_off = k_off + KVH * HS;
    scale = 1.0f / std::sqrt(static_cast<float>(HS));
  }
  // Element offsets of query head bh = b NH + hd (in qkv rows) and of key/value head
  // bkv = b KVH + j (its keys; its values are v_off - k_off further).
  int64_t q_offset(int64_t bh) const { return (bh / NH) * T * row + (bh % NH) * HS; }
  int64_t k_offset(int64_t bkv) const { return (bkv / KVH) * T * row + k_off + (bkv % KVH) * HS; }
  // transformers' repeat_kv: key/value head j serves query heads j G .. j G + G - 1.
  int64_t query_head(int64_t bkv, int64_t r) const {
    return (bkv / KVH) * NH + (bkv % KVH) * G + r;
  }
  int64_t kv_head_of(int64_t bh) const { return (bh / NH) * KVH + (bh % NH) / G; }
  // Documents: the first key row t of batch row b sees, and its RoPE position (t - that start).
  // Both are 0 and t without documents. doc_first is non-decreasing in t.
  int64_t doc_first(int64_t b, int64_t t) const { return doc_start ? doc_start[b * T + t] : 0; }
  int64_t rope_pos(int64_t b, int64_t t) const { return t - doc_first(b, t); }
};

// Fills the cos/sin table: angle(t, i) = t * inv_freq[i] in double, times yarn's attention
// factor (engine/core/ops/rope.h, with its scaling; the factor then scales the rotated q and k,
// and R^T in the backward by the same table is the gradient of that scaled rotation).
void fill_rope_table(float* cos_t, float* sin_t, int64_t T, int64_t HS, float theta,
                     const RopeScaling& scaling, int threads) {
  const int64_t half = HS / 2;
  const RopeAngles angles =  // once per call, not per position
      rope_angles(HS, static_cast<double>(theta), scaling);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t t = 0; t < T; ++t) angles.cos_sin(t, cos_t + t * half, sin_t + t * half);
}

// A row of one head's q or k, rotated with RoPE at position `pos` when enabled, times `mult`,
// into d[0..HS).
inline void load_row(float* d, const float* s, int64_t pos, const Heads& h, float mult) {
  if (!h.rope_cos) {
    for (int64_t c = 0; c < h.HS; ++c) d[c] = s[c] * mult;
    return;
  }
  const int64_t half = h.HS / 2;
  const float* cs = h.rope_cos + pos * half;
  const float* sn = h.rope_sin + pos * half;
  for (int64_t i = 0; i < half; ++i) {
    d[i] = (s[i] * cs[i] - s[i + half] * sn[i]) * mult;
    d[i + half] = (s[i] * sn[i] + s[i + half] * cs[i]) * mult;
  }
}

// A (n, HS) operand of rows [t0, t0+n) of batch row b's q or k (src: the head's row t0 = 0).
// Without RoPE the rows are used in place; with it they are rotated into `tile` (row stride HSp).
struct Rows {
  const float* p;
  int64_t ld;
};
Rows rotated_rows(float* tile, const float* src, int64_t b, int64_t t0, int64_t n, const Heads& h) {
  if (!h.rope_cos) return {src + t0 * h.row, h.row};
  for (int64_t r = 0; r < n; ++r)
    load_row(tile + r * h.HSp, src + (t0 + r) * h.row, h.rope_pos(b, t0 + r), h, 1);
  return {tile, h.HSp};
}

#if defined(__AVX2__) && defined(__FMA__)
// 8 rows x 8 columns of src (row stride ld), times mult, into tile[c * width + r]: 8 loads, an
// 8 x 8 transpose in registers, 8 stores. The same products as load_row's, so the same bits.
inline void transpose8x8_scaled(float* tile, int64_t width, const float* src, int64_t ld,
                                float mult) {
  const __m256 m = _mm256_set1_ps(mult);
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_mul_ps(_mm256_loadu_ps(src + i * ld), m);
  // Pairs, then quads, then halves: the standard 8 x 8 transpose of 24 shuffles.
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  const __m256 out[8] = {
      _mm256_permute2f128_ps(u0, u4, 0x20), _mm256_permute2f128_ps(u1, u5, 0x20),
      _mm256_permute2f128_ps(u2, u6, 0x20), _mm256_permute2f128_ps(u3, u7, 0x20),
      _mm256_permute2f128_ps(u0, u4, 0x31), _mm256_permute2f128_ps(u1, u5, 0x31),
      _mm256_permute2f128_ps(u2, u6, 0x31), _mm256_permute2f128_ps(u3, u7, 0x31)};
  for (int c = 0; c < 8; ++c) _mm256_storeu_ps(tile + c * width, out[c]);
}
#endif

// Transposed tile (HS, width) of rows [t0, t0+n), rotated and times `mult`; columns n..width
// are zero. With whole 8 x 8 blocks, the blocks are transposed in registers rather than element
// by element, a store each to another row of the tile; with RoPE each 8 rows are first rotated
// (and scaled) by load_row into a block on the stack and then transposed times 1 (exact): the
// same bits. Measured at GPT-2's shape (T = 1024, 12 heads of 64, 2 threads, Intel VM,
// 2026-12-02, 3 alternated pairs): the forward 168-170 -> 181-185 GFLOP/s, the backward 171-175
// -> 178-190; in GPT-2's step attention took 405 ms against 414-431 (2 pairs). With RoPE (the
// forward's Q^T, which went element by element before; SmolLM2-135M's shape, T = 512, 9 query
// heads over 3 key/value heads of 64, 2026-12-07): the forward 1.62-1.83 -> 1.58-1.73 ms a layer
// (best of 11 calls; 8 alternated pairs, each faster by 1-10%).
void load_transposed(float* tile, int64_t width, const float* src, int64_t b, int64_t t0, int64_t n,
                     const Heads& h, float mult, float* tmp) {
#if defined(__AVX2__) && defined(__FMA__)
  constexpr int64_t kMaxRotatedHS = 256;  // the stack block's width
  if (h.HS % 8 == 0 && n % 8 == 0 && (!h.rope_cos || h.HS <= kMaxRotatedHS)) {
    float rotated[8 * kMaxRotatedHS];
    for (int64_t r0 = 0; r0 < n; r0 += 8) {
      const float* rows = src + (t0 + r0) * h.row;
      int64_t ld = h.row;
      float m = mult;
      if (h.rope_cos) {
        for (int64_t i = 0; i < 8; ++i)
          load_row(rotated + i * h.HS, rows + i * h.row, h.rope_pos(b, t0 + r0 + i), h, mult);
        rows = rotated;
        ld = h.HS;
        m = 1.0f;
      }
      for (int64_t c0 = 0; c0 < h.HS; c0 += 8)
        transpose8x8_scaled(tile + c0 * width + r0, width, rows + c0, ld, m);
    }
    for (int64_t c = 0; c < h.HS; ++c)
      std::fill(tile + c * width + n, tile + (c + 1) * width, 0.0f);
    return;
  }
#endif
  for (int64_t r = 0; r < width; ++r) {
    if (r < n)
      load_row(tmp, src + (t0 + r) * h.row, h.rope_pos(b, t0 + r), h, mult);
    else
      std::fill(tmp, tmp + h.HS, 0.0f);
    for (int64_t c = 0; c < h.HS; ++c) tile[c * width + r] = tmp[c];
  }
}

// Per-thread tiles, carved from one block in a fixed order (a bump allocator).
// One thread's tile block, handed out piece by piece. The bound catches a carving order that
// outgrows the size formula of engine/core/cpu_workspace.h (debug and sanitizer builds).
struct Carve {
  float* p;
  float* end;
  float* take(int64_t n) {
    REMAT_DCHECK(p + n <= end, "attention: the tiles overrun the thread's workspace block");
    float* r = p;
    p += n;
    return r;
  }
};

// The workspace, sized by engine/core/cpu_workspace.h and shared by forward and backward:
// [rope cos | rope sin | per-thread tiles]. Each thread carves its block in the order the
// size formulas there list the pieces.
struct Workspace {
  float* base;
  int64_t tiles_offset;
  Carve thread_block(int tid, int64_t HS) const {
    float* begin = base + tiles_offset + tid * attention_thread_floats(HS);
    return {begin, begin + attention_thread_floats(HS)};
  }
};

Workspace make_workspace(const OpWorkspace& op_ws, Heads& h, int threads, float theta,
                         const RopeScaling& scaling) {
  const bool rope = theta > 0;
  REMAT_ASSERT(!rope || h.HS % 2 == 0, "attention: RoPE needs an even head size, got {}", h.HS);
  const Buffer& buf = op_ws.at("attn.workspace");
  // What the carving below uses, counted here rather than taken from the size rule, so that a
  // rule that forgets a piece fails here instead of corrupting the heap.
  const int64_t carved = (rope ? h.T * h.HS : 0) + threads * attention_thread_floats(h.HS);
  REMAT_ASSERT(buf.tensor().numel() >= carved,
               "attention: workspace of {} floats is smaller than the {} it carves",
               buf.tensor().numel(), carved);
  Workspace ws{buf.f32(), rope ? h.T * h.HS : 0};
  if (rope) {
    float* cos_t = ws.base;
    float* sin_t = cos_t + h.T * h.HS / 2;
    fill_rope_table(cos_t, sin_t, h.T, h.HS, theta, scaling, threads);
    h.rope_cos = cos_t;
    h.rope_sin = sin_t;
  }
  return ws;
}

// Rotates a gradient with respect to rotated q or k back to the unrotated input (R^T), at RoPE
// position `pos`.
void unrotate_row(float* d, int64_t pos, const Heads& h) {
  const int64_t half = h.HS / 2;
  const float* cs = h.rope_cos + pos * half;
  const float* sn = h.rope_sin + pos * half;
  for (int64_t i = 0; i < half; ++i) {
    const float a = d[i], b = d[i + half];
    d[i] = a * cs[i] + b * sn[i];
    d[i + half] = -a * sn[i] + b * cs[i];
  }
}

// Rotates every query and key head's rows of qkv in place with RoPE (load_row, as the forward's
// tiles rotate them). Each row is one task's, so the bits do not depend on the thread count.
void rotate_qk_in_place(float* qkv, const Heads& h, int threads) {
  const int64_t n_rows = h.B * h.T;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> tmp(static_cast<size_t>(h.HS));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < n_rows; ++r) {
      const int64_t pos = h.rope_pos(r / h.T, r % h.T);
      for (int64_t part = 0; part < 2; ++part)  // q, then k
        for (int64_t hd = 0; hd < (part == 0 ? h.NH : h.KVH); ++hd) {
          float* row = qkv + r * h.row + part * h.k_off + hd * h.HS;
          load_row(tmp.data(), row, pos, h, 1.0f);
          std::copy(tmp.begin(), tmp.end(), row);
        }
    }
  }
}

// Documents: in a transposed tile s of keys [j0, j0 + nk) (rows) and queries [i0, i0 + nq)
// (columns) of batch row b, the entries of keys before their query's document start become
// `value`. For key j0 + j those are the queries whose document starts after it: a suffix of the
// tile's columns, since starts do not decrease.
void mask_before_documents(float* s, int64_t nk, int64_t j0, int64_t b, int64_t i0, int64_t nq,
                           const Heads& h, float value) {
  if (h.doc_first(b, i0 + nq - 1) <= j0) return;  // every query's document starts by key j0
  const int32_t* first = h.doc_start + b * h.T + i0;
  for (int64_t j = 0; j < nk; ++j) {
    const int64_t from = std::upper_bound(first, first + nq, j0 + j) - first;
    std::fill(s + j * kTq + from, s + j * kTq + nq, value);
  }
}

// The same on row tiles p and ds (nq queries x kTk keys, the backward's per-head form), after the
// softmax step: the probabilities and score gradients of keys before a query's document start
// become 0, so that they add nothing to dV, dK and dQ.
void zero_rows_before_documents(float* p, float* ds, int64_t nq, int64_t j0, int64_t nk, int64_t b,
                                int64_t i0, const Heads& h) {
  if (h.doc_first(b, i0 + nq - 1) <= j0) return;
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t n = std::clamp<int64_t>(h.doc_first(b, i0 + i) - j0, 0, nk);
    std::fill(p + i * kTk, p + i * kTk + n, 0.0f);
    std::fill(ds + i * kTk, ds + i * kTk + n, 0.0f);
  }
}

}  // namespace

void CpuBackend::attention_forward_impl(const AttentionForwardArgs& a, const OpWorkspace& op_ws) {
  if (const AttentionChunks ch = attention_chunks(a.qkv, a.chunk_tokens); ch.chunked())
    return attention_forward_chunked(a, op_ws, ch);
  Heads h(a.qkv, a.n_head, a.n_kv_head);
  if (!a.doc_start.empty()) h.doc_start = a.doc_start.i32();
  Workspace ws = make_workspace(op_ws, h, threads_, a.rope_theta, a.rope_scaling);
  const float* qkv = a.qkv.f32();
  float* out = a.out.f32();
  float* lse = a.lse.f32();
  const int64_t BKV = h.B * h.KVH, n_qt = (h.T + kTq - 1) / kTq;

  // A task is a (batch, key/value head) and a group of up to kGroup units, a unit being one of
  // the head's G query heads on one query tile (query tiles ascending, the G heads of a tile
  // adjacent): each key tile is loaded (rotated, with RoPE) once for the group, and every unit
  // sees the same products in the same order as it would alone. Multi-head attention (G = 1)
  // groups adjacent query tiles of one head; grouped-query attention, query heads that share a
  // key/value head. Largest groups first, so the last tasks are short.
  constexpr int64_t kGroup = kAttnForwardGroup;
  const int64_t n_units = n_qt * h.G, n_groups = (n_units + kGroup - 1) / kGroup;

#pragma omp parallel num_threads(threads_)
  {
    Carve carve = ws.thread_block(omp_get_thread_num(), h.HS);
    float *qt_tile[kGroup], *acc[kGroup], *m[kGroup], *l[kGroup];
    for (int64_t g = 0; g < kGroup; ++g) {
      qt_tile[g] = carve.take(h.HSp * kTq);  // (HS, kTq) Q^T * scale * log2(e)
      acc[g] = carve.take(kTq * h.HSp);      // (kTq, HS) unnormalized output
      m[g] = carve.take(kTq);                // running max (base 2)
      l[g] = carve.take(kTq);                // running sum
    }
    float* k_tile = carve.take(kTk * h.HSp);  // (kTk, HS) rotated keys (RoPE only)
    float* s = carve.take(kTk * kTq);         // (kTk, kTq) S^T, then P^T
    float* corr = carve.take(kTq);            // rescale of this key tile
    float* tmp = carve.take(h.HSp);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < BKV * n_groups; ++task) {
      const int64_t group = n_groups - 1 - task / BKV, bkv = task % BKV;
      const float* keys = qkv + h.k_offset(bkv);
      const float* values = keys + (h.v_off - h.k_off);
      const int64_t u0 = group * kGroup, n_in = std::min(kGroup, n_units - u0);
      const int64_t b = bkv / h.KVH;
      int64_t i0[kGroup] = {}, nq[kGroup] = {}, bh[kGroup] = {};
      for (int64_t g = 0; g < n_in; ++g) {
        bh[g] = h.query_head(bkv, (u0 + g) % h.G);
        i0[g] = (u0 + g) / h.G * kTq;
        nq[g] = std::min(kTq, h.T - i0[g]);
        load_transposed(qt_tile[g], kTq, qkv + h.q_offset(bh[g]), b, i0[g], nq[g], h,
                        h.scale * kLog2e, tmp);
        std::fill(acc[g], acc[g] + nq[g] * h.HSp, 0.0f);
        std::fill(m[g], m[g] + kTq, kNegInf);
        std::fill(l[g], l[g] + kTq, 0.0f);
      }
      // Units ascend by query tile: the last one's ends the keys any unit sees, and the first
      // one's document start (the smallest, as starts do not decrease) begins them.
      const int64_t keys_end = i0[n_in - 1] + nq[n_in - 1];
      const int64_t keys_begin = h.doc_first(b, i0[0]) / kTk * kTk;
      for (int64_t j0 = keys_begin; j0 < keys_end; j0 += kTk) {
        const int64_t nk = std::min(kTk, h.T - j0);
        const Rows k = rotated_rows(k_tile, keys, b, j0, nk, h);
        for (int64_t g = 0; g < n_in; ++g) {
          if (j0 >= i0[g] + nq[g]) continue;               // above this query tile's diagonal
          if (j0 + nk <= h.doc_first(b, i0[g])) continue;  // before every query's document
          gemm<false>(nk, kTq, h.HS, k.p, k.ld, 1, qt_tile[g], kTq, s, kTq);  // S^T = K Q^T
          for (int64_t j = 0; j < nk; ++j)  // causal: query i sees key j when i0 + i >= j0 + j
            std::fill(s + j * kTq, s + j * kTq + std::clamp<int64_t>(j0 + j - i0[g], 0, kTq),
                      kNegInf);
          mask_before_documents(s, nk, j0, b, i0[g], nq[g], h, kNegInf);
          softmax_update_columns(s, nk, m[g], l[g], corr);
          for (int64_t i = 0; i < nq[g]; ++i)
            if (corr[i] != 1.0f)
              for (int64_t c = 0; c < h.HS; ++c) acc[g][i * h.HSp + c] *= corr[i];
          // acc += P V: P^T is s, so A(i, j) = s[j * kTq + i].
          gemm<true>(nq[g], h.HS, nk, s, 1, kTq, values + j0 * h.row, h.row, acc[g], h.HSp);
        }
      }
      for (int64_t g = 0; g < n_in; ++g)
        for (int64_t i = 0; i < nq[g]; ++i) {
          const int64_t hd = bh[g] % h.NH;
          float* o = out + (b * h.T + i0[g] + i) * h.out_row + hd * h.HS;
          const float inv = 1.0f / l[g][i];
          for (int64_t c = 0; c < h.HS; ++c) o[c] = acc[g][i * h.HSp + c] * inv;
          const double lse2 =
              static_cast<double>(m[g][i]) + std::log2(static_cast<double>(l[g][i]));
          lse[bh[g] * h.T + i0[g] + i] = static_cast<float>(lse2 * std::numbers::ln2);
        }
    }
  }
}

namespace {

// One thread's backward tiles, carved in the order engine/core/cpu_workspace.h sizes them. The
// query-tile pass reuses them under other names (see query_tile).
struct BackwardTiles {
  float *q_tile, *kt_tile, *vt_tile, *k_tile, *p, *ds, *dk, *dv, *tmp;
  BackwardTiles(Carve& carve, int64_t HSp) {
    q_tile = carve.take(kTq * HSp);   // (kTq, HS) rotated queries (RoPE only)
    kt_tile = carve.take(HSp * kTk);  // (HS, kTk) K^T * scale * log2(e)
    vt_tile = carve.take(HSp * kTk);  // (HS, kTk) V^T
    k_tile = carve.take(kTk * HSp);   // (kTk, HS) rotated keys (RoPE only)
    p = carve.take(kTq * kTk);        // (kTq, kTk) scores, then probabilities
    ds = carve.take(kTq * kTk);       // (kTq, kTk) dP, then dS * scale
    dk = carve.take(kTk * HSp);       // (kTk, HS) this key tile's dk
    dv = carve.take(kTk * HSp);       // (kTk, HS) and dv
    tmp = carve.take(HSp);
  }
};

// The backward of one call: dq, dk, dv of every head. Two schedules give the same bits:
//  - per head: one task owns a (batch, key/value head) with its G query heads and walks its key
//    tiles, each against the query tiles below it, adding dQ as it goes (no work is done twice);
//  - split: first one task per (key/value head, key tile) for dK and dV, then one per (query
//    head, query tile) for dQ, which recomputes S and dP transposed (S^T = K Q^T, as the forward
//    does). It runs two more tile GEMMs than the five of per head, but has B * NH * T / 64 tasks
//    instead of B * KVH, so a batch of one with fewer heads than cores still uses every core.
// Both sum every output element in the same order (keys ascending for dQ; for dK and dV the
// group's query heads ascending, each over its queries ascending) with the same FMA chains, so
// the choice, made from the thread count, changes no bit. A key tile's K^T and V^T are packed
// once and serve all G query heads of its key/value head.
struct AttentionBackward {
  Heads h;        // q and k: already rotated in place (rotate_qk_in_place), so no tables
  Heads unrot;    // the RoPE tables, to rotate dq and dk back (unrotate_row)
  Heads v_rows;   // V: not rotated
  Heads do_rows;  // dO: not rotated, row stride NH HS
  const float *qkv, *out, *dout, *lse;
  float* dqkv;
  bool rope;
  const float* delta = nullptr;  // D from attention_delta (then `out` is not read), or null

  // Query head bh = b NH + hd's rows; key/value head bkv = b KVH + j's keys and their gradients
  // (its values and theirs are v_off - k_off further).
  const float* head(int64_t bh) const { return qkv + h.q_offset(bh); }
  float* dhead(int64_t bh) const { return dqkv + h.q_offset(bh); }
  const float* kv_head(int64_t bkv) const { return qkv + h.k_offset(bkv); }
  float* dkv_head(int64_t bkv) const { return dqkv + h.k_offset(bkv); }
  int64_t out_offset(int64_t bh) const {
    return (bh / h.NH) * h.T * h.out_row + (bh % h.NH) * h.HS;
  }
  const float* dout_h(int64_t bh) const { return dout + out_offset(bh); }
  const float* out_h(int64_t bh) const { return out + out_offset(bh); }
  float d_of(int64_t bh, int64_t t) const {  // D_t = dO_t . O_t
    if (delta) return delta[bh * h.T + t];
    return dot_in_gemm_order(dout_h(bh) + t * h.out_row, out_h(bh) + t * h.out_row, h.HS);
  }

  // Key tile j0's K^T (scaled), V^T and rotated K rows into the tiles (batch row b).
  Rows load_key_tile(const float* kh, int64_t b, int64_t j0, int64_t nk, BackwardTiles& w) const {
    load_transposed(w.kt_tile, kTk, kh, b, j0, nk, h, h.scale * kLog2e, w.tmp);
    load_transposed(w.vt_tile, kTk, kh + (h.v_off - h.k_off), b, j0, nk, v_rows, 1.0f, w.tmp);
    return rotated_rows(w.k_tile, kh, b, j0, nk, h);
  }

  // S, dP and dS of query tile i0 against the loaded key tile j0 (row form); d[i]: D of row i0 + i.
  void scores_and_grad(const float* d, int64_t bh, int64_t i0, int64_t nq, int64_t j0, int64_t nk,
                       const Rows& q, BackwardTiles& w) const {
    gemm<false>(nq, kTk, h.HS, q.p, q.ld, 1, w.kt_tile, kTk, w.p, kTk);  // S = Q K^T
    gemm<false>(nq, kTk, h.HS, dout_h(bh) + i0 * h.out_row, h.out_row, 1, w.vt_tile, kTk, w.ds,
                kTk);  // dP = dO V^T
    const float* lse_h = lse + bh * h.T;
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t n_valid = std::clamp<int64_t>(i0 + i - j0 + 1, 0, nk);
      softmax_grad_row(w.p + i * kTk, w.ds + i * kTk, n_valid, lse_h[i0 + i] * kLog2e, d[i],
                       h.scale);
    }
    zero_rows_before_documents(w.p, w.ds, nq, j0, nk, bh / h.NH, i0, h);
  }

  // dK and dV of key/value head bkv's key tile j0 over the query tiles below it, for each of its
  // query heads in turn; their dQ too when `with_dq` (per head). D of row t is element 0 of the
  // query head's dq row t (split), or element r of dv row t for the group's r-th query head (per
  // head).
  void key_tile(int64_t bkv, int64_t j0, bool with_dq, BackwardTiles& w) const {
    float* dkh = dkv_head(bkv);
    const int64_t b = bkv / h.KVH, nk = std::min(kTk, h.T - j0);
    const Rows k = load_key_tile(kv_head(bkv), b, j0, nk, w);
    std::fill(w.dk, w.dk + nk * h.HSp, 0.0f);
    std::fill(w.dv, w.dv + nk * h.HSp, 0.0f);
    float d_rows[kTq];
    for (int64_t r = 0; r < h.G; ++r) {
      const int64_t bh = h.query_head(bkv, r);
      const float* hd = head(bh);
      float* dh = dhead(bh);
      const float* d = with_dq ? dkh + (h.v_off - h.k_off) + r : dh;
      for (int64_t i0 = j0 / kTq * kTq; i0 < h.T; i0 += kTq) {
        // Documents: this query tile and every later one start past this key tile's keys.
        if (h.doc_first(b, i0) >= j0 + nk) break;
        const int64_t nq = std::min(kTq, h.T - i0);
        for (int64_t i = 0; i < nq; ++i) d_rows[i] = d[(i0 + i) * h.row];
        const Rows q = rotated_rows(w.q_tile, hd, b, i0, nq, h);
        scores_and_grad(d_rows, bh, i0, nq, j0, nk, q, w);
        const float* do_tile = dout_h(bh) + i0 * h.out_row;
        gemm<true>(nk, h.HS, nq, w.p, 1, kTk, do_tile, h.out_row, w.dv, h.HSp);  // dV += P^T dO
        gemm<true>(nk, h.HS, nq, w.ds, 1, kTk, q.p, q.ld, w.dk, h.HSp);          // dK += dS^T Q
        if (with_dq)
          gemm<true>(nq, h.HS, nk, w.ds, kTk, 1, k.p, k.ld, dh + i0 * h.row, h.row);  // dQ += dS K
      }
    }
    for (int64_t j = 0; j < nk; ++j) {
      float* dk_row = dkh + (j0 + j) * h.row;
      float* dv_row = dk_row + (h.v_off - h.k_off);
      std::copy(w.dk + j * h.HSp, w.dk + j * h.HSp + h.HS, dk_row);
      std::copy(w.dv + j * h.HSp, w.dv + j * h.HSp + h.HS, dv_row);
      if (rope) unrotate_row(dk_row, h.rope_pos(b, j0 + j), unrot);
    }
  }

  // Per-head schedule. Until key tile j0 is written, element r of row t's dv holds D_t of the
  // group's r-th query head (G <= HS): tile j0 reads D of rows >= j0 only, then overwrites rows
  // j0 .. j0+nk-1, whose D no later tile reads.
  void per_head(int64_t bkv, BackwardTiles& w) const {
    float* dv = dkv_head(bkv) + (h.v_off - h.k_off);
    for (int64_t r = 0; r < h.G; ++r) {
      const int64_t bh = h.query_head(bkv, r);
      float* dh = dhead(bh);
      for (int64_t t = 0; t < h.T; ++t) {
        std::fill(dh + t * h.row, dh + t * h.row + h.HS, 0.0f);
        dv[t * h.row + r] = d_of(bh, t);
      }
    }
    for (int64_t j0 = 0; j0 < h.T; j0 += kTk) key_tile(bkv, j0, true, w);
    if (rope)
      for (int64_t r = 0; r < h.G; ++r) {
        float* dh = dhead(h.query_head(bkv, r));
        for (int64_t t = 0; t < h.T; ++t)
          unrotate_row(dh + t * h.row, h.rope_pos(bkv / h.KVH, t), unrot);
      }
  }

  // Split schedule, dQ of query tile i0, after every key tile of its head has been written:
  // element 0 of each row's dq holds D_t until this task reads it. Tiles reused: qt (Q^T) in
  // kt_tile, dot (dO^T) in vt_tile, scaled K rows in k_tile, K rows in q_tile, S^T in p, dP^T in
  // ds, per-column lse and D in dv.
  void query_tile(int64_t bh, int64_t i0, BackwardTiles& w) const {
    const float* hd = head(bh);
    const float* kh = kv_head(h.kv_head_of(bh));
    float* dh = dhead(bh);
    const int64_t b = bh / h.NH, nq = std::min(kTq, h.T - i0);
    float* lse2 = w.dv;
    float* d = w.dv + kTq;
    for (int64_t i = 0; i < kTq; ++i) {
      const bool row = i < nq;
      lse2[i] = row ? lse[bh * h.T + i0 + i] * kLog2e : 0.0f;
      d[i] = row ? dh[(i0 + i) * h.row] : 0.0f;
      if (row) std::fill(dh + (i0 + i) * h.row, dh + (i0 + i) * h.row + h.HS, 0.0f);
    }
    float* qt = w.kt_tile;
    float* dot = w.vt_tile;
    load_transposed(qt, kTq, hd, b, i0, nq, h, 1.0f, w.tmp);
    load_transposed(dot, kTq, dout_h(bh), b, i0, nq, do_rows, 1.0f, w.tmp);
    // Documents: no key before the tile's first document start is seen (the start of row i0).
    for (int64_t j0 = h.doc_first(b, i0) / kTk * kTk; j0 < i0 + nq; j0 += kTk) {
      const int64_t nk = std::min(kTk, h.T - j0);
      for (int64_t r = 0; r < nk; ++r)  // K * scale * log2(e), rotated, as key_tile's K^T
        load_row(w.k_tile + r * h.HSp, kh + (j0 + r) * h.row, h.rope_pos(b, j0 + r), h,
                 h.scale * kLog2e);
      const Rows k = rotated_rows(w.q_tile, kh, b, j0, nk, h);
      gemm<false>(nk, kTq, h.HS, w.k_tile, h.HSp, 1, qt, kTq, w.p, kTq);  // S^T = K Q^T
      gemm<false>(nk, kTq, h.HS, kh + (h.v_off - h.k_off) + j0 * h.row, h.row, 1, dot, kTq, w.ds,
                  kTq);  // dP^T = V dO^T
      softmax_grad_columns(w.p, w.ds, nk, j0 - i0, nq, lse2, d, h.scale);
      mask_before_documents(w.p, nk, j0, b, i0, nq, h, 0.0f);
      mask_before_documents(w.ds, nk, j0, b, i0, nq, h, 0.0f);
      gemm<true>(nq, h.HS, nk, w.ds, 1, kTq, k.p, k.ld, dh + i0 * h.row, h.row);  // dQ += dS K
    }
    if (rope)
      for (int64_t i = 0; i < nq; ++i)
        unrotate_row(dh + (i0 + i) * h.row, h.rope_pos(b, i0 + i), unrot);
  }
};

}  // namespace

void CpuBackend::attention_backward_impl(const AttentionBackwardArgs& a, const OpWorkspace& op_ws) {
  if (const AttentionChunks ch = attention_chunks(a.qkv, a.chunk_tokens); ch.chunked())
    return attention_backward_chunked(a, op_ws, ch);
  Heads h(a.qkv, a.n_head, a.n_kv_head);
  if (!a.doc_start.empty()) h.doc_start = a.doc_start.i32();
  Workspace ws = make_workspace(op_ws, h, threads_, a.rope_theta, a.rope_scaling);
  static_assert(kTq == kTk, "the query-tile pass reuses key tiles as query tiles");
  // RoPE: q and k are rotated in place once (qkv is CLOBBERED, engine/core/ops/attention.h) instead
  // of once per tile pair (each query tile's rows once per key tile below it, and each key tile's
  // once per query tile): the tiles below then read rotated rows like unrotated ones.
  Heads rows = h;
  if (a.rope_theta > 0) {
    rotate_qk_in_place(a.qkv.f32(), h, threads_);
    rows.rope_cos = rows.rope_sin = nullptr;
  }
  AttentionBackward bw{rows,         h,
                       rows,         rows,
                       a.qkv.f32(),  a.out.empty() ? nullptr : a.out.f32(),
                       a.dout.f32(), a.lse.f32(),
                       a.dqkv.f32(), a.rope_theta > 0};
  if (!a.delta.empty()) bw.delta = a.delta.f32();
  bw.v_rows.rope_cos = bw.v_rows.rope_sin = nullptr;
  bw.do_rows.rope_cos = bw.do_rows.rope_sin = nullptr;
  bw.do_rows.row = h.out_row;
  const int64_t BKV = h.B * h.KVH, n_tiles = (h.T + kTk - 1) / kTk;
  // The split schedule runs 7 tile GEMMs where per head runs 5 (measured ~1.4-1.7x the work), so
  // it takes only the key/value heads left over after whole rounds of one per thread, and only
  // when they would leave at least a third of the threads idle in a round of their own: with 3
  // key/value heads on 2 threads, 2 run per head and the third split over both (SmolLM2's
  // backward at 512 tokens ~10% faster than a second round per head); a batch of one with fewer
  // heads than cores runs split whole. It also takes every group whose D do not fit in a dv row
  // (more query heads per key/value head than the head size), since it keeps D in the rows of dq.
  const int64_t left_over = BKV % threads_;
  const int64_t first_split = h.G > h.HS                      ? 0
                              : 3 * left_over <= 2 * threads_ ? BKV - left_over
                                                              : BKV;
  const int64_t split_kv = BKV - first_split, split_q = split_kv * h.G;
  // The i-th query head of the split key/value heads.
  auto split_q_head = [&](int64_t i) { return h.query_head(first_split + i / h.G, i % h.G); };

#pragma omp parallel num_threads(threads_)
  {
    Carve carve = ws.thread_block(omp_get_thread_num(), h.HS);
    BackwardTiles w(carve, h.HSp);
    if (split_kv > 0) {
      // D_t into element 0 of row t's dq, for both passes (the dq rows are zeroed later).
#pragma omp for schedule(static)
      for (int64_t r = 0; r < split_q * h.T; ++r) {
        const int64_t bh = split_q_head(r / h.T);
        bw.dhead(bh)[(r % h.T) * h.row] = bw.d_of(bh, r % h.T);
      }
    }
    // Per head, then (a thread free) the split heads: they share no head.
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t bkv = 0; bkv < first_split; ++bkv) bw.per_head(bkv, w);
    if (split_kv > 0) {
      // Key tiles: the lowest first (they see the most query tiles).
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < split_kv * n_tiles; ++task)
        bw.key_tile(first_split + task % split_kv, (task / split_kv) * kTk, false, w);
        // Query tiles: the highest first (they see the most key tiles).
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < split_q * n_tiles; ++task)
        bw.query_tile(split_q_head(task % split_q), (n_tiles - 1 - task / split_q) * kTq, w);
    }
  }
}

// The same dot product, in the same order, as the backward's own D (d_of without delta): a
// backward given this delta computes bit for bit what it computes from O.
void CpuBackend::attention_delta_impl(const AttentionDeltaArgs& a) {
  const int64_t B = a.dout.dim(0), T = a.dout.dim(1), C = a.dout.dim(2), NH = a.n_head;
  const int64_t HS = C / NH;
  const float* dout = a.dout.f32();
  const float* out = a.out.f32();
  float* delta = a.delta.f32();
#pragma omp parallel for schedule(static) num_threads(threads_)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t base = (bh / NH) * T * C + (bh % NH) * HS;
    for (int64_t t = 0; t < T; ++t)
      delta[bh * T + t] = dot_in_gemm_order(dout + base + t * C, out + base + t * C, HS);
  }
}

}  // namespace remat::cpu
