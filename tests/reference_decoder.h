// A deliberately naive double-precision reference of the decoder models, GPT and the Llama family
// as options of one model, and of the tutorial MLP: loss and every parameter gradient, written
// from the formulas with plain loops. It shares no code with the kernels, the layers or the
// executor: no tiles, no online softmax, no fused loss, no BLAS. Attention forms the full T x T
// probability matrix with grouped heads indexed directly, RoPE rotates from its definition, llama3
// scaling is transcribed from transformers' _compute_llama3_parameters (not taken from
// engine/core/ops/rope.h), and the LM head forms all N x V logits. A bug that the model's forward
// and backward share (a causal mask off by one, a RoPE frequency off by 2x, a key/value head
// serving the wrong query heads, q/k norm after RoPE) still shows up as a difference against this
// independent statement of the model (tests/test_reference.cpp).
//
// Model (matrices (out, in), y = x W^T (+ b)):
//   x0[b,t] = wte[tok[b,t]] (+ wpe[pos[b,t]] with learned positions)
//   block:   h = Norm1(x); qkv = h Wqkv^T (+ bqkv), rows q (NH HS) | k (KVH HS) | v (KVH HS);
//            with qk_norm every q and k head is RMS-normed over its HS dims (weights q_norm,
//            k_norm) BEFORE RoPE; with RoPE q and k rotated (rotate_half: dim i pairs with
//            i + HS/2, angle pos[b,t] * inv_freq[i]); query head h reads key/value head
//            h / (NH / KVH); a = causal softmax(q k^T / sqrt(HS)) v; res = x + a Wo^T (+ bo);
//            y = res + MLP(Norm2(res)), MLP = gelu(n Wfc^T + bfc) Wproj^T + bproj (GPT) or
//            (silu(n Wg^T) * (n Wu^T)) Wd^T (SwiGLU)
//   head:    logits = Normf(x_L) Wh^T, Wh = wte (tied) or lm_head; loss = mean over the B*T rows
//            of logsumexp(logits) - logit[target]
//   LayerNorm: w * (x - mean) / sqrt(var + eps) + b, biased variance. RMSNorm: w * (x /
//   sqrt(mean(x^2) + eps)). GELU: the tanh approximation.
// The tutorial MLP: per block y = relu(x W^T + b); loss = mean over rows of sum_j (x_L -
// target)^2 / D.
// GPT (model.kind = "gpt") is LayerNorm, GELU, biases on every Linear, multi-head, tied head,
// learned or RoPE positions; the Llama family is RMSNorm, SwiGLU, RoPE, with the options below.
//
// Where the next capabilities go, each in one place: what a token's position is, which keys a
// query sees and how much a target weighs in the loss (position, attends, loss_weight: packed
// documents); every Linear passes through linear / linear_back (adapters); the rotary
// frequencies come from inv_freq (RoPE scaling types).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

namespace remat::ref {

using Vec = std::vector<double>;
/// Parameters or gradients by their checkpoint names ("blocks.0.attn.qkv.weight"), row-major.
using Tensors = std::map<std::string, Vec>;

enum class Positions { Learned, Rope };
enum class Norm { Layer, Rms };
enum class Mlp { Gelu, SwiGlu };

/// transformers' rope_scaling: none, or {"rope_type": "llama3", ...}.
struct RopeScaling {
  enum class Kind { None, Llama3 } kind = Kind::None;
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_context = 8192;  // original_max_position_embeddings
};

struct DecoderShape {
  int64_t B = 1, T = 1, C = 1, NH = 1, KVH = 1, HS = 1, FF = 1, V = 1, L = 1;
  int64_t n_ctx = 1;  // rows of the learned position table
  Positions positions = Positions::Rope;
  Norm norm = Norm::Rms;
  Mlp mlp = Mlp::SwiGlu;
  bool bias = false;      // a bias on every Linear (GPT-2); LayerNorm always has one
  bool qkv_bias = false;  // a bias on the qkv Linear alone (Qwen2)
  bool qk_norm = false;   // per-head RMSNorm of q and k (Qwen3)
  bool tied = true;       // the LM head is wte
  double rope_theta = 10000.0, norm_eps = 1e-5;
  RopeScaling scaling;
  int64_t qkv_width() const { return (NH + 2 * KVH) * HS; }
};

/// GPT-2's block on `s`'s sizes: LayerNorm, GELU MLP, biases everywhere, multi-head attention
/// (HS = C / NH), tied head; positions stay as `s` has them.
inline DecoderShape gpt_layout(DecoderShape s) {
  s.norm = Norm::Layer;
  s.mlp = Mlp::Gelu;
  s.bias = true;
  s.qkv_bias = s.qk_norm = false;
  s.tied = true;
  s.KVH = s.NH;
  s.HS = s.C / s.NH;
  s.norm_eps = 1e-5;
  return s;
}

/// The HS / 2 rotary inverse frequencies, written as transformers computes them: the default
/// 1 / theta^(2i / HS), then llama3's two torch.where passes (long wavelengths divided by factor,
/// then the medium band, neither short nor long, replaced by the blend of the two).
inline Vec inv_freq(const DecoderShape& s) {
  const int64_t half = s.HS / 2;
  Vec out(static_cast<size_t>(half));
  const RopeScaling& r = s.scaling;
  const double low_freq_wavelen = r.original_context / r.low_freq_factor;
  const double high_freq_wavelen = r.original_context / r.high_freq_factor;
  for (int64_t i = 0; i < half; ++i) {
    const double inv =
        1.0 / std::pow(s.rope_theta, static_cast<double>(2 * i) / static_cast<double>(s.HS));
    if (r.kind == RopeScaling::Kind::None) {
      out[static_cast<size_t>(i)] = inv;
      continue;
    }
    const double wavelen = 2 * std::numbers::pi / inv;
    const double inv_llama = wavelen > low_freq_wavelen ? inv / r.factor : inv;
    const double smooth = (r.original_context / wavelen - r.low_freq_factor) /
                          (r.high_freq_factor - r.low_freq_factor);
    const double smoothed = (1 - smooth) * inv_llama / r.factor + smooth * inv_llama;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    out[static_cast<size_t>(i)] = medium ? smoothed : inv_llama;
  }
  return out;
}

/// The norms' names in remat-train's checkpoints: the GPT block's LayerNorms are ln1, ln2, lnf,
/// the Llama block's RMSNorms norm1, norm2, normf. `which`: 1, 2, or 0 for the final one.
inline std::string norm_name(const DecoderShape& s, int which) {
  const std::string stem = s.norm == Norm::Layer ? "ln" : "norm";
  return which == 0 ? stem + "f" : stem + std::to_string(which);
}

/// Every parameter of a model of shape s and its number of values, in remat-train's names.
inline std::vector<std::pair<std::string, int64_t>> param_sizes(const DecoderShape& s) {
  std::vector<std::pair<std::string, int64_t>> out{{"wte", s.V * s.C}};
  if (s.positions == Positions::Learned) out.emplace_back("wpe", s.n_ctx * s.C);
  auto norm = [&](const std::string& name) {
    out.emplace_back(name + ".weight", s.C);
    if (s.norm == Norm::Layer) out.emplace_back(name + ".bias", s.C);
  };
  auto linear = [&](const std::string& name, int64_t in, int64_t outs, bool bias) {
    out.emplace_back(name + ".weight", outs * in);
    if (bias) out.emplace_back(name + ".bias", outs);
  };
  for (int64_t l = 0; l < s.L; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    norm(p + norm_name(s, 1));
    linear(p + "attn.qkv", s.C, s.qkv_width(), s.bias || s.qkv_bias);
    if (s.qk_norm) {
      out.emplace_back(p + "attn.q_norm.weight", s.HS);
      out.emplace_back(p + "attn.k_norm.weight", s.HS);
    }
    linear(p + "attn.proj", s.NH * s.HS, s.C, s.bias);
    norm(p + norm_name(s, 2));
    if (s.mlp == Mlp::Gelu) {
      linear(p + "mlp.fc", s.C, s.FF, s.bias);
      linear(p + "mlp.proj", s.FF, s.C, s.bias);
    } else {
      linear(p + "mlp.gate", s.C, s.FF, s.bias);
      linear(p + "mlp.up", s.C, s.FF, s.bias);
      linear(p + "mlp.down", s.FF, s.C, s.bias);
    }
  }
  norm(norm_name(s, 0));
  if (!s.tied) out.emplace_back("lm_head.weight", s.V * s.C);
  return out;
}

// ---- LayerNorm and RMSNorm, one row ----

/// One row's statistics: LayerNorm's mean (0 for RMSNorm) and rstd.
struct NormStats {
  double mean = 0, rstd = 0;
};

/// One row of n values: y = w xhat (+ b), xhat = (x - mean) rstd (LayerNorm) or x rstd
/// (RMSNorm), rstd = 1 / sqrt(var + eps) or 1 / sqrt(mean(x^2) + eps). Also the op tests'
/// reference (tests/ops/norm_call.h).
inline NormStats norm_row(Norm kind, double* y, double* xhat, const double* x, const double* w,
                          const double* b, int64_t n, double eps) {
  double mean = 0;
  if (kind == Norm::Layer) {
    for (int64_t i = 0; i < n; ++i) mean += x[i];
    mean /= static_cast<double>(n);
  }
  double var = 0;
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  const double rstd = 1.0 / std::sqrt(var / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) {
    xhat[i] = (x[i] - mean) * rstd;
    y[i] = xhat[i] * w[i] + (b ? b[i] : 0.0);
  }
  return {mean, rstd};
}

/// Its backward, derived per row with g = dy w:
///   LayerNorm: dx = rstd (g - mean(g) - xhat mean(g xhat));  RMSNorm: dx = rstd (g - xhat
///   mean(g xhat)) (no mean was subtracted); dw += dy xhat, db += dy (b and db: LayerNorm's).
inline void norm_row_back(Norm kind, double* dx, double* dw, double* db, const double* dy,
                          const double* xhat, const double* w, double rstd, int64_t n) {
  double m1 = 0, m2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = dy[i] * w[i];
    m1 += g;
    m2 += g * xhat[i];
    dw[i] += dy[i] * xhat[i];
    if (db) db[i] += dy[i];
  }
  m1 = kind == Norm::Layer ? m1 / static_cast<double>(n) : 0.0;
  m2 /= static_cast<double>(n);
  for (int64_t i = 0; i < n; ++i) dx[i] = rstd * (dy[i] * w[i] - m1 - xhat[i] * m2);
}

namespace detail {

inline size_t ix(int64_t i) {
  return static_cast<size_t>(i);
}

// ---- the token layout: every row is one sequence ----

/// The position of token t of row b (RoPE's angle, the learned table's row): its index in the
/// row.
inline int64_t position(int64_t /*b*/, int64_t t) {
  return t;
}

/// Whether query i of row b attends to key j of the same row: causal over the whole row.
inline bool attends(int64_t /*b*/, int64_t i, int64_t j) {
  return j <= i;
}

/// The weight of token row n's target in the mean loss: every target counts once.
inline double loss_weight(int64_t /*n*/) {
  return 1.0;
}

// ---- Linear, by the name of its parameters ("blocks.0.attn.qkv") ----

// y (N, OUT) = x (N, IN) W^T (+ b), IN and OUT from the sizes of x and W.
inline Vec linear(const Tensors& P, const std::string& name, const Vec& x, int64_t N, bool bias) {
  const Vec& W = P.at(name + ".weight");
  const int64_t IN = static_cast<int64_t>(x.size()) / N;
  const int64_t OUT = static_cast<int64_t>(W.size()) / IN;
  const Vec* b = bias ? &P.at(name + ".bias") : nullptr;
  Vec y(ix(N * OUT));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OUT; ++o) {
      double s = b ? (*b)[ix(o)] : 0.0;
      for (int64_t i = 0; i < IN; ++i) s += x[ix(n * IN + i)] * W[ix(o * IN + i)];
      y[ix(n * OUT + o)] = s;
    }
  return y;
}

// Given dy (N, OUT): dW += dy^T x, db += sum dy, returns dx = dy W.
inline Vec linear_back(const Tensors& P, Tensors& G, const std::string& name, const Vec& dy,
                       const Vec& x, int64_t N, bool bias) {
  const Vec& W = P.at(name + ".weight");
  Vec& dW = G.at(name + ".weight");
  Vec* db = bias ? &G.at(name + ".bias") : nullptr;
  const int64_t IN = static_cast<int64_t>(x.size()) / N;
  const int64_t OUT = static_cast<int64_t>(W.size()) / IN;
  Vec dx(ix(N * IN), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OUT; ++o) {
      const double g = dy[ix(n * OUT + o)];
      if (db) (*db)[ix(o)] += g;
      for (int64_t i = 0; i < IN; ++i) {
        dW[ix(o * IN + i)] += g * x[ix(n * IN + i)];
        dx[ix(n * IN + i)] += g * W[ix(o * IN + i)];
      }
    }
  return dx;
}

struct NormCache {
  Vec xhat, rstd;
};

// The model's norm `name` over N rows of C.
inline Vec norm(const DecoderShape& s, const Tensors& P, const std::string& name, const Vec& x,
                int64_t N, int64_t C, NormCache& c) {
  const double* w = P.at(name + ".weight").data();
  const double* b = s.norm == Norm::Layer ? P.at(name + ".bias").data() : nullptr;
  Vec y(x.size());
  c.xhat.assign(x.size(), 0.0);
  c.rstd.assign(ix(N), 0.0);
  for (int64_t n = 0; n < N; ++n)
    c.rstd[ix(n)] =
        norm_row(s.norm, &y[ix(n * C)], &c.xhat[ix(n * C)], &x[ix(n * C)], w, b, C, s.norm_eps)
            .rstd;
  return y;
}

inline Vec norm_back(const DecoderShape& s, const Tensors& P, Tensors& G, const std::string& name,
                     const Vec& dy, const NormCache& c, int64_t N, int64_t C) {
  const double* w = P.at(name + ".weight").data();
  double* dw = G.at(name + ".weight").data();
  double* db = s.norm == Norm::Layer ? G.at(name + ".bias").data() : nullptr;
  Vec dx(dy.size());
  for (int64_t n = 0; n < N; ++n)
    norm_row_back(s.norm, &dx[ix(n * C)], dw, db, &dy[ix(n * C)], &c.xhat[ix(n * C)], w,
                  c.rstd[ix(n)], C);
  return dx;
}

// ---- activations ----

inline double gelu(double x) {
  const double s = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
}

inline double gelu_grad(double x) {
  const double s = std::sqrt(2.0 / std::numbers::pi);
  const double th = std::tanh(s * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

inline double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// Rotate-half RoPE of one head vector at position t; inverse rotates by -angle (R^T, the
// gradient map of the rotation).
inline void rotate(double* v, const Vec& freq, int64_t HS, int64_t t, bool inverse) {
  const int64_t half = HS / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double ang = static_cast<double>(t) * freq[ix(i)];
    const double c = std::cos(ang), s = inverse ? -std::sin(ang) : std::sin(ang);
    const double a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = a * s + b * c;
  }
}

struct BlockCache {
  Vec x, h1, qkv, qkvn, qk_rstd, qk_xhat, att, res, h2, fc, act, gate, up;
  NormCache n1, n2;
  // Per (b, query head): rotated q (T, HS) and the T x T probabilities (0 where a query does not
  // attend); per (b, key/value head): rotated k and v (T, HS).
  std::vector<Vec> q, p, k, v;
};

// The q/k norm of the fused qkv rows, in place of their q and k heads: each head's HS values
// RMS-normed with q_norm's or k_norm's weight; the value heads pass unchanged.
inline void qk_norm(const DecoderShape& s, const Tensors& P, const std::string& p, int64_t N,
                    BlockCache& k) {
  const int64_t W = s.qkv_width(), NQK = s.NH + s.KVH;
  k.qk_rstd.assign(ix(N * NQK), 0.0);
  k.qk_xhat.assign(k.qkv.size(), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < NQK; ++h) {
      const Vec& w = P.at(p + (h < s.NH ? "attn.q_norm.weight" : "attn.k_norm.weight"));
      const int64_t off = n * W + h * s.HS;
      k.qk_rstd[ix(n * NQK + h)] = norm_row(Norm::Rms, &k.qkvn[ix(off)], &k.qk_xhat[ix(off)],
                                            &k.qkv[ix(off)], w.data(), nullptr, s.HS, s.norm_eps)
                                       .rstd;
    }
}

// Causal attention of the block's qkv rows into k.att (N, NH HS), keeping q, k, v, p.
inline void attention(const DecoderShape& s, const Vec& freq, BlockCache& k) {
  const int64_t B = s.B, T = s.T, NH = s.NH, KVH = s.KVH, HS = s.HS, W = s.qkv_width();
  const int64_t G = NH / KVH, A = NH * HS;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  const bool rope = s.positions == Positions::Rope;
  k.q.assign(ix(B * NH), Vec(ix(T * HS)));
  k.p.assign(ix(B * NH), Vec(ix(T * T), 0.0));
  k.k.assign(ix(B * KVH), Vec(ix(T * HS)));
  k.v = k.k;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const double* row = &k.qkvn[ix((b * T + t) * W)];
      for (int64_t h = 0; h < NH; ++h) {
        double* q = &k.q[ix(b * NH + h)][ix(t * HS)];
        for (int64_t d = 0; d < HS; ++d) q[d] = row[h * HS + d];
        if (rope) rotate(q, freq, HS, position(b, t), false);
      }
      for (int64_t j = 0; j < KVH; ++j) {
        double* kk = &k.k[ix(b * KVH + j)][ix(t * HS)];
        double* v = &k.v[ix(b * KVH + j)][ix(t * HS)];
        for (int64_t d = 0; d < HS; ++d) {
          kk[d] = row[(NH + j) * HS + d];
          v[d] = row[(NH + KVH + j) * HS + d];
        }
        if (rope) rotate(kk, freq, HS, position(b, t), false);
      }
    }
  k.att.assign(ix(B * T * A), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      const Vec& q = k.q[ix(b * NH + h)];
      const Vec& kk = k.k[ix(b * KVH + h / G)];
      const Vec& v = k.v[ix(b * KVH + h / G)];
      Vec& pr = k.p[ix(b * NH + h)];
      for (int64_t i = 0; i < T; ++i) {
        double mx = -INFINITY;
        for (int64_t j = 0; j < T; ++j) {
          if (!attends(b, i, j)) continue;
          double dot = 0;
          for (int64_t d = 0; d < HS; ++d) dot += q[ix(i * HS + d)] * kk[ix(j * HS + d)];
          pr[ix(i * T + j)] = dot * scale;
          mx = std::max(mx, dot * scale);
        }
        double sum = 0;
        for (int64_t j = 0; j < T; ++j) {
          if (!attends(b, i, j)) continue;
          pr[ix(i * T + j)] = std::exp(pr[ix(i * T + j)] - mx);
          sum += pr[ix(i * T + j)];
        }
        for (int64_t j = 0; j < T; ++j)
          if (attends(b, i, j)) pr[ix(i * T + j)] /= sum;
        for (int64_t d = 0; d < HS; ++d) {
          double o = 0;
          for (int64_t j = 0; j < T; ++j) o += pr[ix(i * T + j)] * v[ix(j * HS + d)];
          k.att[ix((b * T + i) * A + h * HS + d)] = o;
        }
      }
    }
}

// Its backward: from datt (N, NH HS), the gradient of the q/k-normed qkv rows (N, W).
// dP_ij = dout_i . v_j; dS_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij'); key/value gradients sum over
// the G query heads that share them; RoPE's gradient is the inverse rotation.
inline Vec attention_back(const DecoderShape& s, const Vec& freq, const BlockCache& k,
                          const Vec& datt) {
  const int64_t B = s.B, T = s.T, NH = s.NH, KVH = s.KVH, HS = s.HS, W = s.qkv_width();
  const int64_t G = NH / KVH, A = NH * HS;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  const bool rope = s.positions == Positions::Rope;
  Vec dqkvn(ix(B * T * W), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    std::vector<Vec> dk(ix(KVH), Vec(ix(T * HS), 0.0)), dv = dk;
    for (int64_t h = 0; h < NH; ++h) {
      const Vec& q = k.q[ix(b * NH + h)];
      const Vec& kk = k.k[ix(b * KVH + h / G)];
      const Vec& v = k.v[ix(b * KVH + h / G)];
      const Vec& pr = k.p[ix(b * NH + h)];
      Vec& dkj = dk[ix(h / G)];
      Vec& dvj = dv[ix(h / G)];
      Vec dq(ix(T * HS), 0.0);
      for (int64_t i = 0; i < T; ++i) {
        const double* dout = &datt[ix((b * T + i) * A + h * HS)];
        Vec dp(ix(T), 0.0);
        double dot = 0;
        for (int64_t j = 0; j < T; ++j) {
          if (!attends(b, i, j)) continue;
          double z = 0;
          for (int64_t d = 0; d < HS; ++d) z += dout[d] * v[ix(j * HS + d)];
          dp[ix(j)] = z;
          dot += pr[ix(i * T + j)] * z;
        }
        for (int64_t j = 0; j < T; ++j) {
          if (!attends(b, i, j)) continue;
          const double pij = pr[ix(i * T + j)];
          const double ds = pij * (dp[ix(j)] - dot) * scale;
          for (int64_t d = 0; d < HS; ++d) {
            dvj[ix(j * HS + d)] += pij * dout[d];
            dq[ix(i * HS + d)] += ds * kk[ix(j * HS + d)];
            dkj[ix(j * HS + d)] += ds * q[ix(i * HS + d)];
          }
        }
      }
      for (int64_t t = 0; t < T; ++t) {
        if (rope) rotate(&dq[ix(t * HS)], freq, HS, position(b, t), true);
        for (int64_t d = 0; d < HS; ++d)
          dqkvn[ix((b * T + t) * W + h * HS + d)] = dq[ix(t * HS + d)];
      }
    }
    for (int64_t j = 0; j < KVH; ++j)
      for (int64_t t = 0; t < T; ++t) {
        if (rope) rotate(&dk[ix(j)][ix(t * HS)], freq, HS, position(b, t), true);
        for (int64_t d = 0; d < HS; ++d) {
          dqkvn[ix((b * T + t) * W + (NH + j) * HS + d)] = dk[ix(j)][ix(t * HS + d)];
          dqkvn[ix((b * T + t) * W + (NH + KVH + j) * HS + d)] = dv[ix(j)][ix(t * HS + d)];
        }
      }
  }
  return dqkvn;
}

// The q/k norm's backward: dqkvn of the normed rows to the gradient of the Linear's output.
inline Vec qk_norm_back(const DecoderShape& s, const Tensors& P, Tensors& G, const std::string& p,
                        int64_t N, const BlockCache& k, const Vec& dqkvn) {
  const int64_t W = s.qkv_width(), NQK = s.NH + s.KVH;
  Vec dqkv = dqkvn;  // the value heads pass the q/k norm unchanged
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < NQK; ++h) {
      const std::string wn = p + (h < s.NH ? "attn.q_norm.weight" : "attn.k_norm.weight");
      const int64_t off = n * W + h * s.HS;
      norm_row_back(Norm::Rms, &dqkv[ix(off)], G.at(wn).data(), nullptr, &dqkvn[ix(off)],
                    &k.qk_xhat[ix(off)], P.at(wn).data(), k.qk_rstd[ix(n * NQK + h)], s.HS);
    }
  return dqkv;
}

// The MLP of a block on h2 (N, C), keeping what its backward needs in k.
inline Vec mlp(const DecoderShape& s, const Tensors& P, const std::string& p, int64_t N,
               BlockCache& k) {
  if (s.mlp == Mlp::Gelu) {
    k.fc = linear(P, p + "mlp.fc", k.h2, N, s.bias);
    k.act.resize(k.fc.size());
    for (size_t i = 0; i < k.fc.size(); ++i) k.act[i] = gelu(k.fc[i]);
    return linear(P, p + "mlp.proj", k.act, N, s.bias);
  }
  k.gate = linear(P, p + "mlp.gate", k.h2, N, s.bias);
  k.up = linear(P, p + "mlp.up", k.h2, N, s.bias);
  k.act.resize(k.gate.size());
  for (size_t i = 0; i < k.act.size(); ++i) k.act[i] = k.gate[i] * sigmoid(k.gate[i]) * k.up[i];
  return linear(P, p + "mlp.down", k.act, N, s.bias);
}

// Its backward, from dy (N, C) to dh2 (N, C). SwiGLU: act = silu(gate) up, so with sg =
// sigmoid(gate): d gate = dact up sg (1 + gate (1 - sg)), d up = dact gate sg.
inline Vec mlp_back(const DecoderShape& s, const Tensors& P, Tensors& G, const std::string& p,
                    int64_t N, const BlockCache& k, const Vec& dy) {
  if (s.mlp == Mlp::Gelu) {
    Vec dfc = linear_back(P, G, p + "mlp.proj", dy, k.act, N, s.bias);
    for (size_t i = 0; i < dfc.size(); ++i) dfc[i] *= gelu_grad(k.fc[i]);
    return linear_back(P, G, p + "mlp.fc", dfc, k.h2, N, s.bias);
  }
  const Vec dact = linear_back(P, G, p + "mlp.down", dy, k.act, N, s.bias);
  Vec dgate(dact.size()), dup(dact.size());
  for (size_t i = 0; i < dact.size(); ++i) {
    const double sg = sigmoid(k.gate[i]);
    dgate[i] = dact[i] * k.up[i] * sg * (1.0 + k.gate[i] * (1.0 - sg));
    dup[i] = dact[i] * k.gate[i] * sg;
  }
  Vec dh2 = linear_back(P, G, p + "mlp.gate", dgate, k.h2, N, s.bias);
  const Vec dh2_up = linear_back(P, G, p + "mlp.up", dup, k.h2, N, s.bias);
  for (size_t i = 0; i < dh2.size(); ++i) dh2[i] += dh2_up[i];
  return dh2;
}

// The LM head on the final norm's output hf (N, C): the weighted mean cross-entropy, its
// gradient into the head's weight (added to G) and returned for hf.
inline double head_loss(const DecoderShape& s, const Tensors& P, Tensors& G, const Vec& hf,
                        const std::vector<int32_t>& targets, Vec& dhf) {
  const int64_t N = s.B * s.T, C = s.C, V = s.V;
  const std::string head = s.tied ? "wte" : "lm_head.weight";
  const Vec& Wh = P.at(head);
  Vec& dWh = G.at(head);
  double weights = 0;
  for (int64_t n = 0; n < N; ++n) weights += loss_weight(n);
  dhf.assign(ix(N * C), 0.0);
  double loss = 0;
  for (int64_t n = 0; n < N; ++n) {
    Vec logit(ix(V));
    double mx = -INFINITY;
    for (int64_t v = 0; v < V; ++v) {
      double z = 0;
      for (int64_t c = 0; c < C; ++c) z += hf[ix(n * C + c)] * Wh[ix(v * C + c)];
      logit[ix(v)] = z;
      mx = std::max(mx, z);
    }
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(logit[ix(v)] - mx);
    const int64_t tgt = targets[ix(n)];
    const double w = loss_weight(n);
    loss += w * (mx + std::log(sum) - logit[ix(tgt)]);
    for (int64_t v = 0; v < V; ++v) {
      // dL/dlogit = w (softmax - onehot) / sum of the weights
      const double d = (std::exp(logit[ix(v)] - mx) / sum - (v == tgt ? 1.0 : 0.0)) * w / weights;
      for (int64_t c = 0; c < C; ++c) {
        dWh[ix(v * C + c)] += d * hf[ix(n * C + c)];
        dhf[ix(n * C + c)] += d * Wh[ix(v * C + c)];
      }
    }
  }
  return loss / weights;
}

}  // namespace detail

/// Mean next-token cross-entropy of the decoder of shape s on (inputs, targets), both (B, T)
/// row-major, and its gradient with respect to every parameter in P (written to `grads`, same
/// names and sizes; P holds exactly param_sizes(s)).
inline double loss_and_grads(const DecoderShape& s, const Tensors& P,
                             const std::vector<int32_t>& inputs,
                             const std::vector<int32_t>& targets, Tensors& grads) {
  using namespace detail;
  const int64_t B = s.B, T = s.T, C = s.C, N = B * T;
  const bool learned = s.positions == Positions::Learned;
  const bool qkv_bias = s.bias || s.qkv_bias;
  const Vec freq = inv_freq(s);
  grads.clear();
  for (const auto& [name, v] : P) grads[name] = Vec(v.size(), 0.0);

  // ---- embeddings ----
  Vec x(ix(N * C));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double e = P.at("wte")[ix(inputs[ix(b * T + t)] * C + c)];
        if (learned) e += P.at("wpe")[ix(position(b, t) * C + c)];
        x[ix((b * T + t) * C + c)] = e;
      }

  // ---- blocks ----
  std::vector<BlockCache> caches(ix(s.L));
  for (int64_t l = 0; l < s.L; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    BlockCache& k = caches[ix(l)];
    k.x = x;
    k.h1 = norm(s, P, p + norm_name(s, 1), x, N, C, k.n1);
    k.qkv = linear(P, p + "attn.qkv", k.h1, N, qkv_bias);
    k.qkvn = k.qkv;
    if (s.qk_norm) qk_norm(s, P, p, N, k);
    attention(s, freq, k);
    k.res = linear(P, p + "attn.proj", k.att, N, s.bias);
    for (int64_t i = 0; i < N * C; ++i) k.res[ix(i)] += x[ix(i)];
    k.h2 = norm(s, P, p + norm_name(s, 2), k.res, N, C, k.n2);
    x = mlp(s, P, p, N, k);
    for (int64_t i = 0; i < N * C; ++i) x[ix(i)] += k.res[ix(i)];
  }

  // ---- head ----
  NormCache nf;
  const Vec hf = norm(s, P, norm_name(s, 0), x, N, C, nf);
  Vec dhf;
  const double loss = head_loss(s, P, grads, hf, targets, dhf);
  Vec dx = norm_back(s, P, grads, norm_name(s, 0), dhf, nf, N, C);

  // ---- blocks, backward ----
  for (int64_t l = s.L - 1; l >= 0; --l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    const BlockCache& k = caches[ix(l)];
    // y = res + MLP(Norm2(res))
    const Vec dh2 = mlp_back(s, P, grads, p, N, k, dx);
    const Vec dres_norm = norm_back(s, P, grads, p + norm_name(s, 2), dh2, k.n2, N, C);
    Vec dres = dx;
    for (size_t i = 0; i < dres.size(); ++i) dres[i] += dres_norm[i];
    // res = x + att Wo^T (+ bo)
    const Vec datt = linear_back(P, grads, p + "attn.proj", dres, k.att, N, s.bias);
    Vec dqkv = attention_back(s, freq, k, datt);
    if (s.qk_norm) dqkv = qk_norm_back(s, P, grads, p, N, k, dqkv);
    const Vec dh1 = linear_back(P, grads, p + "attn.qkv", dqkv, k.h1, N, qkv_bias);
    const Vec dx_norm = norm_back(s, P, grads, p + norm_name(s, 1), dh1, k.n1, N, C);
    for (size_t i = 0; i < dx.size(); ++i) dx[i] = dres[i] + dx_norm[i];
  }

  // ---- embeddings, backward ----
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const double d = dx[ix((b * T + t) * C + c)];
        grads.at("wte")[ix(inputs[ix(b * T + t)] * C + c)] += d;
        if (learned) grads.at("wpe")[ix(position(b, t) * C + c)] += d;
      }
  return loss;
}

/// The tutorial MLP: L blocks of y = relu(x W^T + b) on (B, D) inputs, loss = mean over rows of
/// sum_j (x_L - target)^2 / D. Parameters "blocks.i.fc.weight" (D, D) and "blocks.i.fc.bias" (D).
inline double mlp_loss_and_grads(int64_t B, int64_t D, int64_t L, const Tensors& P, const Vec& x0,
                                 const Vec& target, Tensors& grads) {
  using namespace detail;
  grads.clear();
  for (const auto& [name, v] : P) grads[name] = Vec(v.size(), 0.0);
  std::vector<Vec> xs{x0}, pre;
  for (int64_t l = 0; l < L; ++l) {
    pre.push_back(linear(P, "blocks." + std::to_string(l) + ".fc", xs.back(), B, true));
    Vec y = pre.back();
    for (double& v : y) v = v > 0 ? v : 0.0;
    xs.push_back(y);
  }
  double loss = 0;
  Vec dx(ix(B * D));
  for (size_t i = 0; i < dx.size(); ++i) {
    const double diff = xs.back()[i] - target[i];
    loss += diff * diff / static_cast<double>(D);
    dx[i] = 2.0 * diff / static_cast<double>(D) / static_cast<double>(B);
  }
  loss /= static_cast<double>(B);
  for (int64_t l = L - 1; l >= 0; --l) {
    for (size_t i = 0; i < dx.size(); ++i) dx[i] = pre[ix(l)][i] > 0 ? dx[i] : 0.0;
    dx = linear_back(P, grads, "blocks." + std::to_string(l) + ".fc", dx, xs[ix(l)], B, true);
  }
  return loss;
}

}  // namespace remat::ref
