// Op-level tests of the CPU backend, the specification every other backend is checked against:
// each op against a naive double-precision reference written here and/or central differences of
// L = sum(out * R) for a fixed random R, plus the gradient contract (parameter gradients +=,
// activation gradients =, LayerNorm's dinp += as the residual stream), determinism and the
// attention / LM-head workspace bytes the pool measures. Tolerances live in tests/test_util.h.
#include <cstring>
#include <numbers>
#include <tuple>

#include "tests/test_util.h"

namespace remat::test {
namespace {

using cpu::CpuBackend;

constexpr uint64_t kSeed = 20240611;

// ---- references ----

// Naive causal multi-head attention in double, forward and its analytic backward, with optional
// half-split (GPT-NeoX) rotary embedding of q and k: for pair (i, i + HS/2) at position t the
// angle is t * theta^(-2i/HS) and (x_i, x_{i+HS/2}) -> (x_i cos - x_{i+HS/2} sin,
// x_i sin + x_{i+HS/2} cos). Backward: with P = softmax(S), D_t = dO_t . O_t,
// dV = P^T dO, dS = P * (dO V^T - D), dQ = scale dS K, dK = scale dS^T Q, then dq, dk rotated
// back by R^T.
struct AttentionRef {
  std::vector<double> out;   // (B, T, C)
  std::vector<double> lse;   // (B, NH, T)
  std::vector<double> dqkv;  // (B, T, 3C)
};

AttentionRef attention_reference(const std::vector<double>& qkv, const std::vector<double>& dout,
                                 int64_t B, int64_t T, int64_t C, int64_t NH, double theta) {
  const int64_t HS = C / NH, half = HS / 2, row = 3 * C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  AttentionRef r{std::vector<double>(static_cast<size_t>(B * T * C)),
                 std::vector<double>(static_cast<size_t>(B * NH * T)),
                 std::vector<double>(static_cast<size_t>(B * T * row))};
  // rotate(x, t, sign): sign +1 applies R_t, -1 applies R_t^T.
  auto rotate = [&](double* x, int64_t t, double sign) {
    if (theta <= 0) return;
    for (int64_t i = 0; i < half; ++i) {
      const double ang = static_cast<double>(t) *
                         std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(HS));
      const double c = std::cos(ang), s = sign * std::sin(ang);
      const double a = x[i], b = x[i + half];
      x[i] = a * c - b * s;
      x[i + half] = a * s + b * c;
    }
  };
  auto dot = [](const double* a, const double* b, int64_t n) {
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
    return acc;
  };
  std::vector<double> q(static_cast<size_t>(T * HS)), k(q.size()), v(q.size()), dq(q.size()),
      dk(q.size()), dv(q.size()), p(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t d = 0; d < HS; ++d) {
          const double* src = qkv.data() + (b * T + t) * row + h * HS + d;
          q[static_cast<size_t>(t * HS + d)] = src[0];
          k[static_cast<size_t>(t * HS + d)] = src[C];
          v[static_cast<size_t>(t * HS + d)] = src[2 * C];
        }
        rotate(&q[static_cast<size_t>(t * HS)], t, 1);
        rotate(&k[static_cast<size_t>(t * HS)], t, 1);
      }
      std::fill(dq.begin(), dq.end(), 0.0);
      std::fill(dk.begin(), dk.end(), 0.0);
      std::fill(dv.begin(), dv.end(), 0.0);
      for (int64_t t = 0; t < T; ++t) {
        const double* qt = &q[static_cast<size_t>(t * HS)];
        double mx = -INFINITY;
        for (int64_t j = 0; j <= t; ++j) {
          p[static_cast<size_t>(j)] = scale * dot(qt, &k[static_cast<size_t>(j * HS)], HS);
          mx = std::max(mx, p[static_cast<size_t>(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= t; ++j) sum += std::exp(p[static_cast<size_t>(j)] - mx);
        const double lse = mx + std::log(sum);
        r.lse[static_cast<size_t>((b * NH + h) * T + t)] = lse;
        double* o = r.out.data() + (b * T + t) * C + h * HS;
        for (int64_t j = 0; j <= t; ++j) {
          p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - lse);
          for (int64_t d = 0; d < HS; ++d)
            o[d] += p[static_cast<size_t>(j)] * v[static_cast<size_t>(j * HS + d)];
        }
        const double* dot_t = dout.data() + (b * T + t) * C + h * HS;
        const double D = dot(dot_t, o, HS);
        for (int64_t j = 0; j <= t; ++j) {
          const double pj = p[static_cast<size_t>(j)];
          const double dp = dot(dot_t, &v[static_cast<size_t>(j * HS)], HS);
          const double ds = pj * (dp - D) * scale;
          for (int64_t d = 0; d < HS; ++d) {
            dv[static_cast<size_t>(j * HS + d)] += pj * dot_t[d];
            dq[static_cast<size_t>(t * HS + d)] += ds * k[static_cast<size_t>(j * HS + d)];
            dk[static_cast<size_t>(j * HS + d)] += ds * qt[d];
          }
        }
      }
      for (int64_t t = 0; t < T; ++t) {
        rotate(&dq[static_cast<size_t>(t * HS)], t, -1);
        rotate(&dk[static_cast<size_t>(t * HS)], t, -1);
        for (int64_t d = 0; d < HS; ++d) {
          double* dst = r.dqkv.data() + (b * T + t) * row + h * HS + d;
          dst[0] = dq[static_cast<size_t>(t * HS + d)];
          dst[C] = dk[static_cast<size_t>(t * HS + d)];
          dst[2 * C] = dv[static_cast<size_t>(t * HS + d)];
        }
      }
    }
  }
  return r;
}

double gelu_ref(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

double gelu_grad_ref(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  const double th = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

// (element - prefill) for the += checks: what an accumulating op added.
std::vector<double> minus(const Tensor& t, const std::vector<double>& before) {
  std::vector<double> d = to_double(t);
  for (size_t i = 0; i < d.size(); ++i) d[i] -= before[i];
  return d;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.data, b.data, a.bytes()) == 0;
}

}  // namespace

// ---- linear ----

TEST_CASE("linear forward matches a double reference with and without bias and accumulate",
          "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const auto [N, C, OC] = GENERATE(table<int64_t, int64_t, int64_t>({{7, 13, 5}, {65, 130, 67}}));
  const bool use_bias = GENERATE(false, true);
  const bool accumulate = GENERATE(false, true);
  CAPTURE(N, C, OC, use_bias, accumulate);
  Buffer inp = make_randn(be, {N, C}, kSeed, 1);
  Buffer weight = make_randn(be, {OC, C}, kSeed, 2);
  Buffer bias = make_randn(be, {OC}, kSeed, 3);
  Buffer out = make_randn(be, {N, OC}, kSeed, 4);  // kept with accumulate, ignored without
  const std::vector<double> before = to_double(out);
  be.linear_forward({.out = out,
                     .inp = inp,
                     .weight = weight,
                     .bias = use_bias ? bias.tensor() : Tensor(),
                     .accumulate = accumulate});
  std::vector<double> want(static_cast<size_t>(N * OC));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double acc = accumulate ? before[static_cast<size_t>(n * OC + o)] : 0.0;
      if (use_bias) acc += bias.f32()[o];
      for (int64_t c = 0; c < C; ++c)
        acc += static_cast<double>(inp.f32()[n * C + c]) * weight.f32()[o * C + c];
      want[static_cast<size_t>(n * OC + o)] = acc;
    }
  CHECK(allclose(to_host(out), want, kTolReduction, "out"));
}

TEST_CASE("linear backward overwrites dinp and accumulates dweight and dbias", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const auto [N, C, OC] = GENERATE(table<int64_t, int64_t, int64_t>({{7, 13, 5}, {65, 130, 67}}));
  const bool with_optional = GENERATE(true, false);  // dinp and dbias present or empty
  CAPTURE(N, C, OC, with_optional);
  Buffer inp = make_randn(be, {N, C}, kSeed, 1);
  Buffer weight = make_randn(be, {OC, C}, kSeed, 2);
  Buffer dout = make_randn(be, {N, OC}, kSeed, 3);
  Buffer dinp = make_filled(be, {N, C}, 7.0f);  // [=]: the 7s must disappear
  Buffer dweight = make_randn(be, {OC, C}, kSeed, 4);
  Buffer dbias = make_randn(be, {OC}, kSeed, 5);
  const std::vector<double> dweight0 = to_double(dweight), dbias0 = to_double(dbias);
  be.linear_backward({.dinp = with_optional ? dinp.tensor() : Tensor(),
                      .dweight = dweight,
                      .dbias = with_optional ? dbias.tensor() : Tensor(),
                      .dout = dout,
                      .inp = inp,
                      .weight = weight});
  std::vector<double> want_dinp(static_cast<size_t>(N * C), 0.0);
  std::vector<double> want_dw(static_cast<size_t>(OC * C), 0.0), want_db(static_cast<size_t>(OC));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      const double g = dout.f32()[n * OC + o];
      want_db[static_cast<size_t>(o)] += g;
      for (int64_t c = 0; c < C; ++c) {
        want_dinp[static_cast<size_t>(n * C + c)] += g * weight.f32()[o * C + c];
        want_dw[static_cast<size_t>(o * C + c)] += g * inp.f32()[n * C + c];
      }
    }
  CHECK(allclose(minus(dweight, dweight0), want_dw, kTolReduction, "dweight added"));
  if (with_optional) {
    CHECK(allclose(to_host(dinp), want_dinp, kTolReduction, "dinp"));
    CHECK(allclose(minus(dbias, dbias0), want_db, kTolReduction, "dbias added"));
  } else {
    CHECK(allclose(to_host(dbias), dbias0, kTolExact, "dbias untouched"));
  }
}

TEST_CASE("linear backward matches central differences", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kFdThreads);
  const int64_t N = 7, C = 13, OC = 5;
  Buffer inp = make_randn(be, {N, C}, kSeed, 11);
  Buffer weight = make_randn(be, {OC, C}, kSeed, 12);
  Buffer bias = make_randn(be, {OC}, kSeed, 13);
  Buffer r = make_randn(be, {N, OC}, kSeed, 14);
  Buffer out = make_tensor(be, {N, OC});
  auto loss = [&] {
    be.linear_forward({.out = out, .inp = inp, .weight = weight, .bias = bias});
    return weighted_sum(out, r);
  };
  Buffer dinp = make_tensor(be, {N, C});
  Buffer dweight = make_filled(be, {OC, C}, 0.0f);
  Buffer dbias = make_filled(be, {OC}, 0.0f);
  be.linear_backward(
      {.dinp = dinp, .dweight = dweight, .dbias = dbias, .dout = r, .inp = inp, .weight = weight});
  CHECK(allclose(to_host(dinp), central_differences(inp.f32(), N * C, kFdEps, loss), kTolGradcheck,
                 "dinp"));
  CHECK(allclose(to_host(dweight), central_differences(weight.f32(), OC * C, kFdEps, loss),
                 kTolGradcheck, "dweight"));
  CHECK(allclose(to_host(dbias), central_differences(bias.f32(), OC, kFdEps, loss), kTolGradcheck,
                 "dbias"));
}

// ---- layernorm ----

TEST_CASE("layernorm forward matches a double reference", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const auto [N, C] = GENERATE(table<int64_t, int64_t>({{7, 13}, {5, 37}, {64, 200}}));
  CAPTURE(N, C);
  Buffer inp = make_randn(be, {N, C}, kSeed, 21, 1.5, 0.3);
  Buffer weight = make_randn(be, {C}, kSeed, 22, 1.0, 1.0);
  Buffer bias = make_randn(be, {C}, kSeed, 23);
  Buffer out = make_tensor(be, {N, C});
  Buffer stats = make_tensor(be, {N, 2});
  be.layernorm_forward({.out = out, .stats = stats, .inp = inp, .weight = weight, .bias = bias});
  std::vector<double> want(static_cast<size_t>(N * C)), want_stats(static_cast<size_t>(N * 2));
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp.f32() + n * C;
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += x[c];
    mean /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) var += (x[c] - mean) * (x[c] - mean);
    const double rstd = 1.0 / std::sqrt(var / static_cast<double>(C) + 1e-5);
    want_stats[static_cast<size_t>(2 * n)] = mean;
    want_stats[static_cast<size_t>(2 * n + 1)] = rstd;
    for (int64_t c = 0; c < C; ++c)
      want[static_cast<size_t>(n * C + c)] = (x[c] - mean) * rstd * weight.f32()[c] + bias.f32()[c];
  }
  CHECK(allclose(to_host(out), want, kTolReduction, "out"));
  CHECK(allclose(to_host(stats), want_stats, kTolReduction, "stats (mean, rstd)"));
}

TEST_CASE("layernorm backward matches central differences and adds into dinp", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kFdThreads);
  const int64_t N = 5, C = 37;  // C > 32: two channel slices in the parameter-gradient pass
  Buffer inp = make_randn(be, {N, C}, kSeed, 31, 1.5, 0.3);
  Buffer weight = make_randn(be, {C}, kSeed, 32, 1.0, 1.0);
  Buffer bias = make_randn(be, {C}, kSeed, 33);
  Buffer r = make_randn(be, {N, C}, kSeed, 34);
  Buffer out = make_tensor(be, {N, C});
  Buffer stats = make_tensor(be, {N, 2});
  auto loss = [&] {
    be.layernorm_forward({.out = out, .stats = stats, .inp = inp, .weight = weight, .bias = bias});
    return weighted_sum(out, r);
  };
  loss();                                       // stats of the unperturbed input
  Buffer dinp = make_filled(be, {N, C}, 0.5f);  // [+=] residual stream: the 0.5 must stay
  Buffer dweight = make_randn(be, {C}, kSeed, 35);
  Buffer dbias = make_randn(be, {C}, kSeed, 36);
  const std::vector<double> dinp0 = to_double(dinp), dweight0 = to_double(dweight),
                            dbias0 = to_double(dbias);
  be.layernorm_backward({.dinp = dinp,
                         .dweight = dweight,
                         .dbias = dbias,
                         .dout = r,
                         .inp = inp,
                         .weight = weight,
                         .stats = stats});
  CHECK(allclose(minus(dinp, dinp0), central_differences(inp.f32(), N * C, kFdEps, loss),
                 kTolGradcheck, "dinp added"));
  CHECK(allclose(minus(dweight, dweight0), central_differences(weight.f32(), C, kFdEps, loss),
                 kTolGradcheck, "dweight added"));
  CHECK(allclose(minus(dbias, dbias0), central_differences(bias.f32(), C, kFdEps, loss),
                 kTolGradcheck, "dbias added"));
}

TEST_CASE("layernorm backward matches a double reference on many rows and channel slices",
          "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const int64_t N = 64, C = 200;
  Buffer inp = make_randn(be, {N, C}, kSeed, 41, 1.5, 0.3);
  Buffer weight = make_randn(be, {C}, kSeed, 42, 1.0, 1.0);
  Buffer bias = make_randn(be, {C}, kSeed, 43);
  Buffer dout = make_randn(be, {N, C}, kSeed, 44);
  Buffer out = make_tensor(be, {N, C});
  Buffer stats = make_tensor(be, {N, 2});
  be.layernorm_forward({.out = out, .stats = stats, .inp = inp, .weight = weight, .bias = bias});
  Buffer dinp = make_filled(be, {N, C}, 0.0f);
  Buffer dweight = make_filled(be, {C}, 0.0f);
  Buffer dbias = make_filled(be, {C}, 0.0f);
  be.layernorm_backward({.dinp = dinp,
                         .dweight = dweight,
                         .dbias = dbias,
                         .dout = dout,
                         .inp = inp,
                         .weight = weight,
                         .stats = stats});
  std::vector<double> want_dx(static_cast<size_t>(N * C)), want_dw(static_cast<size_t>(C), 0.0),
      want_db(static_cast<size_t>(C), 0.0), xhat(static_cast<size_t>(C));
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp.f32() + n * C;
    const float* dy = dout.f32() + n * C;
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += x[c];
    mean /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) var += (x[c] - mean) * (x[c] - mean);
    const double rstd = 1.0 / std::sqrt(var / static_cast<double>(C) + 1e-5);
    double g_mean = 0, gx_mean = 0;
    for (int64_t c = 0; c < C; ++c) {
      xhat[static_cast<size_t>(c)] = (x[c] - mean) * rstd;
      const double g = static_cast<double>(dy[c]) * weight.f32()[c];
      g_mean += g / static_cast<double>(C);
      gx_mean += g * xhat[static_cast<size_t>(c)] / static_cast<double>(C);
      want_dw[static_cast<size_t>(c)] += dy[c] * xhat[static_cast<size_t>(c)];
      want_db[static_cast<size_t>(c)] += dy[c];
    }
    for (int64_t c = 0; c < C; ++c)
      want_dx[static_cast<size_t>(n * C + c)] =
          rstd * (static_cast<double>(dy[c]) * weight.f32()[c] - g_mean -
                  xhat[static_cast<size_t>(c)] * gx_mean);
  }
  CHECK(allclose(to_host(dinp), want_dx, kTolReduction, "dinp"));
  CHECK(allclose(to_host(dweight), want_dw, kTolReduction, "dweight"));
  CHECK(allclose(to_host(dbias), want_db, kTolReduction, "dbias"));
}

// ---- attention ----

namespace {

// Runs attention forward and backward on random q, k, v, dout and compares outputs, log-sum-exp
// and dq, dk, dv with the double reference.
void check_attention_against_reference(int64_t B, int64_t NH, int64_t T, int64_t HS, float theta) {
  CAPTURE(B, NH, T, HS, theta);
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const int64_t C = NH * HS;
  Buffer qkv = make_randn(be, {B, T, 3 * C}, kSeed, 51);
  // Queries 1.5x wider than keys: peakier softmax rows, so the online max rescale matters.
  for (int64_t i = 0; i < B * T; ++i)
    for (int64_t c = 0; c < C; ++c) qkv.f32()[i * 3 * C + c] *= 1.5f;
  Buffer dout = make_randn(be, {B, T, C}, kSeed, 52);
  Buffer out = make_tensor(be, {B, T, C});
  Buffer lse = make_tensor(be, {B, NH, T});
  Buffer dqkv = make_filled(be, {B, T, 3 * C}, 7.0f);  // [=]: the 7s must disappear
  const int n_head = static_cast<int>(NH);
  be.attention_forward({.out = out, .lse = lse, .qkv = qkv, .n_head = n_head, .rope_theta = theta});
  be.attention_backward({.dqkv = dqkv,
                         .dout = dout,
                         .qkv = qkv,
                         .out = out,
                         .lse = lse,
                         .n_head = n_head,
                         .rope_theta = theta});
  const AttentionRef ref =
      attention_reference(to_double(qkv), to_double(dout), B, T, C, NH, static_cast<double>(theta));
  CHECK(allclose(to_host(out), ref.out, kTolAttention, "out"));
  CHECK(allclose(to_host(lse), ref.lse, kTolAttention, "lse"));
  // dq, dk, dv separately: each has its own scale and a bug usually hits only one of them.
  for (int part = 0; part < 3; ++part) {
    std::vector<float> got;
    std::vector<double> want;
    for (int64_t i = 0; i < B * T; ++i)
      for (int64_t c = 0; c < C; ++c) {
        got.push_back(dqkv.f32()[i * 3 * C + part * C + c]);
        want.push_back(ref.dqkv[static_cast<size_t>(i * 3 * C + part * C + c)]);
      }
    CHECK(allclose(got, want, kTolAttention, part == 0 ? "dq" : part == 1 ? "dk" : "dv"));
  }
}

// (B, NH, T): several batches and heads where T is small, one batch of two heads at T = 1000.
constexpr std::tuple<int64_t, int64_t, int64_t> kAttnShapes[] = {
    {2, 3, 1}, {2, 3, 7}, {2, 2, 64}, {2, 2, 129}, {1, 2, 1000}};

}  // namespace

TEST_CASE("attention forward and backward match a naive double-precision causal reference",
          "[ops]") {
  const auto [B, NH, T] = GENERATE(from_range(std::begin(kAttnShapes), std::end(kAttnShapes)));
  const int64_t HS = GENERATE(16, 64, 128);
  check_attention_against_reference(B, NH, T, HS, 0.0f);
}

TEST_CASE("attention with rope matches a double reference with half-split rotary q and k",
          "[ops]") {
  const auto [B, NH, T] = GENERATE(from_range(std::begin(kAttnShapes), std::end(kAttnShapes)));
  const int64_t HS = GENERATE(16, 64, 128);
  check_attention_against_reference(B, NH, T, HS, 10000.0f);
}

TEST_CASE("attention backward with and without rope matches central differences", "[ops]") {
  const float theta = GENERATE(0.0f, 10000.0f);
  CAPTURE(theta);
  CpuBackend be(kTestBudgetBytes, kFdThreads);
  // T = 70 crosses a 64-row tile; HS = 8 gives rotary frequencies 1, 0.1, 0.01, 0.001.
  const int64_t B = 1, NH = 2, T = 70, HS = 8, C = NH * HS;
  Buffer qkv = make_randn(be, {B, T, 3 * C}, kSeed, 61);
  Buffer r = make_randn(be, {B, T, C}, kSeed, 62);
  Buffer out = make_tensor(be, {B, T, C});
  Buffer lse = make_tensor(be, {B, NH, T});
  auto loss = [&] {
    be.attention_forward({.out = out, .lse = lse, .qkv = qkv, .n_head = 2, .rope_theta = theta});
    return weighted_sum(out, r);
  };
  loss();
  Buffer dqkv = make_tensor(be, {B, T, 3 * C});
  be.attention_backward({.dqkv = dqkv,
                         .dout = r,
                         .qkv = qkv,
                         .out = out,
                         .lse = lse,
                         .n_head = 2,
                         .rope_theta = theta});
  CHECK(allclose(to_host(dqkv), central_differences(qkv.f32(), B * T * 3 * C, kFdEps, loss),
                 kTolGradcheck, "dqkv"));
}

TEST_CASE("attention forward and backward are bitwise deterministic", "[ops]") {
  const float theta = GENERATE(0.0f, 10000.0f);
  CAPTURE(theta);
  const int64_t B = 2, NH = 3, T = 129, HS = 64, C = NH * HS;
  // Two runs on one backend, then a run on a one-thread backend: the same bits every time
  // (remat equivalence relies on recomputed tensors being bitwise equal).
  std::vector<float> out_1t, lse_1t, dqkv_1t;
  {
    CpuBackend be1(kTestBudgetBytes, 1);
    Buffer qkv = make_randn(be1, {B, T, 3 * C}, kSeed, 71);
    Buffer dout = make_randn(be1, {B, T, C}, kSeed, 72);
    Buffer out = make_tensor(be1, {B, T, C});
    Buffer lse = make_tensor(be1, {B, NH, T});
    Buffer dqkv = make_tensor(be1, {B, T, 3 * C});
    be1.attention_forward({.out = out, .lse = lse, .qkv = qkv, .n_head = 3, .rope_theta = theta});
    be1.attention_backward({.dqkv = dqkv,
                            .dout = dout,
                            .qkv = qkv,
                            .out = out,
                            .lse = lse,
                            .n_head = 3,
                            .rope_theta = theta});
    out_1t = to_host(out);
    lse_1t = to_host(lse);
    dqkv_1t = to_host(dqkv);
  }
  CpuBackend be(kTestBudgetBytes, kTestThreads);  // restores the tests' thread count
  Buffer qkv = make_randn(be, {B, T, 3 * C}, kSeed, 71);
  Buffer dout = make_randn(be, {B, T, C}, kSeed, 72);
  Buffer out[2] = {make_tensor(be, {B, T, C}), make_tensor(be, {B, T, C})};
  Buffer lse[2] = {make_tensor(be, {B, NH, T}), make_tensor(be, {B, NH, T})};
  Buffer dqkv[2] = {make_tensor(be, {B, T, 3 * C}), make_tensor(be, {B, T, 3 * C})};
  for (int run = 0; run < 2; ++run) {
    be.attention_forward(
        {.out = out[run], .lse = lse[run], .qkv = qkv, .n_head = 3, .rope_theta = theta});
    be.attention_backward({.dqkv = dqkv[run],
                           .dout = dout,
                           .qkv = qkv,
                           .out = out[0],
                           .lse = lse[0],
                           .n_head = 3,
                           .rope_theta = theta});
  }
  CHECK(same_bits(out[0], out[1]));
  CHECK(same_bits(lse[0], lse[1]));
  CHECK(same_bits(dqkv[0], dqkv[1]));
  CHECK(std::memcmp(out_1t.data(), out[0].f32(), out[0].tensor().bytes()) == 0);
  CHECK(std::memcmp(lse_1t.data(), lse[0].f32(), lse[0].tensor().bytes()) == 0);
  CHECK(std::memcmp(dqkv_1t.data(), dqkv[0].f32(), dqkv[0].tensor().bytes()) == 0);
}

TEST_CASE("attention stays in its workspace after another backend raised the OpenMP thread count",
          "[ops]") {
  // OpenMP's thread count is process-global: a backend built for one thread sizes its attention
  // workspace for one thread, and must keep using one even after another backend asks for more.
  // (Without that, the second thread writes past the workspace: ASan reports it, release builds
  // may corrupt the heap silently.)
  CpuBackend one(kTestBudgetBytes, 1);
  { CpuBackend two(kTestBudgetBytes, 2); }
  const int64_t B = 2, NH = 2, T = 129, HS = 64, C = NH * HS;
  Buffer qkv = make_randn(one, {B, T, 3 * C}, kSeed, 75);
  Buffer dout = make_randn(one, {B, T, C}, kSeed, 76);
  Buffer out = make_tensor(one, {B, T, C});
  Buffer lse = make_tensor(one, {B, NH, T});
  Buffer dqkv = make_tensor(one, {B, T, 3 * C});
  one.attention_forward({.out = out, .lse = lse, .qkv = qkv, .n_head = 2});
  one.attention_backward(
      {.dqkv = dqkv, .dout = dout, .qkv = qkv, .out = out, .lse = lse, .n_head = 2});
  const AttentionRef ref = attention_reference(to_double(qkv), to_double(dout), B, T, C, NH, 0.0);
  CHECK(allclose(to_host(out), ref.out, kTolAttention, "out"));
  CHECK(allclose(to_host(dqkv), ref.dqkv, kTolAttention, "dqkv"));
}

TEST_CASE("attention workspace measured by the pool is the stated formula and has no T^2 term",
          "[ops]") {
  const bool use_rope = GENERATE(false, true);
  CAPTURE(use_rope);
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const int64_t B = 1, NH = 1, HS = 64, C = NH * HS;
  const float theta = use_rope ? 10000.0f : 0.0f;
  for (const int64_t T : {int64_t{64}, int64_t{2048}}) {
    CAPTURE(T);
    Buffer qkv = make_randn(be, {B, T, 3 * C}, kSeed, 81);
    Buffer dout = make_randn(be, {B, T, C}, kSeed, 82);
    Buffer out = make_tensor(be, {B, T, C});
    Buffer lse = make_tensor(be, {B, NH, T});
    Buffer dqkv = make_tensor(be, {B, T, 3 * C});
    const uint64_t want = MemoryPool::accounted_bytes(
        static_cast<size_t>(4 * cpu::attention_workspace_floats(T, HS, be.threads(), use_rope)));
    const uint64_t live = be.pool().live_bytes();
    const size_t ws = static_cast<size_t>(MemCategory::Workspace);

    be.pool().reset_peak();
    be.attention_forward({.out = out, .lse = lse, .qkv = qkv, .n_head = 1, .rope_theta = theta});
    CHECK(be.pool().peak_bytes() - live == want);
    CHECK(be.pool().peak_snapshot().by_category[ws] == want);
    CHECK(be.pool().live_bytes() == live);  // the workspace is returned

    be.pool().reset_peak();
    be.attention_backward({.dqkv = dqkv,
                           .dout = dout,
                           .qkv = qkv,
                           .out = out,
                           .lse = lse,
                           .n_head = 1,
                           .rope_theta = theta});
    CHECK(be.pool().peak_bytes() - live == want);
    CHECK(be.pool().live_bytes() == live);
  }
  // The formula itself: per-thread tiles independent of T, plus a (T, HS) rope table.
  const int threads = be.threads();
  CHECK(cpu::attention_workspace_floats(2048, HS, threads, false) ==
        cpu::attention_workspace_floats(64, HS, threads, false));
  CHECK(cpu::attention_workspace_floats(2048, HS, threads, true) -
            cpu::attention_workspace_floats(64, HS, threads, true) ==
        (2048 - 64) * HS);
}

// ---- activations ----

namespace {

// N(0, 2^2) values plus the edges: 0, +-tiny, and tails where GELU's tanh saturates.
Buffer make_activation_input(Backend& be, int64_t N, int64_t D) {
  Buffer x = make_randn(be, {N, D}, kSeed, 91, 2.0);
  const float edges[] = {0.0f, 1e-7f, -1e-7f, 10.0f, -10.0f, 5.5f, -5.5f};
  std::copy(std::begin(edges), std::end(edges), x.f32());
  return x;
}

}  // namespace

TEST_CASE("activation forward matches double references of GELU (tanh) and ReLU", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const int64_t N = 7, D = 129;
  Buffer x = make_activation_input(be, N, D);
  Buffer y = make_tensor(be, {N, D});
  std::vector<double> want_gelu, want_relu;
  for (float v : to_host(x)) {
    want_gelu.push_back(gelu_ref(v));
    want_relu.push_back(v > 0 ? v : 0.0);
  }
  be.activation_forward({.out = y, .inp = x, .kind = Activation::Gelu});
  CHECK(allclose(to_host(y), want_gelu, kTolPointwise, "gelu"));
  be.activation_forward({.out = y, .inp = x, .kind = Activation::Relu});
  CHECK(allclose(to_host(y), want_relu, kTolExact, "relu"));
}

TEST_CASE("activation backward matches the analytic derivative and central differences", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const int64_t N = 7, D = 129;
  Buffer x = make_activation_input(be, N, D);
  Buffer dout = make_randn(be, {N, D}, kSeed, 92);
  Buffer y = make_tensor(be, {N, D});
  Buffer dx = make_filled(be, {N, D}, 7.0f);
  std::vector<double> want_gelu, want_relu;
  for (int64_t i = 0; i < N * D; ++i) {
    want_gelu.push_back(dout.f32()[i] * gelu_grad_ref(x.f32()[i]));
    want_relu.push_back(x.f32()[i] > 0 ? dout.f32()[i] : 0.0);
  }
  be.activation_backward({.dinp = dx, .dout = dout, .inp = x, .kind = Activation::Gelu});
  CHECK(allclose(to_host(dx), want_gelu, kTolGeluBackward, "gelu dinp"));
  auto gelu_loss = [&] {
    be.activation_forward({.out = y, .inp = x, .kind = Activation::Gelu});
    return weighted_sum(y, dout);
  };
  CHECK(allclose(to_host(dx), central_differences(x.f32(), N * D, kFdEps, gelu_loss), kTolGradcheck,
                 "gelu dinp vs central differences"));
  be.fill(dx, 7.0f);
  be.activation_backward({.dinp = dx, .dout = dout, .inp = x, .kind = Activation::Relu});
  CHECK(allclose(to_host(dx), want_relu, kTolExact, "relu dinp"));
}

TEST_CASE("activation backward gives the same bits when dinp aliases dout", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const Activation kind = GENERATE(Activation::Gelu, Activation::Relu);
  // Large enough for the threaded path (> 2^17 elements) as well as a small one.
  const int64_t N = GENERATE(int64_t{7}, int64_t{1100}), D = 129;
  CAPTURE(static_cast<int>(kind), N);
  Buffer x = make_activation_input(be, N, D);
  Buffer dout = make_randn(be, {N, D}, kSeed, 93);
  Buffer separate = make_tensor(be, {N, D});
  be.activation_backward({.dinp = separate, .dout = dout, .inp = x, .kind = kind});
  Buffer aliased = make_tensor(be, {N, D});
  be.copy(aliased, dout);
  be.activation_backward({.dinp = aliased, .dout = aliased, .inp = x, .kind = kind});
  CHECK(same_bits(aliased, separate));
}

// ---- embedding ----

TEST_CASE("embedding forward gathers token rows and adds position rows", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const bool use_wpe = GENERATE(true, false);
  CAPTURE(use_wpe);
  const int64_t B = 3, T = 5, V = 4, C = 37, maxT = 8;
  Buffer tokens = make_ids(be, {B, T}, static_cast<int32_t>(V), kSeed, 101);
  Buffer wte = make_randn(be, {V, C}, kSeed, 102);
  Buffer wpe = make_randn(be, {maxT, C}, kSeed, 103);
  Buffer out = make_filled(be, {B, T, C}, 7.0f);
  be.embedding_forward(
      {.out = out, .tokens = tokens, .wte = wte, .wpe = use_wpe ? wpe.tensor() : Tensor()});
  std::vector<float> want;  // the same single float add as the kernel: exact
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const float e = wte.f32()[tokens.tensor().i32()[b * T + t] * C + c];
        want.push_back(use_wpe ? e + wpe.f32()[t * C + c] : e);
      }
  CHECK(allclose(to_host(out), want, kTolExact, "out"));
}

TEST_CASE("embedding backward scatter-adds repeated tokens into dwte and dwpe", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const bool use_wpe = GENERATE(true, false);
  CAPTURE(use_wpe);
  // 15 tokens over a vocabulary of 5: repeats are certain; C = 37 crosses 16-channel slices.
  const int64_t B = 3, T = 5, V = 5, C = 37, maxT = 8;
  Buffer tokens = make_ids(be, {B, T}, 4, kSeed, 111);  // id 4 never occurs: its row stays
  Buffer dout = make_randn(be, {B, T, C}, kSeed, 112);
  Buffer dwte = make_randn(be, {V, C}, kSeed, 113);
  Buffer dwpe = make_randn(be, {maxT, C}, kSeed, 114);
  std::vector<double> want_wte = to_double(dwte), want_wpe = to_double(dwpe);  // [+=]
  be.embedding_backward(
      {.dwte = dwte, .dwpe = use_wpe ? dwpe.tensor() : Tensor(), .dout = dout, .tokens = tokens});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const double d = dout.f32()[(b * T + t) * C + c];
        want_wte[static_cast<size_t>(tokens.tensor().i32()[b * T + t] * C + c)] += d;
        if (use_wpe) want_wpe[static_cast<size_t>(t * C + c)] += d;
      }
  CHECK(allclose(to_host(dwte), want_wte, kTolReduction, "dwte"));
  CHECK(allclose(to_host(dwpe), want_wpe, use_wpe ? kTolReduction : kTolExact, "dwpe"));
}

// ---- LM head + cross-entropy ----

namespace {

constexpr int64_t kLmN = 37, kLmC = 24, kLmV = 50;

struct LmHeadCase {
  Buffer inp, weight, targets;
  explicit LmHeadCase(Backend& be)
      : inp(make_randn(be, {kLmN, kLmC}, kSeed, 121)),
        weight(make_randn(be, {kLmV, kLmC}, kSeed, 122, 0.3)),
        targets(make_ids(be, {kLmN}, static_cast<int32_t>(kLmV), kSeed, 123)) {}
};

struct LmHeadResult {
  std::vector<float> losses, dinp, dweight;
};

LmHeadResult run_lm_head(Backend& be, const LmHeadCase& c, int64_t chunk_rows) {
  Buffer losses = make_filled(be, {kLmN}, 7.0f);
  Buffer dinp = make_filled(be, {kLmN, kLmC}, 7.0f);
  Buffer dweight = make_randn(be, {kLmV, kLmC}, kSeed, 124);  // [+=]: same prefill every run
  be.lm_head_loss({.losses = losses,
                   .dinp = dinp,
                   .dweight = dweight,
                   .inp = c.inp,
                   .weight = c.weight,
                   .targets = c.targets,
                   .loss_scale = 1.0f / kLmN,
                   .chunk_rows = chunk_rows});
  return {to_host(losses), to_host(dinp), to_host(dweight)};
}

}  // namespace

TEST_CASE("lm head loss matches a naive double reference", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  LmHeadCase c(be);
  const int64_t chunk = GENERATE(int64_t{0}, int64_t{8});
  CAPTURE(chunk);
  const LmHeadResult got = run_lm_head(be, c, chunk);
  std::vector<double> want_loss(kLmN), want_dinp(kLmN * kLmC, 0.0), logits(kLmV);
  std::vector<double> want_dw;
  {
    Buffer prefill = make_randn(be, {kLmV, kLmC}, kSeed, 124);
    want_dw = to_double(prefill);
  }
  const double scale = static_cast<double>(1.0f / kLmN);
  for (int64_t n = 0; n < kLmN; ++n) {
    double mx = -INFINITY;
    for (int64_t v = 0; v < kLmV; ++v) {
      double acc = 0;
      for (int64_t k = 0; k < kLmC; ++k)
        acc += static_cast<double>(c.inp.f32()[n * kLmC + k]) * c.weight.f32()[v * kLmC + k];
      logits[static_cast<size_t>(v)] = acc;
      mx = std::max(mx, acc);
    }
    double sum = 0;
    for (double l : logits) sum += std::exp(l - mx);
    const double lse = mx + std::log(sum);
    const int32_t t = c.targets.tensor().i32()[n];
    want_loss[static_cast<size_t>(n)] = lse - logits[static_cast<size_t>(t)];
    for (int64_t v = 0; v < kLmV; ++v) {
      const double g =
          (std::exp(logits[static_cast<size_t>(v)] - lse) - (v == t ? 1.0 : 0.0)) * scale;
      for (int64_t k = 0; k < kLmC; ++k) {
        want_dinp[static_cast<size_t>(n * kLmC + k)] += g * c.weight.f32()[v * kLmC + k];
        want_dw[static_cast<size_t>(v * kLmC + k)] += g * c.inp.f32()[n * kLmC + k];
      }
    }
  }
  CHECK(allclose(got.losses, want_loss, kTolReduction, "losses"));
  CHECK(allclose(got.dinp, want_dinp, kTolReduction, "dinp"));
  CHECK(allclose(got.dweight, want_dw, kTolReduction, "dweight"));
}

TEST_CASE("chunked lm head loss equals the unchunked one for dividing and non-dividing chunks",
          "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  LmHeadCase c(be);
  const LmHeadResult whole = run_lm_head(be, c, 0);
  const int64_t chunk = GENERATE(int64_t{1}, int64_t{8}, int64_t{37}, int64_t{100});
  CAPTURE(chunk);
  // The logits workspace is one chunk: (min(chunk, N), V) f32, measured by the pool.
  const uint64_t live = be.pool().live_bytes();
  be.pool().reset_peak();
  const LmHeadResult got = run_lm_head(be, c, chunk);
  const uint64_t outputs = MemoryPool::accounted_bytes(kLmN * 4) +         // losses
                           MemoryPool::accounted_bytes(kLmN * kLmC * 4) +  // dinp
                           MemoryPool::accounted_bytes(kLmV * kLmC * 4);   // dweight
  CHECK(be.pool().peak_bytes() - live - outputs ==
        MemoryPool::accounted_bytes(static_cast<size_t>(std::min(chunk, kLmN) * kLmV * 4)));
  CHECK(allclose(got.losses, whole.losses, kTolChunkedLoss, "losses"));
  CHECK(allclose(got.dinp, whole.dinp, kTolChunkedLoss, "dinp"));
  CHECK(allclose(got.dweight, whole.dweight, kTolChunkedLoss, "dweight"));
}

TEST_CASE("lm head loss gradients match central differences of the mean cross-entropy", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kFdThreads);
  LmHeadCase c(be);
  Buffer losses = make_tensor(be, {kLmN});
  Buffer dinp = make_tensor(be, {kLmN, kLmC});
  Buffer dweight = make_filled(be, {kLmV, kLmC}, 0.0f);
  Buffer scratch = make_tensor(be, {kLmV, kLmC});
  auto args = [&](const Tensor& dw) {
    return LmHeadLossArgs{.losses = losses,
                          .dinp = dinp,
                          .dweight = dw,
                          .inp = c.inp,
                          .weight = c.weight,
                          .targets = c.targets,
                          .loss_scale = 1.0f / kLmN,
                          .chunk_rows = 8};
  };
  be.lm_head_loss(args(dweight));
  const std::vector<float> got_dinp = to_host(dinp);
  auto mean_loss = [&] {
    be.lm_head_loss(args(scratch));
    double acc = 0;
    for (int64_t n = 0; n < kLmN; ++n) acc += losses.f32()[n];
    return acc / kLmN;
  };
  CHECK(allclose(got_dinp, central_differences(c.inp.f32(), kLmN * kLmC, kFdEps, mean_loss),
                 kTolGradcheck, "dinp"));
  CHECK(allclose(to_host(dweight),
                 central_differences(c.weight.f32(), kLmV * kLmC, kFdEps, mean_loss), kTolGradcheck,
                 "dweight"));
}

// ---- MSE, sum of squares, AdamW ----

TEST_CASE("mse loss matches a double reference", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const int64_t N = 7, D = 13;
  const float scale = 1.0f / N;
  Buffer inp = make_randn(be, {N, D}, kSeed, 131);
  Buffer target = make_randn(be, {N, D}, kSeed, 132);
  Buffer losses = make_filled(be, {N}, 7.0f);
  Buffer dinp = make_filled(be, {N, D}, 7.0f);
  be.mse_loss({.losses = losses, .dinp = dinp, .inp = inp, .target = target, .loss_scale = scale});
  std::vector<double> want_loss(N, 0.0), want_dinp;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < D; ++j) {
      const double diff = static_cast<double>(inp.f32()[n * D + j]) - target.f32()[n * D + j];
      want_loss[static_cast<size_t>(n)] += diff * diff / D;
      want_dinp.push_back(2.0 * static_cast<double>(scale) * diff / D);
    }
  CHECK(allclose(to_host(losses), want_loss, kTolReduction, "losses"));
  CHECK(allclose(to_host(dinp), want_dinp, kTolPointwise, "dinp"));
}

TEST_CASE("sum of squares matches a double sum over several tensors", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  // 200001 elements: several 65536-element chunks and a ragged last one.
  Buffer a = make_randn(be, {3, 5}, kSeed, 141);
  Buffer b = make_randn(be, {200001}, kSeed, 142, 0.1);
  Buffer c = make_randn(be, {70, 1000}, kSeed, 143, 3.0);
  const Tensor tensors[] = {a, b, c};
  double want = 0;
  for (const Tensor& t : tensors)
    for (int64_t i = 0; i < t.numel(); ++i)
      want += static_cast<double>(t.f32()[i]) * static_cast<double>(t.f32()[i]);
  const double got = be.sum_squares(tensors);
  // Float squares are exact in double; only the order of the double sum differs.
  CHECK(std::abs(got - want) <= 1e-12 * want);
}

TEST_CASE("adamw update matches a scalar reference with decoupled decay and bias correction",
          "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const int64_t n = 37;
  AdamWArgs a;
  a.lr = 1e-2f;
  a.beta1 = 0.9f;
  a.beta2 = 0.95f;
  a.eps = 1e-8f;
  a.weight_decay = 0.1f;
  a.grad_scale = 0.5f;
  Buffer param = make_randn(be, {n}, kSeed, 151);
  Buffer grad = make_tensor(be, {n});
  Buffer m = make_filled(be, {n}, 0.0f);
  Buffer v = make_filled(be, {n}, 0.0f);
  std::vector<double> p_ref = to_double(param), m_ref(n, 0.0), v_ref(n, 0.0);
  const double b1 = a.beta1, b2 = a.beta2;
  for (int64_t step = 1; step <= 3; ++step) {
    CAPTURE(step);
    // Gradients of every size: O(1), tiny (where eps matters next to sqrt(v)) and zero.
    for (int64_t i = 0; i < n; ++i) {
      const double g =
          rng_normal(kSeed, 152 + static_cast<uint64_t>(step), static_cast<uint64_t>(i));
      grad.f32()[i] = static_cast<float>(i % 5 == 0 ? 0.0 : i % 5 == 1 ? 1e-8 * g : g);
    }
    a.param = param;
    a.grad = grad;
    a.m = m;
    a.v = v;
    a.step = step;
    be.adamw_update(a);
    for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
      const double g = static_cast<double>(grad.f32()[i]) * a.grad_scale;
      m_ref[i] = b1 * m_ref[i] + (1 - b1) * g;
      v_ref[i] = b2 * v_ref[i] + (1 - b2) * g * g;
      const double mhat = m_ref[i] / (1 - std::pow(b1, static_cast<double>(step)));
      const double vhat = v_ref[i] / (1 - std::pow(b2, static_cast<double>(step)));
      p_ref[i] -=
          static_cast<double>(a.lr) * (mhat / (std::sqrt(vhat) + static_cast<double>(a.eps)) +
                                       static_cast<double>(a.weight_decay) * p_ref[i]);
    }
    CHECK(allclose(to_host(m), m_ref, kTolPointwise, "m"));
    CHECK(allclose(to_host(v), v_ref, kTolPointwise, "v"));
    CHECK(allclose(to_host(param), p_ref, kTolPointwise, "param"));
  }
}

}  // namespace remat::test
