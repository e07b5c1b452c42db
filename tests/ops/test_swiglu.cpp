// Op test of SwiGLU's gate (engine/core/ops/swiglu.h), out = silu(gate) * up: forward against a
// double reference, backward against the analytic derivative and central differences (dgate and dup
// overwritten), and the same bits for any thread count.
// Against the CPU backend, the specification every other backend is checked against;
// tolerances and shared helpers: tests/test_util.h (through tests/ops/op_test.h).
#include <chrono>

#include "tests/ops/op_test.h"

namespace remat::test {
namespace {

double sigmoid_ref(double g) {
  return 1.0 / (1.0 + std::exp(-g));
}

/// The edges every gate starts with: 0, +-tiny, tails where the sigmoid saturates and where
/// e^-g overflows a float (g < -88), and g ~ -1.278, where silu' = s (1 + g (1 - s)) crosses
/// zero.
constexpr float kSwiGluEdges[] = {0.0f,  1e-7f, -1e-7f, 10.0f,  -10.0f,  5.5f,
                                  -5.5f, 30.0f, -30.0f, 100.0f, -100.0f, -1.2785f};

/// A few float operations and an exp per element against a double reference: 1.3e-7 relative at
/// most, measured on these inputs. silu' = s (1 + g (1 - s)) cancels near its zero at
/// g ~ -1.28, where an absolute error of order 1e-7 |dout up| is left; 1e-6 leaves several
/// times either.
constexpr Tolerance kTolSwiGlu{1e-6, 1e-6};

/// One SwiGLU's tensors: gate ~ N(0, 2^2) after the edges, up and dout ~ N(0, 1); dgate and dup
/// prefilled with 7 (backward overwrites them).
struct SwiGluCall {
  Backend& be;
  int64_t N, FF;
  Buffer gate, up, dout, out, dgate, dup;

  SwiGluCall(Backend& backend, int64_t n, int64_t ff, uint64_t stream)
      : be(backend),
        N(n),
        FF(ff),
        gate(make_randn(be, {N, FF}, kSeed, stream, 2.0)),
        up(make_randn(be, {N, FF}, kSeed, stream + 1)),
        dout(make_randn(be, {N, FF}, kSeed, stream + 2)),
        out(make_tensor(be, {N, FF})),
        dgate(make_filled(be, {N, FF}, 7.0f)),
        dup(make_filled(be, {N, FF}, 7.0f)) {
    std::copy(std::begin(kSwiGluEdges), std::end(kSwiGluEdges), gate.f32());
  }
  void forward() { be.swiglu_forward({.out = out, .gate = gate, .up = up}); }
  void backward() {
    be.swiglu_backward({.dgate = dgate, .dup = dup, .dout = dout, .gate = gate, .up = up});
  }
  std::vector<std::vector<float>> results() const {
    return {to_host(out), to_host(dgate), to_host(dup)};
  }
};

}  // namespace

/// Rows of every shape the backends run: one below and one above the CPU's threading threshold
/// (2^17 elements); 129 columns end in a partial 8-lane vector.
const std::vector<int64_t> kSwiGluRows = {7, 1100};
constexpr int64_t kSwiGluWidth = 129;

TEST_CASE("swiglu forward matches a double reference of silu(gate) * up", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const int64_t N = GENERATE(from_range(kSwiGluRows));
  CAPTURE(N);
  SwiGluCall s(be, N, kSwiGluWidth, 101);
  s.forward();
  std::vector<double> want(static_cast<size_t>(N * kSwiGluWidth));
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = s.gate.f32()[i];
    want[i] = g * sigmoid_ref(g) * s.up.f32()[i];
  }
  CHECK(allclose(to_host(s.out), want, kTolSwiGlu, "out"));
}

TEST_CASE("swiglu backward matches the analytic derivative and central differences", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  SwiGluCall s(be, 7, kSwiGluWidth, 111);
  s.backward();
  std::vector<double> want_dg(static_cast<size_t>(s.N * s.FF)), want_du(want_dg.size());
  for (size_t i = 0; i < want_dg.size(); ++i) {
    const double g = s.gate.f32()[i], sg = sigmoid_ref(g);
    want_dg[i] = static_cast<double>(s.dout.f32()[i]) * s.up.f32()[i] * sg * (1.0 + g * (1.0 - sg));
    want_du[i] = static_cast<double>(s.dout.f32()[i]) * g * sg;
  }
  CHECK(allclose(to_host(s.dgate), want_dg, kTolSwiGlu, "dgate (=)"));
  CHECK(allclose(to_host(s.dup), want_du, kTolSwiGlu, "dup (=)"));
  auto loss = [&] {
    s.forward();
    return weighted_sum(s.out, s.dout);
  };
  CHECK(allclose(to_host(s.dgate), central_differences(s.gate.f32(), s.N * s.FF, kFdEps, loss),
                 kTolGradcheck, "dgate vs central differences"));
  CHECK(allclose(to_host(s.dup), central_differences(s.up.f32(), s.N * s.FF, kFdEps, loss),
                 kTolGradcheck, "dup vs central differences"));
}

TEST_CASE("swiglu gives the same bits for any thread count", "[ops]") {
  // 1100 x 129 elements: past the threading threshold, in chunks split over 1, 2 and 3 threads;
  // the tests' thread count last, as the others expect.
  std::vector<std::vector<float>> by_threads[3];
  for (int threads : {1, 3, kTestThreads}) {
    CpuBackend be(kTestBudgetBytes, threads);
    SwiGluCall s(be, kSwiGluRows.back(), kSwiGluWidth, 121);
    s.forward();
    s.backward();
    by_threads[threads - 1] = s.results();
  }
  CHECK(bitwise_equal(by_threads[0], by_threads[1]));
  CHECK(bitwise_equal(by_threads[0], by_threads[2]));
}

TEST_CASE("swiglu timing on the CPU, run by hand", "[.][swiglu-bench]") {
  // Not a test: remat_tests "[swiglu-bench]" on a quiet machine. A TinyLlama MLP's gate at 1024
  // tokens (FF = 5632), best of 10 calls after a warm-up, with the tests' thread count.
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  SwiGluCall s(be, 1024, 5632, 131);
  auto best_ms = [](auto&& fn) {
    fn();
    double best = 1e30;
    for (int rep = 0; rep < 10; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      best = std::min(
          best,
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  const double fwd = best_ms([&] { s.forward(); }), bwd = best_ms([&] { s.backward(); });
  const double n = static_cast<double>(s.N * s.FF);
  fmt::print(
      "swiglu {} x {}, {} threads: forward {:.3f} ms ({:.2f} ns/element), backward {:.3f} ms "
      "({:.2f} ns/element)\n",
      s.N, s.FF, kTestThreads, fwd, fwd * 1e6 / n, bwd, bwd * 1e6 / n);
}

#if REMAT_TEST_CUDA_ROWS
TEST_CASE("swiglu on CUDA matches the CPU: forward and backward", "[gpu][pointwise]") {
  for_each_pointwise_row(kSwiGluRows, [](CudaRow& r, int64_t N, Tolerance tol) {
    const int64_t FF = kSwiGluWidth;
    auto [g_c, g_g] = r.act_pair({N, FF}, r.act_values_from(kSwiGluEdges, N * FF, 101, 2.0));
    auto [u_c, u_g] = r.act_pair({N, FF}, r.act_values(N * FF, 102));
    auto [y_c, y_g] = r.zeros_act({N, FF});
    r.cpu.swiglu_forward({y_c, g_c, u_c});
    r.gpu->swiglu_forward({y_g, g_g, u_g});
    r.check_same(y_c, y_g, tol, "out");
    auto [dy_c, dy_g] = r.act_pair({N, FF}, r.act_values(N * FF, 103));
    auto [dg_c, dg_g] = r.act_pair({N, FF}, r.act_values(N * FF, 104));  // = : overwritten
    auto [du_c, du_g] = r.act_pair({N, FF}, r.act_values(N * FF, 105));
    r.cpu.swiglu_backward({dg_c, du_c, dy_c, g_c, u_c});
    r.gpu->swiglu_backward({dg_g, du_g, dy_g, g_g, u_g});
    r.check_same(dg_c, dg_g, tol, "dgate");
    r.check_same(du_c, du_g, tol, "dup");
  });
}
#endif

}  // namespace remat::test
