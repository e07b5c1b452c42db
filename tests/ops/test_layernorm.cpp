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

TEST_CASE("layernorm forward matches a double reference", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const auto [N, C] = GENERATE(from_range(kLayerNormShapes));
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
