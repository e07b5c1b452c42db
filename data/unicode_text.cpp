// UTF-8, White_Space, NFC/NFD and Utf8Stream (see data/unicode_text.h).
#include "data/unicode_text.h"

#include <algorithm>
#include <vector>

namespace remat {
namespace unicode {
namespace {

#include "data/unicode_tables.inc"

constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Hangul syllables decompose and compose by arithmetic (The Unicode Standard, section 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

// The length of a valid sequence starting with `lead`, and the range its second byte must be in
// (which rules out overlong forms, surrogates and code points past U+10FFFF); 0 if none starts so.
struct Lead {
  size_t width;
  unsigned char lo, hi;
};
Lead lead_of(unsigned char c) {
  if (c < 0x80) return {1, 0, 0};
  if (c >= 0xC2 && c <= 0xDF) return {2, 0x80, 0xBF};
  if (c == 0xE0) return {3, 0xA0, 0xBF};
  if (c == 0xED) return {3, 0x80, 0x9F};
  if (c >= 0xE1 && c <= 0xEF) return {3, 0x80, 0xBF};
  if (c == 0xF0) return {4, 0x90, 0xBF};
  if (c >= 0xF1 && c <= 0xF3) return {4, 0x80, 0xBF};
  if (c == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

int combining_class(uint32_t cp) {
  if (cp < 0x300) return 0;
  const uint32_t* end = kCombiningClass + std::size(kCombiningClass);
  const uint32_t* it = std::lower_bound(kCombiningClass, end, cp << 8);
  return it != end && (*it >> 8) == cp ? static_cast<int>(*it & 0xFF) : 0;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const uint32_t* end = kDecompIndex + std::size(kDecompIndex);
  const uint32_t* it = std::lower_bound(kDecompIndex, end, cp << 8);
  if (it == end || (*it >> 8) != cp) {
    out.push_back(cp);
    return;
  }
  const size_t i = static_cast<size_t>(it - kDecompIndex);
  out.insert(out.end(), kDecompPool + kDecompStart[i],
             kDecompPool + kDecompStart[i] + (*it & 0xFF));
}

// The primary composite of (a, b), or 0.
uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const uint64_t key = (static_cast<uint64_t>(a) << 21) | b;
  const uint64_t* end = kComposeKey + std::size(kComposeKey);
  const uint64_t* it = std::lower_bound(kComposeKey, end, key);
  return it != end && *it == key ? kComposeValue[it - kComposeKey] : 0;
}

// Full canonical decomposition, then the canonical ordering: each run of non-starters stably
// sorted by combining class.
std::vector<uint32_t> decompose_ordered(std::string_view s) {
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size();) decompose(next_code_point(s, i), cps);
  for (size_t i = 0; i < cps.size();) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0) ++j;
    std::stable_sort(
        cps.begin() + static_cast<std::ptrdiff_t>(i), cps.begin() + static_cast<std::ptrdiff_t>(j),
        [](uint32_t x, uint32_t y) { return combining_class(x) < combining_class(y); });
    i = j;
  }
  return cps;
}

std::string to_utf8(const std::vector<uint32_t>& cps) {
  std::string out;
  out.reserve(cps.size() * 2);
  for (uint32_t cp : cps) append_utf8(out, cp);
  return out;
}

// Whether any code point of `s` is at or above the one whose UTF-8 lead byte is `lead`.
bool has_lead_at_least(std::string_view s, unsigned char lead) {
  return std::any_of(s.begin(), s.end(),
                     [lead](char c) { return static_cast<unsigned char>(c) >= lead; });
}

}  // namespace

uint32_t next_code_point(std::string_view s, size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = sequence_length(c);
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
  for (size_t k = 1; k < n && i + k < s.size(); ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3Fu);
  i += n;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t sequence_length(unsigned char lead) {
  return lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : lead < 0xF8 ? 4 : 1;
}

size_t find_invalid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const Lead l = lead_of(static_cast<unsigned char>(s[i]));
    if (l.width == 0 || i + l.width > s.size()) return i;
    for (size_t k = 1; k < l.width; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if (k == 1 ? (b < l.lo || b > l.hi) : (b < 0x80 || b > 0xBF)) return i;
    }
    i += l.width;
  }
  return std::string_view::npos;
}

bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

std::string nfd(std::string_view s) {
  if (!has_lead_at_least(s, 0xC3)) return std::string(s);  // all below U+00C0: already NFD
  return to_utf8(decompose_ordered(s));
}

std::string nfc(std::string_view s) {
  if (!has_lead_at_least(s, 0xCC)) return std::string(s);  // all below U+0300: already NFC
  const std::vector<uint32_t> cps = decompose_ordered(s);
  std::vector<uint32_t> out;
  out.reserve(cps.size());
  // The standard's composition: each character joins the last starter unless a character between
  // them blocks it (class 0, or a class at least its own; the order is canonical, so the last one
  // between decides). last_ccc is -1 while nothing follows the starter.
  size_t starter = SIZE_MAX;
  int last_ccc = -1;
  for (uint32_t c : cps) {
    const int ccc = combining_class(c);
    if (starter != SIZE_MAX && (last_ccc == -1 || (last_ccc != 0 && last_ccc < ccc))) {
      if (const uint32_t composite = compose(out[starter], c)) {
        out[starter] = composite;
        continue;
      }
    }
    if (ccc == 0) {
      starter = out.size();
      last_ccc = -1;
    } else {
      last_ccc = ccc;
    }
    out.push_back(c);
  }
  return to_utf8(out);
}

const char* version() {
  return kUnicodeVersion;
}

}  // namespace unicode

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  const size_t n = pending_.size();
  size_t i = 0;
  while (i < n) {
    const auto c = static_cast<unsigned char>(pending_[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    const unicode::Lead l = unicode::lead_of(c);
    if (l.width == 0) {  // a continuation byte alone, or a byte no UTF-8 has
      out += unicode::kReplacement;
      ++i;
      continue;
    }
    size_t k = 1;
    for (; k < l.width && i + k < n; ++k) {
      const auto b = static_cast<unsigned char>(pending_[i + k]);
      if (k == 1 ? (b < l.lo || b > l.hi) : (b < 0x80 || b > 0xBF)) break;
    }
    if (k == l.width) {
      out.append(pending_, i, l.width);
      i += l.width;
    } else if (i + k == n) {
      break;  // valid so far: the rest of the character comes with the next push
    } else {
      out += unicode::kReplacement;  // the valid prefix; the byte that broke it starts anew
      i += k;
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Stream::finish() {
  std::string out = pending_.empty() ? std::string() : std::string(unicode::kReplacement);
  pending_.clear();
  return out;
}

}  // namespace remat
