// Op test of the optimizer ops: the global sum of squares in double, and AdamW against a scalar
// reference with decoupled decay and bias correction; and their batched forms (and the batched
// zero fill of a step's gradients) over many tensors of odd sizes, against one call per tensor.
// Against the CPU backend, the specification every other backend is checked against;
// tolerances and shared helpers: tests/test_util.h (through tests/ops/op_test.h).
#include <array>
#include <span>

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

// ---- many tensors at once: the batched ops ----

/// Tensors per batched call: more than two launches' worth of AdamW updates on CUDA (48 a launch)
/// and more than one launch of sums and of zero fills (128 each; engine/cuda/kernels.cuh).
constexpr int kManyTensors = 150;
/// Their sizes in turn: one element, less than a warp, and around and past a block's 256 threads.
constexpr std::array<int64_t, 4> kManySizes = {1, 7, 1000, 4099};
int64_t many_size(int i) {
  return kManySizes[static_cast<size_t>(i) % kManySizes.size()];
}

/// N(0, scale^2) values, deterministic in (seed, stream).
std::vector<float> normal_values(int64_t n, uint64_t stream, double scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(scale * rng_normal(kSeed, stream, i));
  return v;
}

/// An f32 tensor holding `host` on any backend, and the way back.
Buffer put_floats(Backend& be, const std::vector<float>& host) {
  Buffer b = make_tensor(be, {static_cast<int64_t>(host.size())});
  be.upload(b, host.data());
  return b;
}
std::vector<float> get_floats(Backend& be, const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  be.download(out.data(), t);
  return out;
}

/// kManyTensors parameters of odd sizes with their gradients and non-zero moments, on any
/// backend. Parameter i has hyperparameters of its own (learning rate, decay), so a batch that
/// applied one parameter's to another would show.
struct ManyParams {
  std::vector<Buffer> param, grad, m, v;

  explicit ManyParams(Backend& be) {
    for (int i = 0; i < kManyTensors; ++i) {
      const int64_t n = many_size(i);
      const auto stream = 1000 + 4 * static_cast<uint64_t>(i);
      std::vector<float> v0 = normal_values(n, stream + 3, 0.1);
      for (float& x : v0) x *= x;
      param.push_back(put_floats(be, normal_values(n, stream, 1.0)));
      grad.push_back(put_floats(be, adamw_gradient(n, static_cast<int64_t>(stream))));
      m.push_back(put_floats(be, normal_values(n, stream + 2, 0.1)));
      v.push_back(put_floats(be, v0));
    }
  }
  AdamWArgs args(int i, int64_t step) const {
    const auto k = static_cast<size_t>(i);
    AdamWArgs a = adamw_hyperparameters();
    a.param = param[k], a.grad = grad[k], a.m = m[k], a.v = v[k];
    a.lr = 1e-2f * static_cast<float>(1 + i % 3);
    a.weight_decay = i % 2 == 0 ? 0.1f : 0.0f;
    a.step = step;
    return a;
  }
  std::vector<AdamWArgs> all_args(int64_t step) const {
    std::vector<AdamWArgs> all;
    for (int i = 0; i < kManyTensors; ++i) all.push_back(args(i, step));
    return all;
  }
  std::vector<Tensor> params() const { return {param.begin(), param.end()}; }
  /// Host copies of every parameter, then every m, then every v.
  std::vector<std::vector<float>> state(Backend& be) const {
    std::vector<std::vector<float>> out;
    for (const auto* list : {&param, &m, &v})
      for (const Buffer& b : *list) out.push_back(get_floats(be, b));
    return out;
  }
};

/// Two AdamW steps on `one`, one call per parameter, and on `all`, one batched call a step.
void update_both_ways(Backend& be, const ManyParams& one, const ManyParams& all) {
  for (int64_t step = 1; step <= 2; ++step) {
    for (int i = 0; i < kManyTensors; ++i) be.adamw_update(one.args(i, step));
    be.adamw_update(all.all_args(step));
  }
}

/// How many of `before`'s tensors `after` left exactly as they were.
int unchanged(const std::vector<std::vector<float>>& before,
              const std::vector<std::vector<float>>& after) {
  int n = 0;
  for (size_t i = 0; i < before.size(); ++i) n += bitwise_equal({before[i]}, {after[i]}) ? 1 : 0;
  return n;
}

/// kManyTensors views of odd sizes into one buffer of non-zero values, one guard element before
/// each and after the last (so views also start off any vector boundary).
struct ManyViews {
  std::vector<float> initial;
  Buffer storage;
  std::vector<Tensor> views;
  std::vector<int64_t> offsets;

  explicit ManyViews(Backend& be) {
    int64_t end = 0;
    for (int i = 0; i < kManyTensors; ++i) {
      offsets.push_back(end + 1);
      end += 1 + many_size(i);
    }
    initial.resize(static_cast<size_t>(end + 1));
    for (size_t k = 0; k < initial.size(); ++k) initial[k] = static_cast<float>(k % 97) + 0.5f;
    storage = put_floats(be, initial);
    for (int i = 0; i < kManyTensors; ++i)
      views.emplace_back(storage.f32() + offsets[static_cast<size_t>(i)], Dims{many_size(i)},
                         DType::F32);
  }
  /// The buffer as it should be once every view is zero: the guards as they were.
  std::vector<float> zeroed() const {
    std::vector<float> want = initial;
    for (int i = 0; i < kManyTensors; ++i) {
      const auto first = want.begin() + offsets[static_cast<size_t>(i)];
      std::fill(first, first + many_size(i), 0.0f);
    }
    return want;
  }
};

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

TEST_CASE("batched adamw over many odd-sized tensors gives the bits of one call per tensor",
          "[ops][optimizer]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const ManyParams one(be), all(be);
  const auto before = all.state(be);
  update_both_ways(be, one, all);
  const auto after = all.state(be);
  CHECK(bitwise_equal(one.state(be), after));
  CHECK(unchanged(before, after) == 0);  // every parameter and moment moved
}

TEST_CASE("batched zero fill zeroes every tensor and nothing around them", "[ops][optimizer]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const ManyViews many(be);
  be.fill_zero(many.views);
  CHECK(bitwise_equal({get_floats(be, many.storage)}, {many.zeroed()}));
}

TEST_CASE("sum of squares over many tensors is the sum of each one's", "[ops][optimizer]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const ManyParams many(be);
  const std::vector<Tensor> ts = many.params();
  double each = 0;
  for (const Tensor& t : ts) each += be.sum_squares(std::span<const Tensor>(&t, 1));
  // Only the order of the double additions differs.
  CHECK(std::abs(be.sum_squares(ts) - each) <= 1e-12 * each);
}

// The planner's counts and bench's rows must not change when calls are batched: each tensor is
// counted as its own call, in the same order, so every counter has the same bits.
TEST_CASE("batched adamw and zero fill count and time as one call per tensor", "[ops][optimizer]") {
  CpuBackend one(kTestBudgetBytes, kTestThreads), all(kTestBudgetBytes, kTestThreads);
  const ManyParams p_one(one), p_all(all);
  const ManyViews v_one(one), v_all(all);
  for (CpuBackend* be : {&one, &all}) {
    be->set_op_timing(true);
    be->set_phase(Phase::Optimizer);
    be->reset_cost();
  }
  for (int i = 0; i < kManyTensors; ++i) one.adamw_update(p_one.args(i, 1));
  all.adamw_update(p_all.all_args(1));
  for (const Tensor& t : v_one.views) one.fill(t, 0.0f);
  all.fill_zero(v_all.views);
  for (int p = 0; p < kNumPhases; ++p) {
    const OpCost &a = one.cost(static_cast<Phase>(p)), &b = all.cost(static_cast<Phase>(p));
    CHECK(std::memcmp(&a, &b, sizeof(OpCost)) == 0);
  }
  REQUIRE(one.op_times().size() == all.op_times().size());
  for (const auto& [key, t] : one.op_times()) {
    INFO(key.first);
    REQUIRE(all.op_times().contains(key));
    CHECK(all.op_times().at(key).calls == t.calls);
    CHECK(all.op_times().at(key).flops == t.flops);
  }
  CHECK(all.op_times().at({"adamw_update", Phase::Optimizer}).calls == kManyTensors);
  CHECK(all.op_times().at({"fill", Phase::Optimizer}).calls == kManyTensors);
}

#if REMAT_TEST_CUDA_ROWS
static_assert(kManyTensors > 2 * cuda::kern::kAdamWPerLaunch &&
                  kManyTensors > cuda::kern::kSumSquaresPerLaunch &&
                  kManyTensors > cuda::kern::kZeroPerLaunch,
              "the batched rows must span several launches");

namespace {

/// The sum of squares in the CUDA kernel's order (engine/cuda/kernels.cuh,
/// sum_squares_partials): per tensor, each block's threads' strided partials in double, the
/// block's tree over them, and the blocks' partials added in order. A float's square is exact in
/// double, so a fused multiply-add gives the same bits as a multiply and an add.
double sum_squares_in_kernel_order(const std::vector<std::vector<float>>& tensors) {
  constexpr int64_t kBlocks = cuda::kern::kSumSquaresBlocks;
  constexpr int64_t kThreadsPerBlock = cuda::kern::kSumSquaresThreads;
  double total = 0;
  for (const std::vector<float>& x : tensors) {
    const auto n = static_cast<int64_t>(x.size());
    for (int64_t b = 0; b < kBlocks; ++b) {
      std::array<double, kThreadsPerBlock> part{};
      for (int64_t t = 0; t < kThreadsPerBlock; ++t)
        for (int64_t i = b * kThreadsPerBlock + t; i < n; i += kBlocks * kThreadsPerBlock)
          part[static_cast<size_t>(t)] +=
              static_cast<double>(x[static_cast<size_t>(i)]) * x[static_cast<size_t>(i)];
      for (int64_t s = kThreadsPerBlock / 2; s > 0; s >>= 1)
        for (int64_t t = 0; t < s; ++t)
          part[static_cast<size_t>(t)] += part[static_cast<size_t>(t + s)];
      total += part[0];
    }
  }
  return total;
}

}  // namespace

TEST_CASE("batched adamw on CUDA gives the bits of one call per tensor", "[gpu][optimizer]") {
  CudaRow r(DType::F32);
  const ManyParams one(*r.gpu), all(*r.gpu), on_cpu(r.cpu);
  const auto before = all.state(*r.gpu);
  update_both_ways(*r.gpu, one, all);
  for (int64_t step = 1; step <= 2; ++step) r.cpu.adamw_update(on_cpu.all_args(step));
  const auto after = all.state(*r.gpu), want = on_cpu.state(r.cpu);
  CHECK(bitwise_equal(one.state(*r.gpu), after));
  CHECK(unchanged(before, after) == 0);
  for (size_t k = 0; k < after.size(); ++k) {
    CAPTURE(k);
    CHECK(allclose(after[k], want[k], kCudaF32Pointwise, "adamw"));
  }
}

TEST_CASE("batched zero fill on CUDA zeroes every tensor and nothing around them",
          "[gpu][optimizer]") {
  CudaRow r(DType::F32);
  const ManyViews many(*r.gpu);
  r.gpu->fill_zero(many.views);
  CHECK(bitwise_equal({fetch(*r.gpu, many.storage)}, {many.zeroed()}));
}

TEST_CASE("sum of squares of many tensors on CUDA: the kernel's order, bit for bit",
          "[gpu][optimizer]") {
  CudaRow r(DType::F32);
  const ManyParams on_gpu(*r.gpu), on_cpu(r.cpu);
  std::vector<std::vector<float>> host;
  for (const Buffer& b : on_gpu.param) host.push_back(fetch(*r.gpu, b));
  const double got = r.gpu->sum_squares(on_gpu.params());
  CHECK(got == sum_squares_in_kernel_order(host));
  const double cpu = r.cpu.sum_squares(on_cpu.params());
  CHECK(std::abs(got - cpu) <= 1e-9 * cpu);
}

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
