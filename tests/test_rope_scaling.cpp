// RoPE scaling types (engine/core/ops/rope.h, engine/config/rope_scaling.h): each type's
// frequencies and attention factor against its formula's defining properties, and
// model.rope_scaling read from TOML, written back into state.json's TOML and into an exported
// config.json, and read again, for every type. Agreement with transformers itself (frequencies,
// attention factor, logits, loss, gradients past the original context) is the rope-* goldens of
// tests/test_hf.cpp; the attention op with each scaling against a double reference and central
// differences is tests/ops/test_attention.cpp.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>

#include "engine/config/config.h"
#include "engine/config/hf_config.h"
#include "engine/core/error.h"
#include "tests/temp_dir.h"

using namespace remat;
using Catch::Matchers::Contains;

namespace {

const std::vector<double> kPlain = rope_inv_freq(64, 10000.0);

}  // namespace

TEST_CASE("linear rope scaling divides every frequency by the factor", "[rope]") {
  const std::vector<double> f =
      rope_inv_freq(64, 10000.0, {.kind = RopeScaling::Linear, .factor = 4.0});
  for (size_t i = 0; i < f.size(); ++i) CHECK(f[i] == kPlain[i] / 4.0);
  CHECK(rope_attention_factor({.kind = RopeScaling::Linear, .factor = 4.0}) == 1.0);
}

TEST_CASE("dynamic rope scaling keeps the frequencies up to its length, then grows the base",
          "[rope]") {
  RopeScaling s{.kind = RopeScaling::Dynamic, .factor = 2.0, .original_context = 4096};
  for (const int64_t len : {int64_t{0}, int64_t{100}, int64_t{4096}}) {  // not past: the same bits
    s.seq_len = len;
    CHECK(rope_inv_freq(64, 10000.0, s) == kPlain);
  }
  // At 16k, 4x the length: base 10^4 (2 x 4 - 1)^(64 / 62) = 10^4 x 7^(32/31).
  s.seq_len = 16384;
  const std::vector<double> f = rope_inv_freq(64, 10000.0, s);
  const double base = 10000.0 * std::pow(7.0, 64.0 / 62.0);
  CHECK(rope_dynamic_theta(64, 10000.0, s) == Approx(base).epsilon(1e-15));
  for (size_t i = 0; i < f.size(); ++i)
    CHECK(f[i] == Approx(std::pow(base, -2.0 * static_cast<double>(i) / 64.0)).epsilon(1e-14));
  CHECK(f[0] == 1.0);
  CHECK(f.back() < kPlain.back() / 6);  // the slowest pair turns ~7x slower
  CHECK(rope_attention_factor(s) == 1.0);
}

TEST_CASE("yarn rope scaling keeps fast pairs, interpolates slow ones, ramps between", "[rope]") {
  // Qwen2.5's long-context setting: factor 4 over an original 32k, theta 10^6, head 128.
  const RopeScaling yarn{.kind = RopeScaling::Yarn, .factor = 4.0, .original_context = 32768};
  const std::vector<double> plain = rope_inv_freq(128, 1e6);
  const std::vector<double> f = rope_inv_freq(128, 1e6, yarn);
  // The ramp's ends: the dimension whose wavelength fits 32 times (beta_fast), resp. once
  // (beta_slow), into 32768 positions, floored and ceiled: 128 ln(32768 / (2 pi b)) / (2 ln 10^6).
  auto dim_of = [](double turns) {
    return 128 * std::log(32768 / (turns * 2 * std::numbers::pi)) / (2 * std::log(1e6));
  };
  const double low = std::floor(dim_of(32)), high = std::ceil(dim_of(1));
  REQUIRE(low == 23);   // 23.6 floored
  REQUIRE(high == 40);  // 39.7 ceiled
  for (size_t i = 0; i < f.size(); ++i) {
    CAPTURE(i);
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    if (i <= 23) CHECK(f[i] == plain[i]);      // extrapolated: as trained
    if (i >= 40) CHECK(f[i] == plain[i] / 4);  // interpolated
    CHECK(f[i] == Approx(plain[i] / 4 * ramp + plain[i] * (1 - ramp)).epsilon(1e-15));
  }
  // The attention factor on cos and sin: 0.1 ln 4 + 1 by default, an explicit value as given,
  // DeepSeek's mscale pair as a ratio, and 1 when only one of the pair is set (transformers'
  // `mscale and mscale_all_dim`).
  CHECK(rope_attention_factor(yarn) == Approx(0.1 * std::log(4.0) + 1).epsilon(1e-15));
  RopeScaling given = yarn;
  given.attention_factor = 0.75;
  CHECK(rope_attention_factor(given) == 0.75);
  RopeScaling deepseek = yarn;
  deepseek.factor = 40;
  deepseek.mscale = 1.0;
  deepseek.mscale_all_dim = 0.707;
  CHECK(rope_attention_factor(deepseek) ==
        Approx((0.1 * std::log(40.0) + 1) / (0.1 * 0.707 * std::log(40.0) + 1)).epsilon(1e-15));
  deepseek.mscale_all_dim = 0;
  CHECK(rope_attention_factor(deepseek) == Approx(0.1 * std::log(40.0) + 1).epsilon(1e-15));
  // Untruncated, the ramp's ends stay fractional.
  RopeScaling exact = yarn;
  exact.truncate = false;
  const std::vector<double> g = rope_inv_freq(128, 1e6, exact);
  const double r24 = (24 - dim_of(32)) / (dim_of(1) - dim_of(32));
  CHECK(g[24] == Approx(plain[24] / 4 * r24 + plain[24] * (1 - r24)).epsilon(1e-15));
  CHECK(g[24] != f[24]);
}

TEST_CASE("rope angles carry the attention factor into cos and sin, and 1 leaves their bits",
          "[rope]") {
  const RopeAngles plain = rope_angles(16, 10000.0);
  const RopeAngles yarn =
      rope_angles(16, 10000.0, {.kind = RopeScaling::Yarn, .factor = 8.0, .original_context = 32});
  REQUIRE(yarn.attention_factor == Approx(0.1 * std::log(8.0) + 1));
  float cs[8], sn[8], ycs[8], ysn[8];
  plain.cos_sin(1000, cs, sn);
  yarn.cos_sin(1000, ycs, ysn);
  for (int i = 0; i < 8; ++i) {
    const double ang = 1000.0 * plain.inv_freq[static_cast<size_t>(i)];
    CHECK(cs[i] == static_cast<float>(std::cos(ang)));
    CHECK(sn[i] == static_cast<float>(std::sin(ang)));
    const double yang = 1000.0 * yarn.inv_freq[static_cast<size_t>(i)];
    CHECK(ycs[i] == static_cast<float>(std::cos(yang) * yarn.attention_factor));
    CHECK(ysn[i] == static_cast<float>(std::sin(yang) * yarn.attention_factor));
  }
}

namespace {

const std::string kModel = R"([model]
kind = "llama"
n_layer = 1
n_head = 2
n_embd = 32
vocab_size = 64
)";

Config with_scaling(const std::string& table) {
  return parse_config(kModel + "rope_scaling = " + table + "\n", "rope.toml", {});
}

std::string error_of(const std::string& table) {
  try {
    with_scaling(table);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("every rope scaling type reads from [model], and back from state.json and config.json",
          "[rope]") {
  const std::vector<std::pair<std::string, RopeScaling>> rows = {
      {"{ rope_type = \"linear\", factor = 4.0 }", {.kind = RopeScaling::Linear, .factor = 4.0}},
      {"{ rope_type = \"dynamic\", factor = 2, original_max_position_embeddings = \"4k\" }",
       {.kind = RopeScaling::Dynamic, .factor = 2.0, .original_context = 4096}},
      {"{ rope_type = \"yarn\", factor = 4.0, original_max_position_embeddings = 32768 }",
       {.kind = RopeScaling::Yarn, .factor = 4.0, .original_context = 32768}},
      {"{ type = \"yarn\", factor = 40.0, original_max_position_embeddings = 4096, beta_fast = "
       "16.0, beta_slow = 2.0, truncate = false, mscale = 1.0, mscale_all_dim = 0.5, "
       "attention_factor = 1.25 }",
       {.kind = RopeScaling::Yarn,
        .factor = 40.0,
        .original_context = 4096,
        .beta_fast = 16.0,
        .beta_slow = 2.0,
        .truncate = false,
        .attention_factor = 1.25,
        .mscale = 1.0,
        .mscale_all_dim = 0.5}},
      {"{ rope_type = \"llama3\", factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, "
       "original_max_position_embeddings = 8192 }",
       {.kind = RopeScaling::Llama3, .factor = 8.0, .original_context = 8192}},
      {"\"none\"", {}},
  };
  remat::test::TempDir tmp("rope-scaling");
  for (const auto& [table, want] : rows) {
    CAPTURE(table);
    const Config c = with_scaling(table);
    CHECK(c.model.rope_scaling == want);
    // state.json keeps the config as TOML.
    CHECK(parse_config(config_to_toml(c), "state.json", {}).model.rope_scaling == want);
    // An exported config.json reads back to the same scaling (and transformers reads it: the
    // rope-* goldens' folders are such files).
    std::ofstream(tmp.path / "config.json")
        << hf::config_json(c.model, 512, "float32", nullptr).dump(1);
    const hf::ModelKeys keys = hf::read_model_keys(tmp.str());
    CHECK(parse_config("[model]\n" + keys.toml, "config.json", {}).model.rope_scaling == want);
  }
}

TEST_CASE("config.json's max_position_embeddings is dynamic's length and yarn's fallback",
          "[rope]") {
  remat::test::TempDir tmp("rope-scaling-json");
  Config c = with_scaling("{ rope_type = \"linear\", factor = 2.0 }");
  nlohmann::ordered_json j = hf::config_json(c.model, 512, "float32", nullptr);
  auto read_back = [&] {
    std::ofstream(tmp.path / "config.json") << j.dump(1);
    return parse_config("[model]\n" + hf::read_model_keys(tmp.str()).toml, "config.json", {})
        .model.rope_scaling;
  };
  j["max_position_embeddings"] = 2048;
  // yarn without original_max_position_embeddings: max_position_embeddings (transformers 4.57).
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  CHECK(read_back().original_context == 2048);
  j["rope_scaling"]["original_max_position_embeddings"] = 1024;
  CHECK(read_back().original_context == 1024);
  // dynamic reads max_position_embeddings only, whatever rope_scaling says.
  j["rope_scaling"] = {
      {"rope_type", "dynamic"}, {"factor", 2.0}, {"original_max_position_embeddings", 1024}};
  CHECK(read_back().original_context == 2048);
  // Without max_position_embeddings: the class default, as transformers takes absent keys
  // (LlamaConfig's 2048; the export above is a LlamaForCausalLM).
  j.erase("max_position_embeddings");
  j["max_position_embeddings"] = nullptr;
  CHECK(read_back().original_context == 2048);
  j.erase("max_position_embeddings");
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  CHECK(read_back().original_context == 2048);
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  j["max_position_embeddings"] = 4096;
  CHECK(read_back().original_context == 4096);
  // and exports it as max_position_embeddings, where transformers looks.
  c = with_scaling(
      "{ rope_type = \"dynamic\", factor = 2.0, original_max_position_embeddings = 96 }");
  CHECK(hf::config_json(c.model, 512, "float32", nullptr)["max_position_embeddings"] == 96);
}

TEST_CASE("a rope scaling type or key that is not supported is one line naming it", "[rope]") {
  CHECK_THAT(error_of("{ rope_type = \"longrope\", factor = 4.0 }"),
             Contains("rope.toml") && Contains("model.rope_scaling.rope_type") &&
                 Contains("\"longrope\" is not supported") &&
                 Contains("use one of linear, dynamic, yarn, llama3"));
  CHECK_THAT(error_of("{ rope_type = \"yarn\", original_max_position_embeddings = 64 }"),
             Contains("rope_type \"yarn\" needs factor"));
  CHECK_THAT(error_of("{ rope_type = \"yarn\", factor = 4.0 }"),
             Contains("needs original_max_position_embeddings"));
  CHECK_THAT(error_of("{ rope_type = \"dynamic\", factor = 4.0, original_max_position_embeddings "
                      "= 64, beta_fast = 32.0 }"),
             Contains("model.rope_scaling.beta_fast") &&
                 Contains("does not apply to rope_type \"dynamic\"") &&
                 Contains("takes factor, original_max_position_embeddings"));
  CHECK_THAT(error_of("{ rope_type = \"yarn\", factor = 4.0, original_max_position_embeddings = "
                      "64, betafast = 32.0 }"),
             Contains("unknown key 'betafast'"));
  CHECK_THAT(error_of("{ rope_type = \"linear\", factor = 0.5 }"),
             Contains("model.rope_scaling.factor") && Contains("out of range (1 to 1e6)"));
  CHECK_THAT(error_of("{ rope_type = \"linear\", factor = 1e9 }"),
             Contains("1000000000 is out of range (1 to 1e6)"));
  CHECK_THAT(
      error_of("{ rope_type = \"yarn\", factor = 4.0, original_max_position_embeddings = 0 }"),
      Contains("expected a positive integer, got 0"));
  CHECK_THAT(error_of("{ rope_type = \"yarn\", factor = 4.0, original_max_position_embeddings = "
                      "64, beta_fast = 1.0, beta_slow = 2.0 }"),
             Contains("beta_fast = 1 must exceed beta_slow = 2"));
  CHECK_THAT(error_of("{ rope_type = \"yarn\", factor = 4.0, original_max_position_embeddings = "
                      "64.5 }"),
             Contains("expected a positive integer"));
  CHECK_THAT(error_of("{ factor = 4.0 }"), Contains("rope_scaling has no rope_type"));
  // Both spellings of the type, disagreeing: which one a reader takes is not for it to guess.
  CHECK_THAT(error_of("{ type = \"linear\", rope_type = \"yarn\", factor = 4.0 }"),
             Contains("[config] model.rope_scaling.") && Contains("rope_type \"yarn\"") &&
                 Contains(" type \"linear\"") && Contains("disagree. Fix: keep one of them"));
  // A factor is a number: "4k" is not 4096 (a length may still be written as a count).
  CHECK_THAT(error_of("{ rope_type = \"linear\", factor = \"4k\" }"),
             Contains("model.rope_scaling.factor"));
  CHECK(with_scaling("{ rope_type = \"yarn\", factor = 4.0, original_max_position_embeddings = "
                     "\"1k\" }")
            .model.rope_scaling.original_context == 1024);
}
