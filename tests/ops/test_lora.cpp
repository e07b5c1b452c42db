// Op test of the LoRA adapter pair (engine/core/ops/lora.h): the forward against a double
// reference on a column range of a wider output, the gradient contract (dinp, dA and dB +=),
// central differences of every gradient with and without dropout, the dropout's mask equal to the
// dropout op's, and the frozen linear that the adapter sits on (an empty dweight: no weight
// gradient, the same dinp, the FLOPs it skips). Tolerances and helpers: tests/test_util.h.
#include "engine/core/rng.h"
#include "tests/ops/op_test.h"

namespace remat::test {

/// Rows, input width, output width of the base linear, the adapter's columns and rank: a whole
/// output, a middle column range (Llama's k_proj of a fused q|k|v), odd sizes, and rows past the
/// CPU GEMM's tiles.
struct LoraShape {
  int64_t N, C, OC, col0, n, r;
};
const std::vector<LoraShape> kLoraShapes = {
    {7, 13, 5, 0, 5, 3}, {9, 16, 24, 8, 8, 4}, {65, 40, 70, 33, 29, 8}, {300, 33, 17, 0, 17, 2}};

namespace {

// out[:, col0 + j] += s sum_k (sum_c x'[i, c] A[k, c]) B[j, k], x' = drop(x) in double.
std::vector<double> lora_reference(const LoraShape& sh, const std::vector<double>& out0,
                                   const float* x, const float* A, const float* B, double s,
                                   const LoraDropout& d) {
  std::vector<double> out = out0;
  const double keep = 1.0 / (1.0 - d.p);
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
    for (int64_t j = 0; j < sh.n; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < sh.r; ++k) acc += h[static_cast<size_t>(k)] * B[j * sh.r + k];
      out[static_cast<size_t>(i * sh.OC + sh.col0 + j)] += s * acc;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("lora forward adds s (x A^T) B^T to its columns only, as a double reference", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const LoraShape sh = GENERATE(from_range(kLoraShapes));
  const float p = GENERATE(0.0f, 0.3f);
  CAPTURE(sh.N, sh.C, sh.OC, sh.col0, sh.n, sh.r, p);
  Buffer x = make_randn(be, {sh.N, sh.C}, kSeed, 1);
  Buffer A = make_randn(be, {sh.r, sh.C}, kSeed, 2, 0.3);
  Buffer B = make_randn(be, {sh.n, sh.r}, kSeed, 3, 0.3);
  Buffer out = make_randn(be, {sh.N, sh.OC}, kSeed, 4);  // [+=]: the base linear's output
  const std::vector<double> before = to_double(out);
  const LoraDropout d{p, 7, 99, 13};
  be.lora_forward(
      {.out = out, .inp = x, .a = A, .b = B, .col0 = sh.col0, .scale = 1.5f, .dropout = d});
  const std::vector<double> want = lora_reference(sh, before, x.f32(), A.f32(), B.f32(), 1.5, d);
  CHECK(allclose(to_host(out), want, kTolReduction, "out"));
  // The columns outside [col0, col0 + n) are left as they were, bit for bit.
  for (int64_t i = 0; i < sh.N; ++i)
    for (int64_t j = 0; j < sh.OC; ++j)
      if (j < sh.col0 || j >= sh.col0 + sh.n)
        REQUIRE(out.f32()[i * sh.OC + j] ==
                static_cast<float>(before[static_cast<size_t>(i * sh.OC + j)]));
}

TEST_CASE("lora backward matches central differences, adding into dinp, dA and dB", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kFdThreads);
  // The third: more rows and a wider input than the others, past more than one of the CPU GEMM's
  // tiles (gemm_grid.h).
  const LoraShape sh = GENERATE(LoraShape{7, 13, 11, 3, 5, 3}, LoraShape{5, 9, 4, 0, 4, 2},
                                LoraShape{30, 70, 37, 5, 30, 3});
  const float p = GENERATE(0.0f, 0.25f);
  CAPTURE(sh.N, sh.C, sh.OC, sh.col0, sh.n, sh.r, p);
  Buffer x = make_randn(be, {sh.N, sh.C}, kSeed, 11);
  Buffer A = make_randn(be, {sh.r, sh.C}, kSeed, 12, 0.5);
  Buffer B = make_randn(be, {sh.n, sh.r}, kSeed, 13, 0.5);
  Buffer g = make_randn(be, {sh.N, sh.OC}, kSeed, 14);  // dL/dout
  Buffer out = make_tensor(be, {sh.N, sh.OC});
  const LoraDropout d{p, 5, 1234, 0};
  const float s = 0.75f;
  auto loss = [&] {
    be.fill(out, 0.0f);
    be.lora_forward(
        {.out = out, .inp = x, .a = A, .b = B, .col0 = sh.col0, .scale = s, .dropout = d});
    return weighted_sum(out, g);
  };
  // [+=]: every gradient starts from a prefill that must survive under the sum.
  Buffer dinp = make_randn(be, {sh.N, sh.C}, kSeed, 15);
  Buffer dA = make_randn(be, {sh.r, sh.C}, kSeed, 16);
  Buffer dB = make_randn(be, {sh.n, sh.r}, kSeed, 17);
  const std::vector<double> dinp0 = to_double(dinp), dA0 = to_double(dA), dB0 = to_double(dB);
  // {dinp, da, db, dout, inp, a, b, col0, scale, dropout}, as the CUDA rows below.
  be.lora_backward({dinp, dA, dB, g, x, A, B, sh.col0, s, d});
  CHECK(allclose(minus(dinp, dinp0), central_differences(x.f32(), sh.N * sh.C, kFdEps, loss),
                 kTolGradcheck, "dinp added"));
  CHECK(allclose(minus(dA, dA0), central_differences(A.f32(), sh.r * sh.C, kFdEps, loss),
                 kTolGradcheck, "dA added"));
  CHECK(allclose(minus(dB, dB0), central_differences(B.f32(), sh.n * sh.r, kFdEps, loss),
                 kTolGradcheck, "dB added"));
}

TEST_CASE("lora backward without dinp still accumulates dA and dB, and changes nothing else",
          "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const LoraShape sh{65, 40, 70, 33, 29, 8};
  Buffer x = make_randn(be, {sh.N, sh.C}, kSeed, 1);
  Buffer A = make_randn(be, {sh.r, sh.C}, kSeed, 2);
  Buffer B = make_randn(be, {sh.n, sh.r}, kSeed, 3);
  Buffer g = make_randn(be, {sh.N, sh.OC}, kSeed, 4);
  Buffer dA = make_filled(be, {sh.r, sh.C}, 0.0f), dB = make_filled(be, {sh.n, sh.r}, 0.0f);
  Buffer dA2 = make_filled(be, {sh.r, sh.C}, 0.0f), dB2 = make_filled(be, {sh.n, sh.r}, 0.0f);
  Buffer dinp = make_filled(be, {sh.N, sh.C}, 0.0f);
  const LoraBackwardArgs with{dinp, dA, dB, g, x, A, B, sh.col0, 2.0f};
  be.lora_backward(with);
  LoraBackwardArgs without = with;
  without.dinp = Tensor();
  without.da = dA2;
  without.db = dB2;
  be.lora_backward(without);
  CHECK(same_bits(dA, dA2));
  CHECK(same_bits(dB, dB2));
}

TEST_CASE("the lora dropout's mask is the dropout op's, so a recompute redraws it", "[ops]") {
  // With B = I and A = I (r = C = n), out = s drop(x): the dropout op's output exactly.
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const int64_t N = 50, C = 6;
  Buffer x = make_randn(be, {N, C}, kSeed, 1);
  Buffer I = make_filled(be, {C, C}, 0.0f);
  for (int64_t i = 0; i < C; ++i) I.f32()[i * C + i] = 1.0f;
  Buffer out = make_filled(be, {N, C}, 0.0f), dropped = make_tensor(be, {N, C});
  const LoraDropout d{0.4f, 3, 77, 120};
  be.lora_forward({.out = out, .inp = x, .a = I, .b = I, .col0 = 0, .scale = 1.0f, .dropout = d});
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
TEST_CASE("lora forward and backward on CUDA match the CPU (columns, dropout)", "[gpu][lora]") {
  const LoraShape sh = GENERATE(from_range(kLoraShapes));
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  const float p = GENERATE(0.0f, 0.3f);
  CAPTURE(sh.N, sh.C, sh.OC, sh.col0, sh.n, sh.r, dtype_name(act), p);
  CudaRow r(act);
  const Tolerance out_tol = r.pick(kCudaF32Gemm, kCudaBf16Gemm);
  const Tolerance grad_tol = r.pick(kCudaF32Gemm, kCudaBf16ParamGrad);
  auto [x_c, x_g] = r.act_pair({sh.N, sh.C}, r.act_values(sh.N * sh.C, 1));
  auto [a_c, a_g] = r.f32_pair({sh.r, sh.C}, host_randn(sh.r * sh.C, 2, 0.3));
  auto [b_c, b_g] = r.f32_pair({sh.n, sh.r}, host_randn(sh.n * sh.r, 3, 0.3));
  auto [y_c, y_g] = r.act_pair({sh.N, sh.OC}, r.act_values(sh.N * sh.OC, 4));
  const LoraDropout d{p, 7, 99, 13};
  r.cpu.lora_forward({y_c, x_c, a_c, b_c, sh.col0, 1.5f, d});
  r.gpu->lora_forward({y_g, x_g, a_g, b_g, sh.col0, 1.5f, d});
  r.check_same(y_c, y_g, out_tol, "out (+=)");
  auto [dy_c, dy_g] = r.act_pair({sh.N, sh.OC}, r.act_values(sh.N * sh.OC, 5));
  auto [dx_c, dx_g] = r.act_pair({sh.N, sh.C}, r.act_values(sh.N * sh.C, 6));
  auto [da_c, da_g] = r.f32_pair({sh.r, sh.C}, host_randn(sh.r * sh.C, 7));
  auto [db_c, db_g] = r.f32_pair({sh.n, sh.r}, host_randn(sh.n * sh.r, 8));
  r.cpu.lora_backward({dx_c, da_c, db_c, dy_c, x_c, a_c, b_c, sh.col0, 1.5f, d});
  r.gpu->lora_backward({dx_g, da_g, db_g, dy_g, x_g, a_g, b_g, sh.col0, 1.5f, d});
  r.check_same(dx_c, dx_g, out_tol, "dinp (+=)");
  r.check_same(da_c, da_g, grad_tol, "dA (+=)");
  r.check_same(db_c, db_g, grad_tol, "dB (+=)");
}
#endif

}  // namespace remat::test
