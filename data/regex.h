// The regular expressions of tokenizer.json files (pre-tokenizer splits, Replace normalizers),
// compiled with PCRE2 (Debian's libpcre2-8: UTF-8, Unicode properties, JIT). tokenizers runs them
// with Oniguruma, whose syntax these patterns use; oniguruma_to_pcre2 rewrites what the two read
// differently before compiling (data/regex.cpp, docs/data.md): `\s` as the White_Space property
// (PCRE2: the Z categories plus \t\n\v\f\r and U+180E), `\w`, `\h`, `^`/`$`, option m, and
// every Unicode property with what Unicode 16 (tokenizers' Oniguruma) adds to PCRE2's Unicode 14
// (data/unicode_properties.inc). What it cannot translate is refused by name.
// Not thread-safe: one Regex holds one JIT stack; use one per thread.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace remat {

class Regex {
 public:
  /// Compiles `pattern` (Oniguruma syntax, as tokenizer.json writes it). Throws
  /// std::invalid_argument with PCRE2's message and the offset when it does not compile.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  /// Every leftmost non-overlapping match in `text` (valid UTF-8, not checked again), as
  /// [begin, end) byte offsets, appended to `out`. An empty match moves the search on by one
  /// character, as Oniguruma's find_iter does.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;
  /// Whether `text` has a match anywhere.
  bool search(std::string_view text) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Compiled;
  std::string pattern_;
  std::unique_ptr<Compiled> compiled_;
};

/// `pattern` in PCRE2's syntax, matching as Oniguruma matches it (see the file comment). Throws
/// std::invalid_argument naming what it cannot translate. Exposed for the tests.
std::string oniguruma_to_pcre2(std::string_view pattern);

}  // namespace remat
