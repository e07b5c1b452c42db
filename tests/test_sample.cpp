// Generation: the KV-cached decoder reproduces the training forward position by position (the
// proof that its weight layout, RoPE and cache match the trained model), llm.c's tokenizer file
// is read and validated, and (smoke) `sample` continues the string a tiny byte model learned, and
// takes a token model's prompt as text or ids and prints its output through a tokenizer.json.
// (tests/test_tokenizer.cpp tests the tokenizer.json tokenizer itself against the `tokenizers`
// package; tests/prepare_data_check.py compares `sample`'s text with it where it is installed.)
#include <fmt/format.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "data/gpt2_tokenizer.h"
#include "engine/config/config.h"
#include "engine/core/error.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/remat/executor.h"
#include "layers/gpt_decoder.h"
#include "layers/models.h"
#include "temp_dir.h"
#include "tests/cli_util.h"
#include "tests/decoder_test_util.h"
#include "tests/test_util.h"

using namespace remat;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

using test::TempDir;

// T = 37 is no multiple of the attention tiles, so the training kernel's partial tiles and the
// decoder's one-row attention are compared at every boundary position.
Config parity_config(const std::string& position) {
  return parse_config(fmt::format(R"(
[model]
kind = "gpt"
n_layer = 2
n_head = 4
n_embd = 32
vocab_size = 61
n_ctx = 40
position = "{}"
[train]
seq_len = 37
batch_size = 2
[device]
threads = 2
)",
                                  position),
                      "sample-parity");
}

// A tokenizer file as llm.c writes it: 256 little-endian uint32 of header, then length-prefixed
// tokens. (The test machine is little-endian, like every platform this builds for.)
std::string tokenizer_bytes(uint32_t version, const std::vector<std::string>& tokens,
                            uint32_t eot) {
  std::vector<uint32_t> header(256, 0);
  header[0] = 20240328;
  header[1] = version;
  header[2] = static_cast<uint32_t>(tokens.size());
  if (version == 2) header[3] = eot;
  std::string out(reinterpret_cast<const char*>(header.data()), header.size() * sizeof(uint32_t));
  for (const std::string& t : tokens) {
    out.push_back(static_cast<char>(t.size()));
    out += t;
  }
  return out;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// The DataError message of opening `path`, or "" when it opened.
std::string tokenizer_error(const std::string& path) {
  try {
    Gpt2Tokenizer tok(path);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// Float rounding of two summation orders, within 1e-4 relative (1e-6 absolute).
TEST_CASE("decoder logits match the training forward at every position (learned positions)",
          "[sample]") {
  test::check_decoder_parity(parity_config("learned"), 0.05, 99, test::Tolerance{1e-4, 1e-6});
}

TEST_CASE("decoder logits match the training forward at every position (rope)", "[sample]") {
  test::check_decoder_parity(parity_config("rope"), 0.05, 99, test::Tolerance{1e-4, 1e-6});
}

TEST_CASE("a prompt prefilled in blocks gives the bits of token-by-token decoding", "[sample]") {
  test::check_prefill_blocks(parity_config("rope"), 300);
}

TEST_CASE("decoder checks weight shapes and the learned-position limit", "[sample]") {
  const Config cfg = parity_config("learned");
  cpu::CpuBackend be(1ull << 30, test::kTestThreads);
  auto model = make_model(cfg, be);
  SECTION("a tensor of another shape is named") {
    test::check_decoder_refuses_short_tensor(cfg.model, *model, "blocks.1.mlp.fc.bias");
  }
  SECTION("positions past n_ctx tell the user to lower --tokens") {
    GptDecoder dec(cfg.model, test::weights_of(*model), 1000);
    CHECK(dec.capacity() == cfg.model.n_ctx);
    for (int64_t t = 0; t < cfg.model.n_ctx; ++t) dec.forward(1);
    CHECK_THROWS_WITH(dec.forward(1), Contains("--tokens"));
    dec.reset();
    CHECK(dec.forward(1).size() == 61);
  }
  SECTION("a token outside the vocabulary") {
    GptDecoder dec(cfg.model, test::weights_of(*model), 4);
    CHECK_THROWS_AS(dec.forward(61), DataError);
  }
}

TEST_CASE("gpt2 tokenizer files (v1, v2) decode, and bad ones are DataErrors naming the file",
          "[sample]") {
  TempDir tmp("tok");
  const std::vector<std::string> tokens = {
      "a", "b", " the", "\xe2\x80", std::string(255, 'x'), "<|endoftext|>"};
  SECTION("version 2 with its end-of-text id") {
    write_file(tmp / "v2.bin", tokenizer_bytes(2, tokens, 5));
    Gpt2Tokenizer tok(tmp / "v2.bin");
    CHECK(tok.version() == 2);
    CHECK(tok.vocab_size() == 6);
    CHECK(tok.eot_token() == 5);
    CHECK(tok.decode(2) == " the");
    CHECK(tok.decode(3) == "\xe2\x80");
    CHECK(tok.decode(4).size() == 255);
    CHECK_THROWS_AS(tok.decode(6), DataError);
    CHECK_THROWS_AS(tok.decode(-1), DataError);
  }
  SECTION("version 1 implies GPT-2's end-of-text id") {
    write_file(tmp / "v1.bin", tokenizer_bytes(1, tokens, 0));
    Gpt2Tokenizer tok(tmp / "v1.bin");
    CHECK(tok.eot_token() == 50256);
    CHECK(tok.decode(0) == "a");
  }
  SECTION("bad magic, bad version, truncation, leftovers, empty tokens") {
    std::string bad_magic = tokenizer_bytes(2, tokens, 5);
    bad_magic[0] ^= 1;
    write_file(tmp / "magic.bin", bad_magic);
    CHECK_THAT(tokenizer_error(tmp / "magic.bin"),
               Contains(tmp / "magic.bin") && Contains("magic"));

    write_file(tmp / "version.bin", tokenizer_bytes(3, tokens, 5));
    CHECK_THAT(tokenizer_error(tmp / "version.bin"), Contains("version 3"));

    const std::string full = tokenizer_bytes(2, tokens, 5);
    write_file(tmp / "cut.bin", full.substr(0, full.size() - 4));
    CHECK_THAT(tokenizer_error(tmp / "cut.bin"),
               Contains(tmp / "cut.bin") && Contains("truncated"));
    write_file(tmp / "header.bin", full.substr(0, 100));
    CHECK_THAT(tokenizer_error(tmp / "header.bin"), Contains("header"));

    write_file(tmp / "extra.bin", full + "zz");
    CHECK_THAT(tokenizer_error(tmp / "extra.bin"), Contains("left"));

    write_file(tmp / "empty.bin", tokenizer_bytes(2, {"a", ""}, 0));
    CHECK_THAT(tokenizer_error(tmp / "empty.bin"), Contains("length 0"));

    write_file(tmp / "eot.bin", tokenizer_bytes(2, tokens, 6));
    CHECK_THAT(tokenizer_error(tmp / "eot.bin"), Contains("end-of-text"));
  }
  SECTION("a missing file is an IoError") {
    CHECK_THROWS_AS(Gpt2Tokenizer(tmp / "none.bin"), IoError);
  }
}

// Needs `train` to read text data and write checkpoints: a tiny GPT byte model memorizes one
// sentence, then greedy sampling continues it (100 steps suffice; the helper's 150 leave a margin).
TEST_CASE("sample continues the sentence a tiny byte model memorized", "[sample][smoke]") {
  test::check_sample_continues_memorized_sentence(R"(kind = "gpt"
n_layer = 2
n_head = 4
n_embd = 64
vocab_size = 256
position = "rope")",
                                                  "e2e");
}

// Sampling errors exit 2 with a fix; this needs only a checkpoint folder that is not there.
TEST_CASE("sample without a checkpoint exits 2 with a fix", "[sample][smoke]") {
  TempDir tmp("none");
  const auto r =
      test::run_binary(fmt::format("sample --checkpoint {} --prompt x", tmp / "ckpt"), true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("--checkpoint") && Contains("Fix"));
}

namespace {

// A byte-level BPE tokenizer.json whose 16 ids fit the test model below. The characters are
// GPT-2's bytes_to_unicode: U+0120 'Ġ' is the byte 0x20, U+0124 'Ĥ' is 0x82, and the printable
// bytes ('â' 0xE2, 'Ã' 0xC3, '¬' 0xAC) stand for themselves. " the" encodes to 2 through the
// merges; 4 and 5 are € in two pieces; 'z' has no token.
std::string tiny_bpe_json(const std::string& more_vocab = "") {
  return fmt::format(R"({{"version": "1.0",
  "added_tokens": [{{"id": 9, "content": "<|endoftext|>", "normalized": false, "special": true}},
                   {{"id": 10, "content": "<|end of turn|>", "normalized": false, "special": true}}],
  "normalizer": null, "pre_tokenizer": {{"type": "ByteLevel", "add_prefix_space": false}},
  "decoder": {{"type": "ByteLevel"}},
  "model": {{"type": "BPE", "merges": ["\u0120 t", "\u0120t h", "\u0120th e"], "vocab": {{
    "a": 0, "b": 1, "\u0120the": 2, "\u00c3\u00a9": 3, "\u00e2\u0124": 4, "\u00ac": 5,
    "\u00e2": 6, "\u0120": 7, "t": 8, "<|endoftext|>": 9, "<|end of turn|>": 10, "h": 11,
    "e": 12, "\u0120t": 13, "\u0120th": 14, "c": 15{}}}}}}})",
                     more_vocab);
}

}  // namespace

// A token model (synthetic copy data, vocabulary 16) sampled through a tokenizer.json: a --prompt
// is text, encoded (and printed back as text), --prompt-ids are ids, and a tokenizer that does not
// fit the model, or is no tokenizer.json, stops it with exit 2 and a line naming the file; without
// a tokenizer.json --prompt takes ids, and text there says how to give text.
TEST_CASE(
    "sample takes a token model's prompt as text or ids and prints its output through a "
    "tokenizer.json",
    "[sample][smoke]") {
  TempDir tmp("bpe-e2e");
  std::ofstream(tmp / "tiny.toml") << test::cpu_run_toml(
      "kind = \"gpt\"\nn_layer = 1\nn_head = 2\nn_embd = 16\nvocab_size = 16\nposition = \"rope\"",
      "seq_len = 16\nbatch_size = 2\nsteps = 2", "task = \"copy\"", tmp / "ckpt");
  REQUIRE(test::run_binary(fmt::format("train --config {} -q", tmp / "tiny.toml"), true).code == 0);
  write_file(tmp / "tokenizer.json", tiny_bpe_json());
  const std::string sample =
      fmt::format("sample --checkpoint {} --tokens 12 --temperature 0 --tokenizer ", tmp / "ckpt");
  auto ok = test::run_binary(sample + tmp / "tokenizer.json" + " --prompt-ids \"2 3 4 5\"", false);
  INFO(ok.out);
  REQUIRE(ok.code == 0);
  CHECK(ok.out.starts_with(" the\xc3\xa9\xe2\x82\xac"));  // the prompt's ids, as text
  // Text, with an added token in it, encoded to 2 9 0: printed back, then the continuation.
  ok =
      test::run_binary(sample + tmp / "tokenizer.json" + " --prompt \" the<|endoftext|>a\"", false);
  CHECK(ok.code == 0);
  CHECK(ok.out.starts_with(" the<|endoftext|>a"));
  const std::string continuation = ok.out.substr(std::string(" the<|endoftext|>a").size());
  // The same ids given as ids: the same output, generated tokens and all.
  ok = test::run_binary(sample + tmp / "tokenizer.json" + " --prompt-ids 2,9,0", false);
  CHECK(ok.code == 0);
  CHECK(ok.out == " the<|endoftext|>a" + continuation);
  // Past the length the run trained at (16) RoPE goes on, with a warning; a length whose key/value
  // cache cannot fit this machine's memory stops before anything is allocated.
  const std::string longer =
      fmt::format("sample --checkpoint {} --prompt-ids 2 --tokens ", tmp / "ckpt");
  auto past = test::run_binary(longer + "40", true);
  CHECK(past.code == 0);
  CHECK_THAT(past.out, Contains("warning: [sample] prompt + --tokens reach position 40, past the "
                                "16 the model trained at"));
  past =
      test::run_binary(fmt::format("sample --checkpoint {} --prompt-ids 99", tmp / "ckpt"), true);
  CHECK(past.code == 2);
  CHECK_THAT(past.out, Contains("token id 99 is outside the vocabulary of 16. Fix: give ids from 0 "
                                "to 15"));
  past = test::run_binary(longer + "4000000000000", true);
  CHECK(past.code == 3);
  CHECK_THAT(past.out, Contains("key/value cache") && Contains("Fix: lower --tokens to at most"));
  // A character without a token is left out, with a warning.
  auto r = test::run_binary(sample + tmp / "tokenizer.json" + " --prompt \" thez\"", true);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("warning: [sample] 1 character(s) of the prompt have no token"));

  write_file(tmp / "big.json", tiny_bpe_json(R"(, "z": 16)"));
  r = test::run_binary(sample + tmp / "big.json" + " --prompt-ids 2", true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains(tmp / "big.json") &&
                        Contains("17 tokens, more than the model's "
                                 "vocabulary of 16") &&
                        Contains("Fix:"));
  // A folder holding tokenizer.json (the model's folder) is named, with the file it holds.
  r = test::run_binary(sample + tmp.str() + " --prompt-ids 2", true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains(": a folder. Fix: pass the tokenizer file, " +
                             (tmp / "tokenizer.json") + " here"));
  write_file(tmp / "broken.json", "[1, 2");
  r = test::run_binary(sample + tmp / "broken.json" + " --prompt-ids 2", true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains(tmp / "broken.json") && Contains("not valid JSON"));
  r = test::run_binary(sample + tmp / "missing.json" + " --prompt 2", true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains(tmp / "missing.json") && Contains("no such file"));
  // llm.c's table only decodes: its --prompt is ids, and text says to give ids or a tokenizer.json.
  std::vector<std::string> table;
  for (int i = 0; i < 16; ++i) table.push_back(std::string(1, static_cast<char>('a' + i)));
  write_file(tmp / "gpt2.bin", tokenizer_bytes(2, table, 15));
  ok = test::run_binary(sample + tmp / "gpt2.bin" + " --prompt \"0 1 2\"", false);
  CHECK(ok.code == 0);
  CHECK(ok.out.starts_with("abc"));
  r = test::run_binary(sample + tmp / "gpt2.bin" + " --prompt \"the cat\"", true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("only decodes") && Contains("--prompt-ids"));
  r = test::run_binary(
      fmt::format("sample --checkpoint {} --tokens 2 --prompt \"the cat\"", tmp / "ckpt"), true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out,
             Contains("\"the\" is not a token id") && Contains("--tokenizer tokenizer.json"));
}
