// Sizes and counts as people write them: "512MiB", "80GiB", "1.5GB", "4k", "1M".
// Parsing returns std::nullopt on malformed text; callers turn that into a ConfigError.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace remat {

/// Bytes from "512MiB", "80GiB", "1.5GB", "4096" (plain bytes). Binary (KiB..TiB) and decimal
/// (kB..TB) units; case-insensitive; optional space before the unit.
std::optional<uint64_t> parse_size(std::string_view text);
/// Counts from "4k", "32K", "1M", "1.5k" (k = 1024, M = 1024^2: sequence lengths are powers of 2).
std::optional<int64_t> parse_count(std::string_view text);
/// The largest memory budget accepted anywhere (device.memory, --memory): 1 PiB, far above any
/// device, far below where byte arithmetic overflows.
constexpr uint64_t kMaxMemoryBytes = 1ull << 50;
/// Why `bytes` is not a memory budget (0, or over kMaxMemoryBytes), or nullopt when it is one.
/// The config key and the --memory flag share it, so a budget means the same in both.
std::optional<std::string> memory_budget_problem(uint64_t bytes);
inline constexpr const char* kMemoryBudgetFix =
    "give a budget between 1 B and 1 PiB, e.g. \"512MiB\" or \"80GiB\", or leave it out for the "
    "machine's memory";
/// "1.50 GiB", "512.0 MiB", "640 B".
std::string format_bytes(uint64_t bytes);
/// Sequence lengths the way users type them: "64k", "2M" (k = 1024, M = 1024^2), else exact:
/// "1000".
std::string format_count(int64_t n);
/// 2598161 -> "2,598,161": an exact count a person can read.
std::string format_grouped(int64_t n);
/// "12.3 GFLOP", "1.20 TFLOP".
std::string format_flops(double flops);

}  // namespace remat
