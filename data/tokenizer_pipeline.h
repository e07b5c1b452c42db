// The steps of a tokenizer.json between the text and the BPE model, and back: normalizers,
// pre-tokenizers, the post-processor's template and decoders, each read from its JSON node and
// applied as the `tokenizers` package applies it (data/hf_tokenizer.h lists what is supported).
// Internal to data/hf_tokenizer.cpp (and its tests). parse() throws std::invalid_argument naming
// the JSON path of what it cannot use ("pre_tokenizer.pretokenizers[1]: type \"Whitespace\" is not
// supported ..."); the tokenizer adds the file and the fix.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/regex.h"

namespace remat::tokenizer {

/// A piece of text on its way through the pipeline. at_start: it begins where the input text
/// began (tokenizers' offsets_original().0 == 0, which Metaspace's prepend_scheme "first" reads).
struct Piece {
  std::string text;
  bool at_start = false;
};

/// What a Split, Replace or Strip step looks for: a literal string (every occurrence, left to
/// right) or a regex (data/regex.h).
class Pattern {
 public:
  static Pattern literal(std::string text);
  static Pattern regex(const std::string& pattern);  // throws std::invalid_argument
  /// Reads {"String": ...} or {"Regex": ...}.
  static Pattern parse(const nlohmann::json& node, const std::string& where);
  /// The matches in `s`, left to right, not overlapping, as [begin, end) byte offsets.
  void find(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  std::string literal_;
  std::shared_ptr<const Regex> regex_;  // shared: a pipeline copies its steps
};

/// tokenizers' SplitDelimiterBehavior: what becomes of the matches when a piece is split.
enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

/// Splits `piece` at the matches of `pattern` (inverted: at what is between them) and appends the
/// non-empty parts to `out`. Exposed for the tests.
void split_piece(const Piece& piece, const Pattern& pattern, Behavior behavior, bool invert,
                 std::vector<Piece>& out);

class Normalizer {
 public:
  /// A null node is no normalizer.
  static Normalizer parse(const nlohmann::json& node, const std::string& where);
  /// Normalizes `s` in place. Returns whether its first character still comes from the first of
  /// the text given (false when a Strip or an empty Replace removed it): Metaspace's
  /// prepend_scheme "first" reads that, as tokenizers reads the original offsets.
  bool apply(std::string& s) const;
  bool empty() const { return steps_.empty(); }

 private:
  struct Step;
  std::vector<std::shared_ptr<const Step>> steps_;  // a Sequence, flattened
};

class PreTokenizer {
 public:
  static PreTokenizer parse(const nlohmann::json& node, const std::string& where);
  /// Cuts `pieces` into the words the model sees (in place).
  void apply(std::vector<Piece>& pieces) const;

 private:
  struct Step;
  std::vector<std::shared_ptr<const Step>> steps_;
};

/// The single-sequence template of TemplateProcessing (a Sequence of processors flattened; the
/// ByteLevel processor only moves offsets, so it adds nothing here).
class PostProcessor {
 public:
  static PostProcessor parse(const nlohmann::json& node, const std::string& where);
  /// ids with the template's special tokens around them.
  std::vector<int32_t> apply(std::vector<int32_t> ids) const;

 private:
  struct Item {
    bool is_sequence = false;  // the encoded text; else a special token's ids
    std::vector<int32_t> ids;
  };
  std::vector<std::vector<Item>> templates_;  // applied in order
};

class Decoder {
 public:
  static Decoder parse(const nlohmann::json& node, const std::string& where);
  /// The text of the token strings (tokenizers' decode_chain, then the parts joined; without a
  /// decoder, the tokens joined by spaces).
  std::string decode(std::vector<std::string> tokens) const;

 private:
  struct Step;
  std::vector<std::shared_ptr<const Step>> steps_;
  bool present_ = false;
};

/// GPT-2's bytes_to_unicode: the character (as UTF-8) that stands for each byte in a byte-level
/// vocabulary. The printable bytes stand for themselves (! to ~, U+00A1 to U+00AC, U+00AE to
/// U+00FF), the other 68, in byte order, for U+0100 to U+0143.
const std::string& byte_level_char(unsigned char b);

}  // namespace remat::tokenizer
