// The real models (CPU backend, remat executor) against the independent double-precision
// reference of tests/reference_decoder.h: one step's loss and every element of every parameter
// gradient, for the GPT with learned positions and with RoPE, for the Llama family's options one
// at a time and together, and for the tutorial MLP (issue 17, item 1). First the reference is
// checked against central differences of its own forward, and its llama3 frequencies against
// engine/core/ops/rope.h's (two independent transcriptions of transformers' formula).
//
// Gradient checks (tests/test_model.cpp) and the bitwise remat tests prove that forward and
// backward agree; they cannot see a bug that both share (a causal mask off by one, a RoPE
// frequency off by 2x, a LayerNorm eps in the wrong place, a key/value head serving the wrong
// query heads, the q/k norm after RoPE, a llama3 band scaled the wrong way), because the model is
// then consistently a different model. These tests can: the reference is the model the README
// describes, written with none of the kernels' code.
//
// Shapes are small and awkward on purpose: T = 70 spans two attention tiles (64) with a ragged
// second one and is a multiple of no kernel panel (6 rows, 8 or 16 columns); C = 24 with 3 heads;
// d_ff = 40 is not 4C; the LM-head chunk (37 rows) does not divide B*T = 140, nor do the tiled
// MLP's 37-row chunks; learned positions use a table longer than T (n_ctx = 80), so rows T..79 of
// dwpe must stay zero; the Llama rows' rope_theta = 100 turns every frequency through a visible
// angle by t = 69. Every parameter, biases and norm weights included, is overwritten with random
// values of a size that makes attention far from uniform and every term of the model matter.
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/core/ops/rope.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/remat/executor.h"
#include "layers/models.h"
#include "tests/configs.h"
#include "tests/reference_decoder.h"
#include "tests/test_util.h"

using namespace remat;
using remat::test::allclose;
using remat::test::Tolerance;

namespace {

// ---- tolerances (fp32 model against the double reference) ----
//
// Loss: per-row cross-entropies come out of float logits (C = 24 terms each, O(1)) and a
// log-sum-exp in double; the measured relative error of the mean loss is <= 6e-8 (every row
// below and the MLP). 1e-6 leaves >15x and is ~1e4 times smaller than the loss change of the
// planted bugs (a causal off-by-one or a 2x RoPE frequency move it by 1e-3..1e-2; q heads normed
// with k_norm's weight, query head h on key/value head h % KVH or llama3 scaling ignored by
// 3e-3..3e-2).
constexpr double kLossRelTol = 1e-6;
// Gradients: each element is compared with atol scaled by the largest |reference| entry of its
// tensor (rounding noise is set by the scale of the whole tensor: every gradient is a sum of
// float products through two blocks, a T x T attention and the chunked head) plus rtol on the
// element. Measured worst error as a fraction of its tensor's largest entry (2-core CI VM, 2
// threads): GPT learned positions 1.2e-6 (dwpe; the others <= 4e-7); Llama plain MHA tied 1.4e-6
// (qkv.weight), GQA 4/2 untied + biases 2.6e-6 (qkv.weight), q/k norm with head_dim 12 1.0e-6,
// MQA 3/1 + llama3 1.9e-6, tiled MLP with every option 1.0e-6; the tutorial MLP (three GEMMs and
// relus) ~1e-7. 1e-5 leaves ~4x over the worst for other GEMM kernels and thread counts, while
// planted bugs move gradients by 1e-2..2.4 of the largest entry.
constexpr Tolerance kGradTol{1e-5, 1e-5, true};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Scale of each parameter's random values, by role: norm weights around 1, scores of O(1) so
// attention is far from uniform, every matrix large enough that its term matters.
struct ParamScale {
  double mean = 0, sd = 0;
};
ParamScale param_scale(const std::string& name, int64_t C, int64_t A, int64_t FF) {
  for (const char* norm : {"ln1.weight", "ln2.weight", "norm1.weight", "norm2.weight",
                           "_norm.weight", "lnf.weight", "normf.weight"})
    if (ends_with(name, norm)) return {1.0, 0.3};
  if (name == "wte" || name == "wpe") return {0, 0.5};
  if (ends_with(name, ".bias")) return {0, 0.2};
  if (ends_with(name, "attn.qkv.weight")) return {0, 0.3};
  if (ends_with(name, "attn.proj.weight")) return {0, 1.0 / std::sqrt(static_cast<double>(A))};
  if (ends_with(name, "mlp.proj.weight") || ends_with(name, "mlp.down.weight"))
    return {0, 1.0 / std::sqrt(static_cast<double>(FF))};
  return {0, 1.0 / std::sqrt(static_cast<double>(C))};  // fc, gate, up, lm_head
}

// Overwrites every parameter of `model` with seeded random values and returns them, widened: the
// reference sees exactly the float values.
ref::Tensors randomize_params(Model& model, const ModelConfig& m, uint64_t seed) {
  ref::Tensors out;
  for (Param& p : model.params()) {
    const ParamScale sc = param_scale(p.name, m.n_embd, m.n_head * m.head_size(), m.ff());
    float* w = p.value.f32();
    const int64_t n = p.value.tensor().numel();
    ref::Vec& r = out[p.name];
    r.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      w[i] = static_cast<float>(
          sc.mean + sc.sd * rng_normal(seed, hash_name(p.name.c_str()), static_cast<uint64_t>(i)));
      r[static_cast<size_t>(i)] = w[i];
    }
  }
  return out;
}

// The model's config as the reference's shape. theta and eps reach the model's ops as floats, so
// the reference takes them rounded the same way.
ref::DecoderShape reference_shape(const Config& cfg) {
  const ModelConfig& m = cfg.model;
  ref::DecoderShape s;
  s.B = cfg.train.batch_size;
  s.T = cfg.train.seq_len;
  s.C = m.n_embd;
  s.NH = m.n_head;
  s.KVH = m.kv_heads();
  s.HS = m.head_size();
  s.FF = m.ff();
  s.V = m.vocab_size;
  s.L = m.n_layer;
  s.n_ctx = m.n_ctx;
  s.positions = m.position == PositionKind::Rope ? ref::Positions::Rope : ref::Positions::Learned;
  s.rope_theta = static_cast<float>(m.rope_theta);
  if (m.kind == ModelKind::Gpt) return ref::gpt_layout(s);
  s.norm_eps = static_cast<float>(m.norm_eps);
  if (m.rope_scaling.kind == RopeScaling::Llama3)
    s.scaling = {.kind = ref::RopeScaling::Kind::Llama3,
                 .factor = m.rope_scaling.factor,
                 .low_freq_factor = m.rope_scaling.low_freq_factor,
                 .high_freq_factor = m.rope_scaling.high_freq_factor,
                 .original_context = static_cast<double>(m.rope_scaling.original_context)};
  s.qkv_bias = m.attention_bias;
  s.qk_norm = m.qk_norm;
  s.tied = m.tie_embeddings;
  return s;
}

// One step of the model of `cfg` on random tokens (streams `ids_seed`) with random parameters
// (`param_seed`) against the reference: the loss and every gradient, none of them zero.
void compare_with_reference(const Config& cfg, uint64_t param_seed, uint64_t ids_seed) {
  const ModelConfig& m = cfg.model;
  cpu::CpuBackend be(1ull << 30, test::kTestThreads);
  auto model = make_model(cfg, be);
  const ref::Tensors params = randomize_params(*model, m, param_seed);

  const int64_t B = cfg.train.batch_size, T = cfg.train.seq_len;
  Batch batch;
  batch.inputs = test::make_ids(be, {B, T}, static_cast<int32_t>(m.vocab_size), ids_seed, 1);
  batch.targets = test::make_ids(be, {B, T}, static_cast<int32_t>(m.vocab_size), ids_seed, 2);
  batch.n_tokens = B * T;
  const int32_t* in = batch.inputs.tensor().i32();
  const int32_t* tg = batch.targets.tensor().i32();
  const std::vector<int32_t> inputs(in, in + B * T), targets(tg, tg + B * T);

  const RematPlan plan = resolve_remat_plan(cfg, *model);
  for (Param& p : model->params()) be.fill(p.grad, 0.0f);
  model->begin_step(0);
  const double loss = forward_backward(be, *model, plan, batch).mean;

  ref::Tensors grads;
  const double want = ref::loss_and_grads(reference_shape(cfg), params, inputs, targets, grads);
  const double loss_rel = std::abs(loss - want) / std::abs(want);
  INFO(fmt::format("{}, policy {}: loss {:.9g}, reference {:.9g}, rel err {:.3g}",
                   model->describe(), cfg.remat.policy, loss, want, loss_rel));
  CHECK(loss_rel <= kLossRelTol);
  REQUIRE(grads.size() == model->params().size());
  for (Param& p : model->params()) {
    const ref::Vec& want_grad = grads.at(p.name);
    const test::Closeness c = allclose(test::to_host(p.grad.tensor()), want_grad, kGradTol, p.name);
    UNSCOPED_INFO(c.report);
    CHECK(c);
    // A gradient that is zero everywhere would compare equal without testing its term.
    CHECK(std::any_of(want_grad.begin(), want_grad.end(), [](double g) { return g != 0; }));
  }
}

// The reference's own parameters, seeded, for the central-difference check.
ref::Tensors reference_params(const ref::DecoderShape& s) {
  ref::Tensors P;
  for (const auto& [name, n] : ref::param_sizes(s)) {
    const ParamScale sc = param_scale(name, s.C, s.NH * s.HS, s.FF);
    const double sd = ends_with(name, "attn.qkv.weight") ? 0.5 : std::max(sc.sd, 0.3);
    ref::Vec& v = P[name];
    for (int64_t i = 0; i < n; ++i)
      v.push_back(sc.mean + sd * rng_normal(99, hash_name(name.c_str()), static_cast<uint64_t>(i)));
  }
  return P;
}

// The reference's backward against central differences of its forward, in double. Double
// rounding (~1e-16) over a step of 1e-5 leaves ~1e-10 of noise and the O(eps^2) truncation is
// ~1e-10 too, so 1e-6 of the tensor's largest gradient is generous while any wrong term is
// orders of magnitude larger. Eight elements of every tensor (all of the small ones).
void reference_selfcheck(const ref::DecoderShape& s) {
  ref::Tensors P = reference_params(s);
  std::vector<int32_t> inputs, targets;
  for (int64_t i = 0; i < s.B * s.T; ++i) {
    inputs.push_back(static_cast<int32_t>(rng_bits(5, 1, static_cast<uint64_t>(i)) %
                                          static_cast<uint64_t>(s.V)));
    targets.push_back(static_cast<int32_t>(rng_bits(5, 2, static_cast<uint64_t>(i)) %
                                           static_cast<uint64_t>(s.V)));
  }
  ref::Tensors grads, scratch;
  ref::loss_and_grads(s, P, inputs, targets, grads);
  REQUIRE(grads.size() == P.size());
  constexpr double kEps = 1e-5;
  for (auto& [name, values] : P) {
    double max_g = 0;
    for (double g : grads.at(name)) max_g = std::max(max_g, std::abs(g));
    CHECK(max_g > 0);
    const size_t n = values.size();
    for (size_t k = 0; k < std::min<size_t>(8, n); ++k) {
      const size_t i = n <= 8 ? k : (k * 7919 + 13) % n;
      const double orig = values[i];
      values[i] = orig + kEps;
      const double up = ref::loss_and_grads(s, P, inputs, targets, scratch);
      values[i] = orig - kEps;
      const double down = ref::loss_and_grads(s, P, inputs, targets, scratch);
      values[i] = orig;
      const double fd = (up - down) / (2 * kEps);
      const double g = grads.at(name)[i];
      INFO(fmt::format("{}[{}]: reference backward {:.10g}, central difference {:.10g}", name, i, g,
                       fd));
      CHECK(std::abs(fd - g) <= 1e-6 * std::max(max_g, 1e-3));
    }
  }
  // Learned positions past T get no gradient.
  if (s.positions == ref::Positions::Learned)
    for (int64_t i = s.T * s.C; i < s.n_ctx * s.C; ++i)
      CHECK(grads.at("wpe")[static_cast<size_t>(i)] == 0.0);
}

// Two blocks of a tiny multi-head model with a tied head: fast rotations at T = 7 (theta 10), so
// that every frequency matters.
ref::DecoderShape selfcheck_shape() {
  ref::DecoderShape s;
  s.B = 2;
  s.T = 7;
  s.C = 8;
  s.NH = 2;
  s.KVH = 2;
  s.HS = 4;
  s.FF = 12;
  s.V = 5;
  s.L = 2;
  s.n_ctx = 9;
  s.rope_theta = 10.0;
  s.norm_eps = 1e-5;
  return s;
}

// How many of the head's frequencies fall in each llama3 band: high (kept), medium (blended), low
// (divided by factor), from their wavelengths before scaling.
struct Bands {
  int high = 0, medium = 0, low = 0;
};
Bands llama3_bands(const ref::DecoderShape& s) {
  Bands b;
  for (int64_t i = 0; i < s.HS / 2; ++i) {
    const double wavelen =
        2 * std::numbers::pi *
        std::pow(s.rope_theta, static_cast<double>(2 * i) / static_cast<double>(s.HS));
    if (wavelen < s.scaling.original_context / s.scaling.high_freq_factor)
      ++b.high;
    else if (wavelen > s.scaling.original_context / s.scaling.low_freq_factor)
      ++b.low;
    else
      ++b.medium;
  }
  return b;
}

const ref::RopeScaling kSelfcheckLlama3{.kind = ref::RopeScaling::Kind::Llama3,
                                        .factor = 8.0,
                                        .low_freq_factor = 1.0,
                                        .high_freq_factor = 4.0,
                                        .original_context = 32};

// ---- the models compared ----

Config gpt_config(const std::string& position, const std::string& policy) {
  test::SmallGpt g{.n_head = 3, .n_embd = 24, .vocab_size = 13, .n_ctx = 80, .d_ff = 40};
  g.seq_len = 70, g.loss_chunk = 37, g.position = position, g.policy = policy;
  return parse_config(test::small_gpt_toml(g), "reference-gpt");
}

const char* kLlamaBase = R"(
[model]
kind = "llama"
n_layer = 2
n_head = 3
n_embd = 24
d_ff = 40
vocab_size = 13
rope_theta = 100.0
[train]
seq_len = 70
batch_size = 2
loss_chunk = 37
[device]
threads = 2
)";

Config llama_config(const std::vector<std::string>& sets) {
  return parse_config(kLlamaBase, "reference-llama", sets);
}

// original context 32 < T = 70, so the tested positions reach past the scaled context, and each
// band holds a frequency of the head (HS = 8, theta 100: wavelengths 6.3 | 19.9 | 62.8, 199 against
// the edges 8 and 32); the low band turns 8x slower than unscaled (by 0.86 instead of 6.9 rad at
// t = 69 for its fastest frequency).
const std::string kLlama3 =
    "model.rope_scaling={rope_type=\"llama3\", factor=8.0, low_freq_factor=1.0, "
    "high_freq_factor=4.0, original_max_position_embeddings=32}";

}  // namespace

TEST_CASE("reference model: its backward matches central differences of its forward",
          "[reference]") {
  ref::DecoderShape s = ref::gpt_layout(selfcheck_shape());
  SECTION("learned positions") {
    s.positions = ref::Positions::Learned;
    reference_selfcheck(s);
  }
  SECTION("rope") {
    reference_selfcheck(s);
  }
}

TEST_CASE("llama reference: its backward matches central differences of its forward",
          "[llama][reference]") {
  SECTION("plain: multi-head, tied head") {
    reference_selfcheck(selfcheck_shape());
  }
  SECTION("every option: grouped-query, head_dim != C / NH, biases, q/k norm, llama3, untied") {
    ref::DecoderShape s = selfcheck_shape();
    s.NH = 4;
    s.KVH = 2;
    s.HS = 6;
    s.rope_theta = 100.0;
    s.scaling = kSelfcheckLlama3;
    s.qkv_bias = s.qk_norm = true;
    s.tied = false;
    const Bands b = llama3_bands(s);
    CHECK((b.high == 1 && b.medium == 1 && b.low == 1));
    reference_selfcheck(s);
  }
  SECTION("multi-query: one key/value head for three query heads") {
    ref::DecoderShape s = selfcheck_shape();
    s.NH = 3;
    s.KVH = 1;
    s.HS = 4;
    reference_selfcheck(s);
  }
}

// Two transcriptions of transformers' _compute_llama3_parameters, one per band structure (an
// if/else chain in engine/core/ops/rope.h, torch.where passes here), over heads whose frequencies
// fill all three bands.
TEST_CASE("llama reference: llama3 frequencies agree with engine/core/ops/rope.h",
          "[llama][reference]") {
  for (const double theta : {100.0, 10000.0, 500000.0})
    for (const int64_t HS : {6, 8, 64, 128})
      for (const int64_t ctx : {16, 32, 8192}) {
        ref::DecoderShape s;
        s.HS = HS;
        s.rope_theta = theta;
        s.scaling = kSelfcheckLlama3;
        s.scaling.original_context = static_cast<double>(ctx);
        const RopeScaling r{.kind = RopeScaling::Llama3,
                            .factor = 8.0,
                            .low_freq_factor = 1.0,
                            .high_freq_factor = 4.0,
                            .original_context = ctx};
        const std::vector<double> engine = rope_inv_freq(HS, theta, r);
        const ref::Vec want = ref::inv_freq(s);
        INFO(fmt::format("theta {} HS {} original context {}", theta, HS, ctx));
        CHECK(allclose(engine, want, Tolerance{1e-14, 0}));
      }
}

TEST_CASE("GPT with learned positions matches the double reference: loss and every gradient",
          "[reference]") {
  compare_with_reference(gpt_config("learned", "full"), 2024, 7);
}

TEST_CASE("GPT with RoPE matches the double reference: loss and every gradient", "[reference]") {
  compare_with_reference(gpt_config("rope", "save_attn"), 2024, 7);
}

TEST_CASE("llama matches the double reference: plain multi-head attention, tied head",
          "[llama][reference]") {
  compare_with_reference(llama_config({"model.rope_theta=10000.0", "remat.policy=\"full\""}), 2025,
                         11);
}

TEST_CASE("llama matches the double reference: grouped-query attention, untied head, biases",
          "[llama][reference]") {
  compare_with_reference(
      llama_config({"model.n_head=4", "model.n_kv_head=2", "model.attention_bias=true",
                    "model.tie_embeddings=false", "remat.policy=\"save_attn\""}),
      2025, 11);
}

TEST_CASE("llama matches the double reference: q/k norm with head_dim != n_embd / n_head",
          "[llama][reference]") {
  compare_with_reference(
      llama_config({"model.qk_norm=true", "model.head_dim=12", "remat.policy=\"save_dots\""}), 2025,
      11);
}

TEST_CASE("llama matches the double reference: multi-query attention with llama3 scaling",
          "[llama][reference]") {
  const Config cfg = llama_config({"model.n_kv_head=1", kLlama3, "remat.policy=\"none\""});
  const Bands b = llama3_bands(reference_shape(cfg));
  CHECK((b.high == 1 && b.medium == 1 && b.low == 2));
  compare_with_reference(cfg, 2025, 11);
}

TEST_CASE("llama matches the double reference: tiled MLP with every option", "[llama][reference]") {
  compare_with_reference(
      llama_config({"model.n_head=4", "model.n_kv_head=2", "model.qk_norm=true",
                    "model.attention_bias=true", "model.tie_embeddings=false", "model.head_dim=10",
                    kLlama3, "remat.tile_tokens=37", "remat.policy=\"full\""}),
      2025, 11);
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
        allclose(test::to_host(p.grad.tensor()), grads.at(p.name), kGradTol, p.name);
    UNSCOPED_INFO(c.report);
    CHECK(c);
  }
}
