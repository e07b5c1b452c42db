// Gradient accumulation (train.grad_accum, engine/training/trainer.cpp): N micro-batches of B rows
// give the gradient of one batch of N x B rows, the data order and resume stay exact, and the
// planner's dry run follows (the same peak as one micro-batch, N times its FLOPs).
//
// The bound. Micro-batch k of step s is batch s N + k of the data stream, so the accumulated step
// trains on exactly the rows of the one big batch, and each micro-batch's loss gradient is scaled
// by 1 / (N B T), the big batch's own factor (the same float). Every quantity of one row -- its
// loss, the gradients of its activations -- is computed from that row alone, so it is the same
// float in both runs (the per-row losses are checked bit for bit below). A parameter's gradient is
// a sum over the step's n = N B T rows: the big batch adds them in one GEMM or scatter-add, the
// micro-batches in N, each added to the gradient with the ops' `+=`. Only that association
// differs. Two float evaluations of one sum of n products p_k, in any orders, differ by at most
// 2 (n - 1) u sum_k |p_k| (u = 2^-24; each is within (n - 1) u sum |p_k| of the exact sum:
// Higham, Accuracy and Stability of Numerical Algorithms, 4.2, which covers blocked sums too).
// The test cannot see the products, so it bounds sum |p_k| by 16 max|g| per tensor -- cancellation
// within an element of up to 16x -- and checks, tensor by tensor,
//   max |g_accum - g_big| <= 2 n u 16 max|g_big| = 32 n u max|g_big|   (9.2e-5 for n = 48 tokens).
// Measured here: at most 6.0e-7 max|g| (about 10 u, a tenth of 2 n u), and 0 for the token
// embedding, whose scatter-add runs through the rows in order either way. What the test is there
// to catch -- a loss scale of 1 / (B T) instead of 1 / (N B T), a micro-batch lost or drawn from
// the wrong place in the stream, gradients zeroed between micro-batches -- changes a gradient by
// 1 / N of itself or more.
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "data/dataset.h"
#include "engine/config/config.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/planner/planner.h"
#include "engine/remat/executor.h"
#include "engine/training/trainer.h"
#include "layers/models.h"
#include "tests/planner_util.h"
#include "tests/temp_dir.h"
#include "tests/test_util.h"

using namespace remat;

namespace {

constexpr double kUnitRoundoff = 1.0 / (1 << 24);

const char* kGpt = R"(
[model]
n_layer = 2
n_head = 2
n_embd = 16
vocab_size = 11
n_ctx = 32
position = "rope"
[train]
seq_len = 12
steps = 6
lr = 1e-2
warmup_steps = 2
[data]
task = "copy"
[remat]
policy = "full"
[device]
threads = 2
)";

const char* kLlama = R"(
[model]
kind = "llama"
n_layer = 2
n_head = 4
n_kv_head = 2
n_embd = 16
d_ff = 24
vocab_size = 13
tie_embeddings = false
[train]
seq_len = 12
steps = 6
lr = 1e-2
[remat]
policy = "save_attn"
[device]
threads = 2
)";

// The tutorial MLP: 2 x 16 features per micro-batch, so every micro-batch starts on a whole pair
// of the regression's normal generator (the big batch's rows are the same numbers).
const char* kMlp = R"(
[model]
kind = "mlp"
n_layer = 3
n_embd = 16
[train]
steps = 6
lr = 1e-2
[device]
threads = 2
)";

struct StepResult {
  double loss = 0;
  int64_t tokens = 0;
  std::vector<std::vector<float>> grads;  // per parameter, after the step
  std::vector<std::string> names;
};

// One trainer step of `text` with batch_size `rows` and grad_accum `micro`: its loss and the
// gradients it applied (the grad buffers after AdamW, which reads them only).
StepResult one_step(const char* text, int64_t rows, int64_t micro) {
  const Config cfg = parse_config(
      text, "accum",
      {fmt::format("train.batch_size={}", rows), fmt::format("train.grad_accum={}", micro)});
  cpu::CpuBackend be(1ull << 30, test::kTestThreads);
  auto model = make_model(cfg, be);
  auto data = make_data_source(cfg);
  data->open();
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data);
  const StepMetrics m = trainer.step();
  StepResult r;
  r.loss = m.loss;
  r.tokens = m.tokens;
  for (Param& p : model->params()) {
    r.names.push_back(p.name);
    r.grads.emplace_back(p.grad.f32(), p.grad.f32() + p.grad.tensor().numel());
  }
  return r;
}

// The bound above, tensor by tensor: max |a - b| <= 32 n u max|a|, n the rows summed.
void check_same_gradient(const StepResult& big, const StepResult& accum, int64_t n) {
  REQUIRE(big.grads.size() == accum.grads.size());
  const double bound = 32.0 * static_cast<double>(n) * kUnitRoundoff;
  for (size_t k = 0; k < big.grads.size(); ++k) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < big.grads[k].size(); ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(big.grads[k][i]) - accum.grads[k][i]));
      scale = std::max(scale, std::abs(static_cast<double>(big.grads[k][i])));
    }
    INFO(fmt::format("{}: max |diff| {:.3g} = {:.3g} x max|g| ({:.3g}); bound {:.3g} x max|g|",
                     big.names[k], diff, scale > 0 ? diff / scale : 0.0, scale, bound));
    CHECK(scale > 0);  // every parameter has a gradient to compare
    CHECK(diff <= bound * scale);
  }
}

}  // namespace

TEST_CASE("gradient accumulation: N micro-batches give the gradient of one batch of N x B rows",
          "[accum]") {
  struct Case {
    const char* name;
    const char* text;
    int64_t tokens_per_row;
  };
  for (const Case& c : {Case{"gpt", kGpt, 12}, Case{"llama", kLlama, 12}, Case{"mlp", kMlp, 1}}) {
    INFO(c.name);
    const StepResult big = one_step(c.text, 4, 1);
    for (const int64_t micro : {2, 4}) {
      INFO("grad_accum = " << micro);
      const StepResult accum = one_step(c.text, 4 / micro, micro);
      // The loss: the mean of the micro-batches' means, each over its own rows (reassociation).
      CHECK(accum.loss == Approx(big.loss).epsilon(1e-6));
      CHECK(accum.tokens == big.tokens);
      CHECK(accum.tokens == 4 * c.tokens_per_row);
      check_same_gradient(big, accum, 4 * c.tokens_per_row);
    }
  }
}

TEST_CASE(
    "gradient accumulation: each micro-batch's loss is that of its rows in the big batch, bit "
    "for bit",
    "[accum]") {
  // Rows are independent in the forward pass: micro-batch k's per-row losses are rows
  // [k B, (k + 1) B) of the big batch's, to the bit.
  const Config big = parse_config(kGpt, "accum", {"train.batch_size=4"});
  const Config small = parse_config(kGpt, "accum", {"train.batch_size=2"});
  cpu::CpuBackend be(1ull << 30, test::kTestThreads);
  auto model_big = make_model(big, be);
  auto model_small = make_model(small, be);
  auto data_big = make_data_source(big);
  auto data_small = make_data_source(small);
  const RematPlan plan_big = resolve_remat_plan(big, *model_big);
  const RematPlan plan_small = resolve_remat_plan(small, *model_small);
  const int64_t step = 3;  // micro-batches 6 and 7 of a grad_accum = 2 run
  Batch b = data_big->next(be, step);
  const StepLoss whole = forward_backward(be, *model_big, plan_big, b);
  std::vector<float> parts;
  for (int64_t k = 0; k < 2; ++k) {
    Batch m = data_small->next(be, step * 2 + k);
    const StepLoss l = forward_backward(be, *model_small, plan_small, m);
    parts.insert(parts.end(), l.row_losses.begin(), l.row_losses.end());
  }
  CHECK(parts == whole.row_losses);
}

TEST_CASE(
    "gradient accumulation: grad_accum = 1 is the step it always was, and N = 3 resumes "
    "bit for bit",
    "[accum]") {
  auto run = [](const Config& cfg, int64_t from, int64_t to, std::vector<float>* state,
                std::vector<double>* losses) {
    cpu::CpuBackend be(1ull << 30, test::kTestThreads);
    auto model = make_model(cfg, be);
    auto data = make_data_source(cfg);
    Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data);
    if (from > 0) {  // the state a checkpoint holds: weights and moments
      size_t at = 0;
      for (Param& p : model->params())
        for (Buffer* b : {&p.value, &p.m, &p.v})
          for (int64_t i = 0; i < b->tensor().numel(); ++i) b->f32()[i] = (*state)[at++];
      trainer.set_steps_done(from);
    }
    while (trainer.steps_done() < to) losses->push_back(trainer.step().loss);
    state->clear();
    for (Param& p : model->params())
      for (Buffer* b : {&p.value, &p.m, &p.v})
        state->insert(state->end(), b->f32(), b->f32() + b->tensor().numel());
  };
  SECTION("grad_accum = 1 gives the bits of a config without the key") {
    std::vector<float> a, b;
    std::vector<double> la, lb;
    run(parse_config(kGpt, "accum", {"train.batch_size=2"}), 0, 4, &a, &la);
    run(parse_config(kGpt, "accum", {"train.batch_size=2", "train.grad_accum=1"}), 0, 4, &b, &lb);
    CHECK(la == lb);
    CHECK(a == b);
  }
  SECTION("3 + 3 steps of grad_accum = 3 equal 6 steps") {
    const Config cfg = parse_config(kGpt, "accum", {"train.batch_size=2", "train.grad_accum=3"});
    std::vector<float> whole, half;
    std::vector<double> lw, lh;
    run(cfg, 0, 6, &whole, &lw);
    run(cfg, 0, 3, &half, &lh);
    run(cfg, 3, 6, &half, &lh);
    CHECK(lh == lw);
    CHECK(half == whole);
    // And a mistake is caught: a resume that draws the stream as grad_accum = 1 would (batch 3
    // instead of 9) trains on other rows.
    Config one = cfg;
    one.train.grad_accum = 1;
    std::vector<float> wrong;
    std::vector<double> lx;
    run(cfg, 0, 3, &wrong, &lx);
    run(one, 3, 4, &wrong, &lx);
    CHECK(lx[3] != lw[3]);
  }
}

TEST_CASE("gradient accumulation: the planner's peak is one micro-batch's, its FLOPs N times",
          "[accum]") {
  const Planner planner = test::cpu_test_planner(2, 1ull << 32);
  for (const char* text : {kGpt, kLlama}) {
    const Config one = parse_config(text, "accum", {"train.batch_size=2"});
    const Config three = parse_config(text, "accum", {"train.batch_size=2", "train.grad_accum=3"});
    const DryRun a = planner.dry_run(one), b = planner.dry_run(three);
    // Each micro-batch frees its batch and activations before the next; the gradients only add.
    CHECK(b.peak.total_bytes == a.peak.total_bytes);
    for (Phase p : {Phase::Forward, Phase::Loss, Phase::Backward, Phase::Recompute})
      CHECK(b.cost[static_cast<size_t>(p)].flops ==
            Approx(3 * a.cost[static_cast<size_t>(p)].flops).epsilon(1e-12));
    CHECK(b.cost[static_cast<size_t>(Phase::Optimizer)].flops ==
          a.cost[static_cast<size_t>(Phase::Optimizer)].flops);
  }
}

TEST_CASE("gradient accumulation: refused with weights in host memory, which auto then skips",
          "[accum]") {
  const std::string offload = "remat.offload=\"checkpoints+optimizer+weights\"";
  CHECK_THROWS_WITH(
      parse_config(kGpt, "accum", {"train.grad_accum=2", offload}),
      Catch::Matchers::Contains("train.grad_accum") && Catch::Matchers::Contains("replaced"));
  CHECK_NOTHROW(parse_config(kGpt, "accum", {"train.grad_accum=1", offload}));
}

TEST_CASE("the binary: grad_accum's run, banner, metrics and measured peak", "[accum][smoke]") {
  test::TempDir tmp("accum-cli");
  const std::string metrics = tmp / "m.jsonl";
  const test::CliResult r = test::run_binary(
      fmt::format("train --config configs/tiny.toml --steps 3 --set train.batch_size=4 --set "
                  "train.grad_accum=3 --metrics {}",
                  metrics),
      true);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Matchers::Contains("batch 4 x seq_len 64 x grad_accum 3 (768 tokens "
                                              "per step)") &&
                        Catch::Matchers::Contains("equal to the measured peak"));
  std::ifstream in(metrics);
  std::string line;
  int steps = 0;
  while (std::getline(in, line))
    if (line.find("\"step\":") != std::string::npos) {
      CHECK_THAT(line, Catch::Matchers::Contains("\"tokens\":768"));
      ++steps;
    }
  CHECK(steps == 3);
}
