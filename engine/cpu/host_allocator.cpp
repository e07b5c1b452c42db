// Host memory with freed blocks kept for reuse (see engine/cpu/host_allocator.h).
#include "engine/cpu/host_allocator.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace remat::cpu {

namespace {

// A cached block is no tensor's: under AddressSanitizer any access to it is reported, as it was
// when released buffers went straight back to free().
#if defined(__SANITIZE_ADDRESS__)
void poison(void* p, size_t bytes) {
  ASAN_POISON_MEMORY_REGION(p, bytes);
}
void unpoison(void* p, size_t bytes) {
  ASAN_UNPOISON_MEMORY_REGION(p, bytes);
}
#else
void poison(void*, size_t) {}
void unpoison(void*, size_t) {}
#endif

}  // namespace

HostAllocator::~HostAllocator() {
  for (auto& [age, block] : by_age_) {
    unpoison(block.ptr, block.bytes);
    std::free(block.ptr);
  }
}

void* HostAllocator::allocate(size_t bytes) {
  // The newest block of this size (a multimap keeps equal keys in insertion order): the one most
  // likely still in cache.
  auto [first, last] = by_size_.equal_range(bytes);
  if (first != last) {
    const auto newest = std::prev(last);
    void* ptr = by_age_.at(newest->second).ptr;
    by_age_.erase(newest->second);
    by_size_.erase(newest);
    cached_ -= bytes;
    live_ += bytes;
    unpoison(ptr, bytes);
    return ptr;
  }
  while (!by_age_.empty() && live_ + cached_ + bytes > high_water_) evict_oldest();
  void* ptr = std::aligned_alloc(MemoryPool::kAlignment, bytes);
  if (!ptr && !by_age_.empty()) {  // what is cached may be what the system lacks
    while (!by_age_.empty()) evict_oldest();
    ptr = std::aligned_alloc(MemoryPool::kAlignment, bytes);
  }
  if (!ptr) return nullptr;
  live_ += bytes;
  high_water_ = std::max(high_water_, live_);
  return ptr;
}

void HostAllocator::deallocate(void* ptr, size_t bytes) {
  live_ -= bytes;
  const uint64_t age = next_age_++;
  by_age_.emplace(age, Cached{ptr, bytes});
  by_size_.emplace(bytes, age);
  cached_ += bytes;
  poison(ptr, bytes);
}

void HostAllocator::evict_oldest() {
  auto oldest = by_age_.begin();
  const Cached block = oldest->second;
  auto [first, last] = by_size_.equal_range(block.bytes);
  by_size_.erase(
      std::find_if(first, last, [&](const auto& e) { return e.second == oldest->first; }));
  by_age_.erase(oldest);
  cached_ -= block.bytes;
  unpoison(block.ptr, block.bytes);
  std::free(block.ptr);
}

}  // namespace remat::cpu
