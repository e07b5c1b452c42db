// Op test of LayerNorm: forward against a double reference, backward against central differences
// and a double reference, and dinp += as the residual stream.
// Against the CPU backend, the specification every other backend is checked against;
// tolerances and shared helpers: tests/test_util.h (through tests/ops/op_test.h).
#include "tests/ops/op_test.h"

namespace remat::test {

/// The shapes every backend runs: channel counts below, across and far beyond one 32-channel
/// slice of the parameter-gradient pass, and 5000 rows for its two-pass (row chunks, then chunk
/// order) reduction, not a multiple of the chunk.
struct LayerNormShape {
  int64_t N, C;
};
const std::vector<LayerNormShape> kLayerNormShapes = {
    {7, 13}, {5, 37}, {64, 200}, {41, 77}, {5000, 77}};

namespace {

/// One LayerNorm's tensors on `be`: inputs ~ N(0.3, 1.5^2), weight ~ N(1, 1), bias and dout
/// ~ N(0, 1) from streams `stream` .. `stream + 3`; the gradients prefilled with `grad_prefill`
/// (backward adds into all three).
struct LayerNormCall {
  Backend& be;
  int64_t N, C;
  Buffer inp, weight, bias, dout, out, stats, dinp, dweight, dbias;

  LayerNormCall(Backend& backend, int64_t n, int64_t c, uint64_t stream, float grad_prefill)
      : be(backend),
        N(n),
        C(c),
        inp(make_randn(be, {N, C}, kSeed, stream, 1.5, 0.3)),
        weight(make_randn(be, {C}, kSeed, stream + 1, 1.0, 1.0)),
        bias(make_randn(be, {C}, kSeed, stream + 2)),
        dout(make_randn(be, {N, C}, kSeed, stream + 3)),
        out(make_tensor(be, {N, C})),
        stats(make_tensor(be, {N, 2})),
        dinp(make_filled(be, {N, C}, grad_prefill)),
        dweight(make_filled(be, {C}, grad_prefill)),
        dbias(make_filled(be, {C}, grad_prefill)) {}

  void forward() {
    be.layernorm_forward({.out = out, .stats = stats, .inp = inp, .weight = weight, .bias = bias});
  }
  void backward() {
    be.layernorm_backward({.dinp = dinp,
                           .dweight = dweight,
                           .dbias = dbias,
                           .dout = dout,
                           .inp = inp,
                           .weight = weight,
                           .stats = stats});
  }
};

}  // namespace

TEST_CASE("layernorm forward matches a double reference", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const auto [N, C] = GENERATE(from_range(kLayerNormShapes));
  CAPTURE(N, C);
  LayerNormCall ln(be, N, C, 21, 0.0f);
  ln.forward();
  const Buffer &inp = ln.inp, &weight = ln.weight, &bias = ln.bias;
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
  CHECK(allclose(to_host(ln.out), want, kTolReduction, "out"));
  CHECK(allclose(to_host(ln.stats), want_stats, kTolReduction, "stats (mean, rstd)"));
}

TEST_CASE("layernorm backward matches central differences and adds into dinp", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kFdThreads);
  const int64_t N = 5, C = 37;  // C > 32: two channel slices in the parameter-gradient pass
  LayerNormCall ln(be, N, C, 31, 0.5f);  // [+=]: dinp is the residual stream, the 0.5 must stay
  auto loss = [&] {
    ln.forward();
    return weighted_sum(ln.out, ln.dout);
  };
  loss();  // stats of the unperturbed input
  const std::vector<double> dinp0 = to_double(ln.dinp), dweight0 = to_double(ln.dweight),
                            dbias0 = to_double(ln.dbias);
  ln.backward();
  CHECK(allclose(minus(ln.dinp, dinp0), central_differences(ln.inp.f32(), N * C, kFdEps, loss),
                 kTolGradcheck, "dinp added"));
  CHECK(allclose(minus(ln.dweight, dweight0), central_differences(ln.weight.f32(), C, kFdEps, loss),
                 kTolGradcheck, "dweight added"));
  CHECK(allclose(minus(ln.dbias, dbias0), central_differences(ln.bias.f32(), C, kFdEps, loss),
                 kTolGradcheck, "dbias added"));
}

TEST_CASE("layernorm backward matches a double reference on many rows and channel slices",
          "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const int64_t N = 64, C = 200;
  LayerNormCall ln(be, N, C, 41, 0.0f);
  ln.forward();
  ln.backward();
  const Buffer &inp = ln.inp, &weight = ln.weight, &dout = ln.dout;
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
  CHECK(allclose(to_host(ln.dinp), want_dx, kTolReduction, "dinp"));
  CHECK(allclose(to_host(ln.dweight), want_dw, kTolReduction, "dweight"));
  CHECK(allclose(to_host(ln.dbias), want_db, kTolReduction, "dbias"));
}

#if REMAT_TEST_CUDA_ROWS
TEST_CASE("layernorm forward and backward on CUDA match the CPU (dinp accumulates)",
          "[gpu][layernorm]") {
  const auto [N, C] = GENERATE(from_range(kLayerNormShapes));
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  CAPTURE(N, C, dtype_name(act));
  CudaRow r(act);
  const Tolerance out_tol = r.pick(kCudaF32Gemm, kCudaBf16Gemm);
  const Tolerance grad_tol = r.pick(kCudaF32Gemm, kCudaBf16ParamGrad);
  auto [x_c, x_g] = r.act_pair({N, C}, r.act_values(N * C, 11, 2.0));
  auto [w_c, w_g] = r.f32_pair({C}, host_randn(C, 12));
  auto [b_c, b_g] = r.f32_pair({C}, host_randn(C, 13));
  auto [y_c, y_g] = r.zeros_act({N, C});
  auto [s_c, s_g] = r.zeros_f32({N, 2});
  r.cpu.layernorm_forward({y_c, s_c, x_c, w_c, b_c});
  r.gpu->layernorm_forward({y_g, s_g, x_g, w_g, b_g});
  r.check_same(y_c, y_g, out_tol, "out");
  r.check_same(s_c, s_g, kCudaF32Gemm, "stats (mean, rstd)");
  auto [dy_c, dy_g] = r.act_pair({N, C}, r.act_values(N * C, 14));
  auto [dx_c, dx_g] = r.act_pair({N, C}, r.act_values(N * C, 15));  // += : the residual stream
  auto [dw_c, dw_g] = r.f32_pair({C}, host_randn(C, 16));
  auto [db_c, db_g] = r.f32_pair({C}, host_randn(C, 17));
  r.cpu.layernorm_backward({dx_c, dw_c, db_c, dy_c, x_c, w_c, s_c});
  r.gpu->layernorm_backward({dx_g, dw_g, db_g, dy_g, x_g, w_g, s_g});
  r.check_same(dx_c, dx_g, out_tol, "dinp (+=)");
  r.check_same(dw_c, dw_g, grad_tol, "dweight (+=)");
  r.check_same(db_c, db_g, grad_tol, "dbias (+=)");
}
#endif

}  // namespace remat::test
