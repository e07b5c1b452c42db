// Op test of GELU (tanh) and ReLU forward and backward against double references and central
// differences, and aliasing of dinp and dout.
// Against the CPU backend, the specification every other backend is checked against;
// tolerances and shared helpers: tests/test_util.h (through tests/ops/op_test.h).
#include "tests/ops/op_test.h"

namespace remat::test {
namespace {

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

/// The edges every input starts with: 0, +-tiny, and tails where GELU's tanh saturates.
constexpr float kActivationEdges[] = {0.0f, 1e-7f, -1e-7f, 10.0f, -10.0f, 5.5f, -5.5f};

// N(0, 2^2) values after the edges.
Buffer make_activation_input(Backend& be, int64_t N, int64_t D) {
  Buffer x = make_randn(be, {N, D}, kSeed, 91, 2.0);
  std::copy(std::begin(kActivationEdges), std::end(kActivationEdges), x.f32());
  return x;
}

}  // namespace

/// Rows of every shape the backends run: one below and one above the CPU's threading threshold
/// (2^17 elements).
const std::vector<int64_t> kActivationRows = {7, 1100};
constexpr int64_t kActivationWidth = 129;

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
  const int64_t N = GENERATE(from_range(kActivationRows));
  const int64_t D = kActivationWidth;
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

#if REMAT_TEST_CUDA_ROWS
TEST_CASE("activations on CUDA match the CPU: gelu and relu, forward and in-place backward",
          "[gpu][pointwise]") {
  for_each_pointwise_row(kActivationRows, [](CudaRow& r, int64_t N, Tolerance tol) {
    const int64_t D = kActivationWidth;
    auto [x_c, x_g] = r.act_pair({N, D}, r.act_values_from(kActivationEdges, N * D, 91, 2.0));
    for (Activation kind : {Activation::Gelu, Activation::Relu}) {
      CAPTURE(static_cast<int>(kind));
      auto [y_c, y_g] = r.zeros_act({N, D});
      r.cpu.activation_forward({y_c, x_c, kind});
      r.gpu->activation_forward({y_g, x_g, kind});
      r.check_same(y_c, y_g, tol, "out");
      auto [d_c, d_g] = r.act_pair({N, D}, r.act_values(N * D, 93));
      r.cpu.activation_backward({d_c, d_c, x_c, kind});  // in place, as the GPT block runs it
      r.gpu->activation_backward({d_g, d_g, x_g, kind});
      r.check_same(d_c, d_g, tol, "dinp (aliasing dout)");
    }
  });
}

TEST_CASE("elementwise primitives on CUDA match the CPU: add, fill, copy and casts",
          "[gpu][pointwise]") {
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  CAPTURE(dtype_name(act));
  CudaRow r(act);
  const Tolerance tol = r.pick(kCudaF32Pointwise, kCudaBf16Pointwise);
  const int64_t n = 1001;
  auto [x_c, x_g] = r.act_pair({n}, r.act_values(n, 31, 2.0));
  auto [y_c, y_g] = r.act_pair({n}, r.act_values(n, 32));
  auto [s_c, s_g] = r.zeros_act({n});
  r.cpu.add(s_c, x_c, y_c);
  r.gpu->add(s_g, x_g, y_g);
  r.check_same(s_c, s_g, tol, "add");
  r.cpu.add(s_c, s_c, y_c);  // out aliases a
  r.gpu->add(s_g, s_g, y_g);
  r.check_same(s_c, s_g, tol, "add (aliased)");
  r.gpu->fill(s_g, 0.5f);
  CHECK(allclose(fetch(*r.gpu, s_g), std::vector<float>(n, 0.5f), kTolExact, "fill"));
  r.gpu->copy(s_g, x_g);
  r.check_same(x_c, s_g, kTolExact, "copy");
  Buffer wide = r.gpu->pool().allocate({n}, DType::F32, MemCategory::Transient, "test");
  r.gpu->copy(wide, x_g);  // a cast when activations are bf16; exact, as the inputs are bf16 values
  r.check_same(x_c, wide, kTolExact, "copy (cast to f32)");
}

TEST_CASE(
    "pointwise ops on CUDA: 16-byte vectors, the scalar path and the tails give the same bits",
    "[gpu][pointwise]") {
  // Sizes about the vector widths (8 bf16 or 4 f32 per 16 bytes): one element, less than a
  // group, groups and a tail of 3 (8k + 3). Each op runs on tensors at a pool block's start (the
  // kernels' 16-byte vectors) and one element past it (their scalar path), in place where the
  // GPT block runs it so. Both give the same bits, and those of the CPU as the GPU stores them;
  // GELU, whose tanhf is not the CPU's, within tolerance.
  const int64_t n = GENERATE(int64_t{1}, int64_t{7}, int64_t{8003});
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  CAPTURE(n, dtype_name(act));
  CudaRow r(act);
  const std::vector<float> xs = r.act_values_from(kActivationEdges, n, 91, 2.0);
  const std::vector<float> ys = r.act_values(n, 92), zeros(static_cast<size_t>(n), 0.0f);
  const std::vector<float> wide = host_randn(n, 94, 2.0);  // f32 values a bf16 cast rounds
  const DropoutArgs drop{
      .out = {}, .inp = {}, .p = 0.25f, .seed = kSeed, .stream = 7, .first_index = 1000003};
  // What the GPU must store, in the order on_gpu runs the ops; `exact`: bit for bit.
  struct Want {
    const char* what;
    std::vector<float> values;
    bool exact = true;
  };
  Buffer x_c = upload(r.cpu, {n}, DType::F32, xs), y_c = upload(r.cpu, {n}, DType::F32, ys);
  auto on_cpu = [&](auto op) {
    Buffer o = upload(r.cpu, {n}, DType::F32, zeros);
    op(o.tensor());
    return r.stored(to_host(o));
  };
  std::vector<Want> want;
  want.push_back({"add", on_cpu([&](const Tensor& o) { r.cpu.add(o, x_c, y_c); })});
  want.push_back({"add (out aliases a)", want.back().values});
  for (Activation kind : {Activation::Gelu, Activation::Relu})
    want.push_back({kind == Activation::Gelu ? "gelu" : "relu", on_cpu([&](const Tensor& o) {
                      r.cpu.activation_forward({o, x_c, kind});
                    }),
                    kind == Activation::Relu});
  for (Activation kind : {Activation::Gelu, Activation::Relu})
    want.push_back(
        {kind == Activation::Gelu ? "gelu backward (dinp aliases dout)" : "relu backward",
         on_cpu([&](const Tensor& o) {
           r.cpu.activation_backward({o, y_c, x_c, kind});
         }),
         kind == Activation::Relu});
  want.push_back({"dropout", on_cpu([&](const Tensor& o) {
                    DropoutArgs d = drop;
                    d.out = o;
                    d.inp = x_c;
                    r.cpu.dropout(d);
                  })});
  want.push_back({"dropout (in place)", want.back().values});
  want.push_back({"fill", r.stored(std::vector<float>(static_cast<size_t>(n), -3.14159f))});
  want.push_back({"cast f32 -> bf16", bf16_values(wide)});
  want.push_back({"cast bf16 -> f32", bf16_values(wide)});

  auto on_gpu = [&](int64_t offset) {
    Backend& g = *r.gpu;
    auto at = [&](DType t, const std::vector<float>& v) { return upload_at(g, {n}, t, offset, v); };
    const Placed x = at(act, xs), y = at(act, ys);
    std::vector<std::vector<float>> got;
    auto run = [&](Placed o, auto op) {
      op(o.t);
      got.push_back(fetch(g, o));
    };
    run(at(act, zeros), [&](const Tensor& o) { g.add(o, x, y); });
    run(at(act, xs), [&](const Tensor& o) { g.add(o, o, y); });
    for (Activation kind : {Activation::Gelu, Activation::Relu})
      run(at(act, zeros), [&](const Tensor& o) { g.activation_forward({o, x, kind}); });
    run(at(act, ys), [&](const Tensor& o) { g.activation_backward({o, o, x, Activation::Gelu}); });
    run(at(act, zeros), [&](const Tensor& o) {
      g.activation_backward({o, y, x, Activation::Relu});
    });
    for (bool in_place : {false, true})
      run(at(act, in_place ? xs : zeros), [&](const Tensor& o) {
        DropoutArgs d = drop;
        d.out = o;
        d.inp = in_place ? o : x.t;
        g.dropout(d);
      });
    run(at(act, zeros), [&](const Tensor& o) { g.fill(o, -3.14159f); });
    const Placed w32 = at(DType::F32, wide), w16 = at(DType::BF16, wide);
    run(at(DType::BF16, zeros), [&](const Tensor& o) { g.copy(o, w32); });
    run(at(DType::F32, zeros), [&](const Tensor& o) { g.copy(o, w16); });
    return got;
  };
  const auto vectors = on_gpu(0), scalars = on_gpu(1);
  REQUIRE(vectors.size() == want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    CAPTURE(want[k].what);
    CHECK(identical_bits(scalars[k], vectors[k], "the scalar path against the vectors"));
    if (want[k].exact)
      CHECK(identical_bits(vectors[k], want[k].values, "the CPU's bits, as the GPU stores them"));
    else
      CHECK(allclose(vectors[k], want[k].values, r.pick(kCudaF32Pointwise, kCudaBf16Pointwise),
                     "the CPU"));
  }
}
#endif

}  // namespace remat::test
