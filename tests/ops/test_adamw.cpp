// Op test of the optimizer ops: the global sum of squares in double, and AdamW against a scalar
// reference with decoupled decay and bias correction.
// Against the CPU backend, the specification every other backend is checked against;
// tolerances and shared helpers: tests/test_util.h (through tests/ops/op_test.h).
#include "tests/ops/op_test.h"

namespace remat::test {
namespace {

/// The tensors every backend sums: 200001 elements make several 65536-element chunks and a
/// ragged last one.
struct SumSquaresCase {
  std::vector<int64_t> shape;
  uint64_t stream;
  double scale;
};
const std::vector<SumSquaresCase> kSumSquaresCases = {
    {{3, 5}, 141, 1.0}, {{200001}, 142, 0.1}, {{70, 1000}, 143, 3.0}};

/// AdamW's hyperparameters in every row; lr, decay and the gradient scale far from 1 so that a
/// misplaced factor shows.
AdamWArgs adamw_hyperparameters() {
  AdamWArgs a;
  a.lr = 1e-2f;
  a.beta1 = 0.9f;
  a.beta2 = 0.95f;
  a.eps = 1e-8f;
  a.weight_decay = 0.1f;
  a.grad_scale = 0.5f;
  return a;
}

/// Gradients of every size for step `step`: O(1), tiny (where eps matters next to sqrt(v)) and
/// zero.
std::vector<float> adamw_gradient(int64_t n, int64_t step) {
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double x = rng_normal(kSeed, 152 + static_cast<uint64_t>(step), static_cast<uint64_t>(i));
    g[static_cast<size_t>(i)] = static_cast<float>(i % 5 == 0 ? 0.0 : i % 5 == 1 ? 1e-8 * x : x);
  }
  return g;
}

}  // namespace

/// Parameter counts every backend updates: below one vector and with a ragged vector tail.
const std::vector<int64_t> kAdamWSizes = {37, 1003};

TEST_CASE("sum of squares matches a double sum over several tensors", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  std::vector<Buffer> buffers;
  for (const SumSquaresCase& c : kSumSquaresCases)
    buffers.push_back(make_randn(be, c.shape, kSeed, c.stream, c.scale));
  const std::vector<Tensor> tensors(buffers.begin(), buffers.end());
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
  const int64_t n = GENERATE(from_range(kAdamWSizes));
  CAPTURE(n);
  AdamWArgs a = adamw_hyperparameters();
  Buffer param = make_randn(be, {n}, kSeed, 151);
  Buffer grad = make_tensor(be, {n});
  Buffer m = make_filled(be, {n}, 0.0f);
  Buffer v = make_filled(be, {n}, 0.0f);
  std::vector<double> p_ref = to_double(param), m_ref(n, 0.0), v_ref(n, 0.0);
  const double b1 = a.beta1, b2 = a.beta2;
  for (int64_t step = 1; step <= 3; ++step) {
    CAPTURE(step);
    const std::vector<float> grads = adamw_gradient(n, step);
    std::copy(grads.begin(), grads.end(), grad.f32());
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

#if REMAT_TEST_CUDA_ROWS
TEST_CASE("adamw and the sum of squares on CUDA match the CPU", "[gpu][optimizer]") {
  const int64_t n = GENERATE(from_range(kAdamWSizes));
  CAPTURE(n);
  CudaRow r(DType::F32);  // optimizer state is f32 whatever the activations
  auto [p_c, p_g] = r.f32_pair({n}, host_randn(n, 151));
  auto [m_c, m_g] = r.zeros_f32({n});
  auto [v_c, v_g] = r.zeros_f32({n});
  for (int64_t step = 1; step <= 3; ++step) {
    CAPTURE(step);
    auto [g_c, g_g] = r.f32_pair({n}, adamw_gradient(n, step));
    AdamWArgs on_cpu = adamw_hyperparameters();
    on_cpu.step = step;
    AdamWArgs on_gpu = on_cpu;
    on_cpu.param = p_c, on_cpu.grad = g_c, on_cpu.m = m_c, on_cpu.v = v_c;
    on_gpu.param = p_g, on_gpu.grad = g_g, on_gpu.m = m_g, on_gpu.v = v_g;
    r.cpu.adamw_update(on_cpu);
    r.gpu->adamw_update(on_gpu);
    r.check_same(p_c, p_g, kCudaF32Pointwise, "param");
    r.check_same(m_c, m_g, kCudaF32Pointwise, "m");
    r.check_same(v_c, v_g, kCudaF32Pointwise, "v");
  }
  std::vector<Buffer> on_cpu, on_gpu;
  for (const SumSquaresCase& c : kSumSquaresCases) {
    int64_t numel = 1;
    for (int64_t d : c.shape) numel *= d;
    auto [b_c, b_g] = r.f32_pair(c.shape, host_randn(numel, c.stream, c.scale));
    on_cpu.push_back(std::move(b_c));
    on_gpu.push_back(std::move(b_g));
  }
  const std::vector<Tensor> ts_c(on_cpu.begin(), on_cpu.end()), ts_g(on_gpu.begin(), on_gpu.end());
  const double want = r.cpu.sum_squares(ts_c), got = r.gpu->sum_squares(ts_g);
  CHECK(std::abs(got - want) <= 1e-9 * want);  // double accumulation on both sides
  CHECK(r.gpu->sum_squares(ts_g) == got);      // and in a fixed order
}
#endif

}  // namespace remat::test
