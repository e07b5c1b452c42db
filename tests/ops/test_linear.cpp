// Op test of the linear layer: forward against a double reference with and without bias and
// accumulate, the gradient contract (dinp =, dweight and dbias +=), central differences, and the
// fused activation epilogues against the separate activation ops. Against
// the CPU backend, the specification every other backend is checked against; tolerances and shared
// helpers: tests/test_util.h.
#include "engine/core/cpu_workspace.h"
#include "engine/core/nf4.h"
#include "engine/cpu/gemm_grid.h"
#include "tests/ops/op_test.h"

namespace remat::test {

/// The shapes every backend runs: tiny, one past the CPU GEMM's tiles, odd sizes throughout, and
/// 5000 rows for the CUDA bias gradient's two-pass column reduction (row chunks, then chunk
/// order; 5000 is not a multiple of the chunk, 29 columns leave a partial 32-column slice).
struct LinearShape {
  int64_t N, C, OC;
};
const std::vector<LinearShape> kLinearShapes = {
    {7, 13, 5}, {65, 130, 67}, {37, 45, 29}, {5000, 77, 29}};
/// The packed (bf16, NF4) weights' shapes add one of more than 256 NF4 blocks of 64 (17,030
/// values, 267 blocks, the last one partial): double quantisation keeps one absmax scale per 256
/// blocks, so only such a weight reads the second one.
const std::vector<LinearShape> kPackedShapes = {
    {7, 13, 5}, {65, 130, 67}, {37, 45, 29}, {5000, 77, 29}, {9, 130, 131}};

TEST_CASE("linear forward matches a double reference with and without bias and accumulate",
          "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const auto [N, C, OC] = GENERATE(from_range(kLinearShapes));
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
  // The 5000 rows' weight gradient is cut along them, its partial sums held in dinp before dinp
  // is written (engine/cpu/linear.cpp); without a dinp, the tile grid alone.
  REQUIRE(cpu::choose_split_grid(29, 77, 5000).slabs > 1);
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const auto [N, C, OC] = GENERATE(from_range(kLinearShapes));
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
  CHECK(allclose(minus(dweight, dweight0), want_dw, kTolLongReduction, "dweight added"));
  if (with_optional) {
    CHECK(allclose(to_host(dinp), want_dinp, kTolReduction, "dinp"));
    CHECK(allclose(minus(dbias, dbias0), want_db, kTolLongReduction, "dbias added"));
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

TEST_CASE("the linear's fused activations are the activation ops, bit for bit", "[ops]") {
  // Forward: act_out = act(out) in the GEMM tiles' epilogue. Backward: dinp on through act'.
  // Each must equal the separate ops on every element, at every tile edge (65 x 130 x 67 and
  // 300 x 70 x 520 cross the CPU GEMM's tiles; 520 is not a multiple of 8 lanes).
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  std::vector<LinearShape> shapes = kLinearShapes;
  shapes.push_back({300, 70, 520});
  const auto [N, C, OC] = GENERATE_COPY(from_range(shapes));
  const Activation act = GENERATE(Activation::Gelu, Activation::Relu);
  const bool accumulate = GENERATE(false, true);
  CAPTURE(N, C, OC, act == Activation::Gelu ? "gelu" : "relu", accumulate);
  Buffer inp = make_randn(be, {N, C}, kSeed, 1);
  Buffer weight = make_randn(be, {OC, C}, kSeed, 2);
  Buffer bias = make_randn(be, {OC}, kSeed, 3);
  Buffer out_fused = make_randn(be, {N, OC}, kSeed, 4),
         out_apart = make_randn(be, {N, OC}, kSeed, 4);
  Buffer act_fused = make_filled(be, {N, OC}, 7.0f), act_apart = make_tensor(be, {N, OC});
  be.linear_forward({.out = out_fused,
                     .inp = inp,
                     .weight = weight,
                     .bias = bias,
                     .accumulate = accumulate,
                     .act_out = act_fused,
                     .act = act});
  be.linear_forward(
      {.out = out_apart, .inp = inp, .weight = weight, .bias = bias, .accumulate = accumulate});
  be.activation_forward({.out = act_apart, .inp = out_apart, .kind = act});
  CHECK(to_host(out_fused) == to_host(out_apart));
  CHECK(to_host(act_fused) == to_host(act_apart));

  // Backward through a layer whose input was act(pre): d pre = (dout W) act'(pre).
  Buffer pre = make_randn(be, {N, C}, kSeed, 5);
  Buffer dout = make_randn(be, {N, OC}, kSeed, 6);
  Buffer dpre_fused = make_filled(be, {N, C}, 7.0f), dpre_apart = make_tensor(be, {N, C});
  Buffer dw_fused = make_filled(be, {OC, C}, 0.0f), dw_apart = make_filled(be, {OC, C}, 0.0f);
  be.linear_backward({.dinp = dpre_fused,
                      .dweight = dw_fused,
                      .dout = dout,
                      .inp = inp,
                      .weight = weight,
                      .inp_pre_act = pre,
                      .act = act});
  be.linear_backward(
      {.dinp = dpre_apart, .dweight = dw_apart, .dout = dout, .inp = inp, .weight = weight});
  be.activation_backward({.dinp = dpre_apart, .dout = dpre_apart, .inp = pre, .kind = act});
  CHECK(to_host(dpre_fused) == to_host(dpre_apart));
  CHECK(to_host(dw_fused) == to_host(dw_apart));
}

TEST_CASE(
    "a linear with a bf16 or NF4 weight computes what an f32 linear of its decoded values "
    "computes, bit for bit",
    "[ops][nf4]") {
  // The CPU's GEMMs read an f32 copy decoded into the op's workspace ("gemm.weight_f32"): the
  // same products as the decoded f32 weight, and no weight gradient (a frozen base has none).
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const auto [N, C, OC] = GENERATE(from_range(kPackedShapes));
  const DType dtype = GENERATE(from_range(kPackedWeights));
  CAPTURE(N, C, OC, dtype_name(dtype));
  const std::vector<float> w = to_host(make_randn(be, {OC, C}, kSeed, 2));
  const Buffer packed = packed_weight(be, OC, C, dtype, w);
  const Buffer plain = be.pool().allocate({OC, C}, DType::F32, MemCategory::Weights, "plain");
  be.upload(plain, decoded(dtype, w).data());
  const Buffer inp = make_randn(be, {N, C}, kSeed, 1), bias = make_randn(be, {OC}, kSeed, 3);
  Buffer y_packed = make_randn(be, {N, OC}, kSeed, 4), y_plain = make_randn(be, {N, OC}, kSeed, 4);
  be.linear_forward({y_packed, inp, packed, bias, true});
  be.linear_forward({y_plain, inp, plain, bias, true});
  CHECK(to_host(y_packed) == to_host(y_plain));
  const Buffer dout = make_randn(be, {N, OC}, kSeed, 5);
  Buffer dx_packed = make_randn(be, {N, C}, kSeed, 6), dx_plain = make_randn(be, {N, C}, kSeed, 7);
  be.linear_backward(
      {.dinp = dx_packed, .dweight = {}, .dout = dout, .inp = inp, .weight = packed});
  be.linear_backward({.dinp = dx_plain, .dweight = {}, .dout = dout, .inp = inp, .weight = plain});
  CHECK(to_host(dx_packed) == to_host(dx_plain));
  // The copy is the op's workspace: an (OC, C) f32 part, none for an f32 weight.
  const WorkspaceTarget t{DeviceKind::Cpu, kTestThreads};
  const WorkspaceList ws = cpu::workspace(LinearForwardArgs{y_packed, inp, packed}, t);
  REQUIRE(ws.end() - ws.begin() == 1);
  CHECK(std::string(ws.begin()->name) == "gemm.weight_f32");
  const WorkspaceList none = cpu::workspace(LinearForwardArgs{y_plain, inp, plain}, t);
  CHECK(none.begin() == none.end());
}

#if REMAT_TEST_CUDA_ROWS
TEST_CASE("linear forward and backward on CUDA match the CPU (bias, accumulate)", "[gpu][linear]") {
  const auto [N, C, OC] = GENERATE(from_range(kLinearShapes));
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  CAPTURE(N, C, OC, dtype_name(act));
  CudaRow r(act);
  const Tolerance out_tol = r.pick(kCudaF32Gemm, kCudaBf16Gemm);
  const Tolerance grad_tol = r.pick(kCudaF32Gemm, kCudaBf16ParamGrad);
  auto [x_c, x_g] = r.act_pair({N, C}, r.act_values(N * C, 1));
  auto [w_c, w_g] = r.f32_pair({OC, C}, host_randn(OC * C, 2, 0.2));
  auto [b_c, b_g] = r.f32_pair({OC}, host_randn(OC, 3));
  const auto prefill = r.act_values(N * OC, 4);
  for (bool accumulate : {false, true}) {
    auto [y_c, y_g] = r.act_pair({N, OC}, prefill);
    r.cpu.linear_forward({y_c, x_c, w_c, b_c, accumulate});
    r.gpu->linear_forward({y_g, x_g, w_g, b_g, accumulate});
    r.check_same(y_c, y_g, out_tol, accumulate ? "out (accumulate)" : "out");
  }
  auto [dy_c, dy_g] = r.act_pair({N, OC}, r.act_values(N * OC, 5));
  auto [dx_c, dx_g] = r.act_pair({N, C}, std::vector<float>(static_cast<size_t>(N * C), 7.0f));
  auto [dw_c, dw_g] = r.f32_pair({OC, C}, host_randn(OC * C, 6));  // += : start from nonzero
  auto [db_c, db_g] = r.f32_pair({OC}, host_randn(OC, 7));
  r.cpu.linear_backward({dx_c, dw_c, db_c, dy_c, x_c, w_c});
  r.gpu->linear_backward({dx_g, dw_g, db_g, dy_g, x_g, w_g});
  r.check_same(dx_c, dx_g, out_tol, "dinp (=)");
  r.check_same(dw_c, dw_g, grad_tol, "dweight (+=)");
  r.check_same(db_c, db_g, grad_tol, "dbias (+=)");
  // The same backward again from the same start: the same bits (fixed reduction order).
  Buffer dw_again = upload(*r.gpu, {OC, C}, DType::F32, host_randn(OC * C, 6));
  Buffer db_again = upload(*r.gpu, {OC}, DType::F32, host_randn(OC, 7));
  r.gpu->linear_backward({Tensor(), dw_again, db_again, dy_g, x_g, w_g});
  CHECK(fetch(*r.gpu, dw_again) == fetch(*r.gpu, dw_g));
  CHECK(fetch(*r.gpu, db_again) == fetch(*r.gpu, db_g));
}

TEST_CASE("the linear's fused activations on CUDA match the CPU's", "[gpu][linear]") {
  const auto [N, C, OC] = GENERATE(from_range(kLinearShapes));
  const DType dt = GENERATE(from_range(kCudaActivationTypes));
  const Activation act = GENERATE(Activation::Gelu, Activation::Relu);
  CAPTURE(N, C, OC, dtype_name(dt), act == Activation::Gelu ? "gelu" : "relu");
  CudaRow r(dt);
  const Tolerance tol = r.pick(kCudaF32Gemm, kCudaBf16Gemm);
  auto [x_c, x_g] = r.act_pair({N, C}, r.act_values(N * C, 1));
  auto [w_c, w_g] = r.f32_pair({OC, C}, host_randn(OC * C, 2, 0.2));
  auto [b_c, b_g] = r.f32_pair({OC}, host_randn(OC, 3));
  auto [y_c, y_g] = r.act_pair({N, OC}, r.act_values(N * OC, 4));
  auto [a_c, a_g] = r.act_pair({N, OC}, r.act_values(N * OC, 5));
  r.cpu.linear_forward(
      {.out = y_c, .inp = x_c, .weight = w_c, .bias = b_c, .act_out = a_c, .act = act});
  r.gpu->linear_forward(
      {.out = y_g, .inp = x_g, .weight = w_g, .bias = b_g, .act_out = a_g, .act = act});
  r.check_same(y_c, y_g, tol, "out");
  r.check_same(a_c, a_g, tol, "act_out");
  auto [pre_c, pre_g] = r.act_pair({N, C}, r.act_values(N * C, 6));
  auto [dy_c, dy_g] = r.act_pair({N, OC}, r.act_values(N * OC, 7));
  auto [dx_c, dx_g] = r.act_pair({N, C}, std::vector<float>(static_cast<size_t>(N * C), 7.0f));
  auto [dw_c, dw_g] = r.f32_pair({OC, C}, host_randn(OC * C, 8));
  const LinearBackwardArgs cpu_args{.dinp = dx_c,
                                    .dweight = dw_c,
                                    .dout = dy_c,
                                    .inp = x_c,
                                    .weight = w_c,
                                    .inp_pre_act = pre_c,
                                    .act = act};
  r.cpu.linear_backward(cpu_args);
  r.gpu->linear_backward({.dinp = dx_g,
                          .dweight = dw_g,
                          .dout = dy_g,
                          .inp = x_g,
                          .weight = w_g,
                          .inp_pre_act = pre_g,
                          .act = act});
  r.check_same(dx_c, dx_g, tol, "d pre-activation");
  r.check_same(dw_c, dw_g, r.pick(kCudaF32Gemm, kCudaBf16ParamGrad), "dweight (+=)");
}

TEST_CASE("a linear with a bf16 or NF4 weight on CUDA matches the CPU, and decodes it exactly",
          "[gpu][linear][nf4][lora]") {
  // CUDA reads a bf16 weight as it is in a bf16 GEMM, and decodes an NF4 one with its kernel
  // (engine/cuda/nf4.cu) into the op's workspace: against the CPU within the GEMM tolerance, and
  // against CUDA's own GEMM of the host-decoded f32 weight bit for bit (the same operand bits).
  const auto [N, C, OC] = GENERATE(from_range(kPackedShapes));
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  const DType dtype = GENERATE(from_range(kPackedWeights));
  CAPTURE(N, C, OC, dtype_name(act), dtype_name(dtype));
  CudaRow r(act);
  const Tolerance tol = r.pick(kCudaF32Gemm, kCudaBf16Gemm);
  const std::vector<float> w = host_randn(OC * C, 2, 0.2);
  const Buffer w_c = packed_weight(r.cpu, OC, C, dtype, w),
               w_g = packed_weight(*r.gpu, OC, C, dtype, w);
  const Buffer w_plain = upload(*r.gpu, {OC, C}, DType::F32, decoded(dtype, w));
  auto [x_c, x_g] = r.act_pair({N, C}, r.act_values(N * C, 1));
  auto [y_c, y_g] = r.zeros_act({N, OC});
  auto [y2_c, y2_g] = r.zeros_act({N, OC});
  r.cpu.linear_forward({y_c, x_c, w_c});
  r.gpu->linear_forward({y_g, x_g, w_g});
  r.gpu->linear_forward({y2_g, x_g, w_plain});
  r.check_same(y_c, y_g, tol, "out");
  CHECK(fetch(*r.gpu, y_g) == fetch(*r.gpu, y2_g));
  auto [dy_c, dy_g] = r.act_pair({N, OC}, r.act_values(N * OC, 5));
  auto [dx_c, dx_g] = r.zeros_act({N, C});
  auto [dx2_c, dx2_g] = r.zeros_act({N, C});
  r.cpu.linear_backward({.dinp = dx_c, .dweight = {}, .dout = dy_c, .inp = x_c, .weight = w_c});
  r.gpu->linear_backward({.dinp = dx_g, .dweight = {}, .dout = dy_g, .inp = x_g, .weight = w_g});
  r.gpu->linear_backward(
      {.dinp = dx2_g, .dweight = {}, .dout = dy_g, .inp = x_g, .weight = w_plain});
  r.check_same(dx_c, dx_g, tol, "dinp");
  CHECK(fetch(*r.gpu, dx_g) == fetch(*r.gpu, dx2_g));
}

#endif

}  // namespace remat::test
