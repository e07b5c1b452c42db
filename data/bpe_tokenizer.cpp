// BpeTokenizer and Utf8Stream (see data/bpe_tokenizer.h).
#include "data/bpe_tokenizer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/core/regular_file.h"

namespace remat {
namespace {

using nlohmann::json;

constexpr const char* kFix =
    "pass the model's Hugging Face tokenizer.json (a byte-level BPE: GPT-2, Llama 3, Qwen) to "
    "--tokenizer";
constexpr const char* kOtherModelFix =
    "this decodes byte-level BPE tokenizers (GPT-2, Llama 3, Qwen); for another model, drop "
    "--tokenizer and read the ids";
// model.vocab_size's own bound (engine/config/config.cpp): a larger id belongs to no model of this
// tool.
constexpr int64_t kMaxId = int64_t{1} << 24;
constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

[[noreturn]] void fail(const std::string& path, const std::string& problem,
                       const std::string& fix = kFix) {
  throw DataError(fmt::format("[tokenizer] {}: {}. Fix: {}", path, problem, fix));
}

// GPT-2's bytes_to_unicode, inverted: the printable bytes stand for themselves (U+0021..U+007E,
// U+00A1..U+00AC, U+00AE..U+00FF) and the other 68, in byte order, for U+0100..U+0143.
// Index: a code point; value: its byte, or -1.
using InverseTable = std::array<int16_t, 256 + 68>;
InverseTable unicode_to_byte() {
  InverseTable table;
  table.fill(-1);
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    table[static_cast<size_t>(printable ? b : 256 + n++)] = static_cast<int16_t>(b);
  }
  return table;
}

// The bytes a token string stands for; a string with a character outside the table is its own
// UTF-8, as `tokenizers`' ByteLevel decoder keeps it. The table's code points need at most two
// UTF-8 bytes, so a longer character is outside it.
std::string token_bytes(const std::string& s, const InverseTable& table) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    uint32_t cp = c;
    size_t len = 1;
    if (c >= 0x80) {
      if ((c & 0xE0) != 0xC0 || i + 1 >= s.size()) return s;
      cp = (static_cast<uint32_t>(c & 0x1F) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3F);
      len = 2;
    }
    if (cp >= table.size() || table[cp] < 0) return s;
    out.push_back(static_cast<char>(table[cp]));
    i += len;
  }
  return out;
}

json read_json(const std::string& path, const std::string& fix, bool drop_merges) {
  // A device or pipe (/dev/zero) would be read forever: refused before a byte is read.
  RegularFile file = RegularFile::open_read(path);
  if (!file.ok())
    fail(path, file.problem_text(),
         file.problem() == RegularFile::Problem::Error ? "check its permissions" : fix);
  std::string text;
  if (const int err = file.read_all(text))
    fail(path, fmt::format("cannot read ({})", std::strerror(err)), "check the file");
  try {
    // "merges" (280k pairs in Llama 3's) serves encoding only: dropped as it is read.
    return json::parse(text, [drop_merges](int, json::parse_event_t event, json& parsed) {
      return !(drop_merges && event == json::parse_event_t::key && parsed == "merges");
    });
  } catch (const json::parse_error& e) {
    fail(path, fmt::format("not valid JSON (byte {})", e.byte), fix);
  }
}

bool is_byte_level(const json& d) {
  return d.is_object() && d.contains("type") && d["type"] == "ByteLevel";
}

int64_t checked_id(const std::string& path, const json& id, const std::string& where) {
  if (!id.is_number_integer())
    fail(path, fmt::format("{} is {}, not an integer id", where, id.type_name()));
  const auto v = id.get<int64_t>();
  if (v < 0 || v >= kMaxId) fail(path, fmt::format("{} is {}, outside [0, {})", where, v, kMaxId));
  return v;
}

}  // namespace

BpeTokenizer::BpeTokenizer(const std::string& path) : path_(path) {
  const json spec = read_json(path, kFix, true);
  try {
    if (!spec.is_object() || !spec.contains("model") || !spec["model"].is_object())
      fail(path, "no \"model\" object, so not a tokenizer.json");
    const json& model = spec["model"];
    const std::string type = model.value("type", std::string("BPE"));
    if (type != "BPE")
      fail(path, fmt::format("model.type is \"{}\", not \"BPE\"", type), kOtherModelFix);
    const json decoder = spec.value("decoder", json());
    const bool byte_level =
        is_byte_level(decoder) ||
        (decoder.is_object() && decoder.value("type", std::string()) == "Sequence" &&
         decoder.contains("decoders") && decoder["decoders"].is_array() &&
         !decoder["decoders"].empty() &&
         std::all_of(decoder["decoders"].begin(), decoder["decoders"].end(), is_byte_level));
    if (!byte_level)
      fail(path,
           fmt::format("the decoder is {}, not ByteLevel, so the vocabulary is not byte-level BPE",
                       decoder.is_object() ? "\"" + decoder.value("type", std::string("?")) + "\""
                                           : std::string("missing")),
           kOtherModelFix);
    if (!model.contains("vocab") || !model["vocab"].is_object() || model["vocab"].empty())
      fail(path, "model.vocab is missing or empty");

    std::vector<std::pair<int64_t, const std::string*>> tokens;
    for (const auto& [text, id] : model["vocab"].items())
      tokens.emplace_back(checked_id(path, id, "an id of model.vocab"), &text);
    // Added tokens come last: where one shares an id with model.vocab, it is what decode shows.
    const json added = spec.value("added_tokens", json::array());
    if (!added.is_array()) fail(path, "added_tokens is not an array");
    for (const json& t : added) {
      if (!t.is_object() || !t.contains("id") || !t.contains("content") ||
          !t["content"].is_string())
        fail(path, "an entry of added_tokens lacks its id or content");
      tokens.emplace_back(checked_id(path, t["id"], "an id of added_tokens"),
                          t["content"].get_ptr<const std::string*>());
    }
    const InverseTable table = unicode_to_byte();
    bytes_.reserve(tokens.size());
    for (const auto& [id, text] : tokens) {
      bytes_[id] = token_bytes(*text, table);
      vocab_size_ = std::max(vocab_size_, id + 1);
    }

    auto id_of = [&](const std::string& text) -> int64_t {
      int64_t found = -1;
      for (const auto& t : tokens)
        if (*t.second == text) found = t.first;  // the last: an added token over the vocab's
      return found;
    };
    const std::string config =
        (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
    std::error_code ec;
    if (std::filesystem::exists(config, ec)) {
      const std::string config_fix = "repair it, or remove it (it names the end-of-text token)";
      const json cfg = read_json(config, config_fix, false);
      json eos = cfg.is_object() ? cfg.value("eos_token", json()) : json();
      if (eos.is_object()) eos = eos.value("content", json());
      if (eos.is_string()) {
        eot_ = id_of(eos.get<std::string>());
        if (eot_ < 0)
          fail(config,
               fmt::format("eos_token \"{}\" is not a token of {}", eos.get<std::string>(), path),
               "keep tokenizer_config.json beside the tokenizer.json it belongs with");
        return;
      }
    }
    for (const char* name : {"<|end_of_text|>", "<|endoftext|>"})
      if ((eot_ = id_of(name)) >= 0) return;
  } catch (const json::exception& e) {
    // A field of an unexpected type (a number where a string was due, say).
    fail(path, fmt::format("unexpected structure ({})", e.what()));
  }
}

const std::string& BpeTokenizer::decode(int64_t token) const {
  if (token < 0 || token >= vocab_size())
    throw DataError(fmt::format(
        "[tokenizer] {}: token {} is outside its vocabulary of {}. Fix: use the tokenizer.json "
        "the training data was made with",
        path_, token, vocab_size()));
  static const std::string kNone;  // an id in a gap of the vocabulary: `tokenizers` shows nothing
  const auto it = bytes_.find(token);
  return it == bytes_.end() ? kNone : it->second;
}

bool BpeTokenizer::looks_like_json(const std::string& path) {
  if (std::filesystem::path(path).extension() == ".json") return true;
  RegularFile file = RegularFile::open_read(path);
  if (!file.ok()) return false;
  char buf[4096];
  for (ssize_t n; (n = ::read(file.fd(), buf, sizeof buf)) > 0;)
    for (ssize_t i = 0; i < n; ++i)
      if (buf[i] != ' ' && buf[i] != '\t' && buf[i] != '\n' && buf[i] != '\r') return buf[i] == '{';
  return false;
}

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  const size_t n = pending_.size();
  size_t i = 0;
  auto at = [&](size_t k) { return static_cast<unsigned char>(pending_[k]); };
  while (i < n) {
    const unsigned char c = at(i);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    const size_t width = c >= 0xC2 && c <= 0xDF   ? 2
                         : c >= 0xE0 && c <= 0xEF ? 3
                         : c >= 0xF0 && c <= 0xF4 ? 4
                                                  : 0;
    if (width == 0) {  // a continuation byte alone, or a byte no UTF-8 has
      out += kReplacement;
      ++i;
      continue;
    }
    // The second byte's range rules out overlong forms, surrogates and code points past U+10FFFF.
    unsigned char lo = 0x80, hi = 0xBF;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
    size_t k = 1;
    for (; k < width && i + k < n; ++k) {
      const unsigned char b = at(i + k);
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
    }
    if (k == width) {
      out.append(pending_, i, width);
      i += width;
    } else if (i + k == n) {
      break;  // valid so far: the rest of the character comes with the next token
    } else {
      out += kReplacement;  // the valid prefix; the byte that broke it starts anew
      i += k;
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Stream::finish() {
  std::string out = pending_.empty() ? std::string() : std::string(kReplacement);
  pending_.clear();
  return out;
}

}  // namespace remat
