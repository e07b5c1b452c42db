// Regex on PCRE2 (see data/regex.h).
#include "data/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

#include <optional>
#include <stdexcept>

#include "data/unicode_text.h"
#include "engine/core/error.h"

namespace remat {
namespace {

// The White_Space property as the body of a character class (data/unicode_text.cpp's
// is_white_space lists the same code points).
constexpr const char* kWhiteSpace =
    R"(\t\n\x0B\f\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof buffer);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

namespace {

// Oniguruma's \w with Unicode (the onig crate's default): Alphabetic, marks, decimal digits and
// connector punctuation. PCRE2's UCP \w is letters, numbers and '_' (No and Nl in, marks out).
constexpr const char* kWord = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc})";
// Oniguruma's \h: a hexadecimal digit (PCRE2's is horizontal space).
constexpr const char* kHexDigit = "0-9a-fA-F";

[[noreturn]] void unsupported(const std::string& what) {
  throw std::invalid_argument(
      fmt::format("{}: Oniguruma, which tokenizers runs, reads it otherwise than PCRE2 does, and "
                  "this build does not translate it",
                  what));
}

// `set` (a class body) as an escape outside a class ([set]) or inside one (its body);
// `negated` escapes have no body to put inside a class.
void append_class(std::string& out, const char* set, bool negated, bool in_class,
                  std::string_view escape) {
  if (!in_class)
    out += fmt::format("[{}{}]", negated ? "^" : "", set);
  else if (!negated)
    out += set;
  else
    unsupported(fmt::format("{} inside a character class", escape));
}

// An inline option group "(?imx-imx)" or "(?imx-imx:" at p[i] ('(' then '?'): its length, or 0.
size_t option_group(std::string_view p, size_t i) {
  size_t j = i + 2;
  while (j < p.size() && (p[j] == 'i' || p[j] == 'm' || p[j] == 'x' || p[j] == '-')) ++j;
  return j > i + 2 && j < p.size() && (p[j] == ')' || p[j] == ':') ? j - i : 0;
}

}  // namespace

std::string oniguruma_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size());
  bool in_class = false;
  for (size_t i = 0; i < p.size();) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[i + 1];
      const std::string_view escape = p.substr(i, 2);
      if (d == 's' || d == 'S')
        append_class(out, kWhiteSpace, d == 'S', in_class, escape);
      else if (d == 'w' || d == 'W')
        append_class(out, kWord, d == 'W', in_class, escape);
      else if (d == 'h' || d == 'H')
        append_class(out, kHexDigit, d == 'H', in_class, escape);
      else if (d == 'b' || d == 'B')
        unsupported(fmt::format("{} (a word boundary, of Oniguruma's words)", escape));
      else
        out.append(escape);  // any other escape, and what follows it, is PCRE2's too
      i += 2;
      continue;
    }
    if (!in_class && c == '(' && i + 1 < p.size() && p[i + 1] == '?') {
      // Oniguruma's option m is PCRE2's s (a dot matches a newline); ^ and $ are always line
      // anchors there, as PCRE2_MULTILINE makes them (Regex's constructor sets it).
      if (const size_t n = option_group(p, i)) {
        for (char o : p.substr(i, n)) out += o == 'm' ? 's' : o;
        i += n;
        continue;
      }
    }
    if (!in_class && c == '[') {
      // A ']' right after the opening '[' (or '[^') is a literal, not the end of the class.
      in_class = true;
      out += c;
      ++i;
      if (i < p.size() && p[i] == '^') out += p[i++];
      if (i < p.size() && p[i] == ']') out += p[i++];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      const size_t end = p.find(":]", i + 2);  // a POSIX class, [:alpha:], inside the class
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 2;
        continue;
      }
    }
    if (in_class && c == '[') unsupported("a class inside a class ([a[bc]], [a-z&&[^c]])");
    if (in_class && c == '&' && i + 1 < p.size() && p[i + 1] == '&')
      unsupported("a class intersection (&&)");
    if (in_class && c == ']') in_class = false;
    out += c;
    ++i;
  }
  return out;
}

struct Regex::Compiled {
  pcre2_code* code = nullptr;
  pcre2_match_data* match = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ~Compiled() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(match);
    pcre2_code_free(code);
  }
};

Regex::Regex(const std::string& pattern) : pattern_(pattern), compiled_(new Compiled) {
  const std::string translated = oniguruma_to_pcre2(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  compiled_->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &offset, nullptr);
  if (!compiled_->code)
    throw std::invalid_argument(
        fmt::format("{} at offset {}", pcre2_message(error), std::min<size_t>(offset, 1u << 30)));
  // JIT where the platform has it (PCRE2 falls back to its interpreter otherwise). Its stack grows
  // to 4 MiB: long runs of one character class (a megabyte of spaces) need more than the default.
  pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE);
  compiled_->match = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
  compiled_->context = pcre2_match_context_create(nullptr);
  compiled_->stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  if (!compiled_->match || !compiled_->context || !compiled_->stack) throw std::bad_alloc();
  pcre2_jit_stack_assign(compiled_->context, nullptr, compiled_->stack);
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  // Oniguruma's iteration (the onig crate's find_iter): an empty match where the last match
  // ended is skipped by moving one character on; any other match is taken.
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t from = 0;
  std::optional<size_t> last_match_end;
  while (from <= text.size()) {
    const int rc = pcre2_match(compiled_->code, subject, text.size(), from, PCRE2_NO_UTF_CHECK,
                               compiled_->match, compiled_->context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0)
      throw DataError(fmt::format(
          "[tokenizer] the pattern {} failed on a text of {} bytes (PCRE2: {}). Fix: shorten the "
          "text (a run of one kind of character this long is unusual)",
          pattern_, text.size(), pcre2_message(rc)));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(compiled_->match);
    const size_t begin = ovector[0], end = ovector[1];
    if (begin == end && last_match_end == end) {
      from +=
          from < text.size() ? unicode::sequence_length(static_cast<unsigned char>(text[from])) : 1;
      continue;
    }
    out.emplace_back(begin, end);
    from = end;
    last_match_end = end;
  }
}

bool Regex::search(std::string_view text) const {
  const int rc =
      pcre2_match(compiled_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0,
                  PCRE2_NO_UTF_CHECK, compiled_->match, compiled_->context);
  return rc >= 0;
}

}  // namespace remat
