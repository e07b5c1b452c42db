// A deliberately naive double-precision reference of the whole GPT and of the tutorial MLP: loss
// and every parameter gradient, written from the formulas with plain loops. It shares no code
// with the kernels, the layers or the executor: no tiles, no online softmax, no fused loss, no
// BLAS. Attention forms the full T x T probability matrix, RoPE is rotated from its definition,
// the LM head forms all N x V logits. It exists so that a bug which the forward and the backward
// of the real model share (and which gradient checks therefore cannot see) still shows up as a
// difference against an independent statement of the model (issue 17).
//
// Model (GPT-2, pre-LN, as README's parameter table names it; matrices are (out, in), y = x W^T +
// b):
//   x0[b,t]  = wte[tok[b,t]] (+ wpe[t] with learned positions)
//   block:   h = LN1(x); qkv = h Wqkv^T + bqkv; per head: q, k (RoPE-rotated with rope), v;
//            a = causal softmax(q k^T / sqrt(HS)) v; res = x + a Wproj^T + bproj;
//            y = res + gelu(LN2(res) Wfc^T + bfc) Wmp^T + bmp
//   head:    logits = LNf(x_L) wte^T (tied); loss = mean over rows of logsumexp(logits) -
//   logit[target] LayerNorm: eps 1e-5, biased variance. GELU: tanh approximation. RoPE: half-split
//   pairs (i, i + HS/2) rotated by angle t * theta^(-2i/HS), i < HS/2.
// MLP: per block y = relu(x W^T + b); loss = mean over rows of sum_j (x_L - target)^2 / D.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <numbers>
#include <string>
#include <vector>

namespace remat::ref {

using Vec = std::vector<double>;
/// Parameters or gradients by their checkpoint names ("blocks.0.attn.qkv.weight"), row-major.
using Tensors = std::map<std::string, Vec>;

struct GptShape {
  int64_t B = 1, T = 1, C = 1, NH = 1, FF = 1, V = 1, L = 1, n_ctx = 1;
  bool rope = false;
  double rope_theta = 10000.0;
};

namespace detail {

constexpr double kLnEps = 1e-5;

inline double gelu(double x) {
  const double s = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
}

inline double gelu_grad(double x) {
  const double s = std::sqrt(2.0 / std::numbers::pi);
  const double th = std::tanh(s * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

// y (N, OUT) = x (N, IN) W^T + b
inline Vec linear(const Vec& x, const Vec& W, const Vec& b, int64_t N, int64_t IN, int64_t OUT) {
  Vec y(static_cast<size_t>(N * OUT));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OUT; ++o) {
      double s = b[static_cast<size_t>(o)];
      for (int64_t i = 0; i < IN; ++i)
        s += x[static_cast<size_t>(n * IN + i)] * W[static_cast<size_t>(o * IN + i)];
      y[static_cast<size_t>(n * OUT + o)] = s;
    }
  return y;
}

// Given dy (N, OUT): dW += dy^T x, db += sum dy, returns dx = dy W.
inline Vec linear_back(const Vec& dy, const Vec& x, const Vec& W, Vec& dW, Vec& db, int64_t N,
                       int64_t IN, int64_t OUT) {
  Vec dx(static_cast<size_t>(N * IN), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OUT; ++o) {
      const double g = dy[static_cast<size_t>(n * OUT + o)];
      db[static_cast<size_t>(o)] += g;
      for (int64_t i = 0; i < IN; ++i) {
        dW[static_cast<size_t>(o * IN + i)] += g * x[static_cast<size_t>(n * IN + i)];
        dx[static_cast<size_t>(n * IN + i)] += g * W[static_cast<size_t>(o * IN + i)];
      }
    }
  return dx;
}

struct LnCache {
  Vec xhat, rstd;
};

inline Vec layernorm(const Vec& x, const Vec& w, const Vec& b, int64_t N, int64_t C, LnCache& c) {
  Vec y(x.size());
  c.xhat.assign(x.size(), 0.0);
  c.rstd.assign(static_cast<size_t>(N), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < C; ++i) mean += x[static_cast<size_t>(n * C + i)];
    mean /= static_cast<double>(C);
    for (int64_t i = 0; i < C; ++i) {
      const double d = x[static_cast<size_t>(n * C + i)] - mean;
      var += d * d;
    }
    var /= static_cast<double>(C);
    const double rstd = 1.0 / std::sqrt(var + kLnEps);
    c.rstd[static_cast<size_t>(n)] = rstd;
    for (int64_t i = 0; i < C; ++i) {
      const size_t k = static_cast<size_t>(n * C + i);
      c.xhat[k] = (x[k] - mean) * rstd;
      y[k] = c.xhat[k] * w[static_cast<size_t>(i)] + b[static_cast<size_t>(i)];
    }
  }
  return y;
}

// dx of y = xhat * w + b, xhat = (x - mean) / sqrt(var + eps), derived per row:
//   dxhat = dy w;  dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)).
inline Vec layernorm_back(const Vec& dy, const Vec& w, const LnCache& c, Vec& dw, Vec& db,
                          int64_t N, int64_t C) {
  Vec dx(dy.size());
  for (int64_t n = 0; n < N; ++n) {
    double m1 = 0, m2 = 0;
    for (int64_t i = 0; i < C; ++i) {
      const size_t k = static_cast<size_t>(n * C + i);
      const double dxh = dy[k] * w[static_cast<size_t>(i)];
      m1 += dxh;
      m2 += dxh * c.xhat[k];
      dw[static_cast<size_t>(i)] += dy[k] * c.xhat[k];
      db[static_cast<size_t>(i)] += dy[k];
    }
    m1 /= static_cast<double>(C);
    m2 /= static_cast<double>(C);
    for (int64_t i = 0; i < C; ++i) {
      const size_t k = static_cast<size_t>(n * C + i);
      dx[k] = c.rstd[static_cast<size_t>(n)] *
              (dy[k] * w[static_cast<size_t>(i)] - m1 - c.xhat[k] * m2);
    }
  }
  return dx;
}

// Rotation of one head vector at position t (half-split pairs). inverse: rotate by -angle, which
// is R^T, the gradient map of the rotation.
inline void rope_rotate(double* v, int64_t HS, int64_t t, double theta, bool inverse) {
  const int64_t half = HS / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double ang = static_cast<double>(t) *
                       std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(HS));
    const double c = std::cos(ang), s = inverse ? -std::sin(ang) : std::sin(ang);
    const double a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = a * s + b * c;
  }
}

struct BlockCache {
  Vec x, h1, qkv, att, res, h2, fc, g;
  LnCache ln1, ln2;
  // Per (b, head): rotated q, k and v as (T, HS), and the T x T probabilities (0 above the
  // diagonal).
  std::vector<Vec> q, k, v, p;
};

inline const Vec& at(const Tensors& t, const std::string& name) {
  return t.at(name);
}

}  // namespace detail

/// Mean cross-entropy loss of the GPT on (inputs, targets), both (B, T) row-major, and the
/// gradient of that loss with respect to every parameter in `params` (written to `grads`, same
/// names and sizes).
inline double gpt_loss_and_grads(const GptShape& s, const Tensors& P,
                                 const std::vector<int32_t>& inputs,
                                 const std::vector<int32_t>& targets, Tensors& grads) {
  using namespace detail;
  const int64_t B = s.B, T = s.T, C = s.C, NH = s.NH, HS = C / NH, FF = s.FF, V = s.V, N = B * T;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  auto idx = [](int64_t i) { return static_cast<size_t>(i); };
  grads.clear();
  for (const auto& [name, v] : P) grads[name] = Vec(v.size(), 0.0);
  auto G = [&](const std::string& name) -> Vec& { return grads.at(name); };

  // ---- embeddings ----
  Vec x(idx(N * C));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t tok = inputs[idx(b * T + t)];
        double e = at(P, "wte")[idx(tok * C + c)];
        if (!s.rope) e += at(P, "wpe")[idx(t * C + c)];
        x[idx((b * T + t) * C + c)] = e;
      }

  // ---- blocks ----
  std::vector<BlockCache> caches(static_cast<size_t>(s.L));
  for (int64_t l = 0; l < s.L; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    BlockCache& k = caches[idx(l)];
    k.x = x;
    k.h1 = layernorm(x, at(P, p + "ln1.weight"), at(P, p + "ln1.bias"), N, C, k.ln1);
    k.qkv = linear(k.h1, at(P, p + "attn.qkv.weight"), at(P, p + "attn.qkv.bias"), N, C, 3 * C);
    k.att.assign(idx(N * C), 0.0);
    k.q.assign(idx(B * NH), Vec());
    k.k = k.q;
    k.v = k.q;
    k.p = k.q;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h) {
        Vec& q = k.q[idx(b * NH + h)];
        Vec& kk = k.k[idx(b * NH + h)];
        Vec& v = k.v[idx(b * NH + h)];
        Vec& pr = k.p[idx(b * NH + h)];
        q.assign(idx(T * HS), 0.0);
        kk = q;
        v = q;
        pr.assign(idx(T * T), 0.0);
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t d = 0; d < HS; ++d) {
            const int64_t row = (b * T + t) * 3 * C;
            q[idx(t * HS + d)] = k.qkv[idx(row + h * HS + d)];
            kk[idx(t * HS + d)] = k.qkv[idx(row + C + h * HS + d)];
            v[idx(t * HS + d)] = k.qkv[idx(row + 2 * C + h * HS + d)];
          }
          if (s.rope) {
            rope_rotate(&q[idx(t * HS)], HS, t, s.rope_theta, false);
            rope_rotate(&kk[idx(t * HS)], HS, t, s.rope_theta, false);
          }
        }
        // Causal: query i attends to keys j <= i.
        for (int64_t i = 0; i < T; ++i) {
          double mx = -INFINITY;
          for (int64_t j = 0; j <= i; ++j) {
            double dot = 0;
            for (int64_t d = 0; d < HS; ++d) dot += q[idx(i * HS + d)] * kk[idx(j * HS + d)];
            pr[idx(i * T + j)] = dot * scale;
            mx = std::max(mx, dot * scale);
          }
          double sum = 0;
          for (int64_t j = 0; j <= i; ++j) {
            pr[idx(i * T + j)] = std::exp(pr[idx(i * T + j)] - mx);
            sum += pr[idx(i * T + j)];
          }
          for (int64_t j = 0; j <= i; ++j) pr[idx(i * T + j)] /= sum;
          for (int64_t d = 0; d < HS; ++d) {
            double o = 0;
            for (int64_t j = 0; j <= i; ++j) o += pr[idx(i * T + j)] * v[idx(j * HS + d)];
            k.att[idx((b * T + i) * C + h * HS + d)] = o;
          }
        }
      }
    k.res = linear(k.att, at(P, p + "attn.proj.weight"), at(P, p + "attn.proj.bias"), N, C, C);
    for (int64_t i = 0; i < N * C; ++i) k.res[idx(i)] += x[idx(i)];
    k.h2 = layernorm(k.res, at(P, p + "ln2.weight"), at(P, p + "ln2.bias"), N, C, k.ln2);
    k.fc = linear(k.h2, at(P, p + "mlp.fc.weight"), at(P, p + "mlp.fc.bias"), N, C, FF);
    k.g.resize(k.fc.size());
    for (size_t i = 0; i < k.fc.size(); ++i) k.g[i] = gelu(k.fc[i]);
    x = linear(k.g, at(P, p + "mlp.proj.weight"), at(P, p + "mlp.proj.bias"), N, FF, C);
    for (int64_t i = 0; i < N * C; ++i) x[idx(i)] += k.res[idx(i)];
  }

  // ---- head: final LayerNorm, tied logits, mean cross-entropy ----
  LnCache lnf;
  const Vec hf = layernorm(x, at(P, "lnf.weight"), at(P, "lnf.bias"), N, C, lnf);
  const Vec& wte = at(P, "wte");
  Vec dhf(idx(N * C), 0.0);
  double loss = 0;
  for (int64_t n = 0; n < N; ++n) {
    Vec logit(idx(V));
    double mx = -INFINITY;
    for (int64_t v = 0; v < V; ++v) {
      double z = 0;
      for (int64_t c = 0; c < C; ++c) z += hf[idx(n * C + c)] * wte[idx(v * C + c)];
      logit[idx(v)] = z;
      mx = std::max(mx, z);
    }
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(logit[idx(v)] - mx);
    const int64_t tgt = targets[idx(n)];
    loss += mx + std::log(sum) - logit[idx(tgt)];
    for (int64_t v = 0; v < V; ++v) {
      // dL/dlogit = (softmax - onehot) / N
      const double d =
          (std::exp(logit[idx(v)] - mx) / sum - (v == tgt ? 1.0 : 0.0)) / static_cast<double>(N);
      for (int64_t c = 0; c < C; ++c) {
        G("wte")[idx(v * C + c)] += d * hf[idx(n * C + c)];
        dhf[idx(n * C + c)] += d * wte[idx(v * C + c)];
      }
    }
  }
  loss /= static_cast<double>(N);
  Vec dx = layernorm_back(dhf, at(P, "lnf.weight"), lnf, G("lnf.weight"), G("lnf.bias"), N, C);

  // ---- blocks, backward ----
  for (int64_t l = s.L - 1; l >= 0; --l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    const BlockCache& k = caches[idx(l)];
    // y = res + gelu(fc) Wmp^T + bmp
    Vec dg = linear_back(dx, k.g, at(P, p + "mlp.proj.weight"), G(p + "mlp.proj.weight"),
                         G(p + "mlp.proj.bias"), N, FF, C);
    for (size_t i = 0; i < dg.size(); ++i) dg[i] *= gelu_grad(k.fc[i]);
    const Vec dh2 = linear_back(dg, k.h2, at(P, p + "mlp.fc.weight"), G(p + "mlp.fc.weight"),
                                G(p + "mlp.fc.bias"), N, C, FF);
    const Vec dres_ln = layernorm_back(dh2, at(P, p + "ln2.weight"), k.ln2, G(p + "ln2.weight"),
                                       G(p + "ln2.bias"), N, C);
    Vec dres = dx;
    for (size_t i = 0; i < dres.size(); ++i) dres[i] += dres_ln[i];
    // res = x + att Wproj^T + bproj
    const Vec datt = linear_back(dres, k.att, at(P, p + "attn.proj.weight"),
                                 G(p + "attn.proj.weight"), G(p + "attn.proj.bias"), N, C, C);
    Vec dqkv(idx(N * 3 * C), 0.0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h) {
        const Vec& q = k.q[idx(b * NH + h)];
        const Vec& kk = k.k[idx(b * NH + h)];
        const Vec& v = k.v[idx(b * NH + h)];
        const Vec& pr = k.p[idx(b * NH + h)];
        Vec dq(idx(T * HS), 0.0), dk(idx(T * HS), 0.0), dv(idx(T * HS), 0.0);
        for (int64_t i = 0; i < T; ++i) {
          const double* dout = &datt[idx((b * T + i) * C + h * HS)];
          // dP_ij = dout_i . v_j; dS_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij')
          Vec dp(idx(i + 1));
          double dot = 0;
          for (int64_t j = 0; j <= i; ++j) {
            double z = 0;
            for (int64_t d = 0; d < HS; ++d) z += dout[d] * v[idx(j * HS + d)];
            dp[idx(j)] = z;
            dot += pr[idx(i * T + j)] * z;
          }
          for (int64_t j = 0; j <= i; ++j) {
            const double pij = pr[idx(i * T + j)];
            const double ds = pij * (dp[idx(j)] - dot) * scale;
            for (int64_t d = 0; d < HS; ++d) {
              dv[idx(j * HS + d)] += pij * dout[d];
              dq[idx(i * HS + d)] += ds * kk[idx(j * HS + d)];
              dk[idx(j * HS + d)] += ds * q[idx(i * HS + d)];
            }
          }
        }
        for (int64_t t = 0; t < T; ++t) {
          if (s.rope) {
            rope_rotate(&dq[idx(t * HS)], HS, t, s.rope_theta, true);
            rope_rotate(&dk[idx(t * HS)], HS, t, s.rope_theta, true);
          }
          for (int64_t d = 0; d < HS; ++d) {
            const int64_t row = (b * T + t) * 3 * C;
            dqkv[idx(row + h * HS + d)] = dq[idx(t * HS + d)];
            dqkv[idx(row + C + h * HS + d)] = dk[idx(t * HS + d)];
            dqkv[idx(row + 2 * C + h * HS + d)] = dv[idx(t * HS + d)];
          }
        }
      }
    const Vec dh1 = linear_back(dqkv, k.h1, at(P, p + "attn.qkv.weight"), G(p + "attn.qkv.weight"),
                                G(p + "attn.qkv.bias"), N, C, 3 * C);
    const Vec dx_ln = layernorm_back(dh1, at(P, p + "ln1.weight"), k.ln1, G(p + "ln1.weight"),
                                     G(p + "ln1.bias"), N, C);
    for (size_t i = 0; i < dx.size(); ++i) dx[i] = dres[i] + dx_ln[i];
  }

  // ---- embeddings, backward ----
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t tok = inputs[idx(b * T + t)];
      for (int64_t c = 0; c < C; ++c) {
        const double d = dx[idx((b * T + t) * C + c)];
        G("wte")[idx(tok * C + c)] += d;
        if (!s.rope) G("wpe")[idx(t * C + c)] += d;
      }
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
    const std::string p = "blocks." + std::to_string(l) + ".fc.";
    pre.push_back(linear(xs.back(), at(P, p + "weight"), at(P, p + "bias"), B, D, D));
    Vec y = pre.back();
    for (double& v : y) v = v > 0 ? v : 0.0;
    xs.push_back(y);
  }
  double loss = 0;
  Vec dx(static_cast<size_t>(B * D));
  for (size_t i = 0; i < dx.size(); ++i) {
    const double diff = xs.back()[i] - target[i];
    loss += diff * diff / static_cast<double>(D);
    dx[i] = 2.0 * diff / static_cast<double>(D) / static_cast<double>(B);
  }
  loss /= static_cast<double>(B);
  for (int64_t l = L - 1; l >= 0; --l) {
    const std::string p = "blocks." + std::to_string(l) + ".fc.";
    for (size_t i = 0; i < dx.size(); ++i) dx[i] = pre[static_cast<size_t>(l)][i] > 0 ? dx[i] : 0.0;
    dx = linear_back(dx, xs[static_cast<size_t>(l)], at(P, p + "weight"), grads.at(p + "weight"),
                     grads.at(p + "bias"), B, D, D);
  }
  return loss;
}

}  // namespace remat::ref
