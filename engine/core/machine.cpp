// The machine's memory, and CPU time counters from /proc/stat (see engine/core/machine.h).
#include "engine/core/machine.h"

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace remat {

uint64_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page)
                               : (8ull << 30);
}

CpuTicks parse_proc_stat(std::string_view text) {
  // "cpu  user nice system idle iowait irq softirq steal guest guest_nice": guest time is already
  // counted in user, so the first eight fields are the whole.
  std::istringstream in{std::string(text.substr(0, text.find('\n')))};
  std::string label;
  uint64_t field[8] = {};
  if (!(in >> label) || label != "cpu") return {};
  for (uint64_t& x : field)
    if (!(in >> x)) return {};
  CpuTicks t;
  for (uint64_t x : field) t.total += x;
  t.steal = field[7];
  t.ok = true;
  return t;
}

CpuTicks read_cpu_ticks() {
  std::ifstream f("/proc/stat");
  std::string first_line;
  if (!std::getline(f, first_line)) return {};
  return parse_proc_stat(first_line);
}

double steal_share(const CpuTicks& before, const CpuTicks& after) {
  if (!before.ok || !after.ok || after.total <= before.total || after.steal < before.steal)
    return -1;
  return static_cast<double>(after.steal - before.steal) /
         static_cast<double>(after.total - before.total);
}

std::string unsteady_floor_warning(double lowest, double highest) {
  if (!(lowest > 0) || highest <= kUnsteadyFloor * lowest) return "";
  return fmt::format(
      "warning: the SGEMM floor moved from {:.1f} to {:.1f} GFLOP/s during the run (other work "
      "on the host's cores, caches or memory; CPU steal shows only part of it): the shares of it "
      "are unreliable; compare only runs made side by side, or rerun while it holds steady",
      lowest / 1e9, highest / 1e9);
}

}  // namespace remat
