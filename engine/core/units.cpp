// Parsing and printing of byte sizes, counts and FLOP totals.
#include "engine/core/units.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstdlib>

namespace remat {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Splits "1.5GiB" into 1.5 and "gib"; nullopt when the number part is malformed.
std::optional<std::pair<double, std::string>> split_number(std::string_view text) {
  std::string s = lower(text);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  size_t start = i;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == start) return std::nullopt;
  std::string num = s.substr(start, i - start);
  char* end = nullptr;
  double v = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || !std::isfinite(v) || v < 0) return std::nullopt;
  while (i < s.size() && s[i] == ' ') ++i;
  return std::make_pair(v, s.substr(i));
}

}  // namespace

std::optional<uint64_t> parse_size(std::string_view text) {
  auto parts = split_number(text);
  if (!parts) return std::nullopt;
  auto [v, unit] = *parts;
  double mult = 0;
  // One unit a line reads as a table.
  // clang-format off
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "kib" || unit == "k") mult = 1024.0;
  else if (unit == "mib" || unit == "m") mult = 1024.0 * 1024;
  else if (unit == "gib" || unit == "g") mult = 1024.0 * 1024 * 1024;
  else if (unit == "tib" || unit == "t") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "pib" || unit == "p") mult = 1024.0 * 1024 * 1024 * 1024 * 1024;
  else if (unit == "eib" || unit == "e") mult = 1024.0 * 1024 * 1024 * 1024 * 1024 * 1024;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "gb") mult = 1e9;
  else if (unit == "tb") mult = 1e12;
  else if (unit == "pb") mult = 1e15;
  else if (unit == "eb") mult = 1e18;
  else return std::nullopt;
  // clang-format on
  if (mult == 1 && v != std::floor(v)) return std::nullopt;  // "0.5": no such thing as half a byte
  const double bytes = std::round(v * mult);
  if (bytes >= 0x1p64) return std::nullopt;  // 16 EiB and up: past uint64_t
  return static_cast<uint64_t>(bytes);
}

std::optional<int64_t> parse_count(std::string_view text) {
  auto parts = split_number(text);
  if (!parts) return std::nullopt;
  auto [v, unit] = *parts;
  double mult = 0;
  // clang-format off
  if (unit.empty()) mult = 1;
  else if (unit == "k") mult = 1024.0;
  else if (unit == "m") mult = 1024.0 * 1024;
  else if (unit == "g") mult = 1024.0 * 1024 * 1024;
  else return std::nullopt;
  // clang-format on
  double n = v * mult;
  if (n != std::floor(n) || n > 9.0e18) return std::nullopt;
  return static_cast<int64_t>(n);
}

std::optional<std::string> memory_budget_problem(uint64_t bytes) {
  if (bytes == 0) return std::string("a budget of 0 bytes holds nothing");
  if (bytes > kMaxMemoryBytes)
    return fmt::format("{} is out of range (at most {})", format_bytes(bytes),
                       format_bytes(kMaxMemoryBytes));
  return std::nullopt;
}

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.2f} {}", v, units[u]);
}

std::string format_count(int64_t n) {
  if (n >= 1024 * 1024 && n % (1024 * 1024) == 0) return fmt::format("{}M", n / (1024 * 1024));
  if (n >= 1024 && n % 1024 == 0) return fmt::format("{}k", n / 1024);
  return fmt::format("{}", n);
}

std::string format_grouped(int64_t n) {
  const std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out = n < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string format_flops(double flops) {
  if (flops >= 1e15) return fmt::format("{:.2f} PFLOP", flops / 1e15);
  if (flops >= 1e12) return fmt::format("{:.2f} TFLOP", flops / 1e12);
  if (flops >= 1e9) return fmt::format("{:.2f} GFLOP", flops / 1e9);
  return fmt::format("{:.2f} MFLOP", flops / 1e6);
}

}  // namespace remat
