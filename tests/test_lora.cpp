// LoRA (docs/lora.md) on the CPU, held to what the rest of the trainer is held to: the adapted
// model starts as its base (B = 0) and its frozen weights never move; losses, gradients, weights
// and moments are bitwise identical under every remat policy, tiling, offload and chunked
// attention, with adapter dropout on; the planner's peaks equal the measured ones to the byte;
// the model's adapter gradients match central differences; a LoRA step's FLOPs and model FLOPs
// leave out the base's weight gradients; and the [lora] table refuses what it cannot train. The
// op itself is tested in tests/ops/test_lora.cpp, the PEFT folders in tests/test_peft.cpp.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <map>
#include <utility>

#include "data/synthetic.h"
#include "engine/config/config.h"
#include "engine/config/lora.h"
#include "engine/core/error.h"
#include "engine/core/nf4.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/planner/planner.h"
#include "engine/remat/executor.h"
#include "engine/training/trainer.h"
#include "layers/models.h"
#include "tests/configs.h"
#include "tests/planner_util.h"
#include "tests/run_record.h"
#include "tests/test_util.h"

using namespace remat;
using Catch::Matchers::Contains;

namespace {

// The Llama family with every option (GQA, head_dim != n_embd / n_head, q/k/v biases, q/k norms,
// an untied head), adapters of rank 3 on every linear, and the final norm and the LM head trained
// whole: the q|k|v adapters sit on row ranges of one fused weight.
const std::string kLlama = R"(
[model]
kind = "llama"
n_layer = 3
n_head = 4
n_kv_head = 2
head_dim = 12
n_embd = 32
d_ff = 40
vocab_size = 37
attention_bias = true
qk_norm = true
tie_embeddings = false
[train]
seq_len = 41
batch_size = 2
steps = 3
loss_chunk = 16
lr = 0.01
[data]
task = "copy"
[device]
threads = 2
[lora]
rank = 3
alpha = 6.0
modules_to_save = ["norm", "lm_head"]
)";

// GPT-2's block with its own dropout and the adapters' (c_attn, both c_proj, c_fc), learned
// positions trained whole.
const std::string kGpt = test::small_gpt_toml(test::remat_test_gpt()) + R"(
[lora]
rank = 4
alpha = 8.0
targets = ["c_attn", "c_proj", "c_fc"]
dropout = 0.2
modules_to_save = ["wpe", "ln_f"]
)";

using test::check_same_bits;
using test::host_copy;
using test::with;

/// The shared record, and what LoRA's tests read besides: each parameter's name, whether it is
/// frozen, its value before the first step, and the last step's cost per phase.
struct RunRecord : test::TrainedState {
  std::vector<std::string> names;
  std::vector<bool> frozen;
  std::vector<std::vector<float>> before;
  std::array<OpCost, kNumPhases> cost{};
};

// `prepare` runs on the model before the first step (a test that replaces weights).
RunRecord train3(const std::string& toml, const std::vector<std::string>& sets, int threads = 2,
                 const std::function<void(Backend&, Model&)>& prepare = {}) {
  const Config cfg = parse_config(toml, "lora-test", sets);
  cpu::CpuBackend be(1ull << 30, threads);
  RunParts parts = test::synthetic_run_parts(cfg, be);
  if (prepare) prepare(be, *parts.model);
  RunRecord r;
  for (Param& p : parts.model->params()) {
    r.names.push_back(p.name);
    r.frozen.push_back(p.frozen);
    r.before.push_back(host_copy(be, p.value));
  }
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *parts.model), be, *parts.model, *parts.data);
  for (int s = 0; s < 3; ++s) {
    be.reset_cost();
    r.losses.push_back(trainer.step().loss);
  }
  for (int i = 0; i < kNumPhases; ++i)
    r.cost[static_cast<size_t>(i)] = be.cost(static_cast<Phase>(i));
  test::record_state(be, parts.model->params(), r);
  return r;
}

// What trains (adapters, modules trained whole) and the losses, bitwise; frozen weights may be
// stored differently (a bf16 or NF4 base beside the fp32 base of its decoded values).
void check_same_training(const RunRecord& r, const RunRecord& ref) {
  REQUIRE(r.names == ref.names);
  for (size_t i = 0; i < ref.losses.size(); ++i)
    CHECK(std::memcmp(&r.losses[i], &ref.losses[i], sizeof(double)) == 0);
  for (size_t i = 0; i < r.names.size(); ++i) {
    if (r.frozen[i]) continue;
    INFO(r.names[i]);
    CHECK(r.params[i] == ref.params[i]);
    CHECK(r.grads[i] == ref.grads[i]);
    CHECK(r.moments[2 * i] == ref.moments[2 * i]);
  }
}

// The three storages of the frozen base (lora.base) and nf4 without double quant.
const std::vector<std::vector<std::string>> kBases = {
    {"lora.base=\"fp32\""},
    {"lora.base=\"bf16\""},
    {"lora.base=\"nf4\""},
    {"lora.base=\"nf4\"", "lora.double_quant=false"},
};

// Settings compared with policy "none" at the same tiling (a tiled MLP sums the weight gradients
// over its row tiles, another order than one product over every row: tiled runs equal each other).
const std::vector<std::vector<std::string>> kSettings = {
    {"remat.policy=full"},
    {"remat.policy=full", "remat.every=2"},
    {"remat.policy=save_dots"},
    {"remat.policy=save_attn"},
    {"remat.policy=full", "remat.blocks=[0,2]"},
    {"remat.policy=full", "remat.offload=\"checkpoints\""},
    {"remat.policy=save_attn", "remat.offload=\"checkpoints+optimizer+weights\""},
};
const std::vector<std::string> kTiled = {"remat.tile_tokens=17"};
const std::vector<std::vector<std::string>> kTiledSettings = {
    {"remat.policy=full"},
    {"remat.policy=save_dots"},
    {"remat.policy=full", "remat.offload=\"checkpoints+optimizer\""},
    {"remat.policy=full", "remat.every=2", "remat.offload=\"checkpoints+optimizer+weights\""},
};

}  // namespace

TEST_CASE("lora: the adapted model starts as its base, and frozen weights never move", "[lora]") {
  for (const std::string* toml : {&kLlama, &kGpt})
    for (const auto& base : kBases) {
      INFO(fmt::format("{} | {}", toml == &kLlama ? "llama" : "gpt", fmt::join(base, " ")));
      const RunRecord lora = train3(*toml, with({"remat.policy=none"}, base));
      size_t frozen = 0, adapters = 0, saved = 0;
      for (size_t i = 0; i < lora.names.size(); ++i) {
        INFO(lora.names[i]);
        const bool is_adapter = lora.names[i].find(".lora_") != std::string::npos;
        if (lora.frozen[i]) {
          ++frozen;
          // Bit for bit: never updated (bytes: a bf16 or NF4 value seen as floats may hold NaNs).
          CHECK(std::memcmp(lora.params[i].data(), lora.before[i].data(),
                            lora.params[i].size() * sizeof(float)) == 0);
          CHECK(lora.grads[i].empty());  // no gradient, no moments
          CHECK(lora.moments[2 * i].empty());
        } else {
          CHECK_FALSE(lora.params[i] == lora.before[i]);  // trained
          (is_adapter ? adapters : saved) += 1;
        }
        if (lora.names[i].find(".lora_B") != std::string::npos)  // B starts at zero
          CHECK(std::all_of(lora.before[i].begin(), lora.before[i].end(),
                            [](float v) { return v == 0.0f; }));
      }
      CHECK(frozen > 0);
      CHECK(adapters > 0);
      CHECK(saved > 0);
    }
}

TEST_CASE("lora: step 1's loss is the base model's, bit for bit", "[lora]") {
  // The base model of kLlama: the same names and seed, so the same initial weights. With B = 0
  // every adapter adds exact zeros, so the first loss (before any update) is the same.
  const RunRecord lora = train3(kLlama, {"remat.policy=full"});
  const std::string no_lora = kLlama.substr(0, kLlama.find("[lora]"));
  const RunRecord base = train3(no_lora, {"remat.policy=full"});
  CHECK(std::memcmp(&lora.losses[0], &base.losses[0], sizeof(double)) == 0);
  CHECK(lora.losses[1] != base.losses[1]);  // then they train different parameters
}

TEST_CASE("lora: bitwise identical under every remat policy, tiling, offload and thread count",
          "[lora][remat]") {
  for (const std::string* toml : {&kLlama, &kGpt}) {
    const char* family = toml == &kLlama ? "llama" : "gpt";
    const RunRecord ref = train3(*toml, {"remat.policy=none"});
    for (const auto& s : kSettings) {
      INFO(fmt::format("{} | {}", family, fmt::join(s, " ")));
      const RunRecord r = train3(*toml, s);
      check_same_bits(r, ref);
      if (s.back().find("offload") != std::string::npos) CHECK(r.host_peak > 0);
    }
    const RunRecord tiled = train3(*toml, with(kTiled, {"remat.policy=none"}));
    for (const auto& s : kTiledSettings) {
      INFO(fmt::format("{} | tiled | {}", family, fmt::join(s, " ")));
      check_same_bits(train3(*toml, with(kTiled, s)), tiled);
    }
    INFO(family << ": 1 and 3 threads");
    check_same_bits(train3(*toml, {"remat.policy=full"}, 1), ref);
    check_same_bits(train3(*toml, with(kTiled, {"remat.policy=full"}), 3), tiled);
  }
}

TEST_CASE("lora: a bf16 or nf4 base trains as the fp32 base of its decoded weights, bit for bit",
          "[lora][nf4]") {
  // The CPU's GEMMs read a decoded f32 copy of a bf16 or NF4 weight, and the embedding decodes its
  // bf16 rows: the same products as an fp32 base holding those decoded values, so the same
  // losses, gradients and adapters, bit for bit. Llama here trains its head whole, and below
  // (modules_to_save = ["norm"]) freezes it; GPT-2's head is its frozen token table.
  const std::vector<std::string> frozen_head = {"lora.modules_to_save=[\"norm\"]"};
  const std::vector<std::pair<const std::string*, std::vector<std::string>>> runs = {
      {&kLlama, {}}, {&kLlama, frozen_head}, {&kGpt, {}}};
  for (const auto& run : runs)
    for (size_t b = 1; b < kBases.size(); ++b) {
      const std::string* toml = run.first;
      const std::vector<std::string>& sets = run.second;
      const std::vector<std::string> base = with(sets, kBases[b]);
      INFO(fmt::format("{} | {}", toml == &kLlama ? "llama" : "gpt", fmt::join(base, " ")));
      const Config cfg = parse_config(*toml, "lora-test", base);
      // What lora.base stores below f32: every linear of the blocks as it says, and the token
      // table and the LM head in bf16 unless they train whole.
      std::map<std::string, DType> expected;
      for (const lora::Site& site : lora::all_sites(cfg.model))
        expected[site.base] = lora::base_dtype(cfg.lora);
      expected["wte"] = DType::BF16;
      if (!cfg.model.tie_embeddings && sets == frozen_head)
        expected["lm_head.weight"] = DType::BF16;
      std::map<std::string, DType> stored;
      const RunRecord packed =
          train3(*toml, with({"remat.policy=full"}, base), 2, [&](Backend&, Model& model) {
            for (Param& p : model.params())
              if (p.value.tensor().dtype != DType::F32) stored[p.name] = p.value.tensor().dtype;
          });
      CHECK(stored == expected);
      CHECK(expected.size() == (toml == &kLlama ? 3u * 5 : 4u * 4) + 1 + (sets == frozen_head));
      // The fp32 base of the same seed, each of those weights encoded and decoded.
      const auto decode_stored = [&](Backend& be, Model& model) {
        for (Param& p : model.params()) {
          const auto it = expected.find(p.name);
          if (it == expected.end()) continue;
          const int64_t n = p.value.tensor().numel();
          std::vector<uint8_t> bytes(static_cast<size_t>(Tensor(nullptr, {n}, it->second).bytes()));
          encode_weight(it->second, p.value.f32(), n, bytes.data());
          std::vector<float> back(static_cast<size_t>(n));
          decode_weight(it->second, bytes.data(), n, 0, n, back.data());
          be.upload(p.value, back.data());
        }
      };
      check_same_training(packed,
                          train3(*toml, with({"remat.policy=full"}, sets), 2, decode_stored));
    }
}

TEST_CASE("lora: a bf16 or nf4 base is bitwise identical under every remat policy and tiling",
          "[lora][nf4][remat]") {
  for (const std::string* toml : {&kLlama, &kGpt})
    for (size_t b = 1; b < kBases.size(); ++b) {
      const char* family = toml == &kLlama ? "llama" : "gpt";
      const std::vector<std::string>& base = kBases[b];
      const RunRecord ref = train3(*toml, with({"remat.policy=none"}, base));
      for (const auto& s : kSettings) {
        INFO(fmt::format("{} | {} | {}", family, fmt::join(base, " "), fmt::join(s, " ")));
        check_same_bits(train3(*toml, with(s, base)), ref);
      }
      const RunRecord tiled = train3(*toml, with(with(kTiled, {"remat.policy=none"}), base));
      for (const auto& s : kTiledSettings) {
        INFO(fmt::format("{} | {} | tiled | {}", family, fmt::join(base, " "), fmt::join(s, " ")));
        check_same_bits(train3(*toml, with(with(kTiled, s), base)), tiled);
      }
    }
}

TEST_CASE("lora: adapter dropout survives recomputation and changes the loss", "[lora][remat]") {
  const RunRecord drop = train3(kLlama, {"remat.policy=none", "lora.dropout=0.3"});
  const RunRecord plain = train3(kLlama, {"remat.policy=none"});
  CHECK(drop.losses[1] != plain.losses[1]);  // the masks are really drawn
  for (const auto& s : kSettings) {
    INFO(fmt::format("{}", fmt::join(s, " ")));
    check_same_bits(train3(kLlama, with(s, {"lora.dropout=0.3"})), drop);
  }
  const RunRecord tiled = train3(kLlama, with(kTiled, {"remat.policy=none", "lora.dropout=0.3"}));
  for (const auto& s : kTiledSettings) {
    INFO(fmt::format("tiled | {}", fmt::join(s, " ")));
    check_same_bits(train3(kLlama, with(with(kTiled, s), {"lora.dropout=0.3"})), tiled);
  }
}

TEST_CASE("lora: chunked attention gives the same bits under every policy", "[lora][chunks]") {
  const std::vector<std::string> chunked = {"train.seq_len=150", "remat.attention_chunk=64"};
  const RunRecord ref = train3(kLlama, with(chunked, {"remat.policy=none"}));
  for (const char* policy : {"remat.policy=full", "remat.policy=save_dots"}) {
    INFO(policy);
    check_same_bits(train3(kLlama, with(chunked, {policy})), ref);
  }
}

TEST_CASE("lora: predicted device and host peaks equal the measured ones to the byte",
          "[lora][planner]") {
  for (const std::string* toml : {&kLlama, &kGpt}) {
    std::vector<std::vector<std::string>> settings = kSettings;
    for (const auto& s : kTiledSettings) settings.push_back(with(kTiled, s));
    settings.push_back({"remat.policy=none"});
    settings.push_back({"remat.policy=full", "lora.dropout=0.1", "remat.tile_tokens=9"});
    settings.push_back(
        {"remat.policy=full", "train.seq_len=150", "remat.attention_chunk=64", "model.n_ctx=256"});
    // A bf16 and an NF4 base: their weights at their storage's size, and each linear's decoded
    // copy in its op's workspace.
    for (size_t b = 1; b < kBases.size(); ++b) {
      settings.push_back(with({"remat.policy=none"}, kBases[b]));
      settings.push_back(with({"remat.policy=full", "remat.offload=\"checkpoints\""}, kBases[b]));
      settings.push_back(with(with(kTiled, {"remat.policy=save_dots"}), kBases[b]));
    }
    // A frozen LM head of its own (Llama; GPT-2's is its token table): bf16, decoded in the loss.
    if (toml == &kLlama)
      settings.push_back({"remat.policy=full", "lora.base=\"nf4\"", "lora.modules_to_save=[]"});
    for (const auto& s : settings) {
      INFO(fmt::format("{} | {}", toml == &kLlama ? "llama" : "gpt", fmt::join(s, " ")));
      const Config cfg = parse_config(*toml, "lora-test", s);
      for (int threads : {1, 2}) {
        const DryRun plan = test::cpu_test_planner(threads, 1ull << 32).dry_run(cfg);
        cpu::CpuBackend be(1ull << 32, threads);
        RunParts parts = test::synthetic_run_parts(cfg, be);
        Trainer trainer(cfg.train, resolve_remat_plan(cfg, *parts.model), be, *parts.model,
                        *parts.data);
        trainer.step();
        trainer.step();
        CHECK(plan.peak.total_bytes == be.pool().peak_bytes());
        CHECK(plan.host_peak.total_bytes == be.host_pool().peak_bytes());
        CHECK(plan.n_params == parts.model->n_params());
        CHECK(plan.n_trainable_params == parts.model->n_trainable_params());
      }
    }
  }
}

TEST_CASE("lora: auto picks a plan that fits a budget, with the bits of none", "[lora][planner]") {
  // A budget halfway between full's peak and none's: auto mixes policies per block (and may
  // tile); its plan runs as predicted and computes what none computes.
  for (const std::string* toml : {&kLlama, &kGpt}) {
    INFO((toml == &kLlama ? "llama" : "gpt"));
    const Config none = parse_config(*toml, "lora-test", {"remat.policy=none"});
    const Planner unlimited = test::cpu_test_planner(2, 1ull << 32);
    const uint64_t hi = unlimited.dry_run(none).peak.total_bytes;
    const uint64_t lo =
        unlimited.dry_run(parse_config(*toml, "lora-test", {"remat.policy=full"})).peak.total_bytes;
    Config cfg = parse_config(*toml, "lora-test", {"remat.policy=auto"});
    cfg.device.memory_bytes = (lo + hi) / 2;
    const Planner planner = test::cpu_test_planner(2, cfg.device.memory_bytes);
    const std::optional<AutoPlan> chosen = resolve_auto(planner, cfg);
    REQUIRE(chosen);
    REQUIRE(chosen->fits);
    const DryRun plan = planner.dry_run(cfg);
    CHECK(plan.peak.total_bytes <= cfg.device.memory_bytes);
    cpu::CpuBackend be(1ull << 32, 2);
    RunParts parts = test::synthetic_run_parts(cfg, be);
    Trainer trainer(cfg.train, resolve_remat_plan(cfg, *parts.model), be, *parts.model,
                    *parts.data);
    const double loss = trainer.step().loss;
    trainer.step();
    CHECK(plan.peak.total_bytes == be.pool().peak_bytes());
    const RunRecord ref = train3(*toml, {"remat.policy=none"});
    if (cfg.remat.tile_tokens == 0)  // a tiled MLP sums its weight gradients in another order
      CHECK(std::memcmp(&loss, &ref.losses[0], sizeof(double)) == 0);
  }
}

TEST_CASE("lora: the model's adapter gradients match central differences", "[lora]") {
  // One forward/backward of the whole model in float; the loss is the mean of B*T float row
  // losses, summed in double. B is set away from zero first (at zero, dA is zero too), and the
  // checked entries are a few of each kind: q and v adapters on the fused qkv, o_proj, the MLP's
  // down projection, and a norm trained whole. The step is 1e-3: at 1e-2 the curvature of the
  // o_proj adapter's path (attention output into the residual, through a 1.25x dropout scale)
  // moved the quotient by 6%; at 1e-3 the truncation is gone and the float rounding of the loss
  // (~1e-7 of ~3.6, divided by 2e-3) leaves at most 3.1e-5 absolute (measured). Hence 1e-4
  // absolute plus 1% relative: a missing scale, sign, mask or term is off by O(100%).
  // On each storage of the base: its decoded weights are constants of the loss like fp32 ones.
  for (const auto& base : kBases) {
    INFO(fmt::format("{}", fmt::join(base, " ")));
    const Config cfg =
        parse_config(kLlama, "lora-test",
                     with({"train.seq_len=9", "remat.policy=full", "lora.dropout=0.2"}, base));
    cpu::CpuBackend be(1ull << 30, test::kFdThreads);
    RunParts parts = test::synthetic_run_parts(cfg, be);
    Model& model = *parts.model;
    for (Param& p : model.params())
      if (p.name.find(".lora_B") != std::string::npos)
        for (int64_t i = 0; i < p.value.tensor().numel(); ++i)
          p.value.f32()[i] = static_cast<float>(0.3 * rng_normal(7, hash_name(p.name.c_str()), i));
    const RematPlan plan = resolve_remat_plan(cfg, model);
    Batch batch = parts.data->next(be, 0);
    model.begin_step(0);
    auto loss = [&] { return forward_loss(be, model, batch).mean; };
    for (Param& p : model.params())
      if (p.trainable()) be.fill(p.grad, 0.0f);
    forward_backward(be, model, plan, batch);
    const std::vector<const char*> names = {
        "blocks.1.attn.qkv.lora_A.q", "blocks.1.attn.qkv.lora_B.v", "blocks.0.attn.proj.lora_A",
        "blocks.2.mlp.down.lora_B", "normf.weight"};
    // The gradients first: forward_loss's fused head adds into the head's gradients.
    std::vector<std::vector<float>> grads;
    for (const char* name : names)
      for (Param& q : model.params())
        if (q.name == name) grads.emplace_back(q.grad.f32(), q.grad.f32() + 6);
    REQUIRE(grads.size() == names.size());
    for (size_t k = 0; k < names.size(); ++k) {
      Param* p = nullptr;
      for (Param& q : model.params())
        if (q.name == names[k]) p = &q;
      INFO(names[k]);
      // forward_loss runs in training mode here: the same dropout masks as the step's.
      const std::vector<double> fd = test::central_differences(p->value.f32(), 6, 1e-3, loss);
      CHECK(test::allclose(grads[k], fd, test::Tolerance{1e-2, 1e-4}, names[k]));
    }
  }
}

TEST_CASE("lora: a step computes no weight gradient of the base, and MFU counts only its work",
          "[lora]") {
  const RunRecord lora = train3(kLlama, {"remat.policy=none", "lora.modules_to_save=[]"});
  const std::string no_lora = kLlama.substr(0, kLlama.find("[lora]"));
  const RunRecord full = train3(no_lora, {"remat.policy=none"});
  const auto F = [](const RunRecord& r, Phase p) { return r.cost[static_cast<size_t>(p)]; };
  // The forward computes the base plus the adapters; the backward skips every base dW GEMM.
  CHECK(F(lora, Phase::Forward).flops > F(full, Phase::Forward).flops);
  CHECK(F(lora, Phase::Backward).flops < F(full, Phase::Backward).flops);
  CHECK(F(lora, Phase::Backward).skipped_flops > 0);
  CHECK(F(full, Phase::Backward).skipped_flops == 0);
  CHECK(F(lora, Phase::Loss).flops < F(full, Phase::Loss).flops);  // the frozen head: no dW
  const double model_lora = model_flops(lora.cost), model_full = model_flops(full.cost);
  CHECK(model_full == 3 * F(full, Phase::Forward).flops + F(full, Phase::Loss).flops);
  CHECK(model_lora == 3 * F(lora, Phase::Forward).flops + F(lora, Phase::Loss).flops -
                          F(lora, Phase::Backward).skipped_flops);
  CHECK(model_lora < model_full);
}

TEST_CASE("lora: the [lora] table refuses what it cannot train, naming the key", "[lora][config]") {
  auto refusal = [](const std::string& toml, const std::vector<std::string>& sets) {
    try {
      parse_config(toml, "lora.toml", sets);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string llama = kLlama.substr(0, kLlama.find("[lora]"));
  // A rank of 0 with another key set.
  CHECK_THAT(refusal(llama, {"lora.alpha=8"}),
             Contains("lora.alpha") && Contains("lora.rank = 0") && Contains("Fix:"));
  CHECK_THAT(refusal(llama, {"lora.targets=[\"q_proj\"]"}), Contains("lora.targets"));
  // The mlp model has no linears of this kind.
  CHECK_THAT(refusal(test::small_mlp_toml(2, 8, 4), {"lora.rank=4"}),
             Contains("lora.rank") && Contains("mlp"));
  // Targets that are not linears of a block, or nothing.
  CHECK_THAT(refusal(llama, {"lora.rank=4", "lora.targets=[\"mlp\"]"}),
             Contains("lora.targets") && Contains("model.layers.0.mlp"));
  CHECK_THAT(refusal(llama, {"lora.rank=4", "lora.targets=[\"c_attn\"]"}),
             Contains("'c_attn' matches no module"));
  CHECK_THAT(refusal(llama, {"lora.rank=4", "lora.targets=[\"embed_tokens\"]"}),
             Contains("not a linear"));
  // Whole modules: linears, tied embeddings, nothing.
  CHECK_THAT(refusal(llama, {"lora.rank=4", "lora.modules_to_save=[\"self_attn\"]"}),
             Contains("lora.modules_to_save") && Contains("not an embedding"));
  CHECK_THAT(refusal(llama, {"lora.rank=4", "model.tie_embeddings=true",
                             "lora.modules_to_save=[\"embed_tokens\"]"}),
             Contains("tied"));
  CHECK_THAT(refusal(kGpt, {"lora.modules_to_save=[\"wte\"]"}), Contains("tied"));
  CHECK_THAT(refusal(llama, {"lora.rank=4", "lora.modules_to_save=[\"ln_f\"]"}),
             Contains("matches no module"));
  // The base's storage: fp32, bf16 or nf4; double quant is nf4's alone.
  CHECK_THAT(refusal(llama, {"lora.rank=4", "lora.base=\"int8\""}),
             Contains("lora.base") && Contains("nf4"));
  CHECK_THAT(refusal(llama, {"lora.rank=4", "lora.double_quant=false"}),
             Contains("lora.double_quant") && Contains("lora.base = \"fp32\"") &&
                 Contains("Fix: set lora.base = \"nf4\""));
  CHECK_THAT(refusal(llama, {"lora.rank=4", "lora.base=\"bf16\"", "lora.double_quant=true"}),
             Contains("lora.double_quant"));
  CHECK_THAT(refusal(llama, {"lora.double_quant=true"}), Contains("lora.rank = 0"));
  CHECK(refusal(llama, {"lora.rank=4", "lora.base=\"nf4\"", "lora.double_quant=false"}) ==
        "accepted");
  CHECK(refusal(kLlama, {}) == "accepted");
}

TEST_CASE("lora: targets and modules_to_save select modules as peft matches them", "[lora]") {
  const Config gpt = parse_config(kGpt, "lora.toml", {});
  // "c_proj" is both of GPT-2's projections; "attn.c_proj" only the attention's.
  CHECK(lora::select_sites(gpt.model, {"c_proj"}).sites.size() == 2 * 4);
  const auto attn = lora::select_sites(gpt.model, {"attn.c_proj"}).sites;
  REQUIRE(attn.size() == 4);
  CHECK(attn[0].base == "blocks.0.attn.proj.weight");
  CHECK(attn[0].conv1d);
  const Config llama = parse_config(kLlama, "lora.toml", {});
  // A name ends at a dot: "proj" is no module's name, though every projection's ends in it.
  CHECK_THAT(lora::select_sites(llama.model, {"proj"}).problem, Contains("matches no module"));
  const auto all = lora::select_sites(llama.model, {}).sites;
  CHECK(all.size() == 7 * 3);
  // q, k and v are row ranges of the fused weight, in that order.
  CHECK(all[1].module == "model.layers.0.self_attn.k_proj");
  CHECK(all[1].a_name == "blocks.0.attn.qkv.lora_A.k");
  CHECK(all[1].row0 == 4 * 12);
  CHECK(all[1].rows == 2 * 12);
  // "norm" ends input_layernorm, post_attention_layernorm, q_norm, k_norm and the final norm.
  const auto saved = lora::select_saved(llama.model, {"norm"}).modules;
  CHECK(saved.size() == 3 * 4 + 1);
  CHECK(saved.back().params == std::vector<std::string>{"normf.weight"});
  CHECK(lora::scaling(llama.lora) == 2.0);
  LoraConfig rs = llama.lora;
  rs.rslora = true;
  CHECK(lora::scaling(rs) == Approx(6.0 / std::sqrt(3.0)));
}
