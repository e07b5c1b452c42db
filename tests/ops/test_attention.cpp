// Op test of causal attention (flash contract): forward and backward against a naive double
// reference with the T x T matrix, with and without RoPE; central differences; bitwise determinism
// across runs and thread counts; the workspace bytes the pool measures against the stated formula.
// Against the CPU backend, the specification every other backend is checked against;
// tolerances and shared helpers: tests/test_util.h (through tests/ops/op_test.h).
#include "engine/cpu/attention_gemm.h"
#include "tests/ops/op_test.h"
#if defined(REMAT_HAVE_CUDA)
#include "engine/cuda/cudnn_graphs.h"
#endif
#if REMAT_TEST_CUDA_ROWS
#include <cudnn.h>
#endif

namespace remat::test {
namespace {

// Naive causal multi-head attention in double, forward and its analytic backward, with optional
// half-split (GPT-NeoX) rotary embedding of q and k: for pair (i, i + HS/2) at position t the
// angle is t * inv_freq_i and (x_i, x_{i+HS/2}) -> (x_i cos - x_{i+HS/2} sin,
// x_i sin + x_{i+HS/2} cos). Backward: with P = softmax(S), D_t = dO_t . O_t,
// dV = P^T dO, dS = P * (dO V^T - D), dQ = scale dS K, dK = scale dS^T Q, then dq, dk rotated
// back by R^T. Grouped-query attention as transformers' repeat_kv: the KVH key/value heads are
// repeated G = NH / KVH times (query head h reads key/value head h / G), and dk, dv of a
// key/value head are the sums over the query heads that read it.
struct AttentionRef {
  std::vector<double> out;   // (B, T, NH HS)
  std::vector<double> lse;   // (B, NH, T)
  std::vector<double> dqkv;  // (B, T, (NH + 2 KVH) HS)
};

// RoPE's inverse frequency of pair i, written from the formulas (Su et al.; transformers'
// _compute_{linear_scaling,dynamic_ntk,yarn,llama3}_parameters for the rescalings), not with
// engine/core/ops/rope.h.
double reference_inv_freq(int64_t i, int64_t HS, double theta, const RopeScaling& s) {
  const double d = static_cast<double>(HS), ctx = static_cast<double>(s.original_context);
  if (s.kind == RopeScaling::Dynamic) {  // NTK: the base grows with the run's length past ctx
    const double len = std::max(static_cast<double>(s.seq_len), ctx);
    theta *= std::pow(s.factor * len / ctx - (s.factor - 1), d / (d - 2));
  }
  const double base = 1.0 / std::pow(theta, 2.0 * static_cast<double>(i) / d);
  if (s.kind == RopeScaling::Linear) return base / s.factor;
  if (s.kind == RopeScaling::Yarn) {
    // The pairs that turn fewer than beta_slow times over the original context are
    // interpolated (/ factor), those that turn more than beta_fast times kept, a ramp between.
    auto dim_of = [&](double turns) {
      return d * std::log(ctx / (turns * 2 * std::numbers::pi)) / (2 * std::log(theta));
    };
    double lo = dim_of(s.beta_fast), hi = dim_of(s.beta_slow);
    if (s.truncate) lo = std::floor(lo), hi = std::ceil(hi);
    lo = std::max(lo, 0.0), hi = std::min(hi, d - 1);
    const double ramp = std::min(1.0, std::max(0.0, (static_cast<double>(i) - lo) / (hi - lo)));
    return ramp * base / s.factor + (1 - ramp) * base;
  }
  if (s.kind != RopeScaling::Llama3) return base;
  const double wavelen = 2 * std::numbers::pi / base;
  const double old_context = static_cast<double>(s.original_context);
  if (wavelen < old_context / s.high_freq_factor) return base;            // high frequencies: kept
  if (wavelen > old_context / s.low_freq_factor) return base / s.factor;  // low: stretched
  const double smooth =
      (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1 - smooth) * base / s.factor + smooth * base;
}

// yarn's factor on cos and sin when the scaling gives none: 0.1 ln(factor) + 1.
double reference_attention_factor(const RopeScaling& s) {
  if (s.kind != RopeScaling::Yarn) return 1.0;
  return s.attention_factor ? *s.attention_factor : 0.1 * std::log(s.factor) + 1;
}

struct RefShape {
  int64_t B, T, NH, KVH, HS;
  double theta;
  RopeScaling scaling;
};

AttentionRef attention_reference(const std::vector<double>& qkv, const std::vector<double>& dout,
                                 const RefShape& sh) {
  const int64_t B = sh.B, T = sh.T, NH = sh.NH, KVH = sh.KVH, HS = sh.HS, G = NH / KVH;
  const int64_t half = HS / 2, C = NH * HS, row = (NH + 2 * KVH) * HS;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  AttentionRef r{std::vector<double>(static_cast<size_t>(B * T * C)),
                 std::vector<double>(static_cast<size_t>(B * NH * T)),
                 std::vector<double>(static_cast<size_t>(B * T * row))};
  // rotate(x, t, sign): sign +1 applies R_t, -1 applies R_t^T.
  // yarn's attention factor m scales both rotations: m R_t forward, its transpose m R_t^T back.
  const double m = reference_attention_factor(sh.scaling);
  auto rotate = [&](double* x, int64_t t, double sign) {
    if (sh.theta <= 0) return;
    for (int64_t i = 0; i < half; ++i) {
      const double ang = static_cast<double>(t) * reference_inv_freq(i, HS, sh.theta, sh.scaling);
      const double c = m * std::cos(ang), s = m * sign * std::sin(ang);
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
  auto at = [](std::vector<double>& v, int64_t i) -> double& { return v[static_cast<size_t>(i)]; };
  std::vector<double> q(static_cast<size_t>(T * HS)), k(q.size()), v(q.size()), dq(q.size()),
      dk(q.size()), dv(q.size()), p(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t kvh = 0; kvh < KVH; ++kvh) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t d = 0; d < HS; ++d) {
          const double* src = qkv.data() + (b * T + t) * row + C + kvh * HS + d;
          at(k, t * HS + d) = src[0];
          at(v, t * HS + d) = src[KVH * HS];
        }
        rotate(&at(k, t * HS), t, 1);
      }
      std::fill(dk.begin(), dk.end(), 0.0);
      std::fill(dv.begin(), dv.end(), 0.0);
      for (int64_t h = kvh * G; h < (kvh + 1) * G; ++h) {
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t d = 0; d < HS; ++d)
            at(q, t * HS + d) = qkv[static_cast<size_t>((b * T + t) * row + h * HS + d)];
          rotate(&at(q, t * HS), t, 1);
        }
        std::fill(dq.begin(), dq.end(), 0.0);
        for (int64_t t = 0; t < T; ++t) {
          const double* qt = &at(q, t * HS);
          double mx = -INFINITY;
          for (int64_t j = 0; j <= t; ++j) {
            at(p, j) = scale * dot(qt, &at(k, j * HS), HS);
            mx = std::max(mx, at(p, j));
          }
          double sum = 0;
          for (int64_t j = 0; j <= t; ++j) sum += std::exp(at(p, j) - mx);
          const double lse = mx + std::log(sum);
          at(r.lse, (b * NH + h) * T + t) = lse;
          double* o = r.out.data() + (b * T + t) * C + h * HS;
          for (int64_t j = 0; j <= t; ++j) {
            at(p, j) = std::exp(at(p, j) - lse);
            for (int64_t d = 0; d < HS; ++d) o[d] += at(p, j) * at(v, j * HS + d);
          }
          const double* dot_t = dout.data() + (b * T + t) * C + h * HS;
          const double D = dot(dot_t, o, HS);
          for (int64_t j = 0; j <= t; ++j) {
            const double pj = at(p, j);
            const double dp = dot(dot_t, &at(v, j * HS), HS);
            const double ds = pj * (dp - D) * scale;
            for (int64_t d = 0; d < HS; ++d) {
              at(dv, j * HS + d) += pj * dot_t[d];
              at(dq, t * HS + d) += ds * at(k, j * HS + d);
              at(dk, j * HS + d) += ds * qt[d];
            }
          }
        }
        for (int64_t t = 0; t < T; ++t) {
          rotate(&at(dq, t * HS), t, -1);
          for (int64_t d = 0; d < HS; ++d)
            at(r.dqkv, (b * T + t) * row + h * HS + d) = at(dq, t * HS + d);
        }
      }
      for (int64_t t = 0; t < T; ++t) {
        rotate(&at(dk, t * HS), t, -1);
        for (int64_t d = 0; d < HS; ++d) {
          double* dst = r.dqkv.data() + (b * T + t) * row + C + kvh * HS + d;
          dst[0] = at(dk, t * HS + d);
          dst[KVH * HS] = at(dv, t * HS + d);
        }
      }
    }
  }
  return r;
}

}  // namespace

namespace {

/// One attention call's tensors on `be`: q, k, v and dout drawn from streams `stream` and
/// `stream + 1`, the outputs allocated; forward() and backward() run the op on them. KVH
/// key/value heads (0: one per query head) and the RoPE scaling are optional.
struct AttentionCall {
  Backend& be;
  int64_t B, NH, T, HS, C, KVH, W;  // C: out's width NH HS; W: qkv's, (NH + 2 KVH) HS
  float theta;
  RopeScaling scaling;
  Buffer qkv, dout, out, lse, dqkv;
  int64_t chunk = 0;  // chunk_tokens of both calls (attention over chunks); 0: the backend's choice
  Tensor doc_start;   // documents of both calls ((B, T) i32); empty: causal

  AttentionCall(Backend& backend, int64_t b, int64_t nh, int64_t t, int64_t hs, float rope_theta,
                uint64_t stream, int64_t kvh = 0, RopeScaling rope_scaling = {})
      : be(backend),
        B(b),
        NH(nh),
        T(t),
        HS(hs),
        C(nh * hs),
        KVH(kvh > 0 ? kvh : nh),
        W((nh + 2 * KVH) * hs),
        theta(rope_theta),
        scaling(rope_scaling),
        qkv(make_randn(be, {B, T, W}, kSeed, stream)),
        dout(make_randn(be, {B, T, C}, kSeed, stream + 1)),
        out(make_tensor(be, {B, T, C})),
        lse(make_tensor(be, {B, NH, T})),
        dqkv(make_filled(be, {B, T, W}, 7.0f)) {}  // [=]: the 7s must disappear

  int n_head() const { return static_cast<int>(NH); }
  int n_kv_head() const { return KVH == NH ? 0 : static_cast<int>(KVH); }
  RefShape ref_shape() const { return {B, T, NH, KVH, HS, static_cast<double>(theta), scaling}; }

  void forward() {
    be.attention_forward({.out = out,
                          .lse = lse,
                          .qkv = qkv,
                          .n_head = n_head(),
                          .rope_theta = theta,
                          .n_kv_head = n_kv_head(),
                          .rope_scaling = scaling,
                          .chunk_tokens = chunk,
                          .doc_start = doc_start});
  }
  /// The op CLOBBERS qkv (engine/core/ops/attention.h: with RoPE the CPU rotates q and k in place);
  /// the harness puts its values back, so that the call can run again and a reference can read
  /// them. `delta`: D from attention_delta, then out is not passed.
  void backward(const Tensor& delta = Tensor{}) {
    const std::vector<float> kept = to_host(qkv);
    be.attention_backward({.dqkv = dqkv,
                           .dout = dout,
                           .qkv = qkv,
                           .out = delta.empty() ? out.tensor() : Tensor{},
                           .lse = lse,
                           .n_head = n_head(),
                           .rope_theta = theta,
                           .delta = delta,
                           .n_kv_head = n_kv_head(),
                           .rope_scaling = scaling,
                           .chunk_tokens = chunk,
                           .doc_start = doc_start});
    be.upload(qkv, kept.data());
  }
  /// Host copies of out, lse and dqkv.
  std::vector<std::vector<float>> results() const {
    return {to_host(out), to_host(lse), to_host(dqkv)};
  }
};

// Runs attention forward and backward on random q, k, v, dout and compares outputs, log-sum-exp
// and dq, dk, dv with the double reference.
void check_attention_against_reference(int64_t B, int64_t NH, int64_t T, int64_t HS, float theta,
                                       int64_t KVH = 0, RopeScaling scaling = {},
                                       int threads = kTestThreads, int64_t chunk = 0) {
  CAPTURE(B, NH, T, HS, theta, KVH, threads, chunk);
  CpuBackend be(kTestBudgetBytes, threads);
  AttentionCall a(be, B, NH, T, HS, theta, 51, KVH, scaling);
  a.chunk = chunk;
  const int64_t C = a.C, W = a.W;
  // Queries 1.5x wider than keys: peakier softmax rows, so the online max rescale matters.
  for (int64_t i = 0; i < B * T; ++i)
    for (int64_t c = 0; c < C; ++c) a.qkv.f32()[i * W + c] *= 1.5f;
  a.forward();
  a.backward();
  const Buffer& out = a.out;
  const Buffer& lse = a.lse;
  const Buffer& dqkv = a.dqkv;
  const AttentionRef ref = attention_reference(to_double(a.qkv), to_double(a.dout), a.ref_shape());
  CHECK(allclose(to_host(out), ref.out, kTolAttention, "out"));
  CHECK(allclose(to_host(lse), ref.lse, kTolAttention, "lse"));
  // dq, dk, dv separately: each has its own scale and a bug usually hits only one of them.
  const int64_t begin[3] = {0, C, C + a.KVH * HS}, end[3] = {C, C + a.KVH * HS, W};
  for (int part = 0; part < 3; ++part) {
    std::vector<float> got;
    std::vector<double> want;
    for (int64_t i = 0; i < B * T; ++i)
      for (int64_t c = begin[part]; c < end[part]; ++c) {
        got.push_back(dqkv.f32()[i * W + c]);
        want.push_back(ref.dqkv[static_cast<size_t>(i * W + c)]);
      }
    CHECK(allclose(got, want, kTolAttention, part == 0 ? "dq" : part == 1 ? "dk" : "dv"));
  }
}

// The backward's dqkv against central differences of sum(out * dout); each test picks the call
// (one thread, a T that crosses a 64-row tile, a head size with few rotary frequencies).
void check_attention_central_differences(AttentionCall& a) {
  auto loss = [&] {
    a.forward();
    return weighted_sum(a.out, a.dout);
  };
  loss();
  a.backward();
  CHECK(allclose(to_host(a.dqkv), central_differences(a.qkv.f32(), a.B * a.T * a.W, kFdEps, loss),
                 kTolGradcheck, "dqkv"));
}

// The backward given D from attention_delta, without O, against the backward given O: the same
// bits. Returns D (7s before attention_delta overwrote it).
Buffer check_backward_from_delta(AttentionCall& a) {
  a.forward();
  a.backward();
  const std::vector<float> from_o = to_host(a.dqkv);
  Buffer delta = make_filled(a.be, {a.B, a.NH, a.T}, 7.0f);  // [=]: the 7s must disappear
  a.be.attention_delta({delta, a.dout, a.out, a.n_head()});
  a.be.fill(a.dqkv, 7.0f);
  a.backward(delta);
  CHECK(bitwise_equal({to_host(a.dqkv)}, {from_o}));
  return delta;
}

/// Llama 3's rescaling with a short original context, so that at the tested positions (up to
/// 200) it changes most angles: at HS = 16 and theta = 10^4 the pairs of wavelength 2 pi /
/// 10^(-i/2) fall in all three bands (pair 0 kept, pair 1 blended, pairs 2..7 divided by 8).
const RopeScaling kLlama3Short{.kind = RopeScaling::Llama3,
                               .factor = 8.0,
                               .low_freq_factor = 1.0,
                               .high_freq_factor = 4.0,
                               .original_context = 32};

/// The other scalings at the same short original context: each changes most angles at the
/// tested positions (dynamic, for a run of 200 tokens, grows the base 34-fold at HS = 16; yarn
/// keeps pair 0, halves pair 1's stretch and divides the others by 8 there, and its attention
/// factor is 1.208).
const RopeScaling kLinearShort{.kind = RopeScaling::Linear, .factor = 4.0};
const RopeScaling kDynamicShort{
    .kind = RopeScaling::Dynamic, .factor = 4.0, .original_context = 32, .seq_len = 200};
const RopeScaling kYarnShort{.kind = RopeScaling::Yarn, .factor = 8.0, .original_context = 32};

// (B, NH, T): several batches and heads where T is small, one batch of two heads at T = 1000, and
// batches of one with 1 head (whose backward the tests' two threads split over query and key
// tiles instead of heads) and 3 heads.
const std::vector<std::tuple<int64_t, int64_t, int64_t>> kAttnShapes = {
    {2, 3, 1}, {2, 3, 7}, {2, 2, 64}, {2, 2, 129}, {1, 2, 1000}, {1, 1, 200}, {1, 3, 129}};
/// Head sizes of every shape: GPT-2's 64, and both sides of it.
const std::vector<int64_t> kAttnHeadSizes = {16, 64, 128};

}  // namespace

namespace {

// Rows cut into documents: lengths that cross 64-token tiles or end on them, documents of one
// token, a row that is one document (causal) beside rows of several, and rows of one-token
// documents only.
struct DocumentLayout {
  int64_t T;
  std::vector<std::vector<int64_t>> rows;
};
const std::vector<DocumentLayout> kDocumentLayouts = {
    {200, {{1, 62, 71, 66}, {130, 5, 65}}},
    {129, {{64, 64, 1}, {129}}},
    {7, {{3, 1, 3}, {1, 1, 1, 1, 1, 1, 1}}},
};

// Document attention over the layout's rows, then each document's causal attention alone on the
// same q, k, v and dout rows (a call of T = its length, positions from 0): out, lse and dqkv
// compared document by document.
void check_documents_alone(const DocumentLayout& layout, int64_t NH, int64_t KVH, int64_t HS,
                           float theta, int threads, int64_t chunk,
                           const RopeScaling& scaling = RopeScaling{}) {
  CAPTURE(layout.T, NH, KVH, HS, theta, threads, chunk, rope_type_name(scaling.kind));
  CpuBackend be(kTestBudgetBytes, threads);
  const int64_t B = static_cast<int64_t>(layout.rows.size()), T = layout.T;
  AttentionCall a(be, B, NH, T, HS, theta, 97, KVH, scaling);
  const Buffer docs = make_i32(be, {B, T}, document_starts(layout.rows));
  a.doc_start = docs;
  a.chunk = chunk;
  a.forward();
  a.backward();
  const std::vector<float> qkv = to_host(a.qkv), dout = to_host(a.dout), out = to_host(a.out),
                           lse = to_host(a.lse), dqkv = to_host(a.dqkv);
  const int64_t C = a.C, W = a.W;
  auto rows = [](const std::vector<float>& v, int64_t first, int64_t n, int64_t width) {
    return std::vector<float>(v.begin() + first * width, v.begin() + (first + n) * width);
  };
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = 0;
    for (int64_t n : layout.rows[static_cast<size_t>(b)]) {
      CAPTURE(b, start, n);
      AttentionCall one(be, 1, NH, n, HS, theta, 98, KVH, scaling);
      be.upload(one.qkv, rows(qkv, b * T + start, n, W).data());
      be.upload(one.dout, rows(dout, b * T + start, n, C).data());
      one.forward();
      one.backward();
      std::vector<float> lse_doc;
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t t = 0; t < n; ++t)
          lse_doc.push_back(lse[static_cast<size_t>((b * NH + h) * T + start + t)]);
      CHECK(allclose(rows(out, b * T + start, n, C), to_double(one.out), kTolAttention, "out"));
      CHECK(allclose(lse_doc, to_double(one.lse), kTolAttention, "lse"));
      CHECK(allclose(rows(dqkv, b * T + start, n, W), to_double(one.dqkv), kTolAttention, "dqkv"));
      start += n;
    }
  }
}

}  // namespace

TEST_CASE("document attention equals each document's causal attention alone, outputs and gradients",
          "[ops][documents]") {
  // Both backward schedules (one thread: per head; three: split over tiles), the flash kernel and
  // attention over 64-token chunks, multi-head and grouped-query heads, RoPE restarting at 0.
  const DocumentLayout layout = GENERATE(from_range(kDocumentLayouts));
  const float theta = GENERATE(0.0f, 10000.0f);
  const int threads = GENERATE(1, 3);
  const int64_t chunk = GENERATE(int64_t{0}, int64_t{64});
  const auto [NH, KVH] = GENERATE(table<int64_t, int64_t>({{2, 2}, {4, 2}}));
  const int64_t HS = GENERATE(int64_t{16}, int64_t{64});
  check_documents_alone(layout, NH, KVH, HS, theta, threads, chunk);
}

TEST_CASE("document attention with scaled RoPE equals each document alone under that scaling",
          "[ops][documents][rope]") {
  // The scaled frequencies (and yarn's factor on cos and sin) times positions restarting at each
  // document: a packed row of an extended model sees what each document alone sees.
  const DocumentLayout layout = GENERATE(from_range(kDocumentLayouts));
  const RopeScaling scaling = GENERATE(kLinearShort, kYarnShort);
  const int64_t chunk = GENERATE(int64_t{0}, int64_t{64});
  check_documents_alone(layout, 4, 2, 16, 10000.0f, 3, chunk, scaling);
}

TEST_CASE("document attention gives the same bits on any thread count and either kernel",
          "[ops][documents]") {
  const float theta = GENERATE(0.0f, 10000.0f);
  const DocumentLayout& layout = kDocumentLayouts[0];
  const int64_t B = 2, NH = 2, T = layout.T, HS = 40;
  using cpu::AttentionIsa;
  const AttentionIsa native = cpu::attention_isa();
  std::vector<AttentionIsa> isas = {AttentionIsa::Avx2};
  if (__builtin_cpu_supports("avx512f")) isas.push_back(AttentionIsa::Avx512);
  std::vector<std::vector<std::vector<float>>> runs;
  for (AttentionIsa isa : isas)
    for (int threads : {1, 2, 3}) {
      CAPTURE(theta, threads, static_cast<int>(isa));
      cpu::force_attention_isa(isa);
      CpuBackend be(kTestBudgetBytes, threads);
      AttentionCall a(be, B, NH, T, HS, theta, 99);
      const Buffer docs = make_i32(be, {B, T}, document_starts(layout.rows));
      a.doc_start = docs;
      a.forward();
      a.backward();
      runs.push_back(a.results());
    }
  cpu::force_attention_isa(native);
  for (size_t i = 1; i < runs.size(); ++i) CHECK(bitwise_equal(runs[0], runs[i]));
}

TEST_CASE("attention forward and backward match a naive double-precision causal reference",
          "[ops]") {
  const auto [B, NH, T] = GENERATE(from_range(kAttnShapes));
  const int64_t HS = GENERATE(from_range(kAttnHeadSizes));
  check_attention_against_reference(B, NH, T, HS, 0.0f);
}

TEST_CASE("attention with rope matches a double reference with half-split rotary q and k",
          "[ops]") {
  const auto [B, NH, T] = GENERATE(from_range(kAttnShapes));
  const int64_t HS = GENERATE(from_range(kAttnHeadSizes));
  check_attention_against_reference(B, NH, T, HS, 10000.0f);
}

TEST_CASE("attention backward with and without rope matches central differences", "[ops]") {
  const float theta = GENERATE(0.0f, 10000.0f);
  CAPTURE(theta);
  CpuBackend be(kTestBudgetBytes, kFdThreads);
  // T = 70 crosses a 64-row tile; HS = 8 gives rotary frequencies 1, 0.1, 0.01, 0.001.
  AttentionCall a(be, 1, 2, 70, 8, theta, 61);
  check_attention_central_differences(a);
}

TEST_CASE("attention forward and backward are bitwise deterministic", "[ops]") {
  const float theta = GENERATE(0.0f, 10000.0f);
  CAPTURE(theta);
  const int64_t B = 2, NH = 3, T = 129, HS = 64;
  // Two runs on one backend, then a run on a one-thread backend: the same bits every time
  // (remat equivalence relies on recomputed tensors being bitwise equal).
  std::vector<std::vector<float>> one_thread;
  {
    CpuBackend be1(kTestBudgetBytes, 1);
    AttentionCall a(be1, B, NH, T, HS, theta, 71);
    a.forward();
    a.backward();
    one_thread = a.results();
  }
  CpuBackend be(kTestBudgetBytes, kTestThreads);  // restores the tests' thread count
  AttentionCall a(be, B, NH, T, HS, theta, 71);
  std::vector<std::vector<float>> runs[2];
  for (auto& run : runs) {
    a.forward();
    a.backward();
    run = a.results();
  }
  CHECK(bitwise_equal(runs[0], runs[1]));
  CHECK(bitwise_equal(runs[0], one_thread));
}

TEST_CASE("attention backward split over key and query tiles gives the bits of one task per head",
          "[ops]") {
  // 1 head: per head on 1 thread, split on 2 and 3; 2 heads: per head on 1 and 2 threads, split
  // on 3. T = 200 and 129 end in partial tiles; HS = 40 leaves a masked vector.
  const float theta = GENERATE(0.0f, 10000.0f);
  const auto [NH, T, HS] = GENERATE(table<int64_t, int64_t, int64_t>({{1, 200, 64}, {2, 129, 40}}));
  CAPTURE(theta, NH, T, HS);
  std::vector<std::vector<float>> by_threads[3];
  for (int threads : {1, 2, 3}) {
    CpuBackend be(kTestBudgetBytes, threads);
    AttentionCall a(be, 1, NH, T, HS, theta, 79);
    a.forward();
    a.backward();
    by_threads[threads - 1] = a.results();
  }
  CHECK(bitwise_equal(by_threads[0], by_threads[1]));
  CHECK(bitwise_equal(by_threads[0], by_threads[2]));
}

TEST_CASE(
    "attention backward given D from attention_delta, without O, gives the bits it gets "
    "from O",
    "[ops][attention]") {
  // Both schedules (1 and 3 threads with one head; grouped-query heads per head on 1 thread,
  // split on 3), partial tiles: multi-head with two batch rows, with plain RoPE and without; 4
  // query heads over 2 and over 1 key/value heads, with llama3-scaled RoPE and without.
  const int threads = GENERATE(1, 3);
  const auto [B, NH, KVH, T, HS, rope] =
      GENERATE(table<int64_t, int64_t, int64_t, int64_t, int64_t, int>(
          {{2, 1, 0, 200, 64, 0},
           {2, 1, 0, 200, 64, 1},
           {2, 2, 0, 129, 40, 0},
           {2, 2, 0, 129, 40, 1},
           {1, 4, 2, 129, 16, 0},
           {1, 4, 2, 129, 16, 2},
           {1, 4, 1, 200, 40, 0},
           {1, 4, 1, 200, 40, 2}}));  // rope: none, plain, llama3-scaled
  CAPTURE(threads, B, NH, KVH, T, HS, rope);
  CpuBackend be(kTestBudgetBytes, threads);
  AttentionCall a(be, B, NH, T, HS, rope > 0 ? 10000.0f : 0.0f, KVH > 0 ? 89 : 83, KVH,
                  rope == 2 ? kLlama3Short : RopeScaling{});
  const Buffer delta = check_backward_from_delta(a);
  // D itself against a double reference: rowsum(dO * O) per (b, h, t).
  const std::vector<float> d = to_host(delta), o = to_host(a.out), dout = to_host(a.dout);
  const int64_t C = NH * HS;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        double want = 0;
        for (int64_t c = 0; c < HS; ++c) {
          const size_t i = static_cast<size_t>((b * T + t) * C + h * HS + c);
          want += static_cast<double>(dout[i]) * o[i];
        }
        CHECK(d[static_cast<size_t>((b * NH + h) * T + t)] == Approx(want).margin(1e-5));
      }
}

TEST_CASE("attention's AVX-512 and AVX2 kernels give the same bits, in both backward schedules",
          "[ops]") {
  if (!__builtin_cpu_supports("avx512f")) {
    WARN("this CPU has no AVX-512: only the AVX2 kernel runs here, nothing to compare");
    return;
  }
  const float theta = GENERATE(0.0f, 10000.0f);
  // T = 129 and HS = 8, 40, 64: full and partial row blocks, full, masked and 1.5-vector panels.
  // T = 85, 86, 87 end on a tile of 21, 22, 23 rows: one 12-row block of the AVX-512 kernel and a
  // remainder of 9, 10, 11. 2 x 2 heads on the tests' two threads run the backward per head, 1 x 1
  // split (the AVX2 path is checked only here on an AVX-512 machine, so both schedules must run on
  // it).
  const int64_t T = GENERATE(int64_t{129}, int64_t{85}, int64_t{86}, int64_t{87});
  const int64_t HS = GENERATE(int64_t{8}, int64_t{40}, int64_t{64});
  const int64_t B = GENERATE(int64_t{2}, int64_t{1});
  const int64_t NH = B;
  CAPTURE(theta, T, HS, B, NH);
  using cpu::AttentionIsa, cpu::attention_isa, cpu::force_attention_isa;
  const AttentionIsa native = attention_isa();
  std::vector<std::vector<float>> by_isa[2];
  for (AttentionIsa isa : {AttentionIsa::Avx2, AttentionIsa::Avx512}) {
    force_attention_isa(isa);
    CpuBackend be(kTestBudgetBytes, kTestThreads);
    AttentionCall a(be, B, NH, T, HS, theta, 77);
    a.forward();
    a.backward();
    by_isa[static_cast<int>(isa)] = a.results();
  }
  force_attention_isa(native);
  CHECK(bitwise_equal(by_isa[0], by_isa[1]));
}

TEST_CASE("attention stays in its workspace after another backend raised the OpenMP thread count",
          "[ops]") {
  // OpenMP's thread count is process-global: a backend built for one thread sizes its attention
  // workspace for one thread, and must keep using one even after another backend asks for more.
  // (Without that, the second thread writes past the workspace: ASan reports it, release builds
  // may corrupt the heap silently.)
  CpuBackend one(kTestBudgetBytes, 1);
  { CpuBackend two(kTestBudgetBytes, 2); }
  const int64_t B = 2, NH = 2, T = 129, HS = 64;
  AttentionCall a(one, B, NH, T, HS, 0.0f, 75);
  a.forward();
  a.backward();
  const AttentionRef ref = attention_reference(to_double(a.qkv), to_double(a.dout), a.ref_shape());
  CHECK(allclose(to_host(a.out), ref.out, kTolAttention, "out"));
  CHECK(allclose(to_host(a.dqkv), ref.dqkv, kTolAttention, "dqkv"));
}

TEST_CASE("attention workspace measured by the pool is the stated formula and has no T^2 term",
          "[ops]") {
  const bool use_rope = GENERATE(false, true);
  CAPTURE(use_rope);
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const int64_t B = 1, NH = 1, HS = 64;
  const float theta = use_rope ? 10000.0f : 0.0f;
  for (const int64_t T : {int64_t{64}, int64_t{2048}}) {
    CAPTURE(T);
    AttentionCall a(be, B, NH, T, HS, theta, 81);
    const uint64_t want = MemoryPool::accounted_bytes(
        static_cast<size_t>(4 * cpu::attention_workspace_floats(T, HS, be.threads(), use_rope)));
    const uint64_t live = be.pool().live_bytes();
    const size_t ws = static_cast<size_t>(MemCategory::Workspace);

    be.pool().reset_peak();
    a.forward();
    CHECK(be.pool().peak_bytes() - live == want);
    CHECK(be.pool().peak_snapshot().by_category[ws] == want);
    CHECK(be.pool().live_bytes() == live);  // the workspace is returned

    be.pool().reset_peak();
    a.backward();
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

namespace {

// (B, NH, KVH, T, HS) of grouped-query attention: 2 and 3 query heads per key/value head (3: the
// forward's pairs of units straddle query tiles), multi-query (one key/value head), partial
// tiles; HS = 128 with 4 query heads (a head size set apart from the model's width, as Qwen3's
// 128 beside a width of 1024 over 16 heads); HS = 2 under 4 query heads per key/value head, more
// heads than a dv row has room for their D, so the backward runs split at any thread count.
using GqaShape = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>;
const std::vector<GqaShape> kGqaShapes = {{2, 4, 2, 129, 16}, {1, 4, 1, 200, 64}, {2, 3, 1, 7, 40},
                                          {1, 4, 2, 70, 128}, {2, 6, 2, 64, 24},  {1, 4, 1, 65, 2}};

// The largest |a - b| of two tensors' host copies.
double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return m;
}

}  // namespace

TEST_CASE("grouped-query attention matches a double reference that repeats key/value heads",
          "[ops][attention]") {
  const auto [B, NH, KVH, T, HS] = GENERATE(from_range(kGqaShapes));
  const float theta = GENERATE(0.0f, 10000.0f);
  check_attention_against_reference(B, NH, T, HS, theta, KVH);
}

TEST_CASE("attention with llama3 rope scaling matches a double reference of the rescaled angles",
          "[ops][attention]") {
  // Multi-head, grouped-query and multi-query; one thread runs the backward per head, three split.
  const auto [B, NH, KVH, T, HS] = GENERATE(table<int64_t, int64_t, int64_t, int64_t, int64_t>(
      {{1, 2, 0, 200, 16}, {2, 4, 2, 129, 16}, {1, 4, 1, 70, 64}}));
  const int threads = GENERATE(1, 3);
  check_attention_against_reference(B, NH, T, HS, 10000.0f, KVH, kLlama3Short, threads);
}

TEST_CASE("attention with linear, dynamic and yarn rope scaling matches a double reference",
          "[ops][attention][rope]") {
  // yarn's attention factor scales the rotated q and k (the logits by its square) and the
  // gradients back through the same scaled rotation.
  const RopeScaling scaling = GENERATE(kLinearShort, kDynamicShort, kYarnShort);
  CAPTURE(rope_type_name(scaling.kind));
  const auto [B, NH, KVH, T, HS] = GENERATE(
      table<int64_t, int64_t, int64_t, int64_t, int64_t>({{1, 2, 0, 200, 16}, {2, 4, 2, 129, 16}}));
  check_attention_against_reference(B, NH, T, HS, 10000.0f, KVH, scaling);
}

TEST_CASE("each rope scaling changes attention's output at the tested positions",
          "[ops][attention][rope]") {
  // Were the scaled angles (or yarn's factor) no different from the plain ones here, the rows
  // above would test nothing of them.
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  AttentionCall plain(be, 1, 4, 200, 16, 10000.0f, 53, 2);
  plain.forward();
  RopeScaling yarn_angles_only = kYarnShort;
  yarn_angles_only.attention_factor = 1.0;
  for (const RopeScaling& s : {kLinearShort, kDynamicShort, kYarnShort, yarn_angles_only}) {
    CAPTURE(rope_type_name(s.kind));
    AttentionCall scaled(be, 1, 4, 200, 16, 10000.0f, 53, 2, s);
    scaled.forward();
    CHECK(max_abs_difference(to_host(plain.out), to_host(scaled.out)) > 0.05);
  }
  AttentionCall yarn(be, 1, 4, 200, 16, 10000.0f, 53, 2, kYarnShort);
  AttentionCall angles_only(be, 1, 4, 200, 16, 10000.0f, 53, 2, yarn_angles_only);
  yarn.forward();
  angles_only.forward();
  CHECK(max_abs_difference(to_host(yarn.out), to_host(angles_only.out)) > 0.01);
}

TEST_CASE("llama3 rope scaling changes attention's output at the tested positions",
          "[ops][attention]") {
  // Were the scaled angles no different from the plain ones at these positions, the scaled rows
  // above would test nothing of the scaling.
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  AttentionCall plain(be, 1, 4, 70, 16, 10000.0f, 53, 2);
  AttentionCall scaled(be, 1, 4, 70, 16, 10000.0f, 53, 2, kLlama3Short);
  plain.forward();
  scaled.forward();
  CHECK(max_abs_difference(to_host(plain.out), to_host(scaled.out)) > 0.05);
}

TEST_CASE(
    "grouped-query attention's backward with llama3 and yarn rope scaling matches central "
    "differences, whole and over chunks",
    "[ops][attention][chunks][rope]") {
  // 4 query heads over 2, 1 and 4 key/value heads; whole, and in chunks of 32, 32 and 6 tokens
  // (6 pairs). RoPE none, llama3-scaled, yarn-scaled (its attention factor on cos and sin too).
  const int rope = GENERATE(0, 1, 2);
  const auto [KVH, chunk, stream] = GENERATE(
      table<int64_t, int64_t, uint64_t>({{2, 0, 63}, {1, 0, 63}, {0, 32, 65}, {2, 32, 65}}));
  CAPTURE(rope, KVH, chunk);
  CpuBackend be(kTestBudgetBytes, kFdThreads);
  // T = 70 crosses a 64-row tile; HS = 8 gives rotary frequencies 1, 0.1, 0.01, 0.001, rescaled
  // by kLlama3Short to 1, 0.0125, 0.00125, 0.000125.
  AttentionCall a(be, 1, 4, 70, 8, rope > 0 ? 10000.0f : 0.0f, stream, KVH,
                  rope == 1   ? kLlama3Short
                  : rope == 2 ? kYarnShort
                              : RopeScaling{});
  a.chunk = chunk;
  check_attention_central_differences(a);
}

TEST_CASE(
    "grouped-query attention gives the same bits for any thread count and both backward "
    "schedules",
    "[ops][attention]") {
  // A batch of one: 4 query heads over 2 key/value heads run the backward per head on 1 and 2
  // threads, split on 3; over 1, per head on 1 thread, split on 2 and 3. 6 over 2 (3 per group):
  // per head on 1 and 2, split on 3. 9 over 3 (SmolLM2's heads): per head on 1 and 3 threads, on
  // 2 both at once (two key/value heads per head, the third split). dK and dV sum their group's
  // query heads in one order in both.
  const auto [NH, KVH, T, HS] = GENERATE(table<int64_t, int64_t, int64_t, int64_t>(
      {{4, 2, 129, 16}, {4, 1, 200, 40}, {6, 2, 130, 64}, {9, 3, 130, 32}}));
  const bool rope = GENERATE(false, true);
  CAPTURE(NH, KVH, T, HS, rope);
  const float theta = rope ? 10000.0f : 0.0f;
  const RopeScaling scaling = rope ? kLlama3Short : RopeScaling{};
  std::vector<std::vector<float>> by_threads[3];
  for (int threads : {1, 2, 3}) {
    CpuBackend be(kTestBudgetBytes, threads);
    AttentionCall a(be, 1, NH, T, HS, theta, 87, KVH, scaling);
    a.forward();
    a.backward();
    by_threads[threads - 1] = a.results();
    if (threads == 2) {  // and again on the same backend
      a.forward();
      a.backward();
      CHECK(bitwise_equal(a.results(), by_threads[1]));
    }
  }
  CHECK(bitwise_equal(by_threads[0], by_threads[1]));
  CHECK(bitwise_equal(by_threads[0], by_threads[2]));
}

TEST_CASE("grouped-query attention's workspace is the stated formula at its head size",
          "[ops][attention]") {
  // qkv is (NH + 2 KVH) HS wide: a rule that took it for 3 NH HS would size the tiles for another
  // head size, and the RoPE table with it.
  const bool use_rope = GENERATE(false, true);
  CAPTURE(use_rope);
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const int64_t NH = 8, KVH = 2, T = 100, HS = 128;
  AttentionCall a(be, 1, NH, T, HS, use_rope ? 10000.0f : 0.0f, 85, KVH);
  const uint64_t want = MemoryPool::accounted_bytes(
      static_cast<size_t>(4 * cpu::attention_workspace_floats(T, HS, be.threads(), use_rope)));
  const uint64_t live = be.pool().live_bytes();
  be.pool().reset_peak();
  a.forward();
  CHECK(be.pool().peak_bytes() - live == want);
  be.pool().reset_peak();
  a.backward();
  CHECK(be.pool().peak_bytes() - live == want);
}

TEST_CASE("rope_inv_freq gives Llama 3.1 8B's rescaled frequencies, and GPT's plain ones exactly",
          "[ops][attention]") {
  // theta 500000, HS 128, factor 8, low 1, high 4, original context 8192: wavelengths under
  // 8192 / 4 = 2048 are kept (pairs 0..28), over 8192 are divided by 8 (pairs 35..63), between
  // blended. Values: transformers' formula evaluated in double (Python), by pair index.
  const RopeScaling llama31{.kind = RopeScaling::Llama3,
                            .factor = 8.0,
                            .low_freq_factor = 1.0,
                            .high_freq_factor = 4.0,
                            .original_context = 8192};
  const std::vector<double> f = rope_inv_freq(128, 500000.0, llama31);
  REQUIRE(f.size() == 64);
  const std::vector<std::pair<size_t, double>> want = {
      {0, 1.0},                      // wavelength 2 pi: kept
      {20, 0.016560440080994446},    // 379: kept
      {28, 0.003211445994752591},    // 1956: kept, the last one
      {29, 0.002166570763503359},    // 2402: blended, smooth 0.8036
      {32, 0.0005248461609929547},   // 4443: blended, smooth 0.2813
      {34, 0.0001785078127679964},   // 6695: blended, smooth 0.0745
      {35, 9.556212353964683e-05},   // 8219: divided by 8, the first one
      {63, 3.068925988914511e-07}};  // 2.6e6: divided by 8
  for (const auto& [i, v] : want) {
    CAPTURE(i);
    CHECK(f[i] == Approx(v).epsilon(1e-12));
  }
  // Without scaling: theta^(-2i / HS) computed as the CPU's table always did, to the bit (GPT's
  // RoPE must not move).
  const std::vector<double> plain = rope_inv_freq(64, static_cast<double>(10000.0f));
  for (size_t i = 0; i < plain.size(); ++i)
    CHECK(plain[i] == std::pow(static_cast<double>(10000.0f),
                               -2.0 * static_cast<double>(i) / static_cast<double>(64)));
}

// ---- attention over chunks (engine/core/ops/attention.h; engine/cpu/attention_chunks.cpp) ----

namespace {

/// Attention over chunks against the unchunked op, both f32 on the CPU: the chunked path merges
/// the pairs' outputs by their lse and sums dq over key chunks and dk, dv over query chunks, so
/// only the order and grouping of float sums differ. Measured over the rows below (2 threads):
/// at most 1.0e-6 of the largest entry (dqkv), 7.4e-7 (out), 2.9e-7 (lse), so this leaves 5x. A
/// merge weight off by 1e-4 already fails it (3e-4 errors in out, tried); a dropped or doubled
/// pair or a wrong mask gives errors of order 1e-2 and more.
inline constexpr Tolerance kTolAttentionChunks{5e-6, 5e-6, true};

// (B, NH, KVH, T, HS, theta, scaling) of the chunked rows: multi-head with two batch rows,
// grouped-query with llama3 RoPE scaling, multi-query with RoPE, a head size of 128.
struct ChunkRow {
  int64_t B, NH, KVH, T, HS;
  float theta;
  RopeScaling scaling;
};
const std::vector<ChunkRow> kChunkRows = {{2, 3, 0, 129, 16, 0.0f, {}},
                                          {1, 4, 2, 200, 16, 10000.0f, kLlama3Short},
                                          {1, 4, 1, 150, 64, 10000.0f, {}},
                                          {2, 2, 0, 100, 128, 10000.0f, {}}};

// One forward and one backward (D from attention_delta, as the blocks run it on the CPU) with
// `chunk` tokens per chunk: out, lse, dqkv.
std::vector<std::vector<float>> run_attention(const ChunkRow& r, int64_t chunk,
                                              int threads = kTestThreads) {
  CpuBackend be(kTestBudgetBytes, threads);
  AttentionCall a(be, r.B, r.NH, r.T, r.HS, r.theta, 71, r.KVH, r.scaling);
  a.chunk = chunk;
  a.forward();
  Buffer delta = make_tensor(be, {r.B, r.NH, r.T});
  be.attention_delta({delta, a.dout, a.out, a.n_head()});
  a.backward(delta);
  return a.results();
}

std::vector<double> widened(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

}  // namespace

TEST_CASE("attention over one chunk gives the unchunked op's bits", "[ops][attention][chunks]") {
  const ChunkRow r = GENERATE(from_range(kChunkRows));
  CAPTURE(r.B, r.NH, r.KVH, r.T, r.HS, r.theta);
  const auto whole = run_attention(r, 0);
  for (const int64_t chunk : {r.T, r.T + 1, r.T + 64}) {
    CAPTURE(chunk);
    const auto one = run_attention(r, chunk);
    for (size_t i = 0; i < whole.size(); ++i) CHECK(test::bitwise_equal({one[i]}, {whole[i]}));
  }
}

TEST_CASE("attention over chunks matches the unchunked op within a measured bound",
          "[ops][attention][chunks]") {
  const ChunkRow r = GENERATE(from_range(kChunkRows));
  // 7 and 33 divide none of the lengths, 64 one of them; T - 1 leaves a last chunk of one token.
  const int64_t chunk = GENERATE(int64_t{7}, int64_t{33}, int64_t{64}, int64_t{-1});
  const int64_t L = chunk > 0 ? chunk : r.T - 1;
  CAPTURE(r.B, r.NH, r.KVH, r.T, r.HS, r.theta, L);
  const auto whole = run_attention(r, 0);
  const auto chunked = run_attention(r, L);
  const char* names[] = {"out", "lse", "dqkv"};
  for (size_t i = 0; i < whole.size(); ++i)
    CHECK(allclose(chunked[i], widened(whole[i]), kTolAttentionChunks, names[i]));
  // The chunked path really ran: its bits differ from the unchunked op's somewhere.
  CHECK_FALSE(test::bitwise_equal({chunked[2]}, {whole[2]}));
}

TEST_CASE("attention over chunks matches the double-precision causal reference",
          "[ops][attention][chunks]") {
  // The same references and tolerance as the unchunked op, GQA and MQA with llama3 RoPE.
  const auto [B, NH, KVH, T, HS] = GENERATE(table<int64_t, int64_t, int64_t, int64_t, int64_t>(
      {{2, 3, 0, 129, 16}, {1, 4, 2, 200, 16}, {1, 4, 1, 70, 64}}));
  const int64_t chunk = GENERATE(int64_t{16}, int64_t{50});
  check_attention_against_reference(B, NH, T, HS, 0.0f, KVH, {}, kTestThreads, chunk);
  check_attention_against_reference(B, NH, T, HS, 10000.0f, KVH, kLlama3Short, kTestThreads, chunk);
}

TEST_CASE("attention over chunks gives the same bits for 1, 2 and 3 threads",
          "[ops][attention][chunks]") {
  const ChunkRow r = kChunkRows[1];
  const auto one = run_attention(r, 33, 1);
  for (int threads : {2, 3}) {
    CAPTURE(threads);
    const auto many = run_attention(r, 33, threads);
    for (size_t i = 0; i < one.size(); ++i) CHECK(test::bitwise_equal({many[i]}, {one[i]}));
  }
}

TEST_CASE("attention over chunks holds the workspace its rule states, and returns it",
          "[ops][attention][chunks]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const int64_t B = 2, NH = 4, KVH = 2, T = 150, HS = 16, L = 64;
  AttentionCall a(be, B, NH, T, HS, 10000.0f, 83, KVH);
  a.chunk = L;
  const int64_t W = a.W, C = a.C;
  auto bytes = [](int64_t floats) {
    return MemoryPool::accounted_bytes(static_cast<size_t>(4 * floats));
  };
  const uint64_t live = be.pool().live_bytes();
  be.pool().reset_peak();
  a.forward();
  CHECK(be.pool().peak_bytes() - live == bytes(B * T * W) + bytes(L * C + 2 * NH * L));
  CHECK(be.pool().live_bytes() == live);
  be.pool().reset_peak();
  a.backward();  // with out, no delta: D for every row in the pair part
  CHECK(be.pool().peak_bytes() - live == 2 * bytes(B * T * W) + bytes(2 * NH * L + B * NH * T));
  CHECK(be.pool().live_bytes() == live);
}

#if REMAT_TEST_CUDA_ROWS
TEST_CASE("causal attention forward and backward on CUDA match the CPU, with and without RoPE",
          "[gpu][attention]") {
  const auto [B, NH, T] = GENERATE(from_range(kAttnShapes));
  const int64_t HS = GENERATE(from_range(kAttnHeadSizes));
  const float theta = GENERATE(0.0f, 10000.0f);
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  CAPTURE(B, NH, T, HS, theta, dtype_name(act));
  CudaRow r(act, process_cuda_backend(act));
  const int64_t C = NH * HS;
  const int n_head = static_cast<int>(NH);
  auto [qkv_c, qkv_g] = r.act_pair({B, T, 3 * C}, r.act_values(B * T * 3 * C, 51));
  auto [o_c, o_g] = r.zeros_act({B, T, C});
  auto [l_c, l_g] = r.zeros_f32({B, NH, T});
  r.cpu.attention_forward({o_c, l_c, qkv_c, n_head, theta});
  r.gpu->attention_forward({o_g, l_g, qkv_g, n_head, theta});
  r.check_same(o_c, o_g, kCudaAttention, "out");
  r.check_same(l_c, l_g, kCudaAttention, "lse");
  // Each backward takes its own forward's out and lse, as in training.
  auto [do_c, do_g] = r.act_pair({B, T, C}, r.act_values(B * T * C, 52));
  auto [dq_c, dq_g] =
      r.act_pair({B, T, 3 * C}, std::vector<float>(static_cast<size_t>(B * T * 3 * C), 7.0f));
  r.cpu.attention_backward({dq_c, do_c, qkv_c, o_c, l_c, n_head, theta});
  r.gpu->attention_backward({dq_g, do_g, qkv_g, o_g, l_g, n_head, theta});
  r.check_same(dq_c, dq_g, kCudaAttention, "dqkv (=)");
  // delta is the row sum of dO * O over a head: both backends get the CPU's O, so that the row
  // measures the delta op alone (each backend's own O differs by kCudaAttention, and a sum of HS
  // products magnifies that past a GEMM's tolerance, as the first run on an H200 showed).
  auto [o2_c, o2_g] = r.act_pair({B, T, C}, fetch(r.cpu, o_c));
  auto [d_c, d_g] = r.zeros_f32({B, NH, T});
  r.cpu.attention_delta({d_c, do_c, o2_c, n_head});
  r.gpu->attention_delta({d_g, do_g, o2_g, n_head});
  r.check_same(d_c, d_g, r.pick(kCudaF32Gemm, kCudaBf16Gemm), "delta (=)");
}

namespace {

/// The heads, RoPE, chunking and documents of an attention call on a CUDA row.
struct AttentionSetup {
  int n_head, n_kv_head;
  float theta;
  RopeScaling scaling;
  int64_t chunk = 0;
  std::vector<int32_t> doc_starts{};  // (B, T) document starts; empty: causal
};

/// One attention forward and backward on the row's CPU or GPU: out, lse and dqkv (prefilled
/// with 7s, [=]). The call gets its own copy of qkv, which the backward clobbers (bf16 with RoPE).
struct AttentionOutputs {
  Buffer out, lse, dqkv;
};
AttentionOutputs attention_on(CudaRow& r, bool gpu, const AttentionSetup& a, int64_t B, int64_t T,
                              const std::vector<float>& qkv_values,
                              const std::vector<float>& dout_values) {
  Backend& be = gpu ? static_cast<Backend&>(*r.gpu) : r.cpu;
  const DType act = gpu ? r.act : DType::F32;
  const int64_t NH = a.n_head, W = static_cast<int64_t>(qkv_values.size()) / (B * T);
  const int64_t C = static_cast<int64_t>(dout_values.size()) / (B * T);
  const Buffer qkv = upload(be, {B, T, W}, act, qkv_values);
  const Buffer dout = upload(be, {B, T, C}, act, dout_values);
  AttentionOutputs o{
      upload(be, {B, T, C}, act, std::vector<float>(dout_values.size(), 0.0f)),
      upload(be, {B, NH, T}, DType::F32, std::vector<float>(static_cast<size_t>(B * NH * T), 0.0f)),
      upload(be, {B, T, W}, act, std::vector<float>(qkv_values.size(), 7.0f))};
  const Buffer docs = a.doc_starts.empty() ? Buffer() : make_i32(be, {B, T}, a.doc_starts);
  be.attention_forward(
      {o.out, o.lse, qkv, a.n_head, a.theta, a.n_kv_head, a.scaling, a.chunk, docs});
  be.attention_backward({o.dqkv, dout, qkv, o.out, o.lse, a.n_head, a.theta, Tensor{}, a.n_kv_head,
                         a.scaling, a.chunk, docs});
  return o;
}

/// The call on CUDA (over chunks of a.chunk tokens there; 0: unchunked) against the CPU's
/// unchunked op: out, lse and dqkv within kCudaAttention. Returns CUDA's dqkv.
std::vector<float> check_against_cpu(CudaRow& r, const AttentionSetup& a, int64_t B, int64_t T,
                                     const std::vector<float>& qkv_values,
                                     const std::vector<float>& dout_values) {
  AttentionSetup unchunked = a;
  unchunked.chunk = 0;
  const AttentionOutputs c = attention_on(r, false, unchunked, B, T, qkv_values, dout_values);
  const AttentionOutputs g = attention_on(r, true, a, B, T, qkv_values, dout_values);
  r.check_same(c.out, g.out, kCudaAttention, "out");
  r.check_same(c.lse, g.lse, kCudaAttention, "lse");
  r.check_same(c.dqkv, g.dqkv, kCudaAttention, "dqkv (=): dq, dk and dv summed over each group");
  return fetch(*r.gpu, g.dqkv);
}

}  // namespace

TEST_CASE(
    "grouped-query attention with llama3 rope scaling on CUDA matches the CPU (cuDNN's own "
    "key/value heads)",
    "[gpu][attention]") {
  // (B, NH, KVH, T, HS): 2 query heads per key/value head, multi-query, 3 per group, and head
  // sizes cuDNN takes (multiples of 8): 64, 128 (a head size apart from width / heads, as
  // Qwen3's), 40; partial tiles. Scaled RoPE, plain RoPE and none.
  const auto [B, NH, KVH, T, HS] = GENERATE(table<int64_t, int64_t, int64_t, int64_t, int64_t>(
      {{2, 4, 2, 129, 64}, {1, 4, 1, 200, 128}, {2, 6, 2, 67, 40}}));
  const int rope = GENERATE(0, 1, 2);  // none, plain, llama3-scaled
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  CAPTURE(B, NH, KVH, T, HS, rope, dtype_name(act));
  CudaRow r(act, process_cuda_backend(act));
  const int64_t C = NH * HS, W = (NH + 2 * KVH) * HS;
  const AttentionSetup args{static_cast<int>(NH), static_cast<int>(KVH), rope > 0 ? 10000.0f : 0.0f,
                            rope == 2 ? kLlama3Short : RopeScaling{}};
  const std::vector<float> qkv = r.act_values(B * T * W, 55), dout = r.act_values(B * T * C, 56);
  check_against_cpu(r, args, B, T, qkv, dout);
}

TEST_CASE("document attention on CUDA matches the CPU's (one cuDNN call per document)",
          "[gpu][attention][documents]") {
  // The CPU's document attention equals each document alone ([ops][documents]); CUDA's runs each
  // document as one padded causal call (engine/cuda/attention.cpp). The layouts of the CPU rows:
  // documents across 64-token tiles, of one token, a row of one document, rows of one-token
  // documents; multi-head and grouped-query heads, plain and scaled RoPE restarting in each
  // document, and none; chunked attention set (documents ignore it on CUDA).
  const DocumentLayout layout = GENERATE(from_range(kDocumentLayouts));
  const auto [NH, KVH, HS] =
      GENERATE(table<int64_t, int64_t, int64_t>({{2, 2, 64}, {4, 2, 40}, {4, 1, 128}}));
  const int rope = GENERATE(0, 1, 2);  // none, plain, llama3-scaled
  const int64_t chunk = GENERATE(int64_t{0}, int64_t{64});
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  const int64_t B = static_cast<int64_t>(layout.rows.size()), T = layout.T;
  CAPTURE(T, NH, KVH, HS, rope, chunk, dtype_name(act));
  CudaRow r(act, process_cuda_backend(act));
  const int64_t C = NH * HS, W = (NH + 2 * KVH) * HS;
  const AttentionSetup args{static_cast<int>(NH),
                            static_cast<int>(KVH),
                            rope > 0 ? 10000.0f : 0.0f,
                            rope == 2 ? kLlama3Short : RopeScaling{},
                            chunk,
                            document_starts(layout.rows)};
  check_against_cpu(r, args, B, T, r.act_values(B * T * W, 55), r.act_values(B * T * C, 56));
}

TEST_CASE("attention with linear, dynamic and yarn rope scaling on CUDA matches the CPU",
          "[gpu][rope]") {
  // The scaled frequencies and yarn's factor on cos and sin reach cuDNN's rotated q and k.
  const RopeScaling scaling = GENERATE(kLinearShort, kDynamicShort, kYarnShort);
  const auto [B, NH, KVH, T, HS] = GENERATE(table<int64_t, int64_t, int64_t, int64_t, int64_t>(
      {{2, 4, 2, 129, 64}, {1, 4, 1, 200, 128}, {2, 6, 2, 67, 40}}));
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  CAPTURE(B, NH, KVH, T, HS, rope_type_name(scaling.kind), dtype_name(act));
  CudaRow r(act, process_cuda_backend(act));
  const int64_t C = NH * HS, W = (NH + 2 * KVH) * HS;
  const AttentionSetup args{static_cast<int>(NH), static_cast<int>(KVH), 10000.0f, scaling};
  check_against_cpu(r, args, B, T, r.act_values(B * T * W, 55), r.act_values(B * T * C, 56));
}

TEST_CASE("attention over chunks on CUDA matches the CPU and unchunked CUDA",
          "[gpu][attention][chunks]") {
  // Each pair is one cuDNN call (causal on the diagonal, unmasked off it), merged in f32: the
  // chunked CUDA op against the unchunked CPU op, and against CUDA's own unchunked op. 64 divides
  // none of the lengths. 128 at T = 129 would leave a last chunk of one token, whose diagonal pair
  // is a 1 x 1 causal call that cuDNN's backward refuses: the CUDA rule shortens the chunk to 127
  // (127 + 2 tokens, three pairs per row; cuda::without_one_token_tail), so this row runs exactly
  // that split; at T = 200, 150 and 100 it is 128 + 72, 128 + 22 and one chunk.
  const ChunkRow row = GENERATE(from_range(kChunkRows));
  const int64_t chunk = GENERATE(int64_t{64}, int64_t{128});
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  CAPTURE(row.B, row.NH, row.KVH, row.T, row.HS, row.theta, chunk, dtype_name(act));
  CudaRow r(act, process_cuda_backend(act));
  const int64_t B = row.B, NH = row.NH, T = row.T, HS = row.HS, C = NH * HS;
  const int64_t KVH = row.KVH > 0 ? row.KVH : NH, W = (NH + 2 * KVH) * HS;
  AttentionSetup args{static_cast<int>(NH), static_cast<int>(row.KVH), row.theta, row.scaling};
  const std::vector<float> qkv = r.act_values(B * T * W, 57), dout = r.act_values(B * T * C, 58);
  const AttentionOutputs c = attention_on(r, false, args, B, T, qkv, dout);
  const AttentionOutputs u = attention_on(r, true, args, B, T, qkv, dout);  // CUDA's unchunked op
  args.chunk = chunk;
  const AttentionOutputs g = attention_on(r, true, args, B, T, qkv, dout);
  const char* names[] = {"out", "lse", "dqkv (=)"};
  const Buffer* cpu[] = {&c.out, &c.lse, &c.dqkv};
  const Buffer* unchunked[] = {&u.out, &u.lse, &u.dqkv};
  const Buffer* chunked[] = {&g.out, &g.lse, &g.dqkv};
  for (int i = 0; i < 3; ++i) {
    INFO(names[i]);
    r.check_same(*cpu[i], *chunked[i], kCudaAttention, "chunked CUDA against the CPU");
    CHECK(allclose(fetch(*r.gpu, *chunked[i]), widened(fetch(*r.gpu, *unchunked[i])),
                   kCudaAttention, "chunked against unchunked CUDA"));
  }
}

TEST_CASE("the cuDNN in use needs no padding mask: key lengths off multiples of 128 backpropagate",
          "[gpu][cudnn_version]") {
  // cuDNN up to 9.15.0 gives NaN in the attention backward when the key length is not a multiple
  // of 128 unless the graph has a padding mask, which cudnn-frontend adds there and our raw graphs
  // do not: the backend refuses those releases (cuda::cudnn_version_refusal), so the one it runs
  // on must pass this. Key lengths 200 (unchunked: 200 % 128 = 72), and 64 + 64 + 64 + 8 (chunks
  // of 64, every pair's key length off 128), grouped-query heads with RoPE, bf16 activations.
  const int64_t version = static_cast<int64_t>(cudnnGetVersion());
  std::printf("cuDNN in use: %lld\n", static_cast<long long>(version));
  CHECK(cuda::cudnn_version_refusal(version).empty());
  const int64_t chunk = GENERATE(int64_t{0}, int64_t{64});
  CAPTURE(chunk);
  CudaRow r(DType::BF16, process_cuda_backend(DType::BF16));
  const int64_t B = 1, NH = 4, KVH = 2, T = 200, HS = 64, C = NH * HS, W = (NH + 2 * KVH) * HS;
  const AttentionSetup args{static_cast<int>(NH), static_cast<int>(KVH), 10000.0f, {}, chunk};
  const std::vector<float> dqkv =
      check_against_cpu(r, args, B, T, r.act_values(B * T * W, 55), r.act_values(B * T * C, 56));
  CHECK(std::all_of(dqkv.begin(), dqkv.end(), [](float v) { return std::isfinite(v); }));
}
#endif

#if defined(REMAT_HAVE_CUDA) && !REMAT_TEST_CUDA_ROWS
TEST_CASE("cuDNN's grouped-query attention graphs finalize on the host", "[cuda][attention]") {
  // No device needed (tests/test_cudnn_graphs.cpp): K and V with fewer heads than Q, dK and dV
  // reduced over each group (two more backward ops), multi-query included.
  struct Shape {
    int64_t B, NH, KVH, T, HS;
  };
  const Shape shapes[] = {{1, 32, 8, 1024, 128}, {2, 4, 1, 67, 64}, {1, 6, 2, 129, 40}};
  for (const Shape& s : shapes) {
    INFO("B=" << s.B << " NH=" << s.NH << " KVH=" << s.KVH << " T=" << s.T << " HS=" << s.HS);
    std::string summary;
    REQUIRE_NOTHROW(summary = cuda::check_attention_graphs_finalize(s.B, s.NH, s.T, s.HS, s.KVH));
    CHECK(summary == "fwd 14 ops, bwd 24 ops");
  }
  // KVH = NH is multi-head attention: the graph of before.
  CHECK(cuda::check_attention_graphs_finalize(1, 4, 64, 64, 4) == "fwd 14 ops, bwd 22 ops");
}

TEST_CASE("cuDNN's graphs of an off-diagonal chunk pair finalize on the host",
          "[cuda][attention][chunks]") {
  // Attention over chunks: T queries against Tk earlier keys, no mask (the causal mask's four ops
  // gone), with multi-head, grouped-query and multi-query heads; the diagonal pairs are the
  // causal graphs above at the chunk's length.
  CHECK(cuda::check_attention_graphs_finalize(1, 4, 64, 64, 0, 128, false) ==
        "fwd 10 ops, bwd 18 ops");
  CHECK(cuda::check_attention_graphs_finalize(1, 32, 22, 128, 8, 64, false) ==
        "fwd 10 ops, bwd 20 ops");
  CHECK(cuda::check_attention_graphs_finalize(1, 4, 64, 64, 1, 64, false) ==
        "fwd 10 ops, bwd 20 ops");
  // A square causal pair of a chunk is the causal graph.
  CHECK(cuda::check_attention_graphs_finalize(1, 4, 64, 64, 0, 64, true) ==
        "fwd 14 ops, bwd 22 ops");
}
#endif

}  // namespace remat::test
