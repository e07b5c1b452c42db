// A Hugging Face tokenizer.json, encoding and decoding as the `tokenizers` package does
// (Tokenizer.encode(text, add_special_tokens).ids and Tokenizer.decode(ids,
// skip_special_tokens=False)), without Python: byte-level BPE (GPT-2, Llama 3, Qwen2/3, SmolLM2,
// OLMo) and BPE with byte fallback (Llama 2, Mistral, TinyLlama, Phi-3).
//
// Encoding, as tokenizers orders it: the added tokens that are not `normalized` are split out of
// the raw text (longest first at the leftmost place, honouring single_word, lstrip and rstrip);
// each remaining piece is normalized, the `normalized` added tokens are split out of it; the
// pre-tokenizer cuts the pieces into words; the BPE model (data/bpe_model.h) turns each word into
// ids; with add_special_tokens, the post-processor's template adds its special tokens.
// Implemented (anything else is refused by name when it is needed):
//   normalizer     NFC, NFD, Prepend, Replace, Strip, Sequence, null
//   pre_tokenizer  ByteLevel, Split (String or Regex, every behavior, invert), Digits,
//                  Punctuation, Metaspace (prepend_scheme always/first/never, split), Sequence,
//                  null
//   post_processor TemplateProcessing (the single-sequence template), ByteLevel, Sequence, null
//   decoder        ByteLevel, ByteFallback, Metaspace, Replace, Fuse, Strip, Sequence, null
//   model          BPE (unk_token, fuse_unk, byte_fallback, ignore_merges, continuing subword
//                  prefix, end-of-word suffix; not dropout)
// A file whose encoding parts are not supported still decodes (`sample` prints its ids as
// text); encode() then throws the reason. Truncation and padding are ignored: every id comes out.
// Regexes run on PCRE2 (data/regex.h), NFC/NFD on tables from Python's unicodedata
// (data/unicode_text.h). Not thread-safe: encode() caches words; use one tokenizer per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace remat {

class HfTokenizer {
 public:
  /// Reads `path` (tokenizer.json) and, for the end-of-text token, tokenizer_config.json beside
  /// it. Throws DataError naming the file, what is wrong and the fix: missing, not a regular file
  /// (refused before it is opened: a FIFO would block), not JSON, not a BPE model, a decoder that
  /// is not supported, ids out of range.
  explicit HfTokenizer(const std::string& path);
  /// From a parsed tokenizer.json; `name` stands for the file in messages (no
  /// tokenizer_config.json is read). For tests and tools that build or patch one in memory.
  static HfTokenizer from_json(const nlohmann::json& spec, const std::string& name);
  ~HfTokenizer();
  HfTokenizer(HfTokenizer&&) noexcept;
  HfTokenizer& operator=(HfTokenizer&&) noexcept;

  /// The ids of `text` (UTF-8). add_special_tokens applies the post-processor's template (Llama
  /// 2's leading <s>, say); scripts/prepare_data.py's training data has none. Characters that
  /// have no token (no byte_fallback, no unk_token) are dropped, as tokenizers drops them, and
  /// counted in *dropped. Throws DataError for text that is not UTF-8 (naming `source` and the
  /// byte offset) and for a tokenizer.json whose encoding parts are not supported (named).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false,
                              size_t* dropped = nullptr, const std::string& source = "the text");
  /// The text of `ids`, special tokens included; bytes that are not UTF-8 become U+FFFD as
  /// tokenizers makes them. An id in a gap of the vocabulary is skipped. Throws DataError for an
  /// id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids) const;

  const std::string& path() const;
  /// One past the largest id (ids may have gaps).
  int64_t vocab_size() const;
  /// tokenizer_config.json's eos_token, else <|end_of_text|> or <|endoftext|>; -1 if none.
  int64_t eot_token() const;
  /// Whether encode() can run; when not, encode_problem() says why (the part not supported).
  bool can_encode() const;
  const std::string& encode_problem() const;

  /// Whether `path` names a tokenizer.json rather than llm.c's binary table: a ".json" name, or
  /// a first non-blank byte '{'.
  static bool looks_like_json(const std::string& path);

 private:
  HfTokenizer(const nlohmann::json& spec, const std::string& path, bool read_config);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Decoding one id at a time, for printing generated tokens as they come: tokenizers'
/// DecodeStream (skip_special_tokens=False). Each push() returns the text the new id completes,
/// possibly empty (a character whose bytes have not all come, a leading space a decoder may still
/// strip); the concatenation of every push() and finish() is decode() of all the ids. The
/// tokenizer must outlive the stream.
class DecodeStream {
 public:
  explicit DecodeStream(const HfTokenizer& tokenizer) : tok_(tokenizer) {}
  /// The new text that `id` completes. Throws DataError for an id outside the vocabulary.
  std::string push(int32_t id);
  /// What the ids pushed so far decode to beyond what push() returned (an incomplete character
  /// at the end: U+FFFD), emptying the stream.
  std::string finish();

 private:
  const HfTokenizer& tok_;
  std::vector<int32_t> ids_;  // since the last place the decoded text was settled
  std::string prefix_;        // what ids_[0, prefix_ids_) decode to
  size_t prefix_ids_ = 0;
};

}  // namespace remat
