// Memory pool accounting (see engine/memory_pool.h).
#include "engine/memory_pool.h"

#include <fmt/format.h>

#include <algorithm>

#include "engine/units.h"

namespace remat {

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::Weights: return "weights";
    case MemCategory::Grads: return "grads";
    case MemCategory::Optimizer: return "optimizer";
    case MemCategory::Activations: return "activations";
    case MemCategory::Checkpoints: return "checkpoints";
    case MemCategory::Transient: return "transient";
    case MemCategory::Workspace: return "workspace";
    case MemCategory::kCount: break;
  }
  return "?";
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    pool_ = o.pool_;
    id_ = o.id_;
    tensor_ = o.tensor_;
    o.pool_ = nullptr;
    o.tensor_ = Tensor();
  }
  return *this;
}

void Buffer::reset() {
  if (pool_) pool_->release(id_);
  pool_ = nullptr;
  tensor_ = Tensor();
}

MemoryPool::MemoryPool(std::unique_ptr<DeviceAllocator> allocator, uint64_t budget_bytes)
    : allocator_(std::move(allocator)), budget_(budget_bytes) {}

MemoryPool::~MemoryPool() {
  // Buffers must not outlive their pool; a leak here is a programmer error, but destructors
  // must not abort, so free what is left.
  for (auto& [id, r] : records_) allocator_->deallocate(r.ptr, r.raw_bytes);
}

Buffer MemoryPool::allocate(const std::vector<int64_t>& shape, DType dtype,
                            MemCategory category, std::string name) {
  Tensor t(nullptr, shape, dtype);
  REMAT_ASSERT(t.numel() > 0, "allocation '{}' has empty shape {}", name, t.shape_str());
  size_t raw = std::max<size_t>(t.bytes(), 1);
  uint64_t bytes = accounted_bytes(raw);
  if (live_.total_bytes + bytes > budget_) throw_oom(name, t, category, bytes, false);
  void* ptr = allocator_->allocate(static_cast<size_t>(bytes));
  if (!ptr) throw_oom(name, t, category, bytes, true);
  t.data = ptr;

  uint64_t id = next_id_++;
  records_.emplace(id, Record{ptr, static_cast<size_t>(bytes), bytes, category, std::move(name)});
  live_.total_bytes += bytes;
  live_.by_category[static_cast<size_t>(category)] += bytes;
  if (live_.total_bytes > peak_.total_bytes) {
    peak_.total_bytes = live_.total_bytes;
    peak_.by_category = live_.by_category;
    peak_.phase = phase_;
    if (track_largest_) fill_largest(peak_);
  }

  Buffer b;
  b.pool_ = this;
  b.id_ = id;
  b.tensor_ = t;
  return b;
}

void MemoryPool::release(uint64_t id) {
  auto it = records_.find(id);
  REMAT_ASSERT(it != records_.end(), "double free of pool allocation {}", id);
  const Record& r = it->second;
  live_.total_bytes -= r.bytes;
  live_.by_category[static_cast<size_t>(r.category)] -= r.bytes;
  allocator_->deallocate(r.ptr, r.raw_bytes);
  records_.erase(it);
}

void MemoryPool::fill_largest(MemorySnapshot& snap) const {
  snap.largest.clear();
  for (const auto& [id, r] : records_) {
    LiveTensorInfo info{r.name, r.category, r.bytes};
    auto pos = std::find_if(snap.largest.begin(), snap.largest.end(),
                            [&](const LiveTensorInfo& x) { return x.bytes < info.bytes; });
    if (pos == snap.largest.end() && snap.largest.size() >= kLargestTracked) continue;
    snap.largest.insert(pos, std::move(info));
    if (snap.largest.size() > kLargestTracked) snap.largest.pop_back();
  }
}

MemorySnapshot MemoryPool::live_snapshot() const {
  MemorySnapshot s = live_;
  s.phase = phase_;
  fill_largest(s);
  return s;
}

void MemoryPool::reset_peak() {
  peak_ = live_;
  peak_.phase = phase_;
  fill_largest(peak_);
}

void MemoryPool::throw_oom(const std::string& name, const Tensor& t, MemCategory c, uint64_t bytes,
                           bool device_refused) const {
  std::string cats;
  for (int i = 0; i < kNumMemCategories; ++i) {
    uint64_t b = live_.by_category[static_cast<size_t>(i)];
    if (b) cats += fmt::format("{}{} {}", cats.empty() ? "" : ", ",
                               mem_category_name(static_cast<MemCategory>(i)), format_bytes(b));
  }
  std::string what =
      device_refused
          ? fmt::format("the device refused {} more", format_bytes(bytes))
          : fmt::format("live {} + {} > budget {}", format_bytes(live_.total_bytes),
                        format_bytes(bytes), format_bytes(budget_));
  throw OutOfMemory(fmt::format(
      "[memory] out of memory during {} allocating {} {} ({}, {}): {}; live: {}. Hint: try "
      "remat.policy = \"full\", a smaller train.batch_size or train.seq_len, or a larger "
      "device.memory; `remat-train plan` shows what fits.",
      phase_, name, t.shape_str(), mem_category_name(c), format_bytes(bytes), what,
      cats.empty() ? "nothing" : cats));
}

}  // namespace remat
