// The machine this process runs on: its physical memory (the default host budget), and how much
// of it other work takes while this process times something: on a VM, the CPU time the hypervisor
// gives other guests shows as steal in /proc/stat, and no load average sees it. cmd/report.cpp
// prints it beside every timing (bench, fit, compare, sweep).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace remat {

/// Physical memory of this machine (the CPU backend's default budget; 8 GiB when unknown).
uint64_t host_memory_bytes();

/// The machine's CPU time counters in clock ticks (all cores together).
struct CpuTicks {
  uint64_t total = 0;  // user + nice + system + idle + iowait + irq + softirq + steal
  uint64_t steal = 0;
  bool ok = false;  // false: no readable "cpu" line
};

/// The counters of the aggregate "cpu" line that starts /proc/stat's text.
CpuTicks parse_proc_stat(std::string_view text);
/// This machine's counters now (ok false where there is no /proc/stat).
CpuTicks read_cpu_ticks();
/// Steal's share of the CPU time that passed between two readings, 0..1; negative when either
/// reading failed or no time passed.
double steal_share(const CpuTicks& before, const CpuTicks& after);

/// A benchmark's SGEMM floor moved by more than this factor (highest / lowest of its readings)
/// means the machine's speed changed under it. Seen on an AMD EPYC VM with no steal at all: the
/// floor fell from 157 to 85 GFLOP/s within one run (other guests on the host's caches and memory
/// bandwidth, which no counter of the guest shows).
constexpr double kUnsteadyFloor = 1.25;
/// The one-line warning for floor readings between `lowest` and `highest` (FLOP/s), or "" while
/// they stay within kUnsteadyFloor.
std::string unsteady_floor_warning(double lowest, double highest);

}  // namespace remat
