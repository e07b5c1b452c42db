// UTF-8 and Unicode helpers for the tokenizer (data/hf_tokenizer.h): code point iteration, the
// White_Space property, canonical normalization (NFC, NFD) from tables generated out of Python's
// unicodedata (data/unicode_tables.inc, scripts/make_unicode_tables.py; no ICU), and Utf8Stream,
// which reads bytes as UTF-8 the way Rust's String::from_utf8_lossy does.
// Functions taking text expect valid UTF-8 (check it once with find_invalid_utf8); they do not
// check again. Compatibility normalization (NFKC, NFKD) is not supported: a tokenizer.json whose
// normalizer asks for it cannot encode (named).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace remat {

namespace unicode {

/// The code point that starts at s[i] (valid UTF-8), moving i past it.
uint32_t next_code_point(std::string_view s, size_t& i);
/// Appends the UTF-8 form of `cp` to `out`.
void append_utf8(std::string& out, uint32_t cp);
/// Bytes in the UTF-8 sequence that starts with `lead` (1 for a byte that starts none).
size_t sequence_length(unsigned char lead);
/// The byte offset of the first byte that is not part of valid UTF-8 (overlong forms, surrogates
/// and code points past U+10FFFF included), or std::string_view::npos when all of `s` is valid.
size_t find_invalid_utf8(std::string_view s);
/// The White_Space property: what Rust's char::is_whitespace and the `\s` of tokenizers' regex
/// libraries (Oniguruma, Rust's regex) match.
bool is_white_space(uint32_t cp);
/// Canonical composition and decomposition (Unicode Standard Annex #15).
std::string nfc(std::string_view s);
std::string nfd(std::string_view s);
/// The Unicode version of the normalization tables ("14.0.0").
const char* version();

}  // namespace unicode

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
