// The real model (CPU backend, remat executor) against the independent double-precision
// reference of tests/reference_model.h: the loss and every element of every parameter gradient,
// for the GPT with learned positions and with RoPE and for the tutorial MLP (issue 17, item 1).
//
// Gradient checks (tests/test_model.cpp) prove that forward and backward agree; they cannot see a
// bug that both share (a causal mask off by one, a RoPE frequency off by 2x, a LayerNorm eps in
// the wrong place), because the model is then consistently a different model. These tests can:
// the reference is the model the README describes, written with none of the kernels' code.
//
// Shapes are small and awkward on purpose: T = 70 spans two attention tiles (64) with a ragged
// second one and is a multiple of no kernel panel (6 rows, 8 or 16 columns); C = 24 with 3 heads
// (HS = 8); d_ff = 40 is not 4C; the LM-head chunk (37 rows) does not divide B*T = 140; learned
// positions use a table longer than T (n_ctx = 80), so rows T..79 of dwpe must stay zero.
// Every parameter, biases and LayerNorm affine terms included, is overwritten with random values
// of a size that makes attention far from uniform and every term of the model matter.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/remat/executor.h"
#include "layers/models.h"
#include "tests/configs.h"
#include "tests/reference_model.h"
#include "tests/test_util.h"

using namespace remat;
using remat::test::allclose;
using remat::test::Tolerance;

namespace {

// ---- tolerances (fp32 model against the double reference) ----
//
// Loss: per-row cross-entropies come out of float logits (C = 24 terms each, O(1)) and a
// log-sum-exp in double; the measured relative error of the mean loss is <= 6e-8 (learned
// positions, RoPE and the MLP). 1e-6 leaves >15x and is ~1e4 times smaller than the loss change
// of the planted bugs (a causal off-by-one or a 2x RoPE frequency move it by 1e-3..1e-2).
constexpr double kLossRelTol = 1e-6;
// Gradients: each element is compared with atol scaled by the largest |reference| entry of its
// tensor (rounding noise is set by the scale of the whole tensor: every gradient is a sum of
// float products through two blocks, a T x T attention and the chunked head) plus rtol on the
// element. The largest error measured is 1.2e-6 of the tensor's largest entry (dwpe; the others
// are <= 4e-7), and the suite passes at 2e-6; 1e-5 leaves 8x for other BLAS kernels and thread
// counts. The planted bugs produce errors of 1e-2..1 of the largest entry.
constexpr Tolerance kGradTol{1e-5, 1e-5, true};
// The MLP is three GEMMs and relus: its measured error is ~1e-7 of the largest entry.
constexpr Tolerance kMlpGradTol{1e-5, 1e-5, true};

// Scale of the random value of each parameter, by its role.
double param_std(const std::string& name, int64_t C, int64_t FF) {
  auto ends = [&](const char* s) {
    const std::string suf(s);
    return name.size() >= suf.size() &&
           name.compare(name.size() - suf.size(), suf.size(), suf) == 0;
  };
  if (name == "wte" || name == "wpe") return 0.5;
  if (ends("ln1.weight") || ends("ln2.weight") || name == "lnf.weight") return 0.3;  // around 1
  if (ends(".bias")) return 0.2;
  if (ends("mlp.proj.weight")) return 1.0 / std::sqrt(static_cast<double>(FF));
  if (ends("attn.qkv.weight")) return 0.3;  // scores of O(1): attention far from uniform
  return 1.0 / std::sqrt(static_cast<double>(C));
}

// Overwrites every parameter of `model` with seeded random values and returns them, widened.
ref::Tensors randomize_params(Model& model, int64_t C, int64_t FF, uint64_t seed) {
  ref::Tensors out;
  for (Param& p : model.params()) {
    const double sd = param_std(p.name, C, FF);
    const bool around_one =
        p.name.find("ln") != std::string::npos && p.name.find(".weight") != std::string::npos;
    float* w = p.value.f32();
    const int64_t n = p.value.tensor().numel();
    ref::Vec& r = out[p.name];
    r.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      w[i] = static_cast<float>(
          (around_one ? 1.0 : 0.0) +
          sd * rng_normal(seed, hash_name(p.name.c_str()), static_cast<uint64_t>(i)));
      r[static_cast<size_t>(i)] = w[i];  // the reference sees exactly the float values
    }
  }
  return out;
}

Config gpt_config(const std::string& position, const std::string& policy) {
  test::SmallGpt g{.n_head = 3, .n_embd = 24, .vocab_size = 13, .n_ctx = 80, .d_ff = 40};
  g.seq_len = 70, g.loss_chunk = 37, g.position = position, g.policy = policy;
  return parse_config(test::small_gpt_toml(g), "reference-gpt");
}

void compare_gpt(const std::string& position, const std::string& policy) {
  const Config cfg = gpt_config(position, policy);
  const ModelConfig& m = cfg.model;
  cpu::CpuBackend be(1ull << 30, test::kTestThreads);
  auto model = make_model(cfg, be);
  const ref::Tensors params = randomize_params(*model, m.n_embd, m.ff(), 2024);

  const int64_t B = cfg.train.batch_size, T = cfg.train.seq_len;
  Batch batch;
  batch.inputs = test::make_ids(be, {B, T}, static_cast<int32_t>(m.vocab_size), 7, 1);
  batch.targets = test::make_ids(be, {B, T}, static_cast<int32_t>(m.vocab_size), 7, 2);
  batch.n_tokens = B * T;
  const int32_t* in = batch.inputs.tensor().i32();
  const int32_t* tg = batch.targets.tensor().i32();
  const std::vector<int32_t> inputs(in, in + B * T), targets(tg, tg + B * T);

  const RematPlan plan = resolve_remat_plan(cfg, *model);
  for (Param& p : model->params()) be.fill(p.grad, 0.0f);
  model->begin_step(0);
  const double loss = forward_backward(be, *model, plan, batch).mean;

  ref::GptShape s;
  s.B = B;
  s.T = T;
  s.C = m.n_embd;
  s.NH = m.n_head;
  s.FF = m.ff();
  s.V = m.vocab_size;
  s.L = m.n_layer;
  s.n_ctx = m.n_ctx;
  s.rope = m.position == PositionKind::Rope;
  s.rope_theta = static_cast<float>(m.rope_theta);  // the model passes theta as float
  ref::Tensors grads;
  const double want = ref::gpt_loss_and_grads(s, params, inputs, targets, grads);

  INFO(fmt::format("{} positions, policy {}: loss {:.9g}, reference {:.9g}, rel err {:.3g}",
                   position, policy, loss, want, std::abs(loss - want) / want));
  CHECK(std::abs(loss - want) <= kLossRelTol * std::abs(want));
  REQUIRE(grads.size() == model->params().size());
  for (Param& p : model->params()) {
    const test::Closeness c =
        allclose(test::to_host(p.grad.tensor()), grads.at(p.name), kGradTol, p.name);
    UNSCOPED_INFO(c.report);
    CHECK(c);
  }
}

// The reference's own backward against central differences of its forward, in double: the
// reference is only worth trusting if its gradients are right. Double rounding (~1e-16) over a
// step of 1e-5 leaves ~1e-10 of noise, and the O(eps^2) truncation is ~1e-10 too, so 1e-6 of the
// tensor's largest gradient is generous while any wrong term is orders of magnitude larger.
void reference_selfcheck(bool rope) {
  ref::GptShape s;
  s.B = 2;
  s.T = 7;
  s.C = 8;
  s.NH = 2;
  s.FF = 12;
  s.V = 5;
  s.L = 2;
  s.n_ctx = 9;
  s.rope = rope;
  s.rope_theta = 10.0;  // fast rotations at T = 7: every frequency matters
  ref::Tensors P;
  auto add = [&](const std::string& name, int64_t n, double mean, double sd) {
    ref::Vec& v = P[name];
    for (int64_t i = 0; i < n; ++i)
      v.push_back(mean + sd * rng_normal(99, hash_name(name.c_str()), static_cast<uint64_t>(i)));
  };
  add("wte", s.V * s.C, 0, 0.5);
  if (!rope) add("wpe", s.n_ctx * s.C, 0, 0.5);
  for (int64_t l = 0; l < s.L; ++l) {
    const std::string p = fmt::format("blocks.{}.", l);
    add(p + "ln1.weight", s.C, 1, 0.3);
    add(p + "ln1.bias", s.C, 0, 0.2);
    add(p + "attn.qkv.weight", 3 * s.C * s.C, 0, 0.5);
    add(p + "attn.qkv.bias", 3 * s.C, 0, 0.2);
    add(p + "attn.proj.weight", s.C * s.C, 0, 0.4);
    add(p + "attn.proj.bias", s.C, 0, 0.2);
    add(p + "ln2.weight", s.C, 1, 0.3);
    add(p + "ln2.bias", s.C, 0, 0.2);
    add(p + "mlp.fc.weight", s.FF * s.C, 0, 0.4);
    add(p + "mlp.fc.bias", s.FF, 0, 0.2);
    add(p + "mlp.proj.weight", s.C * s.FF, 0, 0.3);
    add(p + "mlp.proj.bias", s.C, 0, 0.2);
  }
  add("lnf.weight", s.C, 1, 0.3);
  add("lnf.bias", s.C, 0, 0.2);
  std::vector<int32_t> inputs, targets;
  for (int64_t i = 0; i < s.B * s.T; ++i) {
    inputs.push_back(static_cast<int32_t>(rng_bits(5, 1, static_cast<uint64_t>(i)) % 5));
    targets.push_back(static_cast<int32_t>(rng_bits(5, 2, static_cast<uint64_t>(i)) % 5));
  }
  ref::Tensors grads, scratch;
  ref::gpt_loss_and_grads(s, P, inputs, targets, grads);
  constexpr double kEps = 1e-5;
  for (auto& [name, values] : P) {
    double max_g = 0;
    for (double g : grads.at(name)) max_g = std::max(max_g, std::abs(g));
    const size_t n = values.size();
    for (size_t k = 0; k < 4; ++k) {
      const size_t i = (k * 7919 + 13) % n;
      const double orig = values[i];
      values[i] = orig + kEps;
      const double up = ref::gpt_loss_and_grads(s, P, inputs, targets, scratch);
      values[i] = orig - kEps;
      const double down = ref::gpt_loss_and_grads(s, P, inputs, targets, scratch);
      values[i] = orig;
      const double fd = (up - down) / (2 * kEps);
      const double g = grads.at(name)[i];
      INFO(fmt::format("{}[{}]: reference backward {:.10g}, central difference {:.10g}", name, i, g,
                       fd));
      CHECK(std::abs(fd - g) <= 1e-6 * std::max(max_g, 1e-3));
    }
  }
  // Learned positions past T get no gradient.
  if (!rope)
    for (int64_t i = s.T * s.C; i < s.n_ctx * s.C; ++i)
      CHECK(grads.at("wpe")[static_cast<size_t>(i)] == 0.0);
}

}  // namespace

TEST_CASE("reference model: its backward matches central differences of its forward",
          "[reference]") {
  SECTION("learned positions") {
    reference_selfcheck(false);
  }
  SECTION("rope") {
    reference_selfcheck(true);
  }
}

TEST_CASE("GPT with learned positions matches the double reference: loss and every gradient",
          "[reference]") {
  compare_gpt("learned", "full");
}

TEST_CASE("GPT with RoPE matches the double reference: loss and every gradient", "[reference]") {
  compare_gpt("rope", "save_attn");
}

TEST_CASE("tutorial MLP matches the double reference: loss and every gradient", "[reference]") {
  const Config cfg = parse_config(test::small_mlp_toml(3, 12, 5, "full"), "reference-mlp");
  const int64_t B = cfg.train.batch_size, D = cfg.model.n_embd;
  cpu::CpuBackend be(1ull << 30, test::kTestThreads);
  auto model = make_model(cfg, be);
  ref::Tensors params;
  for (Param& p : model->params()) {
    const bool bias = p.name.find("bias") != std::string::npos;
    const double sd = bias ? 0.2 : std::sqrt(2.0 / static_cast<double>(D));
    float* w = p.value.f32();
    ref::Vec& r = params[p.name];
    for (int64_t i = 0; i < p.value.tensor().numel(); ++i) {
      w[i] = static_cast<float>(
          sd * rng_normal(31, hash_name(p.name.c_str()), static_cast<uint64_t>(i)));
      r.push_back(w[i]);
    }
  }
  Batch batch;
  batch.inputs = test::make_randn(be, {B, D}, 8, 1);
  batch.targets = test::make_randn(be, {B, D}, 8, 2, 0.5, 0.3);
  batch.n_tokens = B;
  const RematPlan plan = resolve_remat_plan(cfg, *model);
  for (Param& p : model->params()) be.fill(p.grad, 0.0f);
  const double loss = forward_backward(be, *model, plan, batch).mean;
  ref::Tensors grads;
  const double want =
      ref::mlp_loss_and_grads(B, D, cfg.model.n_layer, params, test::to_double(batch.inputs),
                              test::to_double(batch.targets), grads);
  INFO(fmt::format("loss {:.9g}, reference {:.9g}", loss, want));
  CHECK(std::abs(loss - want) <= kLossRelTol * std::abs(want));
  for (Param& p : model->params()) {
    const test::Closeness c =
        allclose(test::to_host(p.grad.tensor()), grads.at(p.name), kMlpGradTol, p.name);
    UNSCOPED_INFO(c.report);
    CHECK(c);
  }
}
