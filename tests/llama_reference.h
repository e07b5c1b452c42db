// A deliberately naive double-precision reference of the whole Llama-family model: loss and every
// parameter gradient, from the formulas, with plain loops. Like tests/reference_model.h for the
// GPT, it shares no code with the kernels, the layers or the executor (only that header's plain
// Linear loops): attention forms the full T x T probabilities with grouped heads indexed
// directly, RoPE rotates from its definition, llama3 scaling is transcribed here from
// transformers' _compute_llama3_parameters rather than taken from engine/core/ops/rope.h, and the
// LM head forms all N x V logits. A bug that the model's forward and backward share (a key/value
// head serving the wrong query heads, q/k norm after RoPE instead of before, a scaling band the
// wrong way round) shows up as a difference against this independent statement of the model.
//
// Model (transformers' LlamaForCausalLM; Qwen2's q/k/v biases; Qwen3's q/k norm), matrices
// (out, in), y = x W^T (+ b):
//   x0[b,t] = wte[tok[b,t]]
//   block:   h = RMSNorm1(x); qkv = h Wqkv^T (+ bqkv), rows q (NH HS) | k (KVH HS) | v (KVH HS);
//            with qk_norm every q and k head is RMS-normed over its HS dims (weights q_norm,
//            k_norm) BEFORE RoPE; q and k rotated (rotate_half: dim i pairs with i + HS/2, angle
//            t * inv_freq[i]); query head h reads key/value head h / (NH / KVH);
//            a = causal softmax(q k^T / sqrt(HS)) v; res = x + a Wo^T;
//            y = res + (silu(n Wg^T) * (n Wu^T)) Wd^T, n = RMSNorm2(res)
//   head:    logits = RMSNormf(x_L) Wh^T, Wh = lm_head or wte (tied); loss = mean over the B*T
//            rows of logsumexp(logits) - logit[target]
//   RMSNorm: w * (x / sqrt(mean(x^2) + eps)).
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "tests/reference_model.h"

namespace remat::ref {

/// transformers' rope_scaling = {"rope_type": "llama3", ...}.
struct Llama3Scaling {
  bool on = false;
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_context = 8192;  // original_max_position_embeddings
};

struct LlamaShape {
  int64_t B = 1, T = 1, C = 1, NH = 1, KVH = 1, HS = 1, FF = 1, V = 1, L = 1;
  double rope_theta = 10000.0, norm_eps = 1e-5;
  Llama3Scaling scaling;
  bool attention_bias = false, qk_norm = false, tied = true;
  int64_t qkv_width() const { return (NH + 2 * KVH) * HS; }
};

/// The HS / 2 rotary inverse frequencies, written as transformers computes them: the default
/// 1 / theta^(2i / HS), then llama3's two torch.where passes (long wavelengths divided by factor,
/// then the medium band, neither short nor long, replaced by the blend of the two).
inline Vec llama_inv_freq(const LlamaShape& s) {
  const int64_t half = s.HS / 2;
  Vec out(static_cast<size_t>(half));
  const Llama3Scaling& r = s.scaling;
  const double low_freq_wavelen = r.original_context / r.low_freq_factor;
  const double high_freq_wavelen = r.original_context / r.high_freq_factor;
  for (int64_t i = 0; i < half; ++i) {
    const double inv =
        1.0 / std::pow(s.rope_theta, static_cast<double>(2 * i) / static_cast<double>(s.HS));
    if (!r.on) {
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

namespace llama_detail {

inline size_t ix(int64_t i) {
  return static_cast<size_t>(i);
}

// One RMSNorm row of n: y = w * x * r; returns r = 1 / sqrt(mean(x^2) + eps).
inline double rms_forward(double* y, const double* x, const double* w, int64_t n, double eps) {
  double ms = 0;
  for (int64_t i = 0; i < n; ++i) ms += x[i] * x[i];
  const double r = 1.0 / std::sqrt(ms / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = w[i] * x[i] * r;
  return r;
}

// Its backward: dr/dx_i = -r^3 x_i / n, so with g = dy * w,
//   dx_i = r g_i - r^3 x_i mean(g x),  dw_i += dy_i x_i r.
inline void rms_backward(double* dx, double* dw, const double* dy, const double* x, const double* w,
                         double r, int64_t n) {
  double gx = 0;
  for (int64_t i = 0; i < n; ++i) gx += dy[i] * w[i] * x[i];
  gx /= static_cast<double>(n);
  for (int64_t i = 0; i < n; ++i) {
    dx[i] = r * dy[i] * w[i] - r * r * r * x[i] * gx;
    dw[i] += dy[i] * x[i] * r;
  }
}

inline Vec rmsnorm(const Vec& x, const Vec& w, int64_t N, int64_t C, double eps, Vec& rstd) {
  Vec y(x.size());
  rstd.assign(ix(N), 0.0);
  for (int64_t n = 0; n < N; ++n)
    rstd[ix(n)] = rms_forward(&y[ix(n * C)], &x[ix(n * C)], w.data(), C, eps);
  return y;
}

inline Vec rmsnorm_back(const Vec& dy, const Vec& x, const Vec& w, const Vec& rstd, Vec& dw,
                        int64_t N, int64_t C) {
  Vec dx(x.size());
  for (int64_t n = 0; n < N; ++n)
    rms_backward(&dx[ix(n * C)], dw.data(), &dy[ix(n * C)], &x[ix(n * C)], w.data(), rstd[ix(n)],
                 C);
  return dx;
}

// Rotate-half RoPE of one head vector at position t; inverse rotates by -angle (R^T, the
// gradient map of the rotation).
inline void rotate(double* v, const Vec& inv_freq, int64_t HS, int64_t t, bool inverse) {
  const int64_t half = HS / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double ang = static_cast<double>(t) * inv_freq[ix(i)];
    const double c = std::cos(ang), s = inverse ? -std::sin(ang) : std::sin(ang);
    const double a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = a * s + b * c;
  }
}

struct LlamaBlockCache {
  Vec x, h1, r1, qkv, qkvn, qk_rstd, att, res, h2, r2, gate, up, act;
  // Per (b, query head): rotated q (T, HS) and the T x T probabilities (0 above the diagonal);
  // per (b, key/value head): rotated k and v (T, HS).
  std::vector<Vec> q, p, k, v;
};

}  // namespace llama_detail

/// Mean next-token cross-entropy of the Llama model on (inputs, targets), both (B, T) row-major,
/// and its gradient with respect to every parameter in P (written to `grads`, same names).
/// Parameter names are remat-train's: wte, blocks.i.{norm1.weight, attn.qkv.weight,
/// attn.qkv.bias, attn.q_norm.weight, attn.k_norm.weight, attn.proj.weight, norm2.weight,
/// mlp.gate.weight, mlp.up.weight, mlp.down.weight}, normf.weight, lm_head.weight (untied).
inline double llama_loss_and_grads(const LlamaShape& s, const Tensors& P,
                                   const std::vector<int32_t>& inputs,
                                   const std::vector<int32_t>& targets, Tensors& grads) {
  using detail::at;
  using llama_detail::ix;
  using namespace llama_detail;
  const int64_t B = s.B, T = s.T, C = s.C, NH = s.NH, KVH = s.KVH, HS = s.HS, FF = s.FF, V = s.V;
  const int64_t N = B * T, W = s.qkv_width(), G = NH / KVH, A = NH * HS;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  const Vec inv_freq = llama_inv_freq(s);
  grads.clear();
  for (const auto& [name, v] : P) grads[name] = Vec(v.size(), 0.0);
  auto Gr = [&](const std::string& name) -> Vec& { return grads.at(name); };
  Vec scratch_db;  // the bias gradient of bias-free Linears
  auto nobias = [&](int64_t out) -> Vec& {
    scratch_db.assign(ix(out), 0.0);
    return scratch_db;
  };

  Vec x(ix(N * C));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) x[ix(n * C + c)] = at(P, "wte")[ix(inputs[ix(n)] * C + c)];

  std::vector<LlamaBlockCache> caches(ix(s.L));
  for (int64_t l = 0; l < s.L; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    LlamaBlockCache& k = caches[ix(l)];
    k.x = x;
    k.h1 = rmsnorm(x, at(P, p + "norm1.weight"), N, C, s.norm_eps, k.r1);
    k.qkv =
        detail::linear(k.h1, at(P, p + "attn.qkv.weight"),
                       s.attention_bias ? at(P, p + "attn.qkv.bias") : Vec(ix(W), 0.0), N, C, W);
    k.qkvn = k.qkv;
    if (s.qk_norm) {
      k.qk_rstd.assign(ix(N * (NH + KVH)), 0.0);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t h = 0; h < NH + KVH; ++h) {
          const Vec& w = at(P, p + (h < NH ? "attn.q_norm.weight" : "attn.k_norm.weight"));
          const int64_t off = n * W + h * HS;
          k.qk_rstd[ix(n * (NH + KVH) + h)] =
              rms_forward(&k.qkvn[ix(off)], &k.qkv[ix(off)], w.data(), HS, s.norm_eps);
        }
    }
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
          rotate(q, inv_freq, HS, t, false);
        }
        for (int64_t j = 0; j < KVH; ++j) {
          double* kk = &k.k[ix(b * KVH + j)][ix(t * HS)];
          double* v = &k.v[ix(b * KVH + j)][ix(t * HS)];
          for (int64_t d = 0; d < HS; ++d) {
            kk[d] = row[(NH + j) * HS + d];
            v[d] = row[(NH + KVH + j) * HS + d];
          }
          rotate(kk, inv_freq, HS, t, false);
        }
      }
    k.att.assign(ix(N * A), 0.0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h) {
        const Vec& q = k.q[ix(b * NH + h)];
        const Vec& kk = k.k[ix(b * KVH + h / G)];
        const Vec& v = k.v[ix(b * KVH + h / G)];
        Vec& pr = k.p[ix(b * NH + h)];
        for (int64_t i = 0; i < T; ++i) {
          double mx = -INFINITY;
          for (int64_t j = 0; j <= i; ++j) {
            double dot = 0;
            for (int64_t d = 0; d < HS; ++d) dot += q[ix(i * HS + d)] * kk[ix(j * HS + d)];
            pr[ix(i * T + j)] = dot * scale;
            mx = std::max(mx, dot * scale);
          }
          double sum = 0;
          for (int64_t j = 0; j <= i; ++j) {
            pr[ix(i * T + j)] = std::exp(pr[ix(i * T + j)] - mx);
            sum += pr[ix(i * T + j)];
          }
          for (int64_t j = 0; j <= i; ++j) pr[ix(i * T + j)] /= sum;
          for (int64_t d = 0; d < HS; ++d) {
            double o = 0;
            for (int64_t j = 0; j <= i; ++j) o += pr[ix(i * T + j)] * v[ix(j * HS + d)];
            k.att[ix((b * T + i) * A + h * HS + d)] = o;
          }
        }
      }
    k.res = detail::linear(k.att, at(P, p + "attn.proj.weight"), Vec(ix(C), 0.0), N, A, C);
    for (int64_t i = 0; i < N * C; ++i) k.res[ix(i)] += x[ix(i)];
    k.h2 = rmsnorm(k.res, at(P, p + "norm2.weight"), N, C, s.norm_eps, k.r2);
    const Vec zeros_ff(ix(FF), 0.0);
    k.gate = detail::linear(k.h2, at(P, p + "mlp.gate.weight"), zeros_ff, N, C, FF);
    k.up = detail::linear(k.h2, at(P, p + "mlp.up.weight"), zeros_ff, N, C, FF);
    k.act.resize(k.gate.size());
    for (size_t i = 0; i < k.act.size(); ++i)
      k.act[i] = k.gate[i] / (1.0 + std::exp(-k.gate[i])) * k.up[i];
    x = detail::linear(k.act, at(P, p + "mlp.down.weight"), Vec(ix(C), 0.0), N, FF, C);
    for (int64_t i = 0; i < N * C; ++i) x[ix(i)] += k.res[ix(i)];
  }

  // ---- head: final RMSNorm, logits, mean cross-entropy ----
  Vec rf;
  const Vec hf = rmsnorm(x, at(P, "normf.weight"), N, C, s.norm_eps, rf);
  const std::string head = s.tied ? "wte" : "lm_head.weight";
  const Vec& Wh = at(P, head);
  Vec dhf(ix(N * C), 0.0);
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
    loss += mx + std::log(sum) - logit[ix(tgt)];
    for (int64_t v = 0; v < V; ++v) {
      const double d =
          (std::exp(logit[ix(v)] - mx) / sum - (v == tgt ? 1.0 : 0.0)) / static_cast<double>(N);
      for (int64_t c = 0; c < C; ++c) {
        Gr(head)[ix(v * C + c)] += d * hf[ix(n * C + c)];
        dhf[ix(n * C + c)] += d * Wh[ix(v * C + c)];
      }
    }
  }
  loss /= static_cast<double>(N);
  Vec dx = rmsnorm_back(dhf, x, at(P, "normf.weight"), rf, Gr("normf.weight"), N, C);

  // ---- blocks, backward ----
  for (int64_t l = s.L - 1; l >= 0; --l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    const LlamaBlockCache& k = caches[ix(l)];
    // y = res + act Wd^T, act = silu(gate) up: with sg = sigmoid(gate),
    // d gate = dact up sg (1 + gate (1 - sg)), d up = dact gate sg.
    const Vec dact = detail::linear_back(dx, k.act, at(P, p + "mlp.down.weight"),
                                         Gr(p + "mlp.down.weight"), nobias(C), N, FF, C);
    Vec dgate(dact.size()), dup(dact.size());
    for (size_t i = 0; i < dact.size(); ++i) {
      const double sg = 1.0 / (1.0 + std::exp(-k.gate[i]));
      dgate[i] = dact[i] * k.up[i] * sg * (1.0 + k.gate[i] * (1.0 - sg));
      dup[i] = dact[i] * k.gate[i] * sg;
    }
    Vec dh2 = detail::linear_back(dgate, k.h2, at(P, p + "mlp.gate.weight"),
                                  Gr(p + "mlp.gate.weight"), nobias(FF), N, C, FF);
    const Vec dh2_up = detail::linear_back(dup, k.h2, at(P, p + "mlp.up.weight"),
                                           Gr(p + "mlp.up.weight"), nobias(FF), N, C, FF);
    for (size_t i = 0; i < dh2.size(); ++i) dh2[i] += dh2_up[i];
    const Vec dres_norm =
        rmsnorm_back(dh2, k.res, at(P, p + "norm2.weight"), k.r2, Gr(p + "norm2.weight"), N, C);
    Vec dres = dx;
    for (size_t i = 0; i < dres.size(); ++i) dres[i] += dres_norm[i];
    // res = x + att Wo^T
    const Vec datt = detail::linear_back(dres, k.att, at(P, p + "attn.proj.weight"),
                                         Gr(p + "attn.proj.weight"), nobias(C), N, A, C);
    Vec dqkvn(ix(N * W), 0.0);
    for (int64_t b = 0; b < B; ++b) {
      // Key/value gradients sum over the G query heads that share them.
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
          // dP_ij = dout_i . v_j; dS_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij')
          Vec dp(ix(i + 1));
          double dot = 0;
          for (int64_t j = 0; j <= i; ++j) {
            double z = 0;
            for (int64_t d = 0; d < HS; ++d) z += dout[d] * v[ix(j * HS + d)];
            dp[ix(j)] = z;
            dot += pr[ix(i * T + j)] * z;
          }
          for (int64_t j = 0; j <= i; ++j) {
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
          rotate(&dq[ix(t * HS)], inv_freq, HS, t, true);
          for (int64_t d = 0; d < HS; ++d)
            dqkvn[ix((b * T + t) * W + h * HS + d)] = dq[ix(t * HS + d)];
        }
      }
      for (int64_t j = 0; j < KVH; ++j)
        for (int64_t t = 0; t < T; ++t) {
          rotate(&dk[ix(j)][ix(t * HS)], inv_freq, HS, t, true);
          for (int64_t d = 0; d < HS; ++d) {
            dqkvn[ix((b * T + t) * W + (NH + j) * HS + d)] = dk[ix(j)][ix(t * HS + d)];
            dqkvn[ix((b * T + t) * W + (NH + KVH + j) * HS + d)] = dv[ix(j)][ix(t * HS + d)];
          }
        }
    }
    Vec dqkv = dqkvn;  // the value heads pass the q/k norm unchanged
    if (s.qk_norm)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t h = 0; h < NH + KVH; ++h) {
          const std::string wn = p + (h < NH ? "attn.q_norm.weight" : "attn.k_norm.weight");
          const int64_t off = n * W + h * HS;
          rms_backward(&dqkv[ix(off)], Gr(wn).data(), &dqkvn[ix(off)], &k.qkv[ix(off)],
                       at(P, wn).data(), k.qk_rstd[ix(n * (NH + KVH) + h)], HS);
        }
    const Vec dh1 =
        detail::linear_back(dqkv, k.h1, at(P, p + "attn.qkv.weight"), Gr(p + "attn.qkv.weight"),
                            s.attention_bias ? Gr(p + "attn.qkv.bias") : nobias(W), N, C, W);
    const Vec dx_norm =
        rmsnorm_back(dh1, k.x, at(P, p + "norm1.weight"), k.r1, Gr(p + "norm1.weight"), N, C);
    for (size_t i = 0; i < dx.size(); ++i) dx[i] = dres[i] + dx_norm[i];
  }

  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) Gr("wte")[ix(inputs[ix(n)] * C + c)] += dx[ix(n * C + c)];
  return loss;
}

/// Every parameter of a model of shape s and its number of values, in remat-train's names (for
/// tests that build parameter sets without a Model).
inline std::vector<std::pair<std::string, int64_t>> llama_param_sizes(const LlamaShape& s) {
  std::vector<std::pair<std::string, int64_t>> out{{"wte", s.V * s.C}};
  for (int64_t l = 0; l < s.L; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    out.emplace_back(p + "norm1.weight", s.C);
    out.emplace_back(p + "attn.qkv.weight", s.qkv_width() * s.C);
    if (s.attention_bias) out.emplace_back(p + "attn.qkv.bias", s.qkv_width());
    if (s.qk_norm) {
      out.emplace_back(p + "attn.q_norm.weight", s.HS);
      out.emplace_back(p + "attn.k_norm.weight", s.HS);
    }
    out.emplace_back(p + "attn.proj.weight", s.C * s.NH * s.HS);
    out.emplace_back(p + "norm2.weight", s.C);
    out.emplace_back(p + "mlp.gate.weight", s.FF * s.C);
    out.emplace_back(p + "mlp.up.weight", s.FF * s.C);
    out.emplace_back(p + "mlp.down.weight", s.C * s.FF);
  }
  out.emplace_back("normf.weight", s.C);
  if (!s.tied) out.emplace_back("lm_head.weight", s.V * s.C);
  return out;
}

}  // namespace remat::ref
