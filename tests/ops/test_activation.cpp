// Op test of GELU (tanh) and ReLU forward and backward against double references and central
// differences, and aliasing of dinp and dout.
// Against the CPU backend, the specification every other backend is checked against;
// tolerances and shared helpers: tests/test_util.h.
#include <cstring>
#include <numbers>
#include <tuple>

#include "tests/test_util.h"

namespace remat::test {
namespace {

using cpu::CpuBackend;

double gelu_ref(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

double gelu_grad_ref(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  const double th = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

}  // namespace

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

}  // namespace remat::test
