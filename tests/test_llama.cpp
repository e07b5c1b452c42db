// The Llama family on the CPU, as the GPT is held to: losses, gradients and weights bitwise
// identical under every remat policy, granularity, MLP tiling, offload and thread count; the
// planner's device and host peaks equal to the measured ones to the byte; the slot table and the
// config keys. Numerical correctness against a double-precision reference and against
// transformers is in tests/test_reference.cpp and tests/test_hf.cpp.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "data/synthetic.h"
#include "engine/config/config.h"
#include "engine/core/error.h"
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

namespace {

// Every option of the family at once: grouped-query attention (4 query heads on 2 key/value
// heads), a head size that is not n_embd / n_head (Qwen3), q/k/v biases (Qwen2), the per-head q/k
// norm (Qwen3), an untied head, llama3 RoPE scaling whose band edges fall inside the tested
// positions' frequencies, and an MLP width that is no multiple of anything.
const std::string kLlama =
    "[model]\n" +
    test::llama_model_table(test::every_llama_option({.n_layer = 4,
                                                      .head_dim = 12,
                                                      .n_embd = 32,
                                                      .d_ff = 72,
                                                      .vocab_size = 37,
                                                      .rope_theta = 500000.0,
                                                      .llama3_context = 16})) +
    R"([train]
seq_len = 45
batch_size = 2
steps = 3
loss_chunk = 16
[data]
task = "copy"
[device]
threads = 2
)";

// The plainest member: multi-head attention, tied head, no biases, no q/k norm, no scaling.
const std::vector<std::string> kPlain = {
    "model.n_kv_head=4",   "model.head_dim=0",          "model.attention_bias=false",
    "model.qk_norm=false", "model.tie_embeddings=true", "model.rope_scaling=\"none\""};

using test::check_same_bits;
using test::with;
using RunRecord = test::TrainedState;

RunRecord train3(const std::vector<std::string>& sets, int threads = 2) {
  const Config cfg = parse_config(kLlama, "llama-test", sets);
  cpu::CpuBackend be(1ull << 30, threads);
  RunParts parts = test::synthetic_run_parts(cfg, be);
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *parts.model), be, *parts.model, *parts.data);
  RunRecord r;
  for (int s = 0; s < 3; ++s) r.losses.push_back(trainer.step().loss);
  test::record_state(be, parts.model->params(), r);
  return r;
}

const std::vector<std::vector<std::string>> kSettings = {
    {"remat.policy=full"},
    {"remat.policy=full", "remat.every=2"},
    {"remat.policy=full", "remat.blocks=[0,2,3]"},
    {"remat.policy=save_dots"},
    {"remat.policy=save_attn"},
    {"remat.policy=save_attn", "remat.every=2"},
    {"remat.policy=names", "remat.save=[\"qkv\",\"gate\",\"act\"]"},
    {"remat.policy=names", "remat.save=[\"norm1\",\"norm1.rstd\",\"qkv.normed\",\"up\"]"},
    {"remat.plan=[\"full\",\"save_attn\",\"none\",\"save_dots\"]"},
};

}  // namespace

TEST_CASE("llama: losses, gradients and weights are bitwise identical under every remat setting",
          "[llama][remat]") {
  for (const auto& family : {std::vector<std::string>{}, kPlain}) {
    const RunRecord ref = train3(with(family, {"remat.policy=none"}));
    for (const auto& s : kSettings) {
      if (!family.empty() &&
          fmt::format("{}", fmt::join(s, " ")).find("qkv.normed") != std::string::npos)
        continue;  // the plain block has no q/k norm (the slots test checks the refusal)
      INFO(fmt::format("{} | {}", fmt::join(family, " "), fmt::join(s, " ")));
      const RunRecord r = train3(with(family, s));
      check_same_bits(r, ref);
      CHECK(r.peak <= ref.peak);
    }
  }
}

TEST_CASE("llama: the same bits for 1, 2 and 3 threads, tiled or not", "[llama][threads]") {
  for (const char* tile : {"remat.tile_tokens=0", "remat.tile_tokens=37"}) {
    const RunRecord one = train3({"remat.policy=full", tile}, 1);
    for (int threads : {2, 3}) {
      INFO(tile << ", " << threads << " threads");
      check_same_bits(train3({"remat.policy=full", tile}, threads), one);
    }
  }
}

TEST_CASE("llama: a tiled MLP gives the same bits under every policy and with offload",
          "[llama][remat][offload]") {
  const RunRecord ref = train3({"remat.policy=none", "remat.tile_tokens=17"});
  for (const auto& s : kSettings) {
    if (s.size() > 1 && s[1].find("gate") != std::string::npos) continue;  // no MLP slots tiled
    if (s.size() > 1 && s[1].find("\"up\"") != std::string::npos) continue;
    INFO(fmt::format("{}", fmt::join(s, " ")));
    check_same_bits(train3(with(s, {"remat.tile_tokens=17"})), ref);
  }
  for (const char* offload :
       {"checkpoints", "checkpoints+optimizer", "checkpoints+optimizer+weights"}) {
    INFO(offload);
    const RunRecord moved = train3({"remat.policy=full", "remat.tile_tokens=17",
                                    fmt::format("remat.offload=\"{}\"", offload)});
    check_same_bits(moved, ref);
    CHECK(moved.host_peak > 0);
  }
}

TEST_CASE("llama: attention over chunks gives the same bits under every policy, near unchunked",
          "[llama][remat][chunks]") {
  const std::vector<std::string> chunked = {"train.seq_len=150", "remat.attention_chunk=64"};
  const RunRecord ref = train3(with(chunked, {"remat.policy=none"}));
  for (const char* policy : {"remat.policy=full", "remat.policy=save_dots"}) {
    INFO(policy);
    check_same_bits(train3(with(chunked, {policy})), ref);
  }
  // Against unchunked attention: the same losses but for float rounding (the op tests bound it).
  const RunRecord whole = train3({"train.seq_len=150", "remat.policy=none"});
  for (size_t s = 0; s < ref.losses.size(); ++s)
    CHECK(std::abs(ref.losses[s] - whole.losses[s]) <= 1e-5 * std::abs(whole.losses[s]));
  CHECK_FALSE(test::bitwise_equal(ref.grads, whole.grads));  // chunking really ran
}

TEST_CASE("llama: predicted device and host peaks equal the measured ones to the byte",
          "[llama][planner]") {
  const std::vector<std::vector<std::string>> settings = {
      {"remat.policy=none"},
      {"remat.policy=full"},
      {"remat.policy=save_dots"},
      {"remat.policy=save_attn", "remat.blocks=[0,2]"},
      {"remat.policy=names", "remat.save=[\"x\",\"gate\"]"},
      {"remat.policy=full", "remat.tile_tokens=17"},
      {"remat.policy=save_dots", "remat.tile_tokens=1"},
      {"remat.policy=full", "remat.offload=\"checkpoints\""},
      {"remat.policy=full", "remat.tile_tokens=17", "remat.offload=\"checkpoints+optimizer\""},
      {"remat.policy=save_attn", "remat.offload=\"checkpoints+optimizer+weights\""},
      {"remat.policy=full", "remat.every=2", "remat.offload=\"checkpoints+optimizer+weights\""},
      // attention over chunks of 64, 64 and 22 tokens: its f32 copies and sums in the workspace
      {"train.seq_len=150", "remat.policy=full", "remat.attention_chunk=64"},
      {"train.seq_len=150", "remat.policy=none", "remat.attention_chunk=64"},
  };
  for (const auto& family : {std::vector<std::string>{}, kPlain})
    for (const auto& s : settings) {
      const std::vector<std::string> sets = with(family, s);
      INFO(fmt::format("{}", fmt::join(sets, " ")));
      const Config cfg = parse_config(kLlama, "llama-test", sets);
      for (int threads : {1, 2}) {
        const DryRun plan = test::cpu_test_planner(threads, 1ull << 32).dry_run(cfg);
        const RunRecord r = train3(sets, threads);
        CHECK(plan.peak.total_bytes == r.peak);
        CHECK(plan.host_peak.total_bytes == r.host_peak);
      }
    }
}

TEST_CASE("llama: the block's slots, with and without the q/k norm and tiling", "[llama][remat]") {
  auto names = [](const std::vector<std::string>& sets) {
    const Config cfg = parse_config(kLlama, "llama-test", sets);
    cpu::CpuBackend be(1ull << 30, 1);
    return make_model(cfg, be)->block(0).act_names();
  };
  using V = std::vector<std::string>;
  CHECK(names({}) == V{"x", "norm1", "norm1.rstd", "qkv", "qkv.normed", "qkv.rstd", "attn",
                       "attn.lse", "res", "norm2", "norm2.rstd", "gate", "up", "act"});
  CHECK(names({"model.qk_norm=false"}) == V{"x", "norm1", "norm1.rstd", "qkv", "attn", "attn.lse",
                                            "res", "norm2", "norm2.rstd", "gate", "up", "act"});
  CHECK(names({"model.qk_norm=false", "remat.tile_tokens=8"}) ==
        V{"x", "norm1", "norm1.rstd", "qkv", "attn", "attn.lse", "res"});
}

TEST_CASE("llama: parameters follow the options: biases, q/k norms, untied head", "[llama]") {
  auto count = [](const std::vector<std::string>& sets) {
    const Config cfg = parse_config(kLlama, "llama-test", sets);
    cpu::CpuBackend be(1ull << 30, 1);
    return make_model(cfg, be)->n_params();
  };
  // C = 32, NH = 4, KVH = 2, HS = 12, FF = 72, V = 37, L = 4: qkv width (4 + 4) * 12 = 96.
  const int64_t block = 32 + 96 * 32 + 32 * 48 + 32 + 3 * 72 * 32;
  const int64_t plain = 37 * 32 + 4 * block + 32;
  CHECK(count({"model.attention_bias=false", "model.qk_norm=false", "model.tie_embeddings=true"}) ==
        plain);
  CHECK(count({"model.qk_norm=false", "model.tie_embeddings=true"}) == plain + 4 * 96);
  CHECK(count({"model.attention_bias=false", "model.tie_embeddings=true"}) == plain + 4 * 2 * 12);
  CHECK(count({"model.attention_bias=false", "model.qk_norm=false"}) == plain + 37 * 32);
}

TEST_CASE("llama config keys refuse what the family cannot be", "[llama][config]") {
  auto error_of = [](const std::string& text, const std::vector<std::string>& sets) {
    try {
      parse_config(text, "llama-test", sets);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  using Catch::Matchers::Contains;
  CHECK_THAT(error_of(kLlama, {"model.n_kv_head=3"}),
             Contains("model.n_kv_head") && Contains("not a multiple"));
  CHECK_THAT(error_of(kLlama, {"model.position=\"learned\""}),
             Contains("model.position") && Contains("RoPE only"));
  CHECK_THAT(error_of(kLlama, {"model.dropout=0.1"}), Contains("model.dropout"));
  CHECK_THAT(error_of(kLlama, {"model.head_dim=7"}), Contains("even head size"));
  CHECK_THAT(error_of(kLlama, {"model.rope_scaling={ rope_type = \"longrope\", factor = 4.0 }"}),
             Contains("model.rope_scaling.rope_type") &&
                 Contains("RoPE scaling \"longrope\" is not supported") &&
                 Contains("linear, dynamic, yarn, llama3"));
  CHECK_THAT(error_of(kLlama, {"model.rope_scaling={ rope_type = \"yarn\", "
                               "original_max_position_embeddings = 64 }"}),
             Contains("model.rope_scaling") && Contains("rope_type \"yarn\" needs factor"));
  CHECK_THAT(error_of(kLlama, {"model.rope_scaling={ rope_type = \"linear\", factor = 2.0, "
                               "low_freq_factor = 1.0 }"}),
             Contains("model.rope_scaling.low_freq_factor") &&
                 Contains("does not apply to rope_type \"linear\"") && Contains("takes factor"));
  CHECK_THAT(error_of(kLlama, {"model.rope_scaling={ rope_type = \"yarn\", factor = 2.0, "
                               "original_max_position_embeddings = 64, alpha = 1 }"}),
             Contains("model.rope_scaling.alpha") && Contains("unknown key 'alpha'"));
  CHECK_THAT(error_of(kLlama, {"model.rope_scaling={ rope_type = \"yarn\", factor = 2.0, "
                               "original_max_position_embeddings = 64, truncate = 1 }"}),
             Contains("model.rope_scaling.truncate") && Contains("expected true or false"));
  CHECK_THAT(error_of(kLlama, {"model.rope_scaling={ rope_type = \"llama3\", factor = 8.0 }"}),
             Contains("original_max_position_embeddings"));
  CHECK_THAT(error_of("[model]\nkind = \"gpt\"\nn_kv_head = 2\n", {}),
             Contains("model.n_kv_head applies to model.kind = \"llama\""));
  CHECK_THAT(error_of("[model]\nkind = \"gpt\"\n", {"model.tie_embeddings=false"}),
             Contains("model.tie_embeddings"));
  // The scaling round-trips through state.json's TOML.
  const Config cfg = parse_config(kLlama, "llama-test", {});
  const Config again = parse_config(config_to_toml(cfg), "state.json", {});
  CHECK(again.model.rope_scaling == cfg.model.rope_scaling);
  CHECK(again.model.n_kv_head == 2);
  CHECK(again.model.head_dim == 12);
  CHECK(again.model.qk_norm);
  CHECK(again.model.attention_bias);
  CHECK_FALSE(again.model.tie_embeddings);
}
