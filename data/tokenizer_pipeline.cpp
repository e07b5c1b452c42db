// Normalizers, pre-tokenizers, post-processor and decoders of a tokenizer.json (see
// data/tokenizer_pipeline.h). Each step does what the `tokenizers` package's step of the same name
// does to the text; offsets, which tokenizers also tracks, are not kept (only the at_start flag
// that Metaspace reads).
#include "data/tokenizer_pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <stdexcept>

#include "data/unicode_text.h"

namespace remat::tokenizer {
namespace {

using nlohmann::json;

// GPT-2's pre-tokenizer regex, which ByteLevel with use_regex splits by.
constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// One character each: Rust's char::is_numeric (Digits) and tokenizers' is_punc, which is ASCII
// punctuation or a P category (Punctuation).
constexpr const char* kNumericChar = R"(\p{N})";
constexpr const char* kPunctuationChar = R"([\p{P}!-/:-@\[-`{-~])";

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw std::invalid_argument(fmt::format("{}: {}", where, what));
}

std::string type_of(const json& node, const std::string& where) {
  if (!node.is_object()) bad(where, fmt::format("is {}, not an object", node.type_name()));
  const auto it = node.find("type");
  if (it == node.end() || !it->is_string()) bad(where, "has no \"type\"");
  return it->get<std::string>();
}

bool get_bool(const json& node, const char* key, bool fallback, const std::string& where) {
  const auto it = node.find(key);
  if (it == node.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    bad(where + "." + key, fmt::format("is {}, not true or false", it->type_name()));
  return it->get<bool>();
}

std::string get_string(const json& node, const char* key, const std::string& where) {
  const auto it = node.find(key);
  if (it == node.end() || !it->is_string()) bad(where + "." + key, "is missing or not a string");
  return it->get<std::string>();
}

size_t get_count(const json& node, const char* key, const std::string& where) {
  const auto it = node.find(key);
  if (it == node.end() || !it->is_number_unsigned())
    bad(where + "." + key, "is missing or not a count");
  return it->get<size_t>();
}

// A single character (Metaspace's replacement, Strip's content).
std::string get_char(const json& node, const char* key, const std::string& where) {
  const std::string s = get_string(node, key, where);
  size_t i = 0;
  if (s.empty() || unicode::find_invalid_utf8(s) != std::string::npos ||
      (unicode::next_code_point(s, i), i != s.size()))
    bad(where + "." + key, fmt::format("\"{}\" is not one character", s));
  return s;
}

Behavior get_behavior(const json& node, const std::string& where, Behavior fallback) {
  const auto it = node.find("behavior");
  if (it == node.end()) return fallback;
  const std::string b = it->is_string() ? it->get<std::string>() : "";
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  bad(where + ".behavior",
      fmt::format("\"{}\" is not one of Removed, Isolated, MergedWithPrevious, "
                  "MergedWithNext, Contiguous",
                  it->dump()));
}

enum class Prepend { Always, First, Never };

Prepend get_prepend_scheme(const json& node, const std::string& where) {
  // Older files say add_prefix_space instead; false means never.
  if (!get_bool(node, "add_prefix_space", true, where)) return Prepend::Never;
  const auto it = node.find("prepend_scheme");
  if (it == node.end()) return Prepend::Always;
  const std::string s = it->is_string() ? it->get<std::string>() : "";
  if (s == "always") return Prepend::Always;
  if (s == "first") return Prepend::First;
  if (s == "never") return Prepend::Never;
  bad(where + ".prepend_scheme",
      fmt::format("{} is not \"always\", \"first\" or \"never\"", it->dump()));
}

const json& get_array(const json& node, const char* key, const std::string& where) {
  const auto it = node.find(key);
  if (it == node.end() || !it->is_array()) bad(where + "." + key, "is missing or not an array");
  return *it;
}

// The byte each byte-level character stands for (index: code point), -1 for other characters.
const std::array<int16_t, 324>& byte_of_char() {
  static const std::array<int16_t, 324> table = [] {
    std::array<int16_t, 324> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) {
      size_t i = 0;
      const uint32_t cp =
          unicode::next_code_point(byte_level_char(static_cast<unsigned char>(b)), i);
      t[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return table;
}

// Returns whether a match at the start was replaced by nothing (the text then begins with what
// came after it in the original).
bool replace_all(std::string& s, const Pattern& pattern, const std::string& content) {
  std::vector<std::pair<size_t, size_t>> matches;
  pattern.find(s, matches);
  if (matches.empty()) return false;
  const bool head_removed =
      content.empty() && matches.front().first == 0 && matches.front().second > 0;
  std::string out;
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    out.append(s, prev, b - prev);
    out += content;
    prev = e;
  }
  out.append(s, prev, std::string::npos);
  s = std::move(out);
  return head_removed;
}

// Code points of a (valid UTF-8) string, as the substrings they are.
std::vector<std::string_view> characters(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    unicode::next_code_point(s, i);
    out.push_back(s.substr(start, i - start));
  }
  return out;
}

}  // namespace

const std::string& byte_level_char(unsigned char b) {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    int n = 0;
    for (int c = 0; c < 256; ++c) {
      const bool printable = (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
      unicode::append_utf8(t[static_cast<size_t>(c)],
                           printable ? static_cast<uint32_t>(c) : static_cast<uint32_t>(256 + n++));
    }
    return t;
  }();
  return table[b];
}

// ---- patterns and splitting ----

Pattern Pattern::literal(std::string text) {
  Pattern p;
  p.literal_ = std::move(text);
  return p;
}

Pattern Pattern::regex(const std::string& pattern) {
  Pattern p;
  p.regex_ = std::make_shared<const Regex>(pattern);
  return p;
}

Pattern Pattern::parse(const json& node, const std::string& where) {
  if (node.is_object() && node.size() == 1) {
    if (node.contains("String") && node["String"].is_string())
      return literal(node["String"].get<std::string>());
    if (node.contains("Regex") && node["Regex"].is_string()) {
      try {
        return regex(node["Regex"].get<std::string>());
      } catch (const std::invalid_argument& e) {
        bad(where + ".Regex",
            fmt::format("{} does not compile ({})", node["Regex"].dump(), e.what()));
      }
    }
  }
  bad(where, fmt::format("{} is not {{\"String\": ...}} or {{\"Regex\": ...}}", node.dump()));
}

void Pattern::find(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  if (regex_) {
    regex_->find_all(s, out);
    return;
  }
  if (literal_.empty()) return;  // tokenizers: an empty string matches nothing
  for (size_t at = s.find(literal_); at != std::string_view::npos;
       at = s.find(literal_, at + literal_.size()))
    out.emplace_back(at, at + literal_.size());
}

void split_piece(const Piece& piece, const Pattern& pattern, Behavior behavior, bool invert,
                 std::vector<Piece>& out) {
  const std::string& s = piece.text;
  // The piece as consecutive (begin, end, is_match) runs, covering all of it (tokenizers'
  // find_matches; an empty match is a run of its own and marks a cut).
  struct Run {
    size_t begin, end;
    bool match;
  };
  std::vector<std::pair<size_t, size_t>> matches;
  pattern.find(s, matches);
  std::vector<Run> runs;
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (prev != b) runs.push_back({prev, b, invert});
    runs.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != s.size() || s.empty()) runs.push_back({prev, s.size(), invert});

  // (begin, end, remove) per behavior, as tokenizers' NormalizedString::split folds them.
  struct Part {
    size_t begin, end;
    bool remove;
  };
  std::vector<Part> parts;
  bool previous = false;
  switch (behavior) {
    case Behavior::Isolated:
      for (const Run& r : runs) parts.push_back({r.begin, r.end, false});
      break;
    case Behavior::Removed:
      for (const Run& r : runs) parts.push_back({r.begin, r.end, r.match});
      break;
    case Behavior::Contiguous:
      for (const Run& r : runs) {
        if (r.match == previous && !parts.empty())
          parts.back().end = r.end;
        else
          parts.push_back({r.begin, r.end, false});
        previous = r.match;
      }
      break;
    case Behavior::MergedWithPrevious:
      for (const Run& r : runs) {
        if (r.match && !previous && !parts.empty())
          parts.back().end = r.end;
        else
          parts.push_back({r.begin, r.end, false});
        previous = r.match;
      }
      break;
    case Behavior::MergedWithNext:
      for (auto r = runs.rbegin(); r != runs.rend(); ++r) {
        if (r->match && !previous && !parts.empty())
          parts.back().begin = r->begin;
        else
          parts.push_back({r->begin, r->end, false});
        previous = r->match;
      }
      std::reverse(parts.begin(), parts.end());
      break;
  }
  for (const Part& p : parts)
    if (!p.remove && p.end > p.begin)
      out.push_back({s.substr(p.begin, p.end - p.begin), piece.at_start && p.begin == 0});
}

// ---- normalizers ----

struct Normalizer::Step {
  enum class Kind { Nfc, Nfd, Prepend, Replace, Strip } kind;
  std::string text;                  // Prepend: what is prepended; Replace: the replacement
  Pattern pattern;                   // Replace
  bool left = false, right = false;  // Strip
};

Normalizer Normalizer::parse(const json& node, const std::string& where) {
  Normalizer n;
  if (node.is_null()) return n;
  const std::string type = type_of(node, where);
  if (type == "Sequence") {
    const json& list = get_array(node, "normalizers", where);
    for (size_t i = 0; i < list.size(); ++i) {
      const Normalizer inner = parse(list[i], fmt::format("{}.normalizers[{}]", where, i));
      n.steps_.insert(n.steps_.end(), inner.steps_.begin(), inner.steps_.end());
    }
    return n;
  }
  auto step = std::make_shared<Step>();
  if (type == "NFC") {
    step->kind = Step::Kind::Nfc;
  } else if (type == "NFD") {
    step->kind = Step::Kind::Nfd;
  } else if (type == "Prepend") {
    step->kind = Step::Kind::Prepend;
    step->text = get_string(node, "prepend", where);
  } else if (type == "Replace") {
    step->kind = Step::Kind::Replace;
    step->pattern = Pattern::parse(node.value("pattern", json()), where + ".pattern");
    step->text = get_string(node, "content", where);
  } else if (type == "Strip") {
    step->kind = Step::Kind::Strip;
    step->left = get_bool(node, "strip_left", false, where);
    step->right = get_bool(node, "strip_right", false, where);
  } else {
    bad(where, fmt::format("normalizer \"{}\" is not supported (supported: NFC, NFD, Prepend, "
                           "Replace, Strip, Sequence)",
                           type));
  }
  n.steps_.push_back(std::move(step));
  return n;
}

bool Normalizer::apply(std::string& s) const {
  // Whether the first character still comes from the text's first (tokenizers' alignments:
  // composed or prepended characters take the first one's, a replacement its match's).
  bool head = true;
  for (const auto& step : steps_) {
    switch (step->kind) {
      case Step::Kind::Nfc:
        s = unicode::nfc(s);
        break;
      case Step::Kind::Nfd:
        s = unicode::nfd(s);
        break;
      case Step::Kind::Prepend:
        if (!s.empty()) s = step->text + s;
        break;
      case Step::Kind::Replace:
        if (replace_all(s, step->pattern, step->text)) head = false;
        break;
      case Step::Kind::Strip: {
        // Whitespace is the White_Space property (Rust's char::is_whitespace).
        size_t begin = 0, end = s.size();
        if (step->left)
          for (size_t i = 0; i < s.size(); begin = i)
            if (!unicode::is_white_space(unicode::next_code_point(s, i))) break;
        if (step->right) {
          // Walk forward, remembering where the last run of whitespace began.
          size_t run = s.size();
          for (size_t i = begin; i < s.size();) {
            const size_t at = i;
            if (!unicode::is_white_space(unicode::next_code_point(s, i)))
              run = s.size();
            else if (run == s.size())
              run = at;
          }
          end = run;
        }
        if (begin > 0) head = false;
        s = s.substr(begin, end - begin);
        break;
      }
    }
  }
  return head;
}

// ---- pre-tokenizers ----

struct PreTokenizer::Step {
  enum class Kind { ByteLevel, Split, Metaspace } kind;
  bool add_prefix_space = false;  // ByteLevel
  bool use_regex = false;         // ByteLevel
  Pattern pattern;                // Split (and Digits, Punctuation: one character per match)
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
  std::string replacement;  // Metaspace
  Prepend prepend = Prepend::Always;
  bool split = true;
};

PreTokenizer PreTokenizer::parse(const json& node, const std::string& where) {
  PreTokenizer p;
  if (node.is_null()) return p;
  const std::string type = type_of(node, where);
  if (type == "Sequence") {
    const json& list = get_array(node, "pretokenizers", where);
    for (size_t i = 0; i < list.size(); ++i) {
      const PreTokenizer inner = parse(list[i], fmt::format("{}.pretokenizers[{}]", where, i));
      p.steps_.insert(p.steps_.end(), inner.steps_.begin(), inner.steps_.end());
    }
    return p;
  }
  auto step = std::make_shared<Step>();
  if (type == "ByteLevel") {
    step->kind = Step::Kind::ByteLevel;
    step->add_prefix_space = get_bool(node, "add_prefix_space", true, where);
    step->use_regex = get_bool(node, "use_regex", true, where);
    if (step->use_regex) step->pattern = Pattern::regex(kGpt2Regex);
  } else if (type == "Split") {
    step->kind = Step::Kind::Split;
    step->pattern = Pattern::parse(node.value("pattern", json()), where + ".pattern");
    step->behavior = get_behavior(node, where, Behavior::Isolated);
    step->invert = get_bool(node, "invert", false, where);
    if (node.find("behavior") == node.end()) bad(where + ".behavior", "is missing");
  } else if (type == "Digits") {
    step->kind = Step::Kind::Split;
    step->pattern = Pattern::regex(kNumericChar);
    step->behavior = get_bool(node, "individual_digits", false, where) ? Behavior::Isolated
                                                                       : Behavior::Contiguous;
  } else if (type == "Punctuation") {
    step->kind = Step::Kind::Split;
    step->pattern = Pattern::regex(kPunctuationChar);
    step->behavior = get_behavior(node, where, Behavior::Isolated);
  } else if (type == "Metaspace") {
    step->kind = Step::Kind::Metaspace;
    step->replacement = get_char(node, "replacement", where);
    step->prepend = get_prepend_scheme(node, where);
    step->split = get_bool(node, "split", true, where);
    step->pattern = Pattern::literal(step->replacement);
  } else {
    bad(where, fmt::format("pre-tokenizer \"{}\" is not supported (supported: ByteLevel, Split, "
                           "Digits, Punctuation, Metaspace, Sequence)",
                           type));
  }
  p.steps_.push_back(std::move(step));
  return p;
}

void PreTokenizer::apply(std::vector<Piece>& pieces) const {
  std::vector<Piece> next;
  for (const auto& step : steps_) {
    next.clear();
    next.reserve(pieces.size());
    switch (step->kind) {
      case Step::Kind::ByteLevel:
        for (Piece& piece : pieces) {
          if (step->add_prefix_space && (piece.text.empty() || piece.text[0] != ' '))
            piece.text = " " + piece.text;
          if (step->use_regex)
            split_piece(piece, step->pattern, Behavior::Isolated, false, next);
          else
            next.push_back(std::move(piece));
        }
        // Every byte becomes the character that stands for it (what the vocabulary is written in).
        for (Piece& piece : next) {
          std::string mapped;
          mapped.reserve(piece.text.size() * 2);
          for (char c : piece.text) mapped += byte_level_char(static_cast<unsigned char>(c));
          piece.text = std::move(mapped);
        }
        break;
      case Step::Kind::Split:
        for (const Piece& piece : pieces)
          split_piece(piece, step->pattern, step->behavior, step->invert, next);
        break;
      case Step::Kind::Metaspace:
        for (Piece& piece : pieces) {
          replace_all(piece.text, Pattern::literal(" "), step->replacement);
          const bool starts = piece.text.starts_with(step->replacement);
          if (!starts && (step->prepend == Prepend::Always ||
                          (step->prepend == Prepend::First && piece.at_start)))
            piece.text = step->replacement + piece.text;
          if (step->split)
            split_piece(piece, step->pattern, Behavior::MergedWithNext, false, next);
          else
            next.push_back(std::move(piece));
        }
        break;
    }
    pieces.swap(next);
  }
}

// ---- post-processor ----

PostProcessor PostProcessor::parse(const json& node, const std::string& where) {
  PostProcessor p;
  if (node.is_null()) return p;
  const std::string type = type_of(node, where);
  if (type == "ByteLevel") return p;  // offsets only
  if (type == "Sequence") {
    const json& list = get_array(node, "processors", where);
    for (size_t i = 0; i < list.size(); ++i) {
      const PostProcessor inner = parse(list[i], fmt::format("{}.processors[{}]", where, i));
      p.templates_.insert(p.templates_.end(), inner.templates_.begin(), inner.templates_.end());
    }
    return p;
  }
  if (type != "TemplateProcessing")
    bad(where, fmt::format("post-processor \"{}\" is not supported (supported: "
                           "TemplateProcessing, ByteLevel, Sequence)",
                           type));
  const json& single = get_array(node, "single", where);
  const json specials = node.value("special_tokens", json::object());
  std::vector<Item> items;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string at = fmt::format("{}.single[{}]", where, i);
    const json& item = single[i];
    if (item.is_object() && item.contains("Sequence")) {
      items.push_back({true, {}});
      continue;
    }
    if (!item.is_object() || !item.contains("SpecialToken") || !item["SpecialToken"].is_object())
      bad(at, "is neither {\"Sequence\": ...} nor {\"SpecialToken\": ...}");
    const std::string name = get_string(item["SpecialToken"], "id", at + ".SpecialToken");
    if (!specials.is_object() || !specials.contains(name) || !specials[name].is_object())
      bad(where + ".special_tokens", fmt::format("has no \"{}\", which the template uses", name));
    Item special;
    const json& ids = get_array(specials[name], "ids", where + ".special_tokens." + name);
    for (const json& id : ids) {
      if (!id.is_number_unsigned() || id.get<uint64_t>() >= (uint64_t{1} << 24))
        bad(where + ".special_tokens." + name + ".ids", fmt::format("{} is not an id", id.dump()));
      special.ids.push_back(id.get<int32_t>());
    }
    items.push_back(std::move(special));
  }
  p.templates_.push_back(std::move(items));
  return p;
}

std::vector<int32_t> PostProcessor::apply(std::vector<int32_t> ids) const {
  for (const auto& items : templates_) {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (const Item& item : items) {
      if (item.is_sequence)
        out.insert(out.end(), ids.begin(), ids.end());
      else
        out.insert(out.end(), item.ids.begin(), item.ids.end());
    }
    ids = std::move(out);
  }
  return ids;
}

// ---- decoders ----

struct Decoder::Step {
  enum class Kind { ByteLevel, ByteFallback, Metaspace, Replace, Fuse, Strip } kind;
  Pattern pattern;      // Replace
  std::string content;  // Replace: the replacement; Strip: the character; Metaspace: replacement
  size_t start = 0, stop = 0;         // Strip
  Prepend prepend = Prepend::Always;  // Metaspace
};

Decoder Decoder::parse(const json& node, const std::string& where) {
  Decoder d;
  if (node.is_null()) return d;
  d.present_ = true;
  const std::string type = type_of(node, where);
  if (type == "Sequence") {
    const json& list = get_array(node, "decoders", where);
    for (size_t i = 0; i < list.size(); ++i) {
      const Decoder inner = parse(list[i], fmt::format("{}.decoders[{}]", where, i));
      d.steps_.insert(d.steps_.end(), inner.steps_.begin(), inner.steps_.end());
    }
    return d;
  }
  auto step = std::make_shared<Step>();
  if (type == "ByteLevel") {
    step->kind = Step::Kind::ByteLevel;
  } else if (type == "ByteFallback") {
    step->kind = Step::Kind::ByteFallback;
  } else if (type == "Fuse") {
    step->kind = Step::Kind::Fuse;
  } else if (type == "Replace") {
    step->kind = Step::Kind::Replace;
    step->pattern = Pattern::parse(node.value("pattern", json()), where + ".pattern");
    step->content = get_string(node, "content", where);
  } else if (type == "Strip") {
    step->kind = Step::Kind::Strip;
    step->content = get_char(node, "content", where);
    step->start = get_count(node, "start", where);
    step->stop = get_count(node, "stop", where);
  } else if (type == "Metaspace") {
    step->kind = Step::Kind::Metaspace;
    step->content = get_char(node, "replacement", where);
    step->prepend = get_prepend_scheme(node, where);
  } else {
    bad(where, fmt::format("decoder \"{}\" is not supported (supported: ByteLevel, "
                           "ByteFallback, Metaspace, Replace, Fuse, Strip, Sequence)",
                           type));
  }
  d.steps_.push_back(std::move(step));
  return d;
}

std::string Decoder::decode(std::vector<std::string> tokens) const {
  if (!present_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const auto& step : steps_) {
    switch (step->kind) {
      case Step::Kind::ByteLevel: {
        // Each token's characters back to their bytes (a token with a character outside the
        // table, an added token with a space say, is its own UTF-8), all joined, then read as
        // UTF-8 with U+FFFD for what is not.
        const auto& table = byte_of_char();
        std::string bytes;
        for (const std::string& t : tokens) {
          std::string mine;
          bool all = true;
          for (size_t i = 0; i < t.size() && all;) {
            const uint32_t cp = unicode::next_code_point(t, i);
            all = cp < table.size() && table[cp] >= 0;
            if (all) mine.push_back(static_cast<char>(table[cp]));
          }
          bytes += all ? mine : t;
        }
        Utf8Stream lossy;
        std::string text = lossy.push(bytes);
        text += lossy.finish();
        tokens.assign(1, std::move(text));
        break;
      }
      case Step::Kind::ByteFallback: {
        // A run of <0xXX> tokens becomes its bytes when they are UTF-8, else one U+FFFD per token.
        std::vector<std::string> out;
        std::string run;
        auto flush = [&] {
          if (run.empty()) return;
          if (unicode::find_invalid_utf8(run) == std::string::npos)
            out.push_back(run);
          else
            for (size_t k = 0; k < run.size(); ++k) out.emplace_back("\xEF\xBF\xBD");
          run.clear();
        };
        for (std::string& t : tokens) {
          auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
          if (t.size() == 6 && t.starts_with("<0x") && t[5] == '>' && hex(t[3]) && hex(t[4])) {
            const unsigned byte = static_cast<unsigned>(std::stoul(t.substr(3, 2), nullptr, 16));
            run.push_back(static_cast<char>(byte));
            continue;
          }
          flush();
          out.push_back(std::move(t));
        }
        flush();
        tokens = std::move(out);
        break;
      }
      case Step::Kind::Metaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::string out;
          for (std::string_view ch : characters(tokens[i])) {
            if (ch != step->content)
              out += ch;
            else if (i != 0 || step->prepend == Prepend::Never)
              out += ' ';  // the first token's replacement characters are dropped
          }
          tokens[i] = std::move(out);
        }
        break;
      case Step::Kind::Replace:
        for (std::string& t : tokens) replace_all(t, step->pattern, step->content);
        break;
      case Step::Kind::Fuse: {
        std::string joined;
        for (const std::string& t : tokens) joined += t;
        tokens.assign(1, std::move(joined));
        break;
      }
      case Step::Kind::Strip:
        for (std::string& t : tokens) {
          const std::vector<std::string_view> chars = characters(t);
          size_t begin = 0, end = chars.size();
          while (begin < std::min(step->start, chars.size()) && chars[begin] == step->content)
            ++begin;
          for (size_t k = 0; k < step->stop && end > begin && chars[end - 1] == step->content; ++k)
            --end;
          std::string out;
          for (size_t k = begin; k < end; ++k) out += chars[k];
          t = std::move(out);
        }
        break;
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace remat::tokenizer
