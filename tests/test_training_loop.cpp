// Unit tests of the training loop and the data, each against an independent statement of what it
// must compute (issue 17, item 3): AdamW against a double reference (bias correction, decoupled
// decay on exactly the 2-D weights), global-norm clipping against sqrt(sum g^2) in double and the
// update it produces, the learning-rate schedule at warmup, peak and end, synthetic-data
// invariants, dropout-mask keying, and the memory categories of every policy.
//
// Each test names the bug it is there to catch; all of them passed the earlier suite.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "data/synthetic.h"
#include "engine/config/config.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/remat/executor.h"
#include "engine/training/trainer.h"
#include "layers/models.h"
#include "tests/configs.h"
#include "tests/test_util.h"

using namespace remat;

namespace {

const char* kLoopBase = R"(
[model]
n_layer = 2
n_head = 2
n_embd = 16
vocab_size = 11
n_ctx = 32
[train]
seq_len = 12
batch_size = 2
steps = 10
lr = 1e-2
warmup_steps = 2
[data]
task = "copy"
[device]
threads = 2
)";

// AdamW's constants as the trainer uses them (nanoGPT's betas).
constexpr double kBeta1 = 0.9, kBeta2 = 0.95, kAdamEps = 1e-8;

using HostParams = std::vector<std::vector<float>>;

HostParams snapshot(Model& model, Buffer Param::*field) {
  HostParams out;
  for (Param& p : model.params()) {
    const Buffer& b = p.*field;
    out.emplace_back(b.f32(), b.f32() + b.tensor().numel());
  }
  return out;
}

// The parameters whose README layout is a matrix: the only ones weight decay may touch.
bool is_matrix_param(const std::string& name) {
  if (name == "wte" || name == "wpe") return true;
  for (const char* suf :
       {"attn.qkv.weight", "attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight"}) {
    const std::string s(suf);
    if (name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0)
      return true;
  }
  return false;
}

// Linear warmup then cosine decay, from the definition: step s (0-based) of a warmup of W steps
// runs at lr (s + 1) / W (the first step trains, step W - 1 is the peak); from step W the rate
// follows lr_min + (lr - lr_min) (1 + cos(pi p)) / 2 with p going from 0 at step W to 1 at the
// last step (steps - 1), so the last step runs at exactly lr * min_lr_ratio.
double schedule(double lr, int64_t warmup, int64_t steps, double min_ratio, int64_t s) {
  if (s < warmup) return lr * static_cast<double>(s + 1) / static_cast<double>(warmup);
  const double lr_min = lr * min_ratio;
  const int64_t span = steps - 1 - warmup;
  if (span <= 0) return lr;
  const double p = static_cast<double>(s - warmup) / static_cast<double>(span);
  return lr_min + (lr - lr_min) * 0.5 * (1.0 + std::cos(std::acos(-1.0) * p));
}

// Checks every element of every parameter and moment after a trainer step against AdamW in
// double, given the state before the step, the gradient the step computed, its learning rate and
// the clipping scale `clip_scale` (1 when no clipping). The moments are checked against the
// double recurrence; the parameter against the double update computed from the kernel's own new
// moments, so that float rounding in a moment (which can cancel: m = 0.9 m + 0.1 g) does not
// blur the check of the update. Tolerances: the kernel works in float, ~6e-8 relative per
// operation; the moments get 1e-6 of the magnitude of their two terms, the parameter 1e-7 of |p|
// (its own rounding) plus 1e-5 of the step. The wrong decay set, bias correction, eps placement or
// clipping scale change the result by 1e-3..1 of the step, or of a moment's smaller term.
void check_adamw(Model& model, const HostParams& p0, const HostParams& m0, const HostParams& v0,
                 double lr, double weight_decay, double clip_scale, int64_t step) {
  const HostParams g = snapshot(model, &Param::grad), p1 = snapshot(model, &Param::value),
                   m1 = snapshot(model, &Param::m), v1 = snapshot(model, &Param::v);
  const double bc1 = 1.0 - std::pow(kBeta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(kBeta2, static_cast<double>(step));
  for (size_t k = 0; k < model.params().size(); ++k) {
    const Param& prm = model.params()[k];
    const double wd = is_matrix_param(prm.name) ? weight_decay : 0.0;
    size_t bad = 0;
    std::string first;
    for (size_t i = 0; i < g[k].size(); ++i) {
      const double gi = static_cast<double>(g[k][i]) * clip_scale;
      const double m = kBeta1 * m0[k][i] + (1 - kBeta1) * gi;
      const double m_scale = kBeta1 * std::abs(m0[k][i]) + (1 - kBeta1) * std::abs(gi);
      const double v = kBeta2 * v0[k][i] + (1 - kBeta2) * gi * gi;
      const double upd =
          lr * ((m1[k][i] / bc1) / (std::sqrt(v1[k][i] / bc2) + kAdamEps) + wd * p0[k][i]);
      const double p = p0[k][i] - upd;
      const bool ok =
          std::abs(m1[k][i] - m) <= 1e-6 * m_scale + 1e-15 &&
          std::abs(v1[k][i] - v) <= 1e-6 * v + 1e-18 &&
          std::abs(p1[k][i] - p) <= 1e-7 * std::abs(p0[k][i]) + 1e-5 * std::abs(upd) + 1e-12;
      if (!ok && bad++ == 0)
        first = fmt::format(
            "[{}]: p {:.9g} want {:.9g} (from {:.9g}), m {:.9g} want {:.9g}, v {:.9g} want {:.9g}",
            i, p1[k][i], p, p0[k][i], m1[k][i], m, v1[k][i], v);
    }
    INFO(fmt::format(
        "step {}: {} (decay {}): {} of {} elements differ from AdamW in double; first {}", step,
        prm.name, wd, bad, g[k].size(), first));
    CHECK(bad == 0);
  }
}

// Non-zero moments, so that an update depends on them (and on the clipping scale even at step 1).
void prefill_moments(Model& model) {
  for (Param& p : model.params()) {
    const uint64_t s = hash_name(p.name.c_str());
    for (int64_t i = 0; i < p.m.tensor().numel(); ++i) {
      p.m.f32()[i] = static_cast<float>(1e-3 * rng_normal(3, s, static_cast<uint64_t>(i)));
      p.v.f32()[i] = static_cast<float>(1e-6 * (0.5 + rng_uniform(4, s, static_cast<uint64_t>(i))));
    }
  }
}

double global_norm(Model& model) {
  double sum = 0;
  for (Param& p : model.params())
    for (int64_t i = 0; i < p.grad.tensor().numel(); ++i)
      sum += static_cast<double>(p.grad.f32()[i]) * static_cast<double>(p.grad.f32()[i]);
  return std::sqrt(sum);
}

}  // namespace

// ---- AdamW and clipping ----

TEST_CASE("AdamW matches a double reference: bias correction, decay on exactly the 2-D weights",
          "[loop]") {
  const Config cfg =
      parse_config(kLoopBase, "loop", {"train.grad_clip=0", "train.weight_decay=0.5"});
  cpu::CpuBackend be(1ull << 30, test::kTestThreads);
  auto model = make_model(cfg, be);
  auto data = make_synthetic_data(cfg);
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data);
  // Catches: weight decay on biases / LayerNorm (decay set by rank >= 1).
  for (Param& p : model->params()) {
    INFO(p.name);
    CHECK(p.use_decay == is_matrix_param(p.name));
    CHECK(p.use_decay == (p.value.tensor().ndim() == 2));
  }
  prefill_moments(*model);
  for (int64_t s = 0; s < 3; ++s) {
    const HostParams p0 = snapshot(*model, &Param::value), m0 = snapshot(*model, &Param::m),
                     v0 = snapshot(*model, &Param::v);
    const StepMetrics sm = trainer.step();
    const double lr = schedule(1e-2, 2, 10, 0.1, s);
    CHECK(std::abs(sm.lr - lr) <= 1e-12 * lr);
    CHECK(std::abs(sm.grad_norm - global_norm(*model)) <= 1e-12 * sm.grad_norm);
    check_adamw(*model, p0, m0, v0, static_cast<float>(lr), static_cast<float>(0.5), 1.0, s + 1);
  }
}

TEST_CASE("global-norm clipping: the norm is sqrt(sum g^2) in double and scales the update",
          "[loop]") {
  for (const double clip : {0.05, 1e6}) {  // active, and inactive
    INFO(fmt::format("grad_clip {}", clip));
    const Config cfg = parse_config(
        kLoopBase, "loop", {fmt::format("train.grad_clip={}", clip), "train.weight_decay=0.1"});
    cpu::CpuBackend be(1ull << 30, test::kTestThreads);
    auto model = make_model(cfg, be);
    auto data = make_synthetic_data(cfg);
    Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data);
    prefill_moments(*model);
    for (int64_t s = 0; s < 2; ++s) {
      const HostParams p0 = snapshot(*model, &Param::value), m0 = snapshot(*model, &Param::m),
                       v0 = snapshot(*model, &Param::v);
      const StepMetrics sm = trainer.step();
      const double norm = global_norm(*model);  // the step's (unclipped) gradient, in double
      INFO(fmt::format("step {}: reported grad_norm {:.9g}, sqrt(sum g^2) {:.9g}", s + 1,
                       sm.grad_norm, norm));
      // Catches: clipping by the squared norm (no sqrt).
      CHECK(std::abs(sm.grad_norm - norm) <= 1e-12 * norm);
      if (clip < 1) REQUIRE(norm > clip);  // the premise: clipping is active
      const double scale = norm > clip ? clip / norm : 1.0;
      check_adamw(*model, p0, m0, v0, static_cast<float>(sm.lr), static_cast<float>(0.1),
                  static_cast<float>(scale), s + 1);
    }
  }
}

TEST_CASE("a step applies its own gradient only: zeroed first, from its own batch", "[loop]") {
  const Config cfg = parse_config(kLoopBase, "loop");
  cpu::CpuBackend be(1ull << 30, test::kTestThreads);
  auto model = make_model(cfg, be);
  auto data = make_synthetic_data(cfg);
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data);
  trainer.step();
  const HostParams p1 = snapshot(*model, &Param::value);
  const double loss2 = trainer.step().loss;
  const HostParams g2 = snapshot(*model, &Param::grad);
  // The same step by hand: parameters before step 2, zeroed gradients, step 2's batch.
  for (size_t k = 0; k < p1.size(); ++k)
    std::copy(p1[k].begin(), p1[k].end(), model->params()[k].value.f32());
  for (Param& p : model->params()) be.fill(p.grad, 0.0f);
  model->begin_step(1);
  Batch batch = data->next(be, 1);
  const StepLoss l = forward_backward(be, *model, trainer.plan(), batch);
  CHECK(l.mean == loss2);
  CHECK(snapshot(*model, &Param::grad) == g2);
}

// ---- learning-rate schedule ----

TEST_CASE("learning rate: linear warmup to the peak, cosine to lr * min_lr_ratio at the last step",
          "[loop]") {
  TrainConfig t;
  t.lr = 1e-3;
  t.warmup_steps = 10;
  t.steps = 111;
  t.min_lr_ratio = 0.1;
  auto near = [](double got, double want) { return std::abs(got - want) <= 1e-12 * want; };
  CHECK(near(learning_rate(t, 0), 1e-4));     // first warmup step: lr / warmup
  CHECK(near(learning_rate(t, 4), 5e-4));     // halfway up
  CHECK(near(learning_rate(t, 9), 1e-3));     // last warmup step: the peak
  CHECK(near(learning_rate(t, 10), 1e-3));    // decay starts at the peak
  CHECK(near(learning_rate(t, 60), 5.5e-4));  // halfway down: (lr + lr_min) / 2
  CHECK(near(learning_rate(t, 110), 1e-4));   // last step: lr * min_lr_ratio
  for (int64_t s = 0; s < t.steps; ++s) {
    INFO(fmt::format("step {}", s));
    CHECK(near(learning_rate(t, s), schedule(1e-3, 10, 111, 0.1, s)));
    if (s > 0 && s < 10) CHECK(learning_rate(t, s) > learning_rate(t, s - 1));
    if (s > 10) CHECK(learning_rate(t, s) < learning_rate(t, s - 1));
  }
  t.warmup_steps = 0;
  CHECK(near(learning_rate(t, 0), 1e-3));  // no warmup: the first step runs at the peak
  CHECK(near(learning_rate(t, 110), 1e-4));
}

// ---- synthetic data ----

namespace {

struct HostBatch {
  std::vector<int32_t> inputs, targets;
};

HostBatch draw(DataSource& data, Backend& be, int64_t step) {
  Batch b = data.next(be, step);
  const Tensor& in = b.inputs.tensor();
  const Tensor& tg = b.targets.tensor();
  return {{in.i32(), in.i32() + in.numel()}, {tg.i32(), tg.i32() + tg.numel()}};
}

}  // namespace

TEST_CASE("synthetic random tokens: targets are the inputs shifted by one, every token appears",
          "[loop]") {
  const int64_t V = 7, B = 4, T = 33, kSteps = 12;
  const Config cfg =
      parse_config(kLoopBase, "loop",
                   {"data.task=\"random\"", "model.n_ctx=64", fmt::format("model.vocab_size={}", V),
                    fmt::format("train.seq_len={}", T), fmt::format("train.batch_size={}", B)});
  cpu::CpuBackend be(1ull << 30, 1);
  auto data = make_synthetic_data(cfg);
  std::vector<int64_t> count(static_cast<size_t>(V), 0);
  for (int64_t s = 0; s < kSteps; ++s) {
    const HostBatch hb = draw(*data, be, s);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const int32_t x = hb.inputs[static_cast<size_t>(b * T + t)];
        const int32_t y = hb.targets[static_cast<size_t>(b * T + t)];
        REQUIRE((x >= 0 && x < V && y >= 0 && y < V));
        // Catches: targets equal to the inputs instead of the next token.
        if (t + 1 < T) REQUIRE(y == hb.inputs[static_cast<size_t>(b * T + t + 1)]);
        ++count[static_cast<size_t>(x)];
      }
    if (s == 0) {
      CHECK(hb.inputs != draw(*data, be, 1).inputs);  // steps differ
      CHECK(hb.inputs == draw(*data, be, 0).inputs);  // a step is a pure function of (seed, step)
      CHECK(!std::equal(hb.inputs.begin(), hb.inputs.begin() + T,
                        hb.inputs.begin() + T));  // rows differ
    }
  }
  // Catches: tokens drawn modulo V - 1 (the last token never appears). 1584 draws, 226 expected
  // per token (sd ~14); +-30% is more than 4.5 sd.
  const double expected = static_cast<double>(B * T * kSteps) / static_cast<double>(V);
  for (int64_t v = 0; v < V; ++v) {
    INFO(fmt::format("token {}: {} draws, {:.0f} expected", v, count[static_cast<size_t>(v)],
                     expected));
    CHECK(static_cast<double>(count[static_cast<size_t>(v)]) > 0.7 * expected);
    CHECK(static_cast<double>(count[static_cast<size_t>(v)]) < 1.3 * expected);
  }
}

TEST_CASE("synthetic copy task: the second half repeats the first, its metric is that half's loss",
          "[loop]") {
  const int64_t B = 3, T = 24, H = T / 2;
  const Config cfg =
      parse_config(kLoopBase, "loop",
                   {fmt::format("train.seq_len={}", T), fmt::format("train.batch_size={}", B)});
  cpu::CpuBackend be(1ull << 30, 1);
  auto data = make_synthetic_data(cfg);
  for (int64_t s = 0; s < 3; ++s) {
    const HostBatch hb = draw(*data, be, s);
    for (int64_t b = 0; b < B; ++b) {
      // The row's T + 1 tokens: inputs, then the last target.
      std::vector<int32_t> seq(hb.inputs.begin() + b * T, hb.inputs.begin() + (b + 1) * T);
      seq.push_back(hb.targets[static_cast<size_t>(b * T + T - 1)]);
      for (int64_t t = 0; t + 1 < T; ++t)
        REQUIRE(hb.targets[static_cast<size_t>(b * T + t)] == seq[static_cast<size_t>(t + 1)]);
      for (int64_t k = H; k <= T; ++k)
        REQUIRE(seq[static_cast<size_t>(k)] == seq[static_cast<size_t>(k - H)]);
      std::vector<int32_t> first(seq.begin(), seq.begin() + H);
      std::sort(first.begin(), first.end());
      CHECK(std::unique(first.begin(), first.end()) - first.begin() >= 4);  // random, not constant
    }
  }
  std::vector<float> row_losses(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      row_losses[static_cast<size_t>(b * T + t)] = t < H ? 1.0f : 3.0f + static_cast<float>(b);
  const auto metric = data->task_metric(row_losses);
  REQUIRE(metric.has_value());
  CHECK(*metric == Approx(4.0).epsilon(1e-12));  // mean over the second halves: (3 + 4 + 5) / 3
}

TEST_CASE("synthetic regression: y = relu(x A^T), fresh inputs every step", "[loop]") {
  const Config cfg = parse_config(test::small_mlp_toml(2, 16, 64), "loop-mlp");
  cpu::CpuBackend be(1ull << 30, 1);
  auto data = make_synthetic_data(cfg);
  Batch a = data->next(be, 0), b = data->next(be, 1);
  const std::vector<float> xa = test::to_host(a.inputs), ya = test::to_host(a.targets),
                           xb = test::to_host(b.inputs);
  CHECK(xa != xb);
  size_t zeros = 0;
  double mean = 0, sq = 0;
  for (float v : ya) {
    REQUIRE(v >= 0.0f);
    zeros += v == 0.0f;
  }
  for (float v : xa) {
    mean += v;
    sq += static_cast<double>(v) * v;
  }
  mean /= static_cast<double>(xa.size());
  sq /= static_cast<double>(xa.size());
  CHECK(std::abs(mean) < 0.1);  // x ~ N(0, 1): 1024 draws
  CHECK(std::abs(sq - 1.0) < 0.15);
  CHECK(zeros > ya.size() / 3);  // relu of a symmetric pre-activation: about half are zero
  CHECK(zeros < 2 * ya.size() / 3);
}

// ---- dropout ----

TEST_CASE("dropout masks: the same within a step and across recompute, different across steps",
          "[loop]") {
  const Config cfg = parse_config(kLoopBase, "loop", {"model.dropout=0.5", "remat.policy=none"});
  const Config cfg_full =
      parse_config(kLoopBase, "loop", {"model.dropout=0.5", "remat.policy=full"});
  cpu::CpuBackend be(1ull << 30, test::kTestThreads);
  auto model = make_model(cfg, be);
  auto data = make_synthetic_data(cfg);
  Batch batch = data->next(be, 0);
  const RematPlan none = resolve_remat_plan(cfg, *model),
                  full = resolve_remat_plan(cfg_full, *model);
  struct Run {
    double loss;
    HostParams grads;
  };
  auto run = [&](int64_t step, const RematPlan& plan) {
    for (Param& p : model->params()) be.fill(p.grad, 0.0f);
    model->begin_step(step);
    const double loss = forward_backward(be, *model, plan, batch).mean;
    return Run{loss, snapshot(*model, &Param::grad)};
  };
  const Run a = run(0, none), again = run(0, none), recomputed = run(0, full), next = run(1, none),
            next_full = run(1, full);
  CHECK(std::memcmp(&a.loss, &again.loss, sizeof(double)) == 0);
  CHECK(a.grads == again.grads);
  // Recompute (full remat) redraws the forward's masks: bitwise the same step.
  CHECK(std::memcmp(&a.loss, &recomputed.loss, sizeof(double)) == 0);
  CHECK(a.grads == recomputed.grads);
  CHECK(next.grads == next_full.grads);
  // Catches: the dropout stream not keyed by the step (the same mask every step).
  CHECK(a.loss != next.loss);
  CHECK(a.grads != next.grads);
  // Evaluation turns dropout off: the loss of a model with dropout 0 and the same weights.
  model->set_training(false);
  const double eval = forward_loss(be, *model, batch).mean;
  model->set_training(true);
  const Config cfg0 = parse_config(kLoopBase, "loop", {"model.dropout=0"});
  cpu::CpuBackend be0(1ull << 30, test::kTestThreads);
  auto model0 = make_model(cfg0, be0);  // same seed: same initial weights
  Batch batch0 = data->next(be0, 0);
  const double eval0 = forward_loss(be0, *model0, batch0).mean;
  CHECK(eval == eval0);
  CHECK(a.loss != eval);
}

TEST_CASE("dropout op: drops a fraction p, scales the rest by 1/(1-p), masks differ by stream",
          "[loop]") {
  cpu::CpuBackend be(1ull << 30, 1);
  const int64_t n = 100000;
  Buffer ones = test::make_filled(be, {n}, 1.0f);
  Buffer out1 = test::make_tensor(be, {n}), out2 = test::make_tensor(be, {n});
  be.dropout({out1, ones, 0.3f, 42, 1});
  be.dropout({out2, ones, 0.3f, 42, 2});
  int64_t dropped = 0, same = 0;
  const float kept = 1.0f / (1.0f - 0.3f);
  for (int64_t i = 0; i < n; ++i) {
    REQUIRE((out1.f32()[i] == 0.0f || out1.f32()[i] == kept));
    dropped += out1.f32()[i] == 0.0f;
    same += (out1.f32()[i] == 0.0f) == (out2.f32()[i] == 0.0f);
  }
  CHECK(std::abs(static_cast<double>(dropped) / n - 0.3) < 0.01);  // sd 0.0015
  // Independent masks agree on p^2 + (1-p)^2 = 58% of the elements.
  CHECK(std::abs(static_cast<double>(same) / n - 0.58) < 0.01);
}

// ---- memory categories ----

TEST_CASE("memory categories: checkpoints = segments x stream bytes, activations exclude them",
          "[loop]") {
  // The shape of tests/test_remat.cpp, whose peaks fall in the backward pass of the last block.
  test::SmallGpt shape = test::remat_test_gpt();
  shape.task = "random";
  const std::string base = test::small_gpt_toml(shape);
  const int64_t B = 2, T = 45, C = 32, NH = 2, FF = 4 * C, N = B * T;
  auto bytes = [](int64_t floats) {
    return MemoryPool::accounted_bytes(static_cast<size_t>(floats) * 4);
  };
  const uint64_t x = bytes(N * C), stats = bytes(N * 2), qkv = bytes(N * 3 * C),
                 lse = bytes(B * NH * T), ff = bytes(N * FF);
  // A whole block: x ln1 ln1.stats qkv attn attn.lse res ln2 ln2.stats fc gelu.
  const uint64_t block = x + x + stats + qkv + x + lse + x + x + stats + ff + ff;
  const uint64_t dots = qkv + x + lse + x + ff;  // save_dots: qkv attn attn.lse res fc
  const uint64_t attn = x + lse;                 // save_attn: attn attn.lse
  struct Case {
    std::vector<std::string> sets;
    uint64_t checkpoints, activations;  // live at the peak, during the backward of block 3
  };
  const std::vector<Case> cases = {
      {{"remat.policy=none"}, 0, 4 * block},
      {{"remat.policy=full"}, 4 * x, block - x},
      {{"remat.policy=full", "remat.every=2"}, 2 * x, (block - x) + block},
      {{"remat.policy=full", "remat.every=4"}, 1 * x, (block - x) + 3 * block},
      {{"remat.policy=save_dots"}, 4 * x, 3 * dots + (block - x)},
      {{"remat.policy=save_attn"}, 4 * x, 3 * attn + (block - x)},
      {{"remat.policy=full", "remat.blocks=[1,2]"}, 2 * x, 2 * block + 0},
  };
  for (const Case& c : cases) {
    INFO(fmt::format("setting: {}", fmt::join(c.sets, " ")));
    const Config cfg = parse_config(base, "memory", c.sets);
    cpu::CpuBackend be(1ull << 30, test::kTestThreads);
    auto model = make_model(cfg, be);
    auto data = make_synthetic_data(cfg);
    Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data);
    trainer.step();
    const MemorySnapshot& peak = be.pool().peak_snapshot();
    const uint64_t ckpt = peak.by_category[static_cast<size_t>(MemCategory::Checkpoints)];
    const uint64_t act = peak.by_category[static_cast<size_t>(MemCategory::Activations)];
    INFO(fmt::format("peak during {}: checkpoints {} (want {}), activations {} (want {})",
                     peak.phase, ckpt, c.checkpoints, act, c.activations));
    CHECK(peak.phase == "backward block 3");
    // Catches: checkpoints counted as activations (slot_categories).
    CHECK(ckpt == c.checkpoints);
    CHECK(act == c.activations);
    size_t checkpointed_segments = 0;
    for (const Segment& seg : trainer.plan().segments)
      checkpointed_segments += trainer.plan().blocks[seg.begin].checkpointed;
    CHECK(ckpt == checkpointed_segments * x);
  }
}
