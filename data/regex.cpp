// Regex on PCRE2 (see data/regex.h).
#include "data/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

#include <cctype>
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

#include "data/unicode_properties.inc"

// Oniguruma reads a property's name loosely: case, spaces, '_' and '-' do not count.
std::string loose(std::string_view name) {
  std::string out;
  for (char c : name)
    if (c != ' ' && c != '_' && c != '-')
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The general categories by their short names, and Alphabetic: the properties whose names are
// translated (PCRE2 10.42 reads only the short names, loosely; Oniguruma the long ones too).
constexpr const char* kPropertyNames[] = {
    "L",  "LC", "Lu", "Ll", "Lt", "Lm", "Lo", "M",  "Mn", "Mc", "Me", "N",  "Nd",
    "Nl", "No", "P",  "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S",  "Sm", "Sc",
    "Sk", "So", "Z",  "Zs", "Zl", "Zp", "C",  "Cc", "Cf", "Cs", "Co", "Cn", "Alphabetic"};

// The short name (one of kPropertyNames) of a property name as a pattern writes it, loosely: "L",
// "Letter", "lowercase_letter", "Alpha", ...; "" for any other (a script, another binary
// property: left to PCRE2 as written).
std::string_view table_name(std::string_view name) {
  static constexpr std::pair<const char*, const char*> kLongNames[] = {
      {"letter", "L"},
      {"casedletter", "LC"},
      {"uppercaseletter", "Lu"},
      {"lowercaseletter", "Ll"},
      {"titlecaseletter", "Lt"},
      {"modifierletter", "Lm"},
      {"otherletter", "Lo"},
      {"mark", "M"},
      {"combiningmark", "M"},
      {"nonspacingmark", "Mn"},
      {"spacingmark", "Mc"},
      {"enclosingmark", "Me"},
      {"number", "N"},
      {"decimalnumber", "Nd"},
      {"digit", "Nd"},
      {"letternumber", "Nl"},
      {"othernumber", "No"},
      {"punctuation", "P"},
      {"connectorpunctuation", "Pc"},
      {"dashpunctuation", "Pd"},
      {"openpunctuation", "Ps"},
      {"closepunctuation", "Pe"},
      {"initialpunctuation", "Pi"},
      {"finalpunctuation", "Pf"},
      {"otherpunctuation", "Po"},
      {"symbol", "S"},
      {"mathsymbol", "Sm"},
      {"currencysymbol", "Sc"},
      {"modifiersymbol", "Sk"},
      {"othersymbol", "So"},
      {"separator", "Z"},
      {"spaceseparator", "Zs"},
      {"lineseparator", "Zl"},
      {"paragraphseparator", "Zp"},
      {"other", "C"},
      {"control", "Cc"},
      {"format", "Cf"},
      {"surrogate", "Cs"},
      {"privateuse", "Co"},
      {"unassigned", "Cn"},
      {"alpha", "Alphabetic"},
  };
  const std::string key = loose(name);
  for (const char* short_name : kPropertyNames)
    if (key == loose(short_name)) return short_name;
  for (const auto& [long_name, short_name] : kLongNames)
    if (key == long_name) return short_name;
  return {};
}

const PropertyAdditions* additions_of(std::string_view table) {
  for (const auto& a : kPropertyAdditions)
    if (table == a.name) return &a;
  return nullptr;
}

// A property's additions as PCRE2 class items (\x{1C89}-\x{1C8A}\x{A7CB}-...), made once each.
const std::string& class_items(const PropertyAdditions& a) {
  static const std::vector<std::string> items = [] {
    std::vector<std::string> all;
    for (const auto& table : kPropertyAdditions) {
      std::string s;
      for (size_t r = 0; r < table.count; ++r)
        s += fmt::format("\\x{{{:X}}}-\\x{{{:X}}}", table.ranges[r][0], table.ranges[r][1]);
      all.push_back(std::move(s));
    }
    return all;
  }();
  return items[static_cast<size_t>(&a - kPropertyAdditions)];
}

// One translation's state: whether Unicode 16's additions go in (data/unicode_properties.inc),
// and which properties' additions went in.
struct Translation {
  bool with_additions = true;
  std::vector<const PropertyAdditions*> used;
  // For each byte of the translation, the offset in the pattern of what it translates: PCRE2's
  // error offsets point into the translation, the user's message into the pattern.
  std::vector<size_t> origin;
  size_t origin_of(size_t translated_offset) const {
    return translated_offset < origin.size() ? origin[translated_offset]
                                             : (origin.empty() ? 0 : origin.back() + 1);
  }

  // The class items Unicode 16 adds to these properties ("" without additions).
  std::string additions(std::initializer_list<std::string_view> tables) {
    std::string out;
    if (!with_additions) return out;
    for (std::string_view t : tables)
      if (const PropertyAdditions* a = additions_of(t)) {
        out += class_items(*a);
        used.push_back(a);
      }
    return out;
  }
};

// Oniguruma's \w with Unicode (the onig crate's default): Alphabetic, marks, decimal digits and
// connector punctuation. PCRE2's UCP \w is letters, numbers and '_' (No and Nl in, marks out).
std::string word_class(Translation& t) {
  return R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc})" + t.additions({"Alphabetic", "M", "Nd", "Pc"});
}
// Oniguruma's \d with Unicode: the decimal digits (Nd).
std::string digit_class(Translation& t) {
  return R"(\p{Nd})" + t.additions({"Nd"});
}
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
void append_class(std::string& out, std::string_view set, bool negated, bool in_class,
                  std::string_view escape) {
  if (!in_class)
    out += fmt::format("[{}{}]", negated ? "^" : "", set);
  else if (!negated)
    out += set;
  else
    unsupported(fmt::format("{} inside a character class", escape));
}

// A property escape at p[i] ('\\' then 'p' or 'P'), \p{Name}, \p{^Name} or \P{Name}, appended
// with what Unicode 16 adds to the property (see data/unicode_properties.inc); returns its
// length. Oniguruma reads \p or \P without a '{' as the letter itself (PCRE2: \pL is \p{L}).
// A negated property inside a class keeps PCRE2's tables: a class can add code points to a
// property, not take them out of its complement.
size_t append_property(std::string& out, std::string_view p, size_t i, bool in_class,
                       Translation& t) {
  const bool upper = p[i + 1] == 'P';
  if (i + 2 >= p.size() || p[i + 2] != '{') {
    out += p[i + 1];
    return 2;
  }
  const size_t close = p.find('}', i + 3);
  if (close == std::string_view::npos) {  // PCRE2 reports the unterminated escape
    out.append(p.substr(i));
    return p.size() - i;
  }
  const std::string_view escape = p.substr(i, close + 1 - i);
  std::string_view name = p.substr(i + 3, close - i - 3);
  const bool caret = !name.empty() && name[0] == '^';
  if (caret) name.remove_prefix(1);
  const bool negated = upper != caret;
  const std::string_view table = table_name(name);
  const std::string extra = in_class && negated ? "" : t.additions({table});
  const std::string_view written = table.empty() ? name : table;
  if (in_class && (negated || extra.empty()))
    out += fmt::format("\\{}{{{}}}", negated ? 'P' : 'p', written);
  else if (in_class)
    out += fmt::format("\\p{{{}}}{}", written, extra);
  else if (!negated && extra.empty())
    out += fmt::format("\\p{{{}}}", written);
  else  // a negation is always a class: PCRE2 10.42 makes \P{L}+\P{N} possessive, wrongly
    out += fmt::format("[{}\\p{{{}}}{}]", negated ? "^" : "", written, extra);
  return escape.size();
}

// An inline option group "(?imx-imx)" or "(?imx-imx:" at p[i] ('(' then '?'): its length, or 0.
size_t option_group(std::string_view p, size_t i) {
  size_t j = i + 2;
  while (j < p.size() && (p[j] == 'i' || p[j] == 'm' || p[j] == 'x' || p[j] == '-')) ++j;
  return j > i + 2 && j < p.size() && (p[j] == ')' || p[j] == ':') ? j - i : 0;
}

}  // namespace

namespace {

std::string translate(std::string_view p, Translation& t) {
  std::string out;
  out.reserve(p.size());
  bool in_class = false;
  size_t token = 0;  // where the piece of the pattern being translated starts
  for (size_t i = 0; i < p.size();) {
    t.origin.resize(out.size(), token);
    token = i;
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[i + 1];
      const std::string_view escape = p.substr(i, 2);
      if (d == 's' || d == 'S')
        append_class(out, kWhiteSpace, d == 'S', in_class, escape);
      else if (d == 'w' || d == 'W')
        append_class(out, word_class(t), d == 'W', in_class, escape);
      else if (d == 'D' && in_class)
        out.append(escape);  // PCRE2's Nd (Unicode 14): see append_property on negations
      else if (d == 'd' || d == 'D')
        append_class(out, digit_class(t), d == 'D', in_class, escape);
      else if (d == 'p' || d == 'P') {
        i += append_property(out, p, i, in_class, t);
        continue;
      } else if (d == 'h' || d == 'H')
        append_class(out, kHexDigit, d == 'H', in_class, escape);
      else if (d == 'b' || d == 'B')
        unsupported(fmt::format("{} (a word boundary, of Oniguruma's words)", escape));
      else
        out.append(escape);  // any other escape, and what follows it, is PCRE2's too
      i += 2;
      continue;
    }
    if (!in_class && p.substr(i, 3) == "(?#") {  // a comment, to its ')': no class starts there
      const size_t end = std::min(p.find(')', i), p.size() - 1);
      out.append(p.substr(i, end + 1 - i));
      i = end + 1;
      continue;
    }
    if (!in_class && c == '{' && i + 1 < p.size() && p[i + 1] == ',') {
      // Oniguruma reads {,n} as {0,n}; PCRE2 10.42 as the literal text "{,n}".
      const size_t close = p.find('}', i);
      const std::string_view n =
          close == std::string_view::npos ? std::string_view{} : p.substr(i + 2, close - i - 2);
      if (!n.empty() && n.find_first_not_of("0123456789") == std::string_view::npos) {
        out += fmt::format("{{0,{}}}", n);
        i = close + 1;
        continue;
      }
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
  t.origin.resize(out.size(), token);
  return out;
}

// The pattern compiled (JIT where the platform has it; PCRE2 falls back to its interpreter), or
// null with `error` set.
pcre2_code* compile(const std::string& translated, int& error, PCRE2_SIZE& offset) {
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &offset, nullptr);
  if (code) pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return code;
}

[[noreturn]] void compile_error(int error, PCRE2_SIZE offset, const Translation& t) {
  throw std::invalid_argument(
      fmt::format("{} at offset {}", pcre2_message(error), t.origin_of(offset)));
}

}  // namespace

std::string oniguruma_to_pcre2(std::string_view pattern) {
  Translation t;
  return translate(pattern, t);
}

// Two compilations when the pattern reads a property Unicode 16 adds to: `code` with the
// additions, and `pcre2_tables` without them, which gives the same matches on a text holding none
// of the added code points (nearly every text) and runs faster: each added range is one more
// comparison for every character that fails a property (GPT-2's regex on a multilingual
// megabyte: 40 ms without, 47-53 ms with). `added` marks the added code points, a bit each.
struct Regex::Compiled {
  pcre2_code* code = nullptr;
  pcre2_code* pcre2_tables = nullptr;
  std::vector<uint64_t> added;
  pcre2_match_data* match = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ~Compiled() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(match);
    pcre2_code_free(pcre2_tables);
    pcre2_code_free(code);
  }

  // The compilation to run on `text`: without the additions when no code point of it is added.
  const pcre2_code* for_text(std::string_view text) const {
    if (!pcre2_tables) return code;
    for (size_t i = 0; i < text.size();) {
      if (static_cast<unsigned char>(text[i]) < 0x80) {
        ++i;
        continue;
      }
      const uint32_t cp = unicode::next_code_point(text, i);
      if (added[cp / 64] >> (cp % 64) & 1) return code;
    }
    return pcre2_tables;
  }
};

Regex::Regex(const std::string& pattern) : pattern_(pattern), compiled_(new Compiled) {
  Translation with, without;
  without.with_additions = false;
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* plain = compile(translate(pattern, without), error, offset);
  if (!plain) compile_error(error, offset, without);
  const std::string exact = translate(pattern, with);
  compiled_->code = with.used.empty() ? plain : compile(exact, error, offset);
  if (!compiled_->code && error == PCRE2_ERROR_PATTERN_TOO_LARGE) {
    // Past PCRE2's 64 KiB of compiled pattern (a hundred \w, each hundreds of added ranges):
    // the Unicode 14 reading alone, as before the additions.
    compiled_->code = plain;
    with.used.clear();
  }
  if (!compiled_->code) {
    pcre2_code_free(plain);
    compile_error(error, offset, with);
  }
  if (!with.used.empty()) {
    compiled_->pcre2_tables = plain;
    compiled_->added.assign(0x110000 / 64, 0);
    for (const PropertyAdditions* a : with.used)
      for (size_t r = 0; r < a->count; ++r)
        for (uint32_t cp = a->ranges[r][0]; cp <= a->ranges[r][1]; ++cp)
          compiled_->added[cp / 64] |= uint64_t{1} << (cp % 64);
  }
  // Both compilations have the same groups (the additions are classes): one match data serves.
  compiled_->match = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
  compiled_->context = pcre2_match_context_create(nullptr);
  // The JIT stack grows to 4 MiB: long runs of one character class (a megabyte of spaces) need
  // more than the default.
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
  const pcre2_code* code = compiled_->for_text(text);
  size_t from = 0;
  std::optional<size_t> last_match_end;
  while (from <= text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), from, PCRE2_NO_UTF_CHECK,
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
      pcre2_match(compiled_->for_text(text), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                  0, PCRE2_NO_UTF_CHECK, compiled_->match, compiled_->context);
  return rc >= 0;
}

}  // namespace remat
