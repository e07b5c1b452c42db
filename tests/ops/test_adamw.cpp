// Op test of the optimizer ops: the global sum of squares in double, and AdamW against a scalar
// reference with decoupled decay and bias correction.
// Against the CPU backend, the specification every other backend is checked against;
// tolerances and shared helpers: tests/test_util.h.
#include <cstring>
#include <numbers>
#include <tuple>

#include "tests/test_util.h"

namespace remat::test {
namespace {

using cpu::CpuBackend;

}  // namespace

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
