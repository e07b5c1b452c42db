// Op test of LoRA's adapters on the linear op (engine/core/ops/lora.h, linear.h): the forward
// against a double reference with one to three adapters on column ranges of the output (Llama's
// q|k|v) beside a bias and an accumulated output, the columns without an adapter equal to the
// plain linear's bit for bit, the gradient contract (dinp =, dA and dB +=), central differences of
// every gradient with and without dropout, the activation's derivative applied after the adapters'
// share of dinp, the dropout's mask equal to the dropout op's, and the frozen linear that the
// adapters sit on (an empty dweight: no weight gradient, the same dinp, the FLOPs it skips).
// Tolerances and helpers: tests/test_util.h.
#include "engine/core/rng.h"
#include "tests/ops/op_test.h"

namespace remat::test {

/// Rows, input width and output width of the base linear, the rank, and each adapter's output
/// columns [col0, col0 + n): a whole output, a middle column range (Llama's k_proj of a fused
/// q|k|v), a fused q|k|v with three, two with a gap (q and v only), odd sizes, and rows past the
/// CPU GEMM's tiles.
struct LoraShape {
  int64_t N, C, OC, r;
  std::vector<std::pair<int64_t, int64_t>> cols;  // (col0, n) per adapter
};
const std::vector<LoraShape> kLoraShapes = {{7, 13, 5, 3, {{0, 5}}},
                                            {9, 16, 24, 4, {{8, 8}}},
                                            {65, 40, 70, 8, {{33, 29}}},
                                            {300, 33, 17, 2, {{0, 17}}},
                                            {40, 24, 40, 4, {{0, 24}, {24, 8}, {32, 8}}},
                                            {33, 20, 36, 3, {{0, 20}, {28, 8}}}};

namespace {

/// A linear's weight, bias and adapters, their values deterministic in the shape.
struct LoraLinear {
  LoraShape sh;
  Buffer w, bias;
  std::vector<Buffer> A, B, dA, dB;
  float scale = 1.5f;
  float p = 0;

  LoraLinear(Backend& be, const LoraShape& shape, float dropout, double ab_scale = 0.3)
      : sh(shape), p(dropout) {
    w = make_randn(be, {sh.OC, sh.C}, kSeed, 20, 0.3);
    bias = make_randn(be, {sh.OC}, kSeed, 21);
    for (size_t i = 0; i < sh.cols.size(); ++i) {
      const uint64_t s = 30 + 4 * i;
      A.push_back(make_randn(be, {sh.r, sh.C}, kSeed, s, ab_scale));
      B.push_back(make_randn(be, {sh.cols[i].second, sh.r}, kSeed, s + 1, ab_scale));
      dA.push_back(make_randn(be, {sh.r, sh.C}, kSeed, s + 2));  // [+=]: prefilled
      dB.push_back(make_randn(be, {sh.cols[i].second, sh.r}, kSeed, s + 3));
    }
  }
  LoraDropout dropout(size_t i) const { return {p, 7, 99 + i, 13}; }
  LinearLora forward() const {
    LinearLora l;
    l.scale = scale;
    for (size_t i = 0; i < A.size(); ++i)
      l.add({.a = A[i], .b = B[i], .col0 = sh.cols[i].first, .dropout = dropout(i)});
    return l;
  }
  LinearLora backward() const {
    LinearLora l = forward();
    for (size_t i = 0; i < A.size(); ++i) {
      l.adapters[i].da = dA[i];
      l.adapters[i].db = dB[i];
    }
    return l;
  }
};

// out0 + x W^T + b + sum_i s (drop_i(x) A_i^T) B_i^T on adapter i's columns, in double.
std::vector<double> reference(const LoraLinear& L, const std::vector<double>& out0,
                              const float* x) {
  const LoraShape& sh = L.sh;
  std::vector<double> out = out0;
  for (int64_t i = 0; i < sh.N; ++i)
    for (int64_t j = 0; j < sh.OC; ++j) {
      double acc = L.bias.f32()[j];
      for (int64_t c = 0; c < sh.C; ++c)
        acc += static_cast<double>(x[i * sh.C + c]) * L.w.f32()[j * sh.C + c];
      out[static_cast<size_t>(i * sh.OC + j)] += acc;
    }
  const double keep = 1.0 / (1.0 - L.p);
  for (size_t ad = 0; ad < L.A.size(); ++ad) {
    const auto [col0, n] = sh.cols[ad];
    const LoraDropout d = L.dropout(ad);
    const float *A = L.A[ad].f32(), *B = L.B[ad].f32();
    for (int64_t i = 0; i < sh.N; ++i) {
      std::vector<double> h(static_cast<size_t>(sh.r), 0.0);
      for (int64_t k = 0; k < sh.r; ++k)
        for (int64_t c = 0; c < sh.C; ++c) {
          const uint64_t idx = d.first_index + static_cast<uint64_t>(i * sh.C + c);
          const double xd = d.p > 0 ? (rng_uniform(d.seed, d.stream, idx) >= d.p
                                           ? static_cast<double>(x[i * sh.C + c]) * keep
                                           : 0.0)
                                    : x[i * sh.C + c];
          h[static_cast<size_t>(k)] += xd * A[k * sh.C + c];
        }
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < sh.r; ++k) acc += h[static_cast<size_t>(k)] * B[j * sh.r + k];
        out[static_cast<size_t>(i * sh.OC + col0 + j)] += L.scale * acc;
      }
    }
  }
  return out;
}

bool adapted(const LoraShape& sh, int64_t j) {
  for (const auto& [col0, n] : sh.cols)
    if (j >= col0 && j < col0 + n) return true;
  return false;
}

}  // namespace

TEST_CASE("a linear's adapters add s (x A^T) B^T to their columns only, as a double reference",
          "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const LoraShape sh = GENERATE(from_range(kLoraShapes));
  const float p = GENERATE(0.0f, 0.3f);
  const bool accumulate = GENERATE(false, true);
  CAPTURE(sh.N, sh.C, sh.OC, sh.r, sh.cols.size(), p, accumulate);
  const LoraLinear L(be, sh, p);
  Buffer x = make_randn(be, {sh.N, sh.C}, kSeed, 1);
  Buffer out = make_randn(be, {sh.N, sh.OC}, kSeed, 4);
  Buffer plain = make_tensor(be, {sh.N, sh.OC});
  be.copy(plain, out);
  const std::vector<double> before =
      accumulate ? to_double(out) : std::vector<double>(static_cast<size_t>(sh.N * sh.OC), 0.0);
  be.linear_forward({.out = out,
                     .inp = x,
                     .weight = L.w,
                     .bias = L.bias,
                     .accumulate = accumulate,
                     .lora = L.forward()});
  CHECK(allclose(to_host(out), reference(L, before, x.f32()), kTolReduction, "out"));
  // The columns without an adapter are the plain linear's, bit for bit.
  be.linear_forward(
      {.out = plain, .inp = x, .weight = L.w, .bias = L.bias, .accumulate = accumulate});
  for (int64_t i = 0; i < sh.N; ++i)
    for (int64_t j = 0; j < sh.OC; ++j)
      if (!adapted(sh, j)) REQUIRE(out.f32()[i * sh.OC + j] == plain.f32()[i * sh.OC + j]);
}

TEST_CASE("a linear's adapter gradients match central differences: dinp =, dA and dB +=", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kFdThreads);
  // The third: more rows and a wider input than the others, past more than one of the CPU GEMM's
  // tiles (gemm_grid.h); the fourth, a q|k|v of three adapters.
  const LoraShape sh = GENERATE(LoraShape{7, 13, 11, 3, {{3, 5}}}, LoraShape{5, 9, 4, 2, {{0, 4}}},
                                LoraShape{30, 70, 37, 3, {{5, 30}}},
                                LoraShape{12, 10, 16, 2, {{0, 8}, {8, 4}, {12, 4}}});
  const float p = GENERATE(0.0f, 0.25f);
  CAPTURE(sh.N, sh.C, sh.OC, sh.r, sh.cols.size(), p);
  LoraLinear L(be, sh, p, 0.5);
  L.scale = 0.75f;
  Buffer x = make_randn(be, {sh.N, sh.C}, kSeed, 11);
  Buffer g = make_randn(be, {sh.N, sh.OC}, kSeed, 14);  // dL/dout
  Buffer out = make_tensor(be, {sh.N, sh.OC});
  auto loss = [&] {
    be.linear_forward({.out = out, .inp = x, .weight = L.w, .bias = L.bias, .lora = L.forward()});
    return weighted_sum(out, g);
  };
  Buffer dinp = make_randn(be, {sh.N, sh.C}, kSeed, 15);  // [=]: the prefill must not survive
  std::vector<std::vector<double>> dA0, dB0;
  for (size_t i = 0; i < L.A.size(); ++i) {
    dA0.push_back(to_double(L.dA[i]));
    dB0.push_back(to_double(L.dB[i]));
  }
  be.linear_backward(
      {.dinp = dinp, .dweight = {}, .dout = g, .inp = x, .weight = L.w, .lora = L.backward()});
  CHECK(allclose(to_host(dinp), central_differences(x.f32(), sh.N * sh.C, kFdEps, loss),
                 kTolGradcheck, "dinp"));
  for (size_t i = 0; i < L.A.size(); ++i) {
    CAPTURE(i);
    CHECK(allclose(minus(L.dA[i], dA0[i]),
                   central_differences(L.A[i].f32(), sh.r * sh.C, kFdEps, loss), kTolGradcheck,
                   "dA added"));
    CHECK(allclose(minus(L.dB[i], dB0[i]),
                   central_differences(L.B[i].f32(), L.B[i].tensor().numel(), kFdEps, loss),
                   kTolGradcheck, "dB added"));
  }
}

TEST_CASE("an adapter's share of dinp comes before the fused activation's derivative", "[ops]") {
  // dinp with inp_pre_act is (dout W + the adapters' share) * act'(pre): the same bits as the
  // backward without it followed by the activation op.
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const LoraShape sh = GENERATE(from_range(kLoraShapes));
  const float p = GENERATE(0.0f, 0.3f);
  CAPTURE(sh.N, sh.C, sh.OC, sh.r, sh.cols.size(), p);
  const LoraLinear L(be, sh, p);
  Buffer pre = make_randn(be, {sh.N, sh.C}, kSeed, 1);
  Buffer x = make_tensor(be, {sh.N, sh.C});
  be.activation_forward({x, pre, Activation::Gelu});
  Buffer g = make_randn(be, {sh.N, sh.OC}, kSeed, 2);
  Buffer fused = make_tensor(be, {sh.N, sh.C}), apart = make_tensor(be, {sh.N, sh.C});
  be.linear_backward({.dinp = fused,
                      .dweight = {},
                      .dout = g,
                      .inp = x,
                      .weight = L.w,
                      .inp_pre_act = pre,
                      .act = Activation::Gelu,
                      .lora = L.backward()});
  be.linear_backward(
      {.dinp = apart, .dweight = {}, .dout = g, .inp = x, .weight = L.w, .lora = L.backward()});
  be.activation_backward({apart, apart, pre, Activation::Gelu});
  CHECK(same_bits(fused, apart));
}

TEST_CASE("a linear backward without dinp still accumulates dA and dB, the same bits", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const LoraShape sh = GENERATE(kLoraShapes[2], kLoraShapes[4]);
  const LoraLinear with(be, sh, 0.0f), without(be, sh, 0.0f);
  Buffer x = make_randn(be, {sh.N, sh.C}, kSeed, 1);
  Buffer g = make_randn(be, {sh.N, sh.OC}, kSeed, 4);
  Buffer dinp = make_filled(be, {sh.N, sh.C}, 0.0f);
  be.linear_backward({.dinp = dinp,
                      .dweight = {},
                      .dout = g,
                      .inp = x,
                      .weight = with.w,
                      .lora = with.backward()});
  be.linear_backward({.dinp = {},
                      .dweight = {},
                      .dout = g,
                      .inp = x,
                      .weight = without.w,
                      .lora = without.backward()});
  for (size_t i = 0; i < with.A.size(); ++i) {
    CHECK(same_bits(with.dA[i], without.dA[i]));
    CHECK(same_bits(with.dB[i], without.dB[i]));
  }
}

TEST_CASE("the lora dropout's mask is the dropout op's, so a recompute redraws it", "[ops]") {
  // With W = 0, B = I and A = I (r = C = n), out = s drop(x): the dropout op's output exactly.
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const int64_t N = 50, C = 6;
  Buffer x = make_randn(be, {N, C}, kSeed, 1);
  Buffer I = make_filled(be, {C, C}, 0.0f);
  for (int64_t i = 0; i < C; ++i) I.f32()[i * C + i] = 1.0f;
  Buffer w = make_filled(be, {C, C}, 0.0f);
  Buffer out = make_tensor(be, {N, C}), dropped = make_tensor(be, {N, C});
  const LoraDropout d{0.4f, 3, 77, 120};
  LinearLora l;
  l.add({.a = I, .b = I, .col0 = 0, .dropout = d});
  be.linear_forward({.out = out, .inp = x, .weight = w, .lora = l});
  be.dropout({dropped, x, d.p, d.seed, d.stream, d.first_index});
  CHECK(to_host(out) == to_host(dropped));
  int64_t zeros = 0;
  for (float v : to_host(out)) zeros += v == 0.0f;
  CHECK(zeros > N * C / 5);  // the mask drops about 40%
  CHECK(zeros < N * C * 3 / 5);
}

TEST_CASE("a frozen linear (no dweight) gives the same dinp and skips the weight-gradient GEMM",
          "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const int64_t N = 5000, C = 77, OC = 29;  // the rows where dW would split over dinp's memory
  Buffer x = make_randn(be, {N, C}, kSeed, 1);
  Buffer w = make_randn(be, {OC, C}, kSeed, 2);
  Buffer g = make_randn(be, {N, OC}, kSeed, 3);
  Buffer dx_train = make_tensor(be, {N, C}), dx_frozen = make_tensor(be, {N, C});
  Buffer dw = make_filled(be, {OC, C}, 0.0f);
  be.set_phase(Phase::Backward);
  be.reset_cost();
  be.linear_backward({.dinp = dx_train, .dweight = dw, .dout = g, .inp = x, .weight = w});
  const OpCost trained = be.cost(Phase::Backward);
  be.reset_cost();
  be.linear_backward({.dinp = dx_frozen, .dweight = Tensor(), .dout = g, .inp = x, .weight = w});
  const OpCost frozen = be.cost(Phase::Backward);
  CHECK(same_bits(dx_train, dx_frozen));
  const double gemm = 2.0 * N * C * OC;
  CHECK(trained.flops == 2 * gemm);
  CHECK(trained.skipped_flops == 0);
  CHECK(frozen.flops == gemm);
  CHECK(frozen.skipped_flops == gemm);
  // MFU's model FLOPs: the skipped weight gradient is no part of the model's work.
  std::array<OpCost, kNumPhases> by_phase{};
  by_phase[static_cast<size_t>(Phase::Forward)].flops = gemm;
  by_phase[static_cast<size_t>(Phase::Backward)] = frozen;
  CHECK(model_flops(by_phase) == 2 * gemm);
}

TEST_CASE("frozen norms, embedding and LM head skip their parameter gradients only", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const int64_t N = 37, C = 24, V = 19;
  Buffer x = make_randn(be, {N, C}, kSeed, 1);
  Buffer w = make_randn(be, {C}, kSeed, 2, 0.2, 1.0);
  Buffer b = make_randn(be, {C}, kSeed, 3);
  Buffer dy = make_randn(be, {N, C}, kSeed, 4);
  Buffer stats = make_tensor(be, {N, 2}), ln = make_tensor(be, {N, C});
  be.layernorm_forward({ln, stats, x, w, b});
  Buffer dx1 = make_filled(be, {N, C}, 0.5f), dx2 = make_filled(be, {N, C}, 0.5f);
  Buffer dw = make_filled(be, {C}, 0.0f), db = make_filled(be, {C}, 0.0f);
  be.layernorm_backward({dx1, dw, db, dy, x, w, stats});
  be.layernorm_backward({dx2, Tensor(), Tensor(), dy, x, w, stats});
  CHECK(same_bits(dx1, dx2));

  Buffer rstd = make_tensor(be, {N}), rms = make_tensor(be, {N, C});
  be.rmsnorm_forward({rms, rstd, x, w, 1e-5f});
  Buffer dx3 = make_filled(be, {N, C}, 0.5f), dx4 = make_filled(be, {N, C}, 0.5f);
  Buffer dw2 = make_filled(be, {C}, 0.0f);
  be.rmsnorm_backward({dx3, dw2, dy, x, w, rstd});
  be.rmsnorm_backward({dx4, Tensor(), dy, x, w, rstd});
  CHECK(same_bits(dx3, dx4));

  Buffer head = make_randn(be, {V, C}, kSeed, 5);
  Buffer targets = make_ids(be, {N}, static_cast<int32_t>(V), kSeed, 6);
  Buffer l1 = make_tensor(be, {N}), l2 = make_tensor(be, {N});
  Buffer d1 = make_tensor(be, {N, C}), d2 = make_tensor(be, {N, C});
  Buffer dhead = make_filled(be, {V, C}, 0.0f);
  be.lm_head_loss({l1, d1, dhead, x, head, targets, 1.0f / N, 8});
  be.lm_head_loss({l2, d2, Tensor(), x, head, targets, 1.0f / N, 8});
  CHECK(same_bits(l1, l2));
  CHECK(same_bits(d1, d2));

  // Learned positions train while the token table is frozen (modules_to_save = ["wpe"]).
  const int64_t B = 2, T = 5;
  Buffer tokens = make_ids(be, {B, T}, static_cast<int32_t>(V), kSeed, 7);
  Buffer dout = make_randn(be, {B, T, C}, kSeed, 8);
  Buffer dwte = make_filled(be, {V, C}, 0.0f), dwpe = make_filled(be, {T, C}, 0.0f),
         dwpe_alone = make_filled(be, {T, C}, 0.0f);
  be.embedding_backward({dwte, dwpe, dout, tokens});
  be.embedding_backward({Tensor(), dwpe_alone, dout, tokens});
  CHECK(same_bits(dwpe, dwpe_alone));
}

#if REMAT_TEST_CUDA_ROWS
TEST_CASE("a linear's adapters on CUDA match the CPU (columns, dropout, act')", "[gpu][lora]") {
  const LoraShape sh = GENERATE(from_range(kLoraShapes));
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  const float p = GENERATE(0.0f, 0.3f);
  CAPTURE(sh.N, sh.C, sh.OC, sh.r, sh.cols.size(), dtype_name(act), p);
  CudaRow r(act);
  const Tolerance out_tol = r.pick(kCudaF32Gemm, kCudaBf16Gemm);
  const Tolerance grad_tol = r.pick(kCudaF32Gemm, kCudaBf16ParamGrad);
  auto [x_c, x_g] = r.act_pair({sh.N, sh.C}, r.act_values(sh.N * sh.C, 1));
  auto [pre_c, pre_g] = r.act_pair({sh.N, sh.C}, r.act_values(sh.N * sh.C, 9));
  auto [w_c, w_g] = r.f32_pair({sh.OC, sh.C}, host_randn(sh.OC * sh.C, 10, 0.3));
  std::vector<std::pair<Buffer, Buffer>> A, B, dA, dB;
  LinearLora l_c, l_g;
  l_c.scale = l_g.scale = 1.5f;
  for (size_t i = 0; i < sh.cols.size(); ++i) {
    const auto [col0, n] = sh.cols[i];
    const uint64_t s = 20 + 4 * i;
    A.push_back(r.f32_pair({sh.r, sh.C}, host_randn(sh.r * sh.C, s, 0.3)));
    B.push_back(r.f32_pair({n, sh.r}, host_randn(n * sh.r, s + 1, 0.3)));
    dA.push_back(r.f32_pair({sh.r, sh.C}, host_randn(sh.r * sh.C, s + 2)));
    dB.push_back(r.f32_pair({n, sh.r}, host_randn(n * sh.r, s + 3)));
    const LoraDropout d{p, 7, 99 + i, 13};
    l_c.add({A[i].first, B[i].first, dA[i].first, dB[i].first, col0, d});
    l_g.add({A[i].second, B[i].second, dA[i].second, dB[i].second, col0, d});
  }
  auto [y_c, y_g] = r.act_pair({sh.N, sh.OC}, r.act_values(sh.N * sh.OC, 4));
  r.cpu.linear_forward({.out = y_c, .inp = x_c, .weight = w_c, .accumulate = true, .lora = l_c});
  r.gpu->linear_forward({.out = y_g, .inp = x_g, .weight = w_g, .accumulate = true, .lora = l_g});
  r.check_same(y_c, y_g, out_tol, "out (+=)");
  auto [dy_c, dy_g] = r.act_pair({sh.N, sh.OC}, r.act_values(sh.N * sh.OC, 5));
  auto [dx_c, dx_g] = r.zeros_act({sh.N, sh.C});
  r.cpu.linear_backward({.dinp = dx_c,
                         .dweight = {},
                         .dout = dy_c,
                         .inp = x_c,
                         .weight = w_c,
                         .inp_pre_act = pre_c,
                         .act = Activation::Gelu,
                         .lora = l_c});
  r.gpu->linear_backward({.dinp = dx_g,
                          .dweight = {},
                          .dout = dy_g,
                          .inp = x_g,
                          .weight = w_g,
                          .inp_pre_act = pre_g,
                          .act = Activation::Gelu,
                          .lora = l_g});
  r.check_same(dx_c, dx_g, out_tol, "dinp");
  for (size_t i = 0; i < sh.cols.size(); ++i) {
    r.check_same(dA[i].first, dA[i].second, grad_tol, "dA (+=)");
    r.check_same(dB[i].first, dB[i].second, grad_tol, "dB (+=)");
  }
}
#endif

}  // namespace remat::test
