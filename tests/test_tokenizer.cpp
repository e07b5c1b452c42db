// The tokenizer.json tokenizer (data/hf_tokenizer.h) against the `tokenizers` package: the ids,
// the decoded text and the streamed text of a multilingual corpus equal tests/golden/tokenizers/
// golden.json (scripts/tokenizer_golden.py: tokenizers 0.22) for four real tokenizer files (GPT-2,
// OLMo 2's cl100k with Llama 3's split regex, OLMo 1's GPT-NeoX with NFC, Phi-3's Llama 2
// vocabulary with byte fallback), the pipelines of other families on their vocabularies (Qwen2,
// SmolLM2, Falcon, Llama 2's template, Metaspace conversions) and tiny whole files; its parts
// (NFC/NFD, the regex translation, the split behaviors, UTF-8) on known cases; bad files and text
// refused with one line naming the file and the fix; and (smoke) `remat-train tokenize`.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "data/hf_tokenizer.h"
#include "data/regex.h"
#include "data/tokenizer_pipeline.h"
#include "data/unicode_text.h"
#include "engine/core/error.h"
#include "temp_dir.h"
#include "tests/cli_util.h"

using namespace remat;
using Catch::Matchers::Contains;
using nlohmann::json;

namespace {

using test::TempDir;

const std::string kGoldenDir = std::string(REMAT_SOURCE_DIR) + "/tests/golden/tokenizers";

const json& golden() {
  static const json g = [] {
    std::ifstream f(kGoldenDir + "/golden.json");
    REQUIRE(f);
    return json::parse(f);
  }();
  return g;
}

const json& variant(const std::string& name) {
  for (const json& v : golden()["variants"])
    if (v["name"] == name) return v;
  FAIL("no variant " << name << " in golden.json");
  throw std::logic_error("unreachable");
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// The variant's tokenizer.json, as the golden script builds it: the decompressed file (by the
// build, into REMAT_TOKENIZER_DIR) with the patch's top-level keys replaced, or the patch alone.
// `use` sees it; the file's parsed JSON is kept for the next variant of the same file (patched in
// place and restored: copying 100k-token vocabularies for each variant took a second).
template <class Use>
void with_variant_spec(const json& v, Use use) {
  static std::map<std::string, json> bases;
  if (v["file"].is_null()) {
    use(v["patch"]);
    return;
  }
  std::string name = v["file"].get<std::string>();
  name = name.substr(0, name.size() - 3);  // "gpt2.json.xz" -> "gpt2.json"
  if (!bases.count(name)) {
    std::ifstream f(std::string(REMAT_TOKENIZER_DIR) + "/" + name);
    REQUIRE(f);
    bases[name] = json::parse(f);
  }
  json& spec = bases[name];
  std::map<std::string, json> saved;
  for (const auto& [key, value] : v["patch"].items()) {
    saved[key] = spec.contains(key) ? spec[key] : json();
    spec[key] = value;
  }
  use(spec);
  for (auto& [key, value] : saved) spec[key] = std::move(value);
}

std::string variant_json(const json& v) {
  std::string text;
  with_variant_spec(v, [&](const json& spec) { text = spec.dump(); });
  return text;
}

// One tokenizer per variant for the whole run (built from the parsed file: reading 2-3 MB of JSON
// again for each of 18 variants would double the time these tests take).
HfTokenizer& tokenizer_for(const std::string& name) {
  static std::map<std::string, std::unique_ptr<HfTokenizer>> loaded;
  auto& slot = loaded[name];
  if (!slot)
    with_variant_spec(variant(name), [&](const json& spec) {
      slot = std::make_unique<HfTokenizer>(HfTokenizer::from_json(spec, name));
    });
  return *slot;
}

std::vector<int32_t> ids_of(const json& list) {
  return list.get<std::vector<int32_t>>();
}

std::vector<std::string> corpus() {
  return golden()["corpus"].get<std::vector<std::string>>();
}

// FNV-1a 64 over the ids as little-endian uint32, as the golden script hashes them.
std::string fnv1a(const std::vector<int32_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t id : ids)
    for (int k = 0; k < 4; ++k) {
      h ^= (static_cast<uint32_t>(id) >> (8 * k)) & 0xFF;
      h *= 0x100000001b3ull;
    }
  return fmt::format("{:016x}", h);
}

// The DataError message of loading `path`, or "" when it loads.
std::string load_error(const std::string& path) {
  try {
    HfTokenizer tok(path);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

std::string encode_error(HfTokenizer& tok, const std::string& text) {
  try {
    tok.encode(text);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

// A tiny BPE tokenizer.json with `extra` top-level keys replaced.
std::string tiny_json(const json& extra = json::object()) {
  json spec = {{"version", "1.0"},
               {"added_tokens", json::array()},
               {"normalizer", nullptr},
               {"pre_tokenizer", nullptr},
               {"post_processor", nullptr},
               {"decoder", nullptr},
               {"model",
                {{"type", "BPE"},
                 {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}},
                 {"merges", json::array({"a b"})}}}};
  for (const auto& [key, value] : extra.items()) spec[key] = value;
  return spec.dump();
}

}  // namespace

TEST_CASE("tokenizer ids equal the tokenizers package's on a multilingual corpus", "[tokenizer]") {
  const std::vector<std::string> texts = corpus();
  REQUIRE(texts.size() >= 20);
  size_t compared = 0;
  for (const json& v : golden()["variants"]) {
    const std::string name = v["name"];
    HfTokenizer& tok = tokenizer_for(name);
    REQUIRE(tok.can_encode());
    for (size_t i = 0; i < texts.size(); ++i) {
      INFO(name << ", corpus text " << i << ": " << texts[i]);
      CHECK(tok.encode(texts[i]) == ids_of(v["encode"][i]));
      const std::vector<int32_t> special = ids_of(v["encode_special"][i]);
      CHECK(tok.encode(texts[i], true) == special);
      CHECK(tok.decode(special) == v["decode"][i].get<std::string>());
      ++compared;
    }
  }
  // Four real files and every family's pipeline: the golden must not shrink unnoticed.
  CHECK(golden()["variants"].size() >= 18);
  CHECK(compared >= 18 * texts.size());
}

TEST_CASE("DecodeStream hands out tokenizers' DecodeStream chunks, id by id", "[tokenizer]") {
  const std::vector<std::string> texts = corpus();
  int streamed = 0;
  for (const json& v : golden()["variants"]) {
    if (!v.contains("stream")) continue;
    ++streamed;
    const HfTokenizer& tok = tokenizer_for(v["name"]);
    for (size_t i = 0; i < texts.size(); ++i) {
      INFO(v["name"].get<std::string>() << ", corpus text " << i << ": " << texts[i]);
      const std::vector<int32_t> ids = ids_of(v["encode"][i]);
      DecodeStream stream(tok);
      std::string all;
      for (size_t k = 0; k < ids.size(); ++k) {
        const json& want = v["stream"][i][k];
        const std::string got = stream.push(ids[k]);
        CHECK(got == (want.is_null() ? std::string() : want.get<std::string>()));
        all += got;
      }
      CHECK(all + stream.finish() == tok.decode(ids));
    }
  }
  CHECK(streamed >= 4);
}

TEST_CASE("delicate id sequences decode as tokenizers decodes them", "[tokenizer]") {
  for (const json& c : golden()["decode_cases"]) {
    const HfTokenizer& tok = tokenizer_for(c["variant"]);
    const std::vector<int32_t> ids = ids_of(c["ids"]);
    INFO(c["variant"].get<std::string>() << " " << c["ids"].dump());
    CHECK(tok.decode(ids) == c["text"].get<std::string>());
    DecodeStream stream(tok);  // streamed, the same text in the end
    std::string all;
    for (int32_t id : ids) all += stream.push(id);
    CHECK(all + stream.finish() == c["text"].get<std::string>());
  }
}

TEST_CASE("a 256 KiB text encodes to tokenizers' ids", "[tokenizer]") {
  // The golden script's text: the corpus joined by newlines, plus one, repeated past 256 KiB.
  std::string joined;
  for (const std::string& t : corpus()) joined += (joined.empty() ? "" : "\n") + t;
  std::string text;
  for (size_t k = 0; k < 256 * 1024 / joined.size() + 1; ++k) text += joined + "\n";
  int checked = 0;
  for (const json& v : golden()["variants"]) {
    if (!v.contains("big")) continue;
    ++checked;
    REQUIRE(text.size() == v["big"]["bytes"].get<size_t>());
    HfTokenizer& tok = tokenizer_for(v["name"]);
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = tok.encode(text);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    INFO(v["name"].get<std::string>() << ": " << ids.size() << " ids in " << ms << " ms");
    CHECK(ids.size() == v["big"]["count"].get<size_t>());
    CHECK(fnv1a(ids) == v["big"]["fnv1a"].get<std::string>());
  }
  CHECK(checked >= 3);
}

TEST_CASE("NFC and NFD compose and decompose as Unicode defines them", "[tokenizer]") {
  CHECK(unicode::nfc("e\u0301") == "\u00e9");
  CHECK(unicode::nfd("\u00e9") == "e\u0301");
  CHECK(unicode::nfc("\u212b") == "\u00c5");                // a singleton: the Angstrom sign
  CHECK(unicode::nfc("\u0958") == "\u0915\u093c");          // a composition exclusion
  CHECK(unicode::nfc("\u0344") == "\u0308\u0301");          // a non-starter decomposition
  CHECK(unicode::nfc("q\u0307\u0323") == "q\u0323\u0307");  // marks put in canonical order
  CHECK(unicode::nfc("A\u0328\u0301") == "\u0104\u0301");   // the ogonek joins, the acute cannot
  CHECK(unicode::nfc("\u1100\u1161\u11a8") == "\uac01");    // Hangul, by arithmetic
  CHECK(unicode::nfd("\uac01") == "\u1100\u1161\u11a8");
  CHECK(unicode::nfc("a\u0301\u0301") == "\u00e1\u0301");  // the second acute is blocked
  CHECK(unicode::nfc("plain ASCII") == "plain ASCII");
  CHECK(unicode::is_white_space(0x85));
  CHECK(unicode::is_white_space(0x3000));
  CHECK_FALSE(unicode::is_white_space(0x180E));  // no longer White_Space since Unicode 6.3
  CHECK_FALSE(unicode::is_white_space(0x200B));
}

TEST_CASE("UTF-8 is validated as Rust validates it", "[tokenizer]") {
  CHECK(unicode::find_invalid_utf8("abc \xc3\xa9 \xf0\x9f\x98\x80") == std::string::npos);
  CHECK(unicode::find_invalid_utf8("ab\xc3") == 2);              // cut off
  CHECK(unicode::find_invalid_utf8("a\xc0\x80") == 1);           // overlong
  CHECK(unicode::find_invalid_utf8("\xed\xa0\x80") == 0);        // a surrogate
  CHECK(unicode::find_invalid_utf8("xy\xf4\x90\x80\x80") == 2);  // past U+10FFFF
  CHECK(unicode::find_invalid_utf8("\x80") == 0);
}

TEST_CASE("bytes that are not UTF-8 read as U+FFFD, one per maximal invalid sequence",
          "[tokenizer]") {
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

TEST_CASE(
    "regexes read whitespace classes as White_Space and iterate empty matches as Oniguruma does",
    "[tokenizer]") {
  const std::string ws =
      R"(\t\n\x0B\f\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
  CHECK(oniguruma_to_pcre2(R"(\s+(?!\S)|[^\s\p{Sc}]+)") ==
        "[" + ws + "]+(?![^" + ws + "])|[^" + ws + R"(\p{Sc}]+)");
  // An escaped backslash is no \s; a ']' first in a class and a POSIX class do not end it.
  CHECK(oniguruma_to_pcre2(R"(\\s []\s] [^]\s] [[:alpha:]\s])") ==
        R"(\\s [])" + ws + "] [^]" + ws + "] [[:alpha:]" + ws + "]");
  CHECK(Regex(R"(\s)").search("\u0085"));
  CHECK_FALSE(Regex(R"(\s)").search("\u180e"));  // PCRE2's own \s matches it
  CHECK_FALSE(Regex(R"(\s)").search("\u200b"));
  std::vector<std::pair<size_t, size_t>> m;
  Regex("x*").find_all("axb", m);  // no empty match where the last match ended
  CHECK(m == std::vector<std::pair<size_t, size_t>>{{0, 0}, {1, 2}, {3, 3}});
  CHECK_THROWS_WITH(Regex("(a"), Contains("offset"));
  // Oniguruma's readings of what PCRE2 reads otherwise (tokenizers 0.22.2's matches): \w is
  // Alphabetic, marks, Nd and Pc; \h a hex digit; ^ and $ line anchors; option m a dotall.
  const auto matches = [](const std::string& pattern, std::string_view text) {
    std::vector<std::pair<size_t, size_t>> out;
    Regex(pattern).find_all(text, out);
    return out;
  };
  CHECK(matches(R"(\w)", "x \u2460 e\u0301 \u203f") ==
        std::vector<std::pair<size_t, size_t>>{{0, 1}, {6, 7}, {7, 9}, {10, 13}});
  CHECK(matches(R"(\h+)", "cafe 12 xyz") == std::vector<std::pair<size_t, size_t>>{{0, 4}, {5, 7}});
  CHECK(matches(R"(\w+$)", "ab cd\nef gh\n") ==
        std::vector<std::pair<size_t, size_t>>{{3, 5}, {9, 11}});
  CHECK(matches("(?m)a.+", "ab cd\nef") == std::vector<std::pair<size_t, size_t>>{{0, 8}});
  // What this build cannot translate is refused, never read another way.
  CHECK_THROWS_WITH(Regex("[a-z&&[^c]]"), Contains("class intersection"));
  CHECK_THROWS_WITH(Regex(R"([^\S\n])"), Contains(R"(\S inside a character class)"));
  CHECK_THROWS_WITH(Regex(R"(\bab)"), Contains("word boundary"));
}

TEST_CASE(
    "property escapes and the word and digit classes match what tokenizers' Oniguruma "
    "(Unicode 16) matches",
    "[tokenizer]") {
  using Spans = std::vector<std::pair<size_t, size_t>>;
  const auto matches = [](const std::string& pattern, std::string_view text) {
    Spans out;
    Regex(pattern).find_all(text, out);
    return out;
  };
  // Assigned after PCRE2 10.42's Unicode 14, each 4 bytes of UTF-8: U+11F04 KAWI LETTER A (15.0),
  // U+2EBF0 a CJK Extension I ideograph (15.1), U+10D4A GARAY CAPITAL LETTER A (16.0): letters;
  // U+1E4F0 NAG MUNDARI DIGIT ZERO (15.0): a decimal digit; U+11F00 KAWI SIGN CANDRABINDU: a mark.
  const std::string kawi = "\U00011F04", cjk_i = "\U0002EBF0", garay = "\U00010D4A",
                    digit = "\U0001E4F0", mark = "\U00011F00";
  // tokenizers 0.22.2 on the same patterns and texts (scripts/make_unicode_properties.py checks
  // its Unicode version; golden.json holds such a text for every variant).
  CHECK(matches(R"(\p{L}+)", "a" + kawi + cjk_i + garay + "b " + digit) == Spans{{0, 14}});
  CHECK(matches(R"(\p{N}{1,3})", digit + "1234") == Spans{{0, 6}, {6, 8}});  // Llama 3's digits
  CHECK(matches(R"(\d+)", "x" + digit + "7") == Spans{{1, 6}});
  CHECK(matches(R"(\w+)", "a" + mark + "b " + kawi) == Spans{{0, 6}, {7, 11}});
  CHECK(matches(R"(\P{L}+)", "a" + kawi + " 1") == Spans{{5, 7}});
  CHECK(matches(R"(\p{^L}+)", "a" + kawi + " 1") == Spans{{5, 7}});
  CHECK(matches(R"([^\s\p{L}\p{N}]+)", "x" + kawi + "!" + digit + "?") == Spans{{5, 6}, {10, 11}});
  // Names as Oniguruma reads them: long, any case, spaces, '_' and '-' ignored.
  CHECK(matches(R"(\p{Other_Letter}+)", "a" + kawi) == Spans{{1, 5}});
  CHECK(matches(R"(\p{ decimal-number }+)", digit) == Spans{{0, 4}});
  CHECK(matches(R"(\p{lo})", cjk_i) == Spans{{0, 4}});
  // Oniguruma reads \p without '{' as the letter p (PCRE2 would read \pL as \p{L}).
  CHECK(matches(R"(\pL+)", "xpLLy") == Spans{{1, 4}});
  // A property Unicode 16 adds nothing to is PCRE2's, by the short name PCRE2 knows; a script
  // (or any other property) as written.
  CHECK(oniguruma_to_pcre2(R"(\p{Zs}\p{Currency_Symbol}\P{ control }\p{Han})") ==
        R"(\p{Zs}\p{Sc}[^\p{Cc}]\p{Han})");
  // A negation is written as a class: PCRE2 10.42 makes \P{L}+\P{N} possessive and fails it.
  CHECK(matches(R"(\P{L}+\P{N})", "   ") == Spans{{0, 3}});
  // Oniguruma's {,n} is {0,n}; a comment's '[' starts no class.
  CHECK(matches(R"(x\p{L}{,3})", "xabcd") == Spans{{0, 4}});
  CHECK(matches(R"((?#[)\P{L})", "a1") == Spans{{1, 2}});
  // Past PCRE2's 64 KiB of compiled pattern with the additions: the Unicode 14 reading, not an
  // error (94 \w of hundreds of ranges each compiled before the additions).
  CHECK(matches(R"((?:\w\s){1,94})", "a b ") == Spans{{0, 4}});
  // Errors point into the pattern, not into its translation.
  CHECK_THROWS_WITH(Regex(R"(\p{L}\)"), Contains("at offset 6"));
  CHECK(matches(R"(\p{Currency_Symbol}+)", "a$\u20ac") == Spans{{1, 5}});
}

TEST_CASE("split behaviors cut a piece as tokenizers' SplitDelimiterBehavior does", "[tokenizer]") {
  using tokenizer::Behavior;
  auto cut = [](Behavior b, bool invert = false) {
    std::vector<tokenizer::Piece> out;
    tokenizer::split_piece({"the-final--countdown", true}, tokenizer::Pattern::literal("-"), b,
                           invert, out);
    std::vector<std::string> texts;
    for (const auto& p : out) {
      CHECK(p.at_start == (&p == &out.front() && p.text.starts_with("the")));
      texts.push_back(p.text);
    }
    return texts;
  };
  using V = std::vector<std::string>;
  // tokenizers' documentation of SplitDelimiterBehavior, on the same text.
  CHECK(cut(Behavior::Removed) == V{"the", "final", "countdown"});
  CHECK(cut(Behavior::Isolated) == V{"the", "-", "final", "-", "-", "countdown"});
  CHECK(cut(Behavior::MergedWithPrevious) == V{"the-", "final-", "-", "countdown"});
  CHECK(cut(Behavior::MergedWithNext) == V{"the", "-final", "-", "-countdown"});
  CHECK(cut(Behavior::Contiguous) == V{"the", "-", "final", "--", "countdown"});
  CHECK(cut(Behavior::Removed, true) == V{"-", "-", "-"});
}

TEST_CASE("a tokenizer reads the end-of-text token from tokenizer_config.json beside it",
          "[tokenizer]") {
  TempDir tmp("eot");
  const json added = json::array({{{"id", 3}, {"content", "<|endoftext|>"}, {"special", true}},
                                  {{"id", 4}, {"content", "</s>"}, {"special", true}}});
  write_file(tmp / "tokenizer.json", tiny_json({{"added_tokens", added}}));
  CHECK(HfTokenizer(tmp / "tokenizer.json").eot_token() == 3);  // <|endoftext|> by name
  write_file(tmp / "tokenizer_config.json", R"({"eos_token": {"content": "</s>"}})");
  CHECK(HfTokenizer(tmp / "tokenizer.json").eot_token() == 4);
  write_file(tmp / "tokenizer_config.json", R"({"eos_token": "<eos>"})");
  CHECK_THAT(load_error(tmp / "tokenizer.json"),
             Contains(tmp / "tokenizer_config.json") && Contains("\"<eos>\" is not a token"));
  std::filesystem::remove(tmp / "tokenizer_config.json");
  write_file(tmp / "plain.json", tiny_json());
  CHECK(HfTokenizer(tmp / "plain.json").eot_token() == -1);
  CHECK(HfTokenizer::looks_like_json(tmp / "plain.json"));
}

TEST_CASE("a byte-level token with a character outside the byte table decodes as its own UTF-8",
          "[tokenizer]") {
  TempDir tmp("bytelevel");
  const json added = json::array({{{"id", 3}, {"content", "<|end of turn|>"}, {"special", true}}});
  write_file(tmp / "t.json",
             tiny_json({{"added_tokens", added}, {"decoder", {{"type", "ByteLevel"}}}}));
  HfTokenizer tok(tmp / "t.json");
  CHECK(tok.vocab_size() == 4);  // the added token takes the id after model.vocab's three
  // ' ' is no byte-level character (0x20 is U+0120): the token is its own UTF-8, as tokenizers has
  // it.
  CHECK(tok.decode(std::vector<int32_t>{2, 3, 0}) == "ab<|end of turn|>a");
  CHECK(tok.encode("a<|end of turn|>b") == std::vector<int32_t>{0, 3, 1});
}

TEST_CASE("characters without a token are dropped and counted, as tokenizers drops them",
          "[tokenizer]") {
  TempDir tmp("drop");
  write_file(tmp / "t.json", tiny_json());
  HfTokenizer tok(tmp / "t.json");
  size_t dropped = 0;
  CHECK(tok.encode("abzb\u00e9", false, &dropped) == std::vector<int32_t>{2, 1});
  CHECK(dropped == 2);
  CHECK(tok.decode(std::vector<int32_t>{2, 1}) == "ab b");  // no decoder: joined by spaces
}

TEST_CASE("Metaspace's prepend_scheme first reads where the text began before normalizing",
          "[tokenizer]") {
  // tokenizers prepends the replacement only to a word whose first character maps to the input's
  // first (original offset 0): not after a Strip or an empty Replace removed the text's start.
  // Expected ids from tokenizers 0.22.2 on these files.
  TempDir tmp("metaspace-first");
  const json metaspace = {{"type", "Metaspace"},
                          {"replacement", "\u2581"},
                          {"prepend_scheme", "first"},
                          {"split", false}};
  const json vocab = {{"\u2581", 0}, {"h", 1}, {"i", 2}, {"#", 3}};
  auto file = [&](const char* name, const json& normalizer) {
    write_file(
        tmp / name,
        tiny_json({{"normalizer", normalizer},
                   {"pre_tokenizer", metaspace},
                   {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}}));
    return HfTokenizer(tmp / name);
  };
  HfTokenizer strip =
      file("strip.json", {{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}});
  CHECK(strip.encode(" hi", false) == std::vector<int32_t>{1, 2});
  CHECK(strip.encode("hi", false) == std::vector<int32_t>{0, 1, 2});
  HfTokenizer replace =
      file("replace.json", {{"type", "Replace"}, {"pattern", {{"String", "#"}}}, {"content", ""}});
  CHECK(replace.encode("#hi", false) == std::vector<int32_t>{1, 2});
  CHECK(replace.encode("h#i", false) == std::vector<int32_t>{0, 1, 2});
}

TEST_CASE("bad tokenizer.json files and text are DataErrors naming the file, the part and the fix",
          "[tokenizer]") {
  TempDir tmp("badtok");
  const std::string f = tmp / "tokenizer.json";
  std::string msg;
  SECTION("a model other than BPE") {
    for (const char* type : {"Unigram", "WordPiece", "WordLevel"}) {
      write_file(f, json({{"model", {{"type", type}, {"vocab", {{"a", 0}}}}}}).dump());
      msg = load_error(f);
      CHECK_THAT(msg, Contains(fmt::format("model.type is \"{}\"", type)) &&
                          Contains("only \"BPE\" is supported"));
    }
  }
  SECTION("a normalizer not supported: named when encoding, decoding still works") {
    write_file(
        f, tiny_json(
               {{"normalizer",
                 {{"type", "Sequence"},
                  {"normalizers", json::array({{{"type", "NFC"}}, {{"type", "Lowercase"}}})}}}}));
    HfTokenizer tok(f);
    CHECK_FALSE(tok.can_encode());
    CHECK(tok.decode(std::vector<int32_t>{2}) == "ab");
    msg = encode_error(tok, "ab");
    CHECK_THAT(msg, Contains("normalizer.normalizers[1]") &&
                        Contains("normalizer \"Lowercase\" is not supported"));
  }
  SECTION("a pre-tokenizer not supported") {
    write_file(f, tiny_json({{"pre_tokenizer",
                              {{"type", "Sequence"},
                               {"pretokenizers",
                                json::array({{{"type", "Digits"}}, {{"type", "Whitespace"}}})}}}}));
    HfTokenizer tok(f);
    msg = encode_error(tok, "ab");
    CHECK_THAT(msg, Contains("pre_tokenizer.pretokenizers[1]") &&
                        Contains("pre-tokenizer \"Whitespace\" is not supported"));
  }
  SECTION("a regex that does not compile") {
    write_file(f, tiny_json({{"pre_tokenizer",
                              {{"type", "Split"},
                               {"pattern", {{"Regex", "(a"}}},
                               {"behavior", "Isolated"},
                               {"invert", false}}}}));
    HfTokenizer tok(f);
    msg = encode_error(tok, "ab");
    CHECK_THAT(msg, Contains("pre_tokenizer.pattern.Regex") && Contains("does not compile"));
  }
  SECTION("a decoder not supported, refused when loading") {
    write_file(f, tiny_json({{"decoder", {{"type", "WordPiece"}, {"prefix", "##"}}}}));
    msg = load_error(f);
    CHECK_THAT(msg, Contains("decoder \"WordPiece\" is not supported"));
  }
  SECTION("a merge of tokens that are not in the vocabulary") {
    json spec = json::parse(tiny_json());
    spec["model"]["merges"] = json::array({"a c"});
    write_file(f, spec.dump());
    HfTokenizer tok(f);
    msg = encode_error(tok, "ab");
    CHECK_THAT(msg, Contains("merge 0 (\"a c\") names \"c\""));
  }
  SECTION("BPE dropout") {
    json spec = json::parse(tiny_json());
    spec["model"]["dropout"] = 0.1;
    write_file(f, spec.dump());
    HfTokenizer tok(f);
    msg = encode_error(tok, "ab");
    CHECK_THAT(msg, Contains("model.dropout is 0.1"));
  }
  SECTION("not JSON") {
    write_file(f, "{\"model\": ");
    msg = load_error(f);
    CHECK_THAT(msg, Contains("not valid JSON (byte"));
  }
  SECTION("an id out of range, and ids a field of the wrong type") {
    write_file(f, tiny_json({{"model", {{"type", "BPE"}, {"vocab", {{"a", -1}}}}}}));
    msg = load_error(f);
    CHECK_THAT(msg, Contains("is -1, outside"));
    write_file(f, tiny_json({{"model", {{"type", "BPE"}, {"vocab", {{"a", "zero"}}}}}}));
    msg = load_error(f);
    CHECK_THAT(msg, Contains("not an integer id"));
  }
  SECTION("missing") {
    msg = load_error(f);
    CHECK_THAT(msg, Contains("no such file"));
  }
  CHECK_THAT(msg, Contains("[tokenizer] " + f + ": ") && Contains("Fix:"));
  CHECK(msg.find('\n') == std::string::npos);
}

TEST_CASE("a file far larger than any tokenizer.json is refused before it is read", "[tokenizer]") {
  TempDir tmp("huge-tokenizer");
  const std::string path = tmp / "huge.json";
  { std::ofstream(path) << "{"; }
  std::filesystem::resize_file(path, (uint64_t{512} << 20) + 1);  // sparse: no disk used
  try {
    HfTokenizer tok(path);
    FAIL("accepted");
  } catch (const DataError& e) {
    CHECK_THAT(e.what(), Contains("more than any tokenizer file holds (512 MiB)"));
  }
}

TEST_CASE("tokenizer files that are not regular files are refused before they are opened",
          "[tokenizer]") {
  TempDir tmp("fifo");
  for (const std::string& path : {tmp.str(), tmp / "fifo.json"}) {
    if (path != tmp.str()) REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    const std::string msg = load_error(path);  // opening the FIFO would block here
    CHECK_THAT(msg, Contains("[tokenizer] " + path + ": not a regular file") && Contains("Fix:"));
  }
}

TEST_CASE("text that is not UTF-8 and ids outside the vocabulary are DataErrors", "[tokenizer]") {
  TempDir tmp("badtext");
  write_file(tmp / "t.json", tiny_json());
  HfTokenizer tok(tmp / "t.json");
  try {
    tok.encode("ab\xff", false, nullptr, "stdin");
    FAIL("encoded bytes that are not UTF-8");
  } catch (const DataError& e) {
    CHECK_THAT(e.what(), Contains("stdin is not UTF-8 (byte 2)") && Contains("Fix:"));
  }
  CHECK_THROWS_WITH(tok.decode(std::vector<int32_t>{3}),
                    Contains("token 3 is outside its vocabulary of 3"));
  CHECK_THROWS_AS(tok.decode(std::vector<int32_t>{-1}), DataError);
}

// ---- the command line ----

TEST_CASE("tokenize prints tokenizers' ids and --decode gives the text back",
          "[tokenizer][smoke]") {
  TempDir tmp("tokcli");
  const std::string gpt2 = std::string(REMAT_TOKENIZER_DIR) + "/gpt2.json";
  const json& v = variant("gpt2");
  const size_t i = 1;  // emoji: characters split across tokens
  write_file(tmp / "text.txt", corpus()[i]);
  const auto enc = test::run_binary(
      fmt::format("tokenize --tokenizer {} < {} > {}", gpt2, tmp / "text.txt", tmp / "ids.json"),
      true);
  INFO(enc.out);
  REQUIRE(enc.code == 0);
  std::ifstream ids_file(tmp / "ids.json");
  const std::string printed((std::istreambuf_iterator<char>(ids_file)), {});
  CHECK(printed == fmt::format("[{}]\n", fmt::join(ids_of(v["encode"][i]), ", ")));
  // Back, from the JSON list and from ids separated by whitespace: the text byte for byte.
  auto dec = test::run_binary(
      fmt::format("tokenize --tokenizer {} --decode < {}", gpt2, tmp / "ids.json"), false);
  CHECK(dec.code == 0);
  CHECK(dec.out == corpus()[i]);
  dec = test::run_in_source(
      fmt::format("printf '15496\\n 995 ' | {} tokenize --tokenizer {} --decode", REMAT_BINARY,
                  gpt2),
      false);
  CHECK(dec.code == 0);
  CHECK(dec.out == "Hello world");
  // --add-special-tokens: Llama 2's template on Phi-3's vocabulary puts <s> (1) first.
  write_file(tmp / "llama2.json", variant_json(variant("phi3-llama2")));
  write_file(tmp / "text0.txt", corpus()[0]);
  const auto special =
      test::run_binary(fmt::format("tokenize --tokenizer {} --add-special-tokens < {}",
                                   tmp / "llama2.json", tmp / "text0.txt"),
                       false);
  const std::vector<int32_t> want = ids_of(variant("phi3-llama2")["encode_special"][0]);
  REQUIRE(want.front() == 1);
  CHECK(special.code == 0);
  CHECK(special.out == fmt::format("[{}]\n", fmt::join(want, ", ")));
}

TEST_CASE("tokenize refuses bad tokenizers and input with one line and exit 2",
          "[tokenizer][smoke]") {
  TempDir tmp("tokbad");
  const std::string gpt2 = std::string(REMAT_TOKENIZER_DIR) + "/gpt2.json";
  write_file(tmp / "unigram.json",
             json({{"model", {{"type", "Unigram"}, {"vocab", json::array()}}}}).dump());
  write_file(tmp / "broken.json", "{\"model\": [1, 2");
  write_file(tmp / "latin1.txt", "caf\xe9");
  write_file(tmp / "x.json", "[15496, \"x\"]");
  write_file(tmp / "world.txt", "15496 world\n");
  write_file(tmp / "big.json", "[50257]");
  REQUIRE(::mkfifo((tmp / "fifo.json").c_str(), 0600) == 0);
  struct Case {
    std::string args, expect;
  };
  const std::vector<Case> cases = {
      {fmt::format("tokenize --tokenizer {} < /dev/null", tmp / "unigram.json"),
       "model.type is \"Unigram\""},
      {fmt::format("tokenize --tokenizer {} < /dev/null", tmp / "broken.json"), "not valid JSON"},
      // A FIFO nobody writes to: opening it would block; `timeout` turns a hang into a failure.
      {fmt::format("tokenize --tokenizer {} < /dev/null", tmp / "fifo.json"), "not a regular file"},
      {fmt::format("tokenize --tokenizer {} < {}", gpt2, tmp / "latin1.txt"),
       "stdin is not UTF-8 (byte 3)"},
      {fmt::format("tokenize --tokenizer {} --decode < {}", gpt2, tmp / "x.json"),
       "\"x\" is not a token id"},
      {fmt::format("tokenize --tokenizer {} --decode < {}", gpt2, tmp / "world.txt"),
       "\"world\" is not a token id"},
      {fmt::format("tokenize --tokenizer {} --decode < {}", gpt2, tmp / "big.json"),
       "token id 50257 is outside the vocabulary of 50257"},
  };
  for (const Case& c : cases) {
    // `timeout`: a hang (opening the FIFO) fails the test instead of stopping the suite.
    const auto r = test::run_in_source(fmt::format("timeout 60 {} {}", REMAT_BINARY, c.args));
    INFO(c.args << "\n" << r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains(c.expect) && Contains("Fix:"));
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  }
}
