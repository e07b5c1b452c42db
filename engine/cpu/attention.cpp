// CPU causal self-attention with the flash contract (Dao et al. 2022): tiles of queries against
// tiles of keys with an online softmax; the forward saves only the output and the per-row
// log-sum-exp; the backward recomputes each score tile from Q, K and the log-sum-exp, with
// D_i = rowsum(dO_i * O_i). Tiles above the diagonal are skipped. No T x T matrix exists.
// Optional RoPE (half-split / GPT-NeoX layout) rotates q and k as tiles are loaded.
//
// Thread mapping: forward, one (batch, head, query tile) per task; backward, one (batch, head)
// per task, which owns that head's dq, dk, dv (so no atomics and a fixed summation order).
// Inner loops use `omp simd` reductions: vectorized, and the same order on every run.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/cpu/cpu_backend.h"

namespace remat::cpu {
namespace {

constexpr int64_t kTq = kAttnTileQ;
constexpr int64_t kTk = kAttnTileK;
static_assert(kTq == kTk, "diagonal handling assumes square tiles");

int64_t per_thread_floats(int64_t HS) { return 3 * kTq * HS + kTk * HS + 2 * kTq * kTk + 2 * kTq; }

// Geometry of one attention call, and the pointers every loop needs.
struct Heads {
  int64_t B, T, C, NH, HS, row;  // row: qkv row stride (3C)
  float scale;
  const float* rope_cos = nullptr;  // (T, HS/2), null without RoPE
  const float* rope_sin = nullptr;

  Heads(const Tensor& qkv, int n_head) {
    B = qkv.dim(0);
    T = qkv.dim(1);
    C = qkv.dim(2) / 3;
    NH = n_head;
    HS = C / NH;
    row = 3 * C;
    scale = 1.0f / std::sqrt(static_cast<float>(HS));
  }
};

// Fills the cos/sin table: angle(t, i) = t * theta^(-2i/HS), computed in double because t * freq
// reaches 1e6 at long context.
void fill_rope_table(float* cos_t, float* sin_t, int64_t T, int64_t HS, float theta) {
  const int64_t half = HS / 2;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double freq = std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) /
                                                                   static_cast<double>(HS));
      const double ang = static_cast<double>(t) * freq;
      cos_t[t * half + i] = static_cast<float>(std::cos(ang));
      sin_t[t * half + i] = static_cast<float>(std::sin(ang));
    }
  }
}

// Copies rows [t0, t0+n) of one head's q or k into a dense (n, HS) tile, rotating with RoPE.
void load_tile(float* tile, const float* src, int64_t t0, int64_t n, const Heads& h) {
  const int64_t half = h.HS / 2;
  for (int64_t r = 0; r < n; ++r) {
    const float* s = src + (t0 + r) * h.row;
    float* d = tile + r * h.HS;
    if (!h.rope_cos) {
      for (int64_t c = 0; c < h.HS; ++c) d[c] = s[c];
      continue;
    }
    const float* cs = h.rope_cos + (t0 + r) * half;
    const float* sn = h.rope_sin + (t0 + r) * half;
    for (int64_t i = 0; i < half; ++i) {
      d[i] = s[i] * cs[i] - s[i + half] * sn[i];
      d[i + half] = s[i] * sn[i] + s[i + half] * cs[i];
    }
  }
}

// Rotates a gradient with respect to rotated q or k back to the unrotated input (R^T).
void unrotate_rows(float* base, int64_t T, const Heads& h) {
  const int64_t half = h.HS / 2;
  for (int64_t t = 0; t < T; ++t) {
    float* d = base + t * h.row;
    const float* cs = h.rope_cos + t * half;
    const float* sn = h.rope_sin + t * half;
    for (int64_t i = 0; i < half; ++i) {
      const float a = d[i], b = d[i + half];
      d[i] = a * cs[i] + b * sn[i];
      d[i + half] = -a * sn[i] + b * cs[i];
    }
  }
}

float dot(const float* a, const float* b, int64_t n) {
  float acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

void axpy(float* y, float alpha, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Workspace layout shared by forward and backward: [rope cos | rope sin | per-thread tiles].
struct Workspace {
  Buffer buf;
  float* thread_base(int tid, int64_t HS, int64_t T, bool rope) const {
    return buf.f32() + (rope ? T * HS : 0) + tid * per_thread_floats(HS);
  }
};

}  // namespace

int64_t attention_workspace_floats(int64_t T, int64_t HS, int threads, bool use_rope) {
  return (use_rope ? T * HS : 0) + static_cast<int64_t>(threads) * per_thread_floats(HS);
}

static Workspace make_workspace(MemoryPool& pool, Heads& h, int threads, float theta) {
  const bool rope = theta > 0;
  Workspace ws{pool.allocate({attention_workspace_floats(h.T, h.HS, threads, rope)}, DType::F32,
                             MemCategory::Workspace, "attn.workspace")};
  if (rope) {
    float* cos_t = ws.buf.f32();
    float* sin_t = cos_t + h.T * h.HS / 2;
    fill_rope_table(cos_t, sin_t, h.T, h.HS, theta);
    h.rope_cos = cos_t;
    h.rope_sin = sin_t;
  }
  return ws;
}

void CpuBackend::attention_forward_impl(const AttentionForwardArgs& a) {
  Heads h(a.qkv, a.n_head);
  Workspace ws = make_workspace(pool(), h, threads_, a.rope_theta);
  const bool rope = a.rope_theta > 0;
  const float* qkv = a.qkv.f32();
  float* out = a.out.f32();
  float* lse = a.lse.f32();
  const int64_t n_qt = (h.T + kTq - 1) / kTq;

#pragma omp parallel
  {
    float* base = ws.thread_base(omp_get_thread_num(), h.HS, h.T, rope);
    float* q = base;               // (kTq, HS)
    float* k = q + kTq * h.HS;     // (kTk, HS)
    float* acc = k + kTk * h.HS;   // (kTq, HS)
    float* s = acc + kTq * h.HS;   // (kTq, kTk)
    float* m = s + 2 * kTq * kTk;  // (kTq) running max
    float* l = m + kTq;            // (kTq) running sum
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t bh = 0; bh < h.B * h.NH; ++bh) {
      for (int64_t qt = 0; qt < n_qt; ++qt) {
        const int64_t b = bh / h.NH, hd = bh % h.NH;
        const float* head = qkv + b * h.T * h.row + hd * h.HS;
        const int64_t i0 = qt * kTq, nq = std::min(kTq, h.T - i0);
        load_tile(q, head, i0, nq, h);
        std::fill(acc, acc + nq * h.HS, 0.0f);
        std::fill(m, m + nq, -std::numeric_limits<float>::infinity());
        std::fill(l, l + nq, 0.0f);
        for (int64_t kt = 0; kt <= qt; ++kt) {
          const int64_t j0 = kt * kTk, nk = std::min(kTk, h.T - j0);
          load_tile(k, head + h.C, j0, nk, h);
          const float* v = head + 2 * h.C + j0 * h.row;
          for (int64_t i = 0; i < nq; ++i) {
            const int64_t jmax = std::min(nk, i0 + i - j0 + 1);  // causal: key <= query
            float* si = s + i * kTk;
            float row_max = m[i];
            for (int64_t j = 0; j < jmax; ++j) {
              si[j] = dot(q + i * h.HS, k + j * h.HS, h.HS) * h.scale;
              row_max = std::max(row_max, si[j]);
            }
            const float corr = std::exp(m[i] - row_max);  // rescale what was summed so far
            float* ai = acc + i * h.HS;
            float sum = l[i] * corr;
            for (int64_t c = 0; c < h.HS; ++c) ai[c] *= corr;
            for (int64_t j = 0; j < jmax; ++j) {
              const float p = std::exp(si[j] - row_max);
              sum += p;
              axpy(ai, p, v + j * h.row, h.HS);
            }
            m[i] = row_max;
            l[i] = sum;
          }
        }
        for (int64_t i = 0; i < nq; ++i) {
          float* o = out + (b * h.T + i0 + i) * h.C + hd * h.HS;
          const float inv = 1.0f / l[i];
          for (int64_t c = 0; c < h.HS; ++c) o[c] = acc[i * h.HS + c] * inv;
          lse[(b * h.NH + hd) * h.T + i0 + i] = m[i] + std::log(l[i]);
        }
      }
    }
  }
}

void CpuBackend::attention_backward_impl(const AttentionBackwardArgs& a) {
  Heads h(a.qkv, a.n_head);
  Workspace ws = make_workspace(pool(), h, threads_, a.rope_theta);
  const bool rope = a.rope_theta > 0;
  const float* qkv = a.qkv.f32();
  const float* out = a.out.f32();
  const float* dout = a.dout.f32();
  const float* lse = a.lse.f32();
  float* dqkv = a.dqkv.f32();
  const int64_t n_t = (h.T + kTq - 1) / kTq;

#pragma omp parallel
  {
    float* base = ws.thread_base(omp_get_thread_num(), h.HS, h.T, rope);
    float* q = base;              // (kTq, HS) rotated queries
    float* k = q + kTq * h.HS;    // (kTk, HS) rotated keys
    float* p = k + kTk * h.HS + kTq * h.HS;  // (kTq, kTk) probabilities
    float* ds = p + kTq * kTk;    // (kTq, kTk) score gradients
    float* dd = ds + kTq * kTk;   // (kTq) D_i = dO_i . O_i
#pragma omp for schedule(dynamic)
    for (int64_t bh = 0; bh < h.B * h.NH; ++bh) {
      const int64_t b = bh / h.NH, hd = bh % h.NH;
      const float* head = qkv + b * h.T * h.row + hd * h.HS;
      float* dhead = dqkv + b * h.T * h.row + hd * h.HS;
      const float* lse_h = lse + (b * h.NH + hd) * h.T;
      for (int64_t t = 0; t < h.T; ++t)
        for (int part = 0; part < 3; ++part)
          std::fill(dhead + t * h.row + part * h.C, dhead + t * h.row + part * h.C + h.HS, 0.0f);
      for (int64_t kt = 0; kt < n_t; ++kt) {
        const int64_t j0 = kt * kTk, nk = std::min(kTk, h.T - j0);
        load_tile(k, head + h.C, j0, nk, h);
        const float* v = head + 2 * h.C + j0 * h.row;
        float* dk = dhead + h.C + j0 * h.row;
        float* dv = dhead + 2 * h.C + j0 * h.row;
        for (int64_t qt = kt; qt < n_t; ++qt) {
          const int64_t i0 = qt * kTq, nq = std::min(kTq, h.T - i0);
          load_tile(q, head, i0, nq, h);
          for (int64_t i = 0; i < nq; ++i) {
            const float* o_i = out + (b * h.T + i0 + i) * h.C + hd * h.HS;
            const float* do_i = dout + (b * h.T + i0 + i) * h.C + hd * h.HS;
            dd[i] = dot(do_i, o_i, h.HS);
            const int64_t jmax = std::min(nk, i0 + i - j0 + 1);
            for (int64_t j = 0; j < jmax; ++j) {
              const float sc = dot(q + i * h.HS, k + j * h.HS, h.HS) * h.scale;
              p[i * kTk + j] = std::exp(sc - lse_h[i0 + i]);
              const float dp = dot(do_i, v + j * h.row, h.HS);
              ds[i * kTk + j] = p[i * kTk + j] * (dp - dd[i]);
            }
          }
          for (int64_t i = 0; i < nq; ++i) {
            const float* do_i = dout + (b * h.T + i0 + i) * h.C + hd * h.HS;
            float* dq_i = dhead + (i0 + i) * h.row;
            const int64_t jmax = std::min(nk, i0 + i - j0 + 1);
            for (int64_t j = 0; j < jmax; ++j) {
              axpy(dv + j * h.row, p[i * kTk + j], do_i, h.HS);
              axpy(dq_i, ds[i * kTk + j] * h.scale, k + j * h.HS, h.HS);
              axpy(dk + j * h.row, ds[i * kTk + j] * h.scale, q + i * h.HS, h.HS);
            }
          }
        }
      }
      if (rope) {
        unrotate_rows(dhead, h.T, h);
        unrotate_rows(dhead + h.C, h.T, h);
      }
    }
  }
}

}  // namespace remat::cpu
