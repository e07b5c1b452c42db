// Count backend (see engine/core/count_backend.h).
#include "engine/core/count_backend.h"

#include <fmt/format.h>

#include <cstring>

namespace remat {
namespace {

// Fake, never-dereferenced, distinct and aligned addresses.
class FakeAllocator : public DeviceAllocator {
 public:
  explicit FakeAllocator(uintptr_t base) : next_(base) {}
  void* allocate(size_t bytes) override {
    void* p = reinterpret_cast<void*>(next_);
    next_ += (bytes + MemoryPool::kAlignment - 1) / MemoryPool::kAlignment * MemoryPool::kAlignment;
    return p;
  }
  void deallocate(void*, size_t) override {}

 private:
  uintptr_t next_;
};

}  // namespace

CountBackend::CountBackend(CountTarget target, uint64_t budget_bytes)
    : Backend(std::make_unique<MemoryPool>(std::make_unique<FakeAllocator>(uintptr_t{1} << 40),
                                           budget_bytes),
              // Host-pool budgets are checked by the planner, against the target's host memory.
              std::make_unique<MemoryPool>(std::make_unique<FakeAllocator>(uintptr_t{1} << 52),
                                           UINT64_MAX, MemoryPool::kHostSpace)),
      target_(std::move(target)) {}

std::string CountBackend::describe() const {
  return fmt::format("count (dry run for {}, {} activations)", device_name(target_.device),
                     dtype_name(target_.act_dtype));
}

void CountBackend::download(void* host, const Tensor& src) {
  std::memset(host, 0, src.bytes());
}

}  // namespace remat
