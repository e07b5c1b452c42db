// Generation from Llama-family models: the KV-cached LlamaDecoder reproduces the training
// forward position by position for each option of the family (the proof that its weight layout,
// q/k norm, RoPE frequencies, grouped key/value cache and head match the trained model, which
// tests/test_reference.cpp holds to an independent reference), its errors name what is
// wrong, make_decoder picks it for kind = "llama", and (smoke) `sample` continues the string a
// tiny llama byte model memorized.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/core/error.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/remat/executor.h"
#include "layers/gpt_decoder.h"
#include "layers/llama_decoder.h"
#include "layers/models.h"
#include "temp_dir.h"
#include "tests/cli_util.h"
#include "tests/configs.h"
#include "tests/decoder_test_util.h"
#include "tests/test_util.h"

using namespace remat;
using Catch::Matchers::Contains;

namespace {

using test::TempDir;

// T = 37 is no multiple of the attention tiles, so the training kernel's partial tiles and the
// decoder's one-row attention are compared at every boundary position. rope_theta = 100 turns
// every frequency through a visible angle by t = 36.
const std::string kParity = "[model]\n" +
                            test::llama_model_table({.n_layer = 2,
                                                     .n_head = 4,
                                                     .n_embd = 32,
                                                     .d_ff = 56,
                                                     .vocab_size = 61,
                                                     .rope_theta = 100.0}) +
                            R"([train]
seq_len = 37
batch_size = 2
[device]
threads = 2
)";

// llama3 scaling with an original context (32) shorter than the tested positions (37) and edges
// (wavelengths 8 and 32) that put a frequency of the head in each band: with theta 100, HS = 8 has
// wavelengths 6.3 | 19.9 | 62.8, 199 and HS = 12 has 6.3 | 13.5, 29.2 | 62.8, 135, 292.
const std::string kLlama3 =
    "model.rope_scaling={rope_type=\"llama3\", factor=8.0, low_freq_factor=1.0, "
    "high_freq_factor=4.0, original_max_position_embeddings=32}";

// The decoder's per-position cross-entropies against the training forward's row losses: float
// rounding of two summation orders, measured <= 1.7e-7 relative (6e-7 absolute on losses ~5);
// 1e-5 leaves ~60x, while a decoder that skips RoPE on the keys is off by 0.1..0.2. The serial
// and the fully threaded decoder agree bit for bit.
void check_decoder_parity(const std::vector<std::string>& sets) {
  test::check_decoder_parity(parse_config(kParity, "llama-sample-parity", sets), 0.1, 77,
                             test::Tolerance{1e-5, 1e-6});
}

}  // namespace

TEST_CASE("llama decoder matches the training forward at every position", "[llama][sample]") {
  SECTION("plain: multi-head, tied head") {
    check_decoder_parity({});
  }
  SECTION("untied head, q/k/v biases, q/k norm, head_dim != n_embd / n_head") {
    check_decoder_parity({"model.tie_embeddings=false", "model.attention_bias=true",
                          "model.qk_norm=true", "model.head_dim=12"});
  }
  SECTION("grouped-query attention (4 query heads on 2) with llama3 scaling") {
    check_decoder_parity({"model.n_kv_head=2", kLlama3});
  }
  SECTION("multi-query attention, head_dim != n_embd / n_head, q/k norm, untied, biases") {
    check_decoder_parity({"model.n_kv_head=1", "model.head_dim=12", "model.qk_norm=true",
                          "model.tie_embeddings=false", "model.attention_bias=true", kLlama3});
  }
}

TEST_CASE("a llama prompt prefilled in blocks gives the bits of token-by-token decoding",
          "[llama][sample]") {
  test::check_prefill_blocks(parse_config(kParity, "llama-prefill",
                                          {"model.n_kv_head=2", "model.head_dim=12",
                                           "model.qk_norm=true", "model.attention_bias=true"}),
                             300);
}

TEST_CASE("llama decoder checks weight shapes, the vocabulary and its capacity",
          "[llama][sample]") {
  const Config cfg = parse_config(kParity, "llama-sample-errors",
                                  {"model.tie_embeddings=false", "model.qk_norm=true"});
  cpu::CpuBackend be(1ull << 30, test::kTestThreads);
  auto model = make_model(cfg, be);
  SECTION("a tensor of another shape is named") {
    test::check_decoder_refuses_short_tensor(cfg.model, *model, "blocks.1.attn.k_norm.weight");
  }
  SECTION("an untied head needs lm_head.weight") {
    const WeightSource inner = test::weights_of(*model);
    const WeightSource no_head = [&](const std::string& name, std::vector<int64_t>* shape) {
      if (name == "lm_head.weight") throw CheckpointError("no tensor " + name);
      return inner(name, shape);
    };
    CHECK_THROWS_AS(LlamaDecoder(cfg.model, no_head, 8), CheckpointError);
  }
  SECTION("positions past the cache, tokens outside the vocabulary") {
    LlamaDecoder dec(cfg.model, test::weights_of(*model), 3);
    CHECK(dec.capacity() == 3);
    CHECK(dec.vocab_size() == 61);
    for (int t = 0; t < 3; ++t) dec.forward(1);
    CHECK_THROWS_WITH(dec.forward(1), Contains("cache of 3 positions"));
    dec.reset();
    CHECK(dec.position() == 0);
    CHECK_THROWS_AS(dec.forward(61), DataError);
    CHECK(dec.forward(60).size() == 61);
  }
}

TEST_CASE("make_decoder picks the decoder of model.kind", "[llama][sample]") {
  cpu::CpuBackend be(1ull << 30, test::kTestThreads);
  const Config llama = parse_config(kParity, "llama");
  auto llama_model = make_model(llama, be);
  CHECK(dynamic_cast<LlamaDecoder*>(
      make_decoder(llama.model, test::weights_of(*llama_model), 4).get()));
  const Config gpt = parse_config(test::small_gpt_toml({}), "gpt");
  auto gpt_model = make_model(gpt, be);
  CHECK(dynamic_cast<GptDecoder*>(make_decoder(gpt.model, test::weights_of(*gpt_model), 4).get()));
  const Config mlp = parse_config(test::small_mlp_toml(2, 8, 2), "mlp");
  CHECK_THROWS_WITH(make_decoder(mlp.model, test::weights_of(*gpt_model), 4),
                    Contains("only gpt and llama"));
}

// The same end to end as tests/test_sample.cpp's, for a tiny llama byte model with every option of
// the family on.
TEST_CASE("sample continues the sentence a tiny llama byte model memorized",
          "[llama][sample][smoke]") {
  test::check_sample_continues_memorized_sentence(
      test::llama_model_table(test::every_llama_option(
          {.head_dim = 24, .n_embd = 64, .d_ff = 160, .vocab_size = 256, .llama3_context = 32})),
      "llama-e2e");
}
