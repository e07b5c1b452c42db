// Host memory for the CPU backend's pools, with freed blocks kept for reuse. Internal to
// engine/cpu (cpu_backend.h's make_host_allocator hands one out).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

#include "engine/core/memory_pool.h"

namespace remat::cpu {

/// 256-byte aligned host memory that keeps what the pool frees, to hand the same block to the
/// next request of the same size.
///
/// Why: a training step allocates the same sizes in the same order every step, and a block that
/// goes back to the C library is, for large sizes, unmapped (or trimmed off the heap) and then
/// faulted in again, page by page, when the next step writes it. Measured on the 2-core Intel VM
/// (2026-12-02, configs/mlp4.toml, policy none, 20 steps): 7,000-10,000 page faults a step
/// without the cache, as many as glibc's heap trimming happened to give back, and the step 2-8%
/// slower (115-118 against 109-112 ms, alternated runs); with it, almost none.
///
/// The cache never makes the allocator hold more than the most that was live at once: before it
/// takes fresh memory it frees cached blocks, the longest-unused first, until live + cached + the
/// request fit in that high-water mark. So this allocator holds no more than the pool's peak, the
/// number the planner predicts (what the C library keeps of freed blocks aside). Not thread-safe,
/// like the pool that owns it. In an AddressSanitizer build a cached block is poisoned, so a stale
/// view of a released buffer is still reported.
class HostAllocator : public DeviceAllocator {
 public:
  HostAllocator() = default;
  ~HostAllocator() override;
  HostAllocator(const HostAllocator&) = delete;
  HostAllocator& operator=(const HostAllocator&) = delete;

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;

  uint64_t live_bytes() const { return live_; }
  uint64_t cached_bytes() const { return cached_; }
  /// The most that was live at once: live + cached never exceeds it after an allocation.
  uint64_t high_water_bytes() const { return high_water_; }

 private:
  struct Cached {
    void* ptr;
    size_t bytes;
  };
  void evict_oldest();

  // Cached blocks by the order they were freed (oldest first) and by size (-> that order's key).
  std::map<uint64_t, Cached> by_age_;
  std::multimap<size_t, uint64_t> by_size_;
  uint64_t next_age_ = 0;
  uint64_t live_ = 0, cached_ = 0, high_water_ = 0;
};

}  // namespace remat::cpu
