// Op test of RMSNorm and of the per-head q/k RMSNorm of a fused qkv row
// (engine/core/ops/rmsnorm.h): forward against a double reference, including the rounding of the
// normalized row before the weight multiplies it; backward against central differences and a double
// reference, with dinp += as the residual stream (RMSNorm) or dinp = (q/k norm) and the weight
// gradients +=; grouped-query layouts (NH = 4 query heads over KVH = 2 and 1 key/value heads); the
// same bits for any thread count. Against the CPU backend, the specification every other backend is
// checked against. RMSNorm's fixture, reference and checks are LayerNorm's too
// (tests/ops/norm_call.h): its forward against the reference and its backward against central
// differences run with LayerNorm's in tests/ops/test_layernorm.cpp. Tolerances and shared helpers:
// tests/test_util.h (through tests/ops/op_test.h).
#include "tests/ops/norm_call.h"

namespace remat::test {

/// The q/k norm shapes: grouped-query layouts (4 query heads over 2 and over 1 key/value heads),
/// plain multi-head attention, head sizes that are not a multiple of 16, and enough rows that the
/// query heads' weight gradient (N NH segments) is summed in several chunks on CUDA.
struct QkNormShape {
  int64_t N;
  int NH, KVH;
  int64_t HS;
};
const std::vector<QkNormShape> kQkNormShapes = {
    {5, 4, 2, 8}, {7, 4, 1, 13}, {3, 2, 2, 16}, {33, 4, 1, 64}, {1500, 4, 2, 40}};

namespace {

/// One q/k norm's tensors: a fused qkv input (N, (NH + 2 KVH) HS) ~ N(0.1, 1), q and k weights
/// ~ N(1, 0.5^2) (different draws, so that swapping them shows), dout ~ N(0, 1); dinp prefilled
/// with 7 (backward overwrites it), the weight gradients with `grad_prefill` (backward adds).
struct QkNormCall {
  Backend& be;
  int64_t N;
  int NH, KVH;
  int64_t HS, W;
  float eps;
  Buffer inp, q_weight, k_weight, dout, out, rstd, dinp, dq_weight, dk_weight;

  QkNormCall(Backend& backend, const QkNormShape& s, uint64_t stream, float grad_prefill,
             float eps_ = 1e-6f)
      : be(backend),
        N(s.N),
        NH(s.NH),
        KVH(s.KVH),
        HS(s.HS),
        W((s.NH + 2 * s.KVH) * s.HS),
        eps(eps_),
        inp(make_randn(be, {N, W}, kSeed, stream, 1.0, 0.1)),
        q_weight(make_randn(be, {HS}, kSeed, stream + 1, 0.5, 1.0)),
        k_weight(make_randn(be, {HS}, kSeed, stream + 2, 0.5, 1.0)),
        dout(make_randn(be, {N, W}, kSeed, stream + 3)),
        out(make_tensor(be, {N, W})),
        rstd(make_tensor(be, {N, NH + KVH})),
        dinp(make_filled(be, {N, W}, 7.0f)),
        dq_weight(make_filled(be, {HS}, grad_prefill)),
        dk_weight(make_filled(be, {HS}, grad_prefill)) {}

  void forward() { be.qk_norm_forward({out, rstd, inp, q_weight, k_weight, NH, KVH, eps}); }
  void backward() {
    be.qk_norm_backward({dinp, dq_weight, dk_weight, dout, inp, q_weight, k_weight, rstd, NH, KVH});
  }
  std::vector<std::vector<float>> results() const {
    return {to_host(out), to_host(rstd), to_host(dinp), to_host(dq_weight), to_host(dk_weight)};
  }

  /// The double reference of the whole op: out, rstd, dinp and the gradients the backward adds.
  struct Reference {
    std::vector<double> out, rstd, dinp, dq_weight, dk_weight;
  };
  Reference reference() const {
    const int NQK = NH + KVH;
    Reference ref{.out = std::vector<double>(static_cast<size_t>(N * W)),
                  .rstd = std::vector<double>(static_cast<size_t>(N * NQK)),
                  .dinp = std::vector<double>(static_cast<size_t>(N * W)),
                  .dq_weight = std::vector<double>(static_cast<size_t>(HS), 0.0),
                  .dk_weight = std::vector<double>(static_cast<size_t>(HS), 0.0)};
    const std::vector<double> x = to_double(inp), dy = to_double(dout), qw = to_double(q_weight),
                              kw = to_double(k_weight);
    std::vector<double> xhat(static_cast<size_t>(HS));
    for (int64_t r = 0; r < N; ++r) {
      for (int h = 0; h < NQK; ++h) {
        const size_t off = static_cast<size_t>(r * W + h * HS);
        const bool q = h < NH;
        const double* w = (q ? qw : kw).data();
        const double rs =
            ref::norm_row(ref::Norm::Rms, &ref.out[off], xhat.data(), &x[off], w, nullptr, HS, eps)
                .rstd;
        ref.rstd[static_cast<size_t>(r * NQK + h)] = rs;
        ref::norm_row_back(ref::Norm::Rms, &ref.dinp[off],
                           (q ? ref.dq_weight : ref.dk_weight).data(), nullptr, &dy[off],
                           xhat.data(), w, rs, HS);
      }
      for (int64_t c = NQK * HS; c < W; ++c) {  // the value heads pass through
        ref.out[static_cast<size_t>(r * W + c)] = x[static_cast<size_t>(r * W + c)];
        ref.dinp[static_cast<size_t>(r * W + c)] = dy[static_cast<size_t>(r * W + c)];
      }
    }
    return ref;
  }
};

}  // namespace

TEST_CASE("rmsnorm forward takes eps from its arguments, inside the square root", "[ops]") {
  // Rows whose mean square (~1e-5) is eps's size, where eps moves rstd by half; and O(1) rows
  // with a large eps, where a constant in place of the argument's would show.
  const auto [x_scale, eps] = GENERATE(table<double, float>({{3e-3, 1e-5f}, {1.0, 0.25f}}));
  CAPTURE(x_scale, eps);
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  NormCall rn(be, ref::Norm::Rms, 6, 40, 25, 0.0f, eps, x_scale);
  check_norm_forward(rn);
}

TEST_CASE(
    "rmsnorm and qk_norm round the normalized row to the activation dtype before the "
    "weight multiplies it",
    "[ops]") {
  // As transformers' LlamaRMSNorm: weight * (x * rstd).to(dtype). On the CPU the activation dtype
  // is f32, so the op's out is float(x * rstd) * w to the bit, with the op's own rstd.
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  NormCall rn(be, ref::Norm::Rms, 9, 77, 27, 0.0f);
  rn.forward();
  std::vector<float> want(static_cast<size_t>(rn.N * rn.C));
  for (int64_t n = 0; n < rn.N; ++n)
    for (int64_t c = 0; c < rn.C; ++c) {
      const float xhat = rn.inp.f32()[n * rn.C + c] * rn.stats.f32()[n];
      want[static_cast<size_t>(n * rn.C + c)] = xhat * rn.weight.f32()[c];
    }
  CHECK(allclose(to_host(rn.out), want, kTolExact, "rmsnorm out"));

  QkNormCall qk(be, {5, 4, 2, 24}, 28, 0.0f);
  qk.forward();
  const int NQK = qk.NH + qk.KVH;
  std::vector<float> want_qk = to_host(qk.inp);  // the value heads pass through
  for (int64_t r = 0; r < qk.N; ++r)
    for (int h = 0; h < NQK; ++h)
      for (int64_t c = 0; c < qk.HS; ++c) {
        const int64_t i = r * qk.W + h * qk.HS + c;
        const float xhat = qk.inp.f32()[i] * qk.rstd.f32()[r * NQK + h];
        want_qk[static_cast<size_t>(i)] = xhat * (h < qk.NH ? qk.q_weight : qk.k_weight).f32()[c];
      }
  CHECK(allclose(to_host(qk.out), want_qk, kTolExact, "qk_norm out"));
}

TEST_CASE("rmsnorm backward matches a double reference on every shape, adding into its gradients",
          "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const auto [N, C] = GENERATE(from_range(kRmsNormShapes));
  CAPTURE(N, C);
  NormCall rn(be, ref::Norm::Rms, N, C, 41, 0.5f);
  // dweight sums up to 5000 rows: rounding set by its largest entry (tests/test_util.h).
  check_norm_backward(rn, kTolLongReduction);
}

TEST_CASE("qk_norm forward normalizes the q and k heads with their own weights and copies v",
          "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const QkNormShape s = GENERATE(from_range(kQkNormShapes));
  CAPTURE(s.N, s.NH, s.KVH, s.HS);
  QkNormCall qk(be, s, 51, 0.0f);
  qk.forward();
  const QkNormCall::Reference ref = qk.reference();
  CHECK(allclose(to_host(qk.out), ref.out, kTolReduction, "out"));
  CHECK(allclose(to_host(qk.rstd), ref.rstd, kTolReduction, "rstd (N, NH + KVH)"));
}

TEST_CASE("qk_norm forward takes eps from its arguments", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  QkNormCall qk(be, {4, 4, 2, 16}, 55, 0.0f, 0.25f);
  qk.forward();
  const QkNormCall::Reference ref = qk.reference();
  CHECK(allclose(to_host(qk.out), ref.out, kTolReduction, "out"));
  CHECK(allclose(to_host(qk.rstd), ref.rstd, kTolReduction, "rstd"));
}

TEST_CASE("qk_norm backward matches central differences: dinp overwritten, weight gradients added",
          "[ops]") {
  const int KVH = GENERATE(2, 1);
  CAPTURE(KVH);
  CpuBackend be(kTestBudgetBytes, kFdThreads);
  QkNormCall qk(be, {3, 4, KVH, 13}, 61, 0.5f);
  auto loss = [&] {
    qk.forward();
    return weighted_sum(qk.out, qk.dout);
  };
  loss();
  const std::vector<double> dq0 = to_double(qk.dq_weight), dk0 = to_double(qk.dk_weight);
  qk.backward();
  CHECK(allclose(to_host(qk.dinp), central_differences(qk.inp.f32(), qk.N * qk.W, kFdEps, loss),
                 kTolGradcheck, "dinp (=)"));
  CHECK(allclose(minus(qk.dq_weight, dq0),
                 central_differences(qk.q_weight.f32(), qk.HS, kFdEps, loss), kTolGradcheck,
                 "dq_weight added"));
  CHECK(allclose(minus(qk.dk_weight, dk0),
                 central_differences(qk.k_weight.f32(), qk.HS, kFdEps, loss), kTolGradcheck,
                 "dk_weight added"));
}

TEST_CASE("qk_norm backward matches a double reference on every shape", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const QkNormShape s = GENERATE(from_range(kQkNormShapes));
  CAPTURE(s.N, s.NH, s.KVH, s.HS);
  QkNormCall qk(be, s, 71, 0.5f);
  qk.forward();
  const std::vector<double> dq0 = to_double(qk.dq_weight), dk0 = to_double(qk.dk_weight);
  qk.backward();
  const QkNormCall::Reference ref = qk.reference();
  CHECK(allclose(to_host(qk.dinp), ref.dinp, kTolReduction, "dinp (=)"));
  CHECK(allclose(minus(qk.dq_weight, dq0), ref.dq_weight, kTolLongReduction, "dq_weight added"));
  CHECK(allclose(minus(qk.dk_weight, dk0), ref.dk_weight, kTolLongReduction, "dk_weight added"));
}

TEST_CASE("rmsnorm and qk_norm give the same bits for any thread count", "[ops]") {
  // Rows split over threads, and the weight gradients' 32-channel slices (77 channels: 3 slices;
  // HS = 40: 2) over 1, 2 and 3 threads; the tests' thread count last, as the others expect.
  std::vector<std::vector<float>> rms[3], qk[3];
  for (int threads : {1, 3, kTestThreads}) {
    CAPTURE(threads);
    CpuBackend be(kTestBudgetBytes, threads);
    NormCall rn(be, ref::Norm::Rms, 5000, 77, 81, 0.5f);
    rn.forward();
    rn.backward();
    rms[threads - 1] = rn.results();
    QkNormCall q(be, {300, 4, 2, 40}, 85, 0.5f);
    q.forward();
    q.backward();
    qk[threads - 1] = q.results();
  }
  CHECK(bitwise_equal(rms[0], rms[1]));
  CHECK(bitwise_equal(rms[0], rms[2]));
  CHECK(bitwise_equal(qk[0], qk[1]));
  CHECK(bitwise_equal(qk[0], qk[2]));
}

#if REMAT_TEST_CUDA_ROWS
namespace {

/// out = w * act(float(x * rstd)) rounded to act, on the host with the GPU's rstd: what the
/// kernel computes, operation for operation (float products, round-to-nearest-even to bf16).
float rounded_norm(float x, float rstd, float w, bool bf16) {
  auto to_act = [bf16](float v) { return bf16 ? from_bf16_bits(to_bf16_bits(v)) : v; };
  return to_act(w * to_act(x * rstd));
}

}  // namespace

TEST_CASE("rmsnorm forward and backward on CUDA match the CPU (dinp accumulates)",
          "[gpu][rmsnorm]") {
  check_norm_cuda_rows(ref::Norm::Rms, kRmsNormShapes);
}

TEST_CASE("qk_norm forward and backward on CUDA match the CPU (dinp overwritten)",
          "[gpu][rmsnorm]") {
  const QkNormShape s = GENERATE(from_range(kQkNormShapes));
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  CAPTURE(s.N, s.NH, s.KVH, s.HS, dtype_name(act));
  CudaRow r(act);
  const Tolerance out_tol = r.pick(kCudaF32Gemm, kCudaBf16Gemm);
  const Tolerance grad_tol = r.pick(kCudaF32Gemm, kCudaBf16ParamGrad);
  const int64_t W = (s.NH + 2 * s.KVH) * s.HS, NQK = s.NH + s.KVH;
  auto [x_c, x_g] = r.act_pair({s.N, W}, r.act_values(s.N * W, 21, 2.0));
  auto [qw_c, qw_g] = r.f32_pair({s.HS}, host_randn(s.HS, 22));
  auto [kw_c, kw_g] = r.f32_pair({s.HS}, host_randn(s.HS, 23));
  auto [y_c, y_g] = r.zeros_act({s.N, W});
  auto [st_c, st_g] = r.zeros_f32({s.N, NQK});
  const float eps = 1e-6f;
  r.cpu.qk_norm_forward({y_c, st_c, x_c, qw_c, kw_c, s.NH, s.KVH, eps});
  r.gpu->qk_norm_forward({y_g, st_g, x_g, qw_g, kw_g, s.NH, s.KVH, eps});
  r.check_same(y_c, y_g, out_tol, "out");
  r.check_same(st_c, st_g, kCudaF32Gemm, "rstd");
  auto [dy_c, dy_g] = r.act_pair({s.N, W}, r.act_values(s.N * W, 24));
  auto [dx_c, dx_g] = r.act_pair({s.N, W}, r.act_values(s.N * W, 25));  // = : overwritten
  auto [dq_c, dq_g] = r.f32_pair({s.HS}, host_randn(s.HS, 26));
  auto [dk_c, dk_g] = r.f32_pair({s.HS}, host_randn(s.HS, 27));
  r.cpu.qk_norm_backward({dx_c, dq_c, dk_c, dy_c, x_c, qw_c, kw_c, st_c, s.NH, s.KVH});
  r.gpu->qk_norm_backward({dx_g, dq_g, dk_g, dy_g, x_g, qw_g, kw_g, st_g, s.NH, s.KVH});
  r.check_same(dx_c, dx_g, out_tol, "dinp (=)");
  r.check_same(dq_c, dq_g, grad_tol, "dq_weight (+=)");
  r.check_same(dk_c, dk_g, grad_tol, "dk_weight (+=)");
}

TEST_CASE(
    "rmsnorm and qk_norm on CUDA round the normalized row to the activation dtype before "
    "the weight multiplies it",
    "[gpu][rmsnorm]") {
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  CAPTURE(dtype_name(act));
  CudaRow r(act);
  Backend& gpu = *r.gpu;
  const int64_t N = 9, C = 77;
  const std::vector<float> xs = r.act_values(N * C, 31, 2.0), ws = host_randn(C, 32);
  Buffer x = upload(gpu, {N, C}, act, xs), w = upload(gpu, {C}, DType::F32, ws);
  Buffer y = make_tensor(gpu, {N, C}, act), rstd = make_tensor(gpu, {N});
  gpu.rmsnorm_forward({.out = y, .rstd = rstd, .inp = x, .weight = w});
  const std::vector<float> rs = fetch(gpu, rstd);
  std::vector<float> want(xs.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      want[static_cast<size_t>(n * C + c)] =
          rounded_norm(xs[static_cast<size_t>(n * C + c)], rs[static_cast<size_t>(n)],
                       ws[static_cast<size_t>(c)], r.bf16());
  CHECK(allclose(fetch(gpu, y), want, kTolExact, "rmsnorm out"));

  const int NH = 4, KVH = 1;
  const int64_t HS = 24, W = (NH + 2 * KVH) * HS, NQK = NH + KVH;
  const std::vector<float> qkv = r.act_values(N * W, 33, 2.0), qws = host_randn(HS, 34),
                           kws = host_randn(HS, 35);
  Buffer inp = upload(gpu, {N, W}, act, qkv), qw = upload(gpu, {HS}, DType::F32, qws),
         kw = upload(gpu, {HS}, DType::F32, kws);
  Buffer out = make_tensor(gpu, {N, W}, act), qk_rstd = make_tensor(gpu, {N, NQK});
  gpu.qk_norm_forward({out, qk_rstd, inp, qw, kw, NH, KVH, 1e-6f});
  const std::vector<float> qk_rs = fetch(gpu, qk_rstd);
  std::vector<float> want_qk = qkv;  // the value heads pass through
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < NQK; ++h)
      for (int64_t c = 0; c < HS; ++c) {
        const size_t i = static_cast<size_t>(n * W + h * HS + c);
        want_qk[i] = rounded_norm(qkv[i], qk_rs[static_cast<size_t>(n * NQK + h)],
                                  (h < NH ? qws : kws)[static_cast<size_t>(c)], r.bf16());
      }
  CHECK(allclose(fetch(gpu, out), want_qk, kTolExact, "qk_norm out"));
}

TEST_CASE("rmsnorm and qk_norm backward on CUDA give the same bits run to run", "[gpu][rmsnorm]") {
  // The weight gradients' two-pass column sums (5000 rows; 6000 query segments) in a fixed order.
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  CAPTURE(dtype_name(act));
  CudaRow r(act);
  Backend& gpu = *r.gpu;
  const int64_t N = 5000, C = 77;
  Buffer x = upload(gpu, {N, C}, act, r.act_values(N * C, 41, 2.0));
  Buffer w = upload(gpu, {C}, DType::F32, host_randn(C, 42));
  Buffer dy = upload(gpu, {N, C}, act, r.act_values(N * C, 43));
  Buffer y = make_tensor(gpu, {N, C}, act), rstd = make_tensor(gpu, {N});
  gpu.rmsnorm_forward({.out = y, .rstd = rstd, .inp = x, .weight = w});
  std::vector<std::vector<float>> runs[2];
  for (auto& run : runs) {
    Buffer dx = upload(gpu, {N, C}, act, std::vector<float>(static_cast<size_t>(N * C), 0.0f));
    Buffer dw = upload(gpu, {C}, DType::F32, std::vector<float>(static_cast<size_t>(C), 0.0f));
    gpu.rmsnorm_backward({dx, dw, dy, x, w, rstd});
    run = {fetch(gpu, dx), fetch(gpu, dw)};
  }
  CHECK(bitwise_equal(runs[0], runs[1]));

  const QkNormShape s = kQkNormShapes.back();
  const int64_t W = (s.NH + 2 * s.KVH) * s.HS;
  Buffer inp = upload(gpu, {s.N, W}, act, r.act_values(s.N * W, 44, 2.0));
  Buffer qw = upload(gpu, {s.HS}, DType::F32, host_randn(s.HS, 45));
  Buffer kw = upload(gpu, {s.HS}, DType::F32, host_randn(s.HS, 46));
  Buffer dout = upload(gpu, {s.N, W}, act, r.act_values(s.N * W, 47));
  Buffer out = make_tensor(gpu, {s.N, W}, act), qk_rstd = make_tensor(gpu, {s.N, s.NH + s.KVH});
  gpu.qk_norm_forward({out, qk_rstd, inp, qw, kw, s.NH, s.KVH, 1e-6f});
  std::vector<std::vector<float>> qk_runs[2];
  for (auto& run : qk_runs) {
    const std::vector<float> zeros(static_cast<size_t>(s.HS), 0.0f);
    Buffer dinp = make_tensor(gpu, {s.N, W}, act);
    Buffer dq = upload(gpu, {s.HS}, DType::F32, zeros), dk = upload(gpu, {s.HS}, DType::F32, zeros);
    gpu.qk_norm_backward({dinp, dq, dk, dout, inp, qw, kw, qk_rstd, s.NH, s.KVH});
    run = {fetch(gpu, dinp), fetch(gpu, dq), fetch(gpu, dk)};
  }
  CHECK(bitwise_equal(qk_runs[0], qk_runs[1]));
}
#endif

}  // namespace remat::test
