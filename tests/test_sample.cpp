// Generation: the KV-cached decoder reproduces the training forward position by position (the
// proof that its weight layout, RoPE and cache match the trained model), llm.c's tokenizer file
// and a Hugging Face tokenizer.json are read and validated, token bytes print as UTF-8, and
// (smoke) `sample` continues the string a tiny byte model learned and prints a token model's
// output through a tokenizer.json. (tests/prepare_data_check.py compares the decoding with the
// `tokenizers` package itself where it is installed.)
#include <fmt/format.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "data/bpe_tokenizer.h"
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

// A byte-level BPE tokenizer.json with `vocab` and `added` (JSON object bodies / array items).
// The characters are GPT-2's bytes_to_unicode: U+0120 'Ġ' is the byte 0x20, U+0124 'Ĥ' is 0x82,
// and the printable bytes ('â' 0xE2, 'Ã' 0xC3, '©' 0xA9, '¬' 0xAC) stand for themselves.
std::string bpe_json(const std::string& vocab, const std::string& added,
                     const std::string& decoder = R"({"type": "ByteLevel"})",
                     const std::string& model_type = "BPE") {
  return fmt::format(R"({{"version": "1.0", "added_tokens": [{}], "normalizer": null,
  "pre_tokenizer": {{"type": "ByteLevel", "add_prefix_space": false}}, "decoder": {},
  "model": {{"type": "{}", "vocab": {{{}}}, "merges": ["a b", "\u0120 t"]}}}})",
                     added, decoder, model_type, vocab);
}

const std::string kVocab =
    R"("a": 0, "b": 1, "\u0120the": 2, "\u00c3\u00a9": 3, "\u00e2\u0124": 4, "\u00ac": 5, )"
    R"("\u00e2": 6, "\u0120": 7)";
const std::string kAdded = R"({"id": 9, "content": "<|endoftext|>", "special": true},)"
                           R"({"id": 10, "content": "<|end of turn|>", "special": true})";

std::string bpe_error(const std::string& path) {
  try {
    BpeTokenizer tok(path);
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

TEST_CASE("a byte-level BPE tokenizer.json decodes ids to the bytes they stand for", "[sample]") {
  TempDir tmp("bpe");
  write_file(tmp / "tokenizer.json", bpe_json(kVocab, kAdded));
  BpeTokenizer tok(tmp / "tokenizer.json");
  CHECK(tok.vocab_size() == 11);  // one past the largest id; 8 is a gap
  CHECK(tok.decode(2) == " the");
  CHECK(tok.decode(3) == "\xc3\xa9");  // é
  CHECK(tok.decode(4) == "\xe2\x82");  // the first two bytes of €
  CHECK(tok.decode(5) == "\xac");
  CHECK(tok.decode(8).empty());
  CHECK(tok.decode(9) == "<|endoftext|>");     // every character in the table: itself
  CHECK(tok.decode(10) == "<|end of turn|>");  // a space is not: the string as it is
  CHECK(tok.eot_token() == 9);
  CHECK_THROWS_AS(tok.decode(11), DataError);
  CHECK_THROWS_AS(tok.decode(-1), DataError);
  CHECK(BpeTokenizer::looks_like_json(tmp / "tokenizer.json"));

  SECTION("tokenizer_config.json beside it names the end-of-text token, as a string or object") {
    write_file(tmp / "tokenizer_config.json", R"({"eos_token": "<|end of turn|>"})");
    CHECK(BpeTokenizer(tmp / "tokenizer.json").eot_token() == 10);
    write_file(tmp / "tokenizer_config.json",
               R"({"eos_token": {"content": "<|endoftext|>", "lstrip": false}})");
    CHECK(BpeTokenizer(tmp / "tokenizer.json").eot_token() == 9);
    write_file(tmp / "tokenizer_config.json", R"({"eos_token": "</s>"})");
    CHECK_THAT(bpe_error(tmp / "tokenizer.json"),
               Contains(tmp / "tokenizer_config.json") && Contains("\"</s>\" is not a token"));
  }
  SECTION("without one, no end-of-text token is -1") {
    write_file(tmp / "plain.json", bpe_json(kVocab, ""));
    CHECK(BpeTokenizer(tmp / "plain.json").eot_token() == -1);
  }
  SECTION("a token's bytes are joined with the next before they are read as UTF-8") {
    Utf8Stream out;
    std::string text = out.push(tok.decode(4));  // E2 82: valid so far, held back
    CHECK(text.empty());
    text += out.push(tok.decode(5));  // AC completes €
    text += out.push(tok.decode(2));
    CHECK(text + out.finish() == "\xe2\x82\xac the");
  }
}

TEST_CASE("bytes that are not UTF-8 print as U+FFFD, one per maximal invalid sequence",
          "[sample]") {
  auto lossy = [](const std::string& bytes) {
    Utf8Stream s;
    const std::string head = s.push(bytes);  // before finish(): operands of + have no order
    return head + s.finish();
  };
  const std::string r = "\xef\xbf\xbd";  // U+FFFD
  CHECK(lossy("abc \xc3\xa9") == "abc \xc3\xa9");
  CHECK(lossy("\xe2\x82"
              "A") == r + "A");                       // a cut-off character, then a new one
  CHECK(lossy("A\xf0\x9f\x98") == "A" + r);           // cut off by the end: one
  CHECK(lossy("\xc0\x80") == r + r);                  // overlong: no valid prefix at all
  CHECK(lossy("\xed\xa0\x80") == r + r + r);          // a surrogate
  CHECK(lossy("\x80\xbf\xff") == r + r + r);          // continuation bytes alone, and 0xFF
  CHECK(lossy("\xf4\x90\x80\x80") == r + r + r + r);  // past U+10FFFF
  CHECK(lossy("\xf0\x9f\x98\x80") == "\xf0\x9f\x98\x80");
  Utf8Stream split;  // one byte at a time: the same text
  std::string text;
  for (char c : std::string("x\xe2\x82\xac\xe2\x82y\xf0\x9f"))
    text += split.push(std::string(1, c));
  CHECK(text + split.finish() == "x\xe2\x82\xac" + r + "y" + r);
}

TEST_CASE("bad tokenizer.json files are DataErrors naming the file and the fix", "[sample]") {
  TempDir tmp("badbpe");
  const std::string f = tmp / "tokenizer.json";
  std::string msg;
  SECTION("missing") {
    msg = bpe_error(f);
    CHECK_THAT(msg, Contains("no such file"));
  }
  SECTION("not JSON") {
    write_file(f, "{\"model\": ");
    msg = bpe_error(f);
    CHECK_THAT(msg, Contains("not valid JSON"));
  }
  SECTION("not a BPE model") {
    write_file(f, bpe_json(kVocab, kAdded, R"({"type": "ByteLevel"})", "Unigram"));
    msg = bpe_error(f);
    CHECK_THAT(msg, Contains("model.type is \"Unigram\"") && Contains("drop --tokenizer"));
  }
  SECTION("not byte-level (SentencePiece-style Metaspace)") {
    write_file(f, bpe_json(kVocab, kAdded, R"({"type": "Metaspace", "replacement": "x"})"));
    msg = bpe_error(f);
    CHECK_THAT(msg, Contains("decoder is \"Metaspace\", not ByteLevel"));
  }
  SECTION("an id out of range") {
    write_file(f, bpe_json(R"("a": -1)", ""));
    msg = bpe_error(f);
    CHECK_THAT(msg, Contains("is -1, outside"));
  }
  SECTION("a field of the wrong type") {
    write_file(f, bpe_json(R"("a": "zero")", ""));
    msg = bpe_error(f);
    CHECK_THAT(msg, Contains("not an integer id"));
  }
  CHECK_THAT(msg, Contains("[tokenizer] " + f + ": ") && Contains("Fix:"));
  CHECK(msg.find('\n') == std::string::npos);
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

// A token model (synthetic copy data, vocabulary 16) sampled through a tokenizer.json: its ids
// print as the tokens' text, and a tokenizer that does not fit the model, or is no tokenizer.json,
// stops it with exit 2 and a line naming the file.
TEST_CASE("sample prints a token model's output through a tokenizer.json", "[sample][smoke]") {
  TempDir tmp("bpe-e2e");
  std::ofstream(tmp / "tiny.toml") << test::cpu_run_toml(
      "kind = \"gpt\"\nn_layer = 1\nn_head = 2\nn_embd = 16\nvocab_size = 16\nposition = \"rope\"",
      "seq_len = 16\nbatch_size = 2\nsteps = 2", "task = \"copy\"", tmp / "ckpt");
  REQUIRE(test::run_binary(fmt::format("train --config {} -q", tmp / "tiny.toml"), true).code == 0);
  // Every id of the model is a token: letters, " the", é and € in two pieces, and an end-of-text.
  write_file(tmp / "tokenizer.json",
             bpe_json(kVocab + R"(, "c": 11, "d": 12, "e": 13, "f": 14, "g": 15)", kAdded));
  const std::string sample =
      fmt::format("sample --checkpoint {} --tokens 12 --temperature 0 --tokenizer ", tmp / "ckpt");
  const auto ok =
      test::run_binary(sample + tmp / "tokenizer.json" + " --prompt \"2 3 4 5\"", false);
  INFO(ok.out);
  REQUIRE(ok.code == 0);
  CHECK(ok.out.starts_with(" the\xc3\xa9\xe2\x82\xac"));  // the prompt, as text

  write_file(tmp / "big.json", bpe_json(kVocab + R"(, "z": 16)", kAdded));
  auto r = test::run_binary(sample + tmp / "big.json" + " --prompt 2", true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains(tmp / "big.json") &&
                        Contains("17 tokens, more than the model's "
                                 "vocabulary of 16") &&
                        Contains("Fix:"));
  write_file(tmp / "broken.json", "[1, 2");
  r = test::run_binary(sample + tmp / "broken.json" + " --prompt 2", true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains(tmp / "broken.json") && Contains("not valid JSON"));
  r = test::run_binary(sample + tmp / "missing.json" + " --prompt 2", true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains(tmp / "missing.json") && Contains("no such file"));
  r = test::run_binary(sample + tmp / "tokenizer.json" + " --prompt \"the cat\"", true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("--encode"));
}
