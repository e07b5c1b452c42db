// The CPU backend's host allocator (engine/cpu/host_allocator.h): a freed block goes to the next
// request of its size, the cache never holds more than the high-water mark of live bytes, and a
// steady training step therefore faults in (almost) no fresh pages.
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <fstream>

#include "data/synthetic.h"
#include "engine/config/config.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/host_allocator.h"
#include "engine/remat/executor.h"
#include "engine/training/trainer.h"
#include "layers/models.h"
#include "tests/configs.h"
#include "tests/test_util.h"

using namespace remat;

namespace {

constexpr size_t kMiB = size_t{1} << 20;

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

}  // namespace

TEST_CASE("host allocator: a freed block goes to the next request of its size, the newest first",
          "[memory]") {
  cpu::HostAllocator alloc;
  void* a = alloc.allocate(kMiB);
  void* b = alloc.allocate(kMiB);
  void* g = alloc.allocate(4 * kMiB);  // a high-water mark of 6 MiB: room to cache in
  REQUIRE((a && b && g));
  alloc.deallocate(g, 4 * kMiB);
  alloc.deallocate(a, kMiB);
  alloc.deallocate(b, kMiB);
  CHECK(alloc.cached_bytes() == 6 * kMiB);
  CHECK(alloc.allocate(kMiB) == b);  // freed last: the one most likely still in cache
  CHECK(alloc.allocate(kMiB) == a);
  CHECK(alloc.cached_bytes() == 4 * kMiB);
  CHECK(alloc.live_bytes() == 2 * kMiB);
  // A block of another size is not handed out for this one: a request 256 bytes larger than a
  // leaves a cached (only the older 4 MiB block goes, to stay within the mark).
  alloc.deallocate(a, kMiB);
  void* c = alloc.allocate(kMiB + MemoryPool::kAlignment);
  CHECK(alloc.cached_bytes() == kMiB);
  CHECK(alloc.allocate(kMiB) == a);
  alloc.deallocate(a, kMiB);
  alloc.deallocate(b, kMiB);
  alloc.deallocate(c, kMiB + MemoryPool::kAlignment);
  CHECK(alloc.live_bytes() == 0);
}

TEST_CASE(
    "host allocator: live + cached never exceeds the most that was live at once, and the "
    "longest-unused blocks go first",
    "[memory]") {
  cpu::HostAllocator alloc;
  void* a = alloc.allocate(1 * kMiB);
  void* b = alloc.allocate(1 * kMiB);
  void* c = alloc.allocate(2 * kMiB);
  CHECK(alloc.high_water_bytes() == 4 * kMiB);
  alloc.deallocate(a, 1 * kMiB);
  alloc.deallocate(b, 1 * kMiB);
  alloc.deallocate(c, 2 * kMiB);
  CHECK(alloc.cached_bytes() == 4 * kMiB);
  // 1.5 MiB matches nothing: a and b (freed first) go back to the system, and c (2 MiB) stays,
  // since 2 + 1.5 fits in the high-water mark of 4.
  void* d = alloc.allocate(3 * kMiB / 2);
  CHECK(alloc.cached_bytes() == 2 * kMiB);
  CHECK(alloc.live_bytes() + alloc.cached_bytes() <= alloc.high_water_bytes());
  CHECK(alloc.allocate(2 * kMiB) == c);
  CHECK(alloc.cached_bytes() == 0);
  // A request past the high-water mark empties the cache and raises the mark.
  alloc.deallocate(c, 2 * kMiB);
  void* e = alloc.allocate(4 * kMiB);
  CHECK(alloc.cached_bytes() == 0);
  CHECK(alloc.high_water_bytes() == 3 * kMiB / 2 + 4 * kMiB);
  alloc.deallocate(d, 3 * kMiB / 2);
  alloc.deallocate(e, 4 * kMiB);
  CHECK(alloc.live_bytes() == 0);
}

// The reason for the cache: memory given back to the C library between steps came back as
// 7,000-10,000 fresh pages a step for the tutorial MLP (each a page fault and a zeroed page).
TEST_CASE("a steady training step on the CPU faults in almost no fresh pages", "[memory]") {
  // NUMA balancing unmaps pages to see who touches them: its faults are not the allocator's.
  if (std::ifstream numa("/proc/sys/kernel/numa_balancing"); numa) {
    int on = 0;
    if (numa >> on && on != 0) {
      WARN("skipped: kernel.numa_balancing is on, and its hinting faults count as minor faults");
      return;
    }
  }
  const Config cfg = parse_config(test::small_mlp_toml(2, 512, 2048), "mlp");
  cpu::CpuBackend be(4ull << 30, test::kTestThreads);
  auto model = make_model(cfg, be);
  auto data = make_synthetic_data(cfg);
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data);
  for (int s = 0; s < 3; ++s) trainer.step();  // warm-up: the pool reaches its peak
  const long before = minor_faults();
  for (int s = 0; s < 2; ++s) trainer.step();
  const long faults = minor_faults() - before;
  // A step's transient tensors alone (activation gradients, the batch) are 4 MiB each here,
  // 1024 pages: without the cache every step faulted thousands of pages in again.
  const long step_pages = static_cast<long>(be.pool().peak_bytes() / 4096);
  INFO("minor page faults in 2 steady steps: " << faults << " (the pool's peak is " << step_pages
                                               << " pages)");
  CHECK(faults < step_pages / 16);
}
