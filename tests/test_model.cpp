// Whole-model tests: finite-difference gradient checks of the tiny GPT and the tutorial MLP
// through the remat executor, and the copy task actually being learned.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cmath>

#include "data/synthetic.h"
#include "engine/config/config.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/remat/executor.h"
#include "engine/training/trainer.h"
#include "layers/models.h"
#include "tests/configs.h"

using namespace remat;

namespace {

// Central differences with Richardson extrapolation, (4 D(eps/2) - D(eps)) / 3, which cancels
// the O(eps^2) truncation term: biases move the small residual stream by a lot, so plain central
// differences at a step large enough to beat fp32 rounding are off by several percent.
constexpr float kFdEps = 1e-2f;
// The MLP is piecewise linear (relu): a smaller step avoids crossing a kink.
constexpr float kFdEpsRelu = 1e-3f;
constexpr double kFdRelTol = 5e-3;  // relative, on gradients well above the noise floor
constexpr double kFdAbsTol = 5e-5;  // fp32 loss rounding (~1e-7 |L|) amplified by 1/eps

Config tiny_gpt(const std::string& policy, const std::string& position = "learned") {
  return parse_config(test::small_gpt_toml({.position = position, .policy = policy}),
                      "tiny-gradcheck");
}

double loss_of(Backend& be, Model& model, const RematPlan& plan, const Batch& batch) {
  for (Param& p : model.params()) be.fill(p.grad, 0.0f);
  return forward_backward(be, model, plan, batch).mean;
}

void gradcheck(const Config& cfg, float eps = kFdEps) {
  cpu::CpuBackend be(1ull << 30, 2);
  auto model = make_model(cfg, be);
  auto data = make_synthetic_data(cfg);
  RematPlan plan = resolve_remat_plan(cfg, *model);
  Batch batch = data->next(be, 0);
  loss_of(be, *model, plan, batch);
  // Copy the analytic gradients before the perturbed runs overwrite them.
  std::vector<std::vector<float>> grads;
  for (Param& p : model->params())
    grads.emplace_back(p.grad.f32(), p.grad.f32() + p.grad.tensor().numel());
  int checked = 0;
  for (size_t pi = 0; pi < model->params().size(); ++pi) {
    Param& p = model->params()[pi];
    const int64_t n = p.value.tensor().numel();
    for (int64_t k = 0; k < 3; ++k) {
      const int64_t i = (k * 7919 + static_cast<int64_t>(pi) * 31) % n;
      float* w = p.value.f32() + i;
      const float orig = *w;
      auto central = [&](float h) {
        *w = orig + h;
        const double up = loss_of(be, *model, plan, batch);
        *w = orig - h;
        const double down = loss_of(be, *model, plan, batch);
        *w = orig;
        return (up - down) / (2.0 * static_cast<double>(h));
      };
      const double fd = (4.0 * central(eps / 2) - central(eps)) / 3.0;
      const double g = grads[pi][static_cast<size_t>(i)];
      INFO(fmt::format("{}[{}]: analytic {:.6g} vs central difference {:.6g}", p.name, i, g, fd));
      CHECK(std::abs(fd - g) <= kFdAbsTol + kFdRelTol * std::max(std::abs(fd), std::abs(g)));
      ++checked;
    }
  }
  CHECK(checked == 3 * static_cast<int>(model->params().size()));
}

}  // namespace

TEST_CASE("tiny GPT gradients match central differences under full remat", "[model]") {
  gradcheck(tiny_gpt("full"));
}

TEST_CASE("tiny GPT with rope gradients match central differences", "[model]") {
  gradcheck(tiny_gpt("none", "rope"));
}

TEST_CASE("tiny GPT with dropout: gradients match central differences for a fixed mask",
          "[model]") {
  Config cfg = tiny_gpt("full");
  cfg.model.dropout = 0.3;
  gradcheck(cfg);
}

TEST_CASE("tutorial MLP gradients match central differences", "[model]") {
  gradcheck(parse_config(R"(
[model]
kind = "mlp"
n_layer = 3
n_embd = 12
[train]
batch_size = 5
[remat]
policy = "full"
[device]
threads = 2
)",
                         "mlp-gradcheck"),
            kFdEpsRelu);
}

// Block 0's input is the data: dL/dx there is read by nothing, so its GEMM is not run. The
// backward's GEMMs: dW for every block, dx for all but the first.
TEST_CASE("tutorial MLP: the backward computes no gradient of the data", "[model]") {
  const int64_t L = 3, D = 32, B = 64;
  const Config cfg = parse_config(test::small_mlp_toml(L, D, B), "mlp");
  cpu::CpuBackend be(1ull << 30, 2);
  auto model = make_model(cfg, be);
  auto data = make_synthetic_data(cfg);
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data);
  be.set_op_timing(true);
  trainer.step();
  const auto& t = be.op_times().at({"linear_backward", Phase::Backward});
  CHECK(t.calls == L);
  CHECK(t.flops == 2.0 * B * D * D * static_cast<double>(2 * L - 1));
}

TEST_CASE("copy task: the second half's loss falls well below chance on the tiny config",
          "[model]") {
  Config cfg = load_config(std::string(REMAT_SOURCE_DIR) + "/configs/tiny.toml");
  cpu::CpuBackend be(1ull << 30, 2);
  auto model = make_model(cfg, be);
  auto data = make_synthetic_data(cfg);
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data);
  StepMetrics m;
  for (int64_t s = 0; s < cfg.train.steps; ++s) m = trainer.step();
  const double chance = std::log(static_cast<double>(cfg.model.vocab_size));
  REQUIRE(m.task_metric.has_value());
  INFO(fmt::format("copy_loss after {} steps: {:.4f} (chance {:.4f})", cfg.train.steps,
                   *m.task_metric, chance));
  // A model that copies from T/2 back drives this toward 0; the threshold is a quarter of chance.
  CHECK(*m.task_metric < 0.25 * chance);
}
