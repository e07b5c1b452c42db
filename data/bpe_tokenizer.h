// A Hugging Face tokenizer.json of a byte-level BPE model (GPT-2's, Llama 3's, Qwen's), for
// printing a token model's output as text: decoding only (a prompt is given as token ids, which
// scripts/prepare_data.py --encode prints). Encoding would need the pre-tokenizer's Unicode regex
// and the merges; decoding needs neither, so "merges" is dropped while parsing.
//
// An id decodes as `tokenizers` decodes it (Tokenizer.decode, skip_special_tokens=False): its
// token string (model.vocab, or added_tokens, which win), each character mapped back to its byte
// by the inverse of GPT-2's bytes_to_unicode table; a token with a character outside that table
// (an added token with a space, say) is its own UTF-8 bytes. The bytes of consecutive tokens are
// joined before they are read as UTF-8 (a character may span tokens): Utf8Stream does that.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

namespace remat {

class BpeTokenizer {
 public:
  /// Reads `path` (tokenizer.json) and, for the end-of-text token, tokenizer_config.json beside
  /// it. Throws DataError naming the file, what is wrong and the fix: missing, not JSON, not a
  /// byte-level BPE (model.type, decoder), ids out of range.
  explicit BpeTokenizer(const std::string& path);

  /// One past the largest id (ids may have gaps; an id without a token decodes to nothing).
  int64_t vocab_size() const { return vocab_size_; }
  /// The bytes of `token`. Throws DataError for an id outside [0, vocab_size()).
  const std::string& decode(int64_t token) const;
  /// tokenizer_config.json's eos_token, else <|end_of_text|> or <|endoftext|>; -1 if none.
  int64_t eot_token() const { return eot_; }
  /// Whether `path` names a tokenizer.json rather than llm.c's binary table: a ".json" name, or
  /// a first non-blank byte '{'.
  static bool looks_like_json(const std::string& path);

 private:
  std::string path_;
  // By id; a map, not a vector indexed by id: a file with one id near 2^24 must not cost 2^24
  // strings.
  std::unordered_map<int64_t, std::string> bytes_;
  int64_t vocab_size_ = 0;
  int64_t eot_ = -1;
};

/// Bytes in, valid UTF-8 out, as Rust's String::from_utf8_lossy (what `tokenizers` uses) reads
/// the whole of them: each maximal invalid subsequence becomes one U+FFFD. A character whose bytes
/// have not all arrived waits for the next push().
class Utf8Stream {
 public:
  /// The text that `bytes`, after what came before, completes.
  std::string push(std::string_view bytes);
  /// What is left (an incomplete character: one U+FFFD), emptying the stream.
  std::string finish();

 private:
  std::string pending_;
};

}  // namespace remat
