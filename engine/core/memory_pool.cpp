// Memory pool accounting (see engine/core/memory_pool.h).
#include "engine/core/memory_pool.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>

#include "engine/core/units.h"

namespace remat {

const char* mem_category_name(MemCategory c) {
  static constexpr const char* kNames[] = {"weights",     "grads",     "optimizer", "activations",
                                           "checkpoints", "transient", "workspace"};
  static_assert(std::size(kNames) == kNumMemCategories);
  const auto i = static_cast<size_t>(c);
  return i < std::size(kNames) ? kNames[i] : "?";
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

MemoryPool::MemoryPool(std::unique_ptr<DeviceAllocator> allocator, uint64_t budget_bytes,
                       Space space)
    : allocator_(std::move(allocator)), budget_(budget_bytes), space_(space) {}

MemoryPool::~MemoryPool() {
  // Buffers must not outlive their pool; a leak here is a programmer error, but destructors
  // must not abort, so free what is left.
  for (auto& r : records_)
    if (r.live) allocator_->deallocate(r.ptr, r.raw_bytes);
}

Buffer MemoryPool::allocate(const Dims& shape, DType dtype, MemCategory category,
                            std::string name) {
  Tensor t(nullptr, shape, dtype);
  REMAT_ASSERT(t.numel() > 0, "allocation '{}' has empty shape {}", name, t.shape_str());
  size_t raw = std::max<size_t>(t.bytes(), 1);
  uint64_t bytes = accounted_bytes(raw);
  if (live_.total_bytes + bytes > budget_) throw_oom(name, t, category, bytes, false);
  void* ptr = allocator_->allocate(static_cast<size_t>(bytes));
  if (!ptr) throw_oom(name, t, category, bytes, true);
  t.data = ptr;

  uint64_t id = records_.size();
  if (!free_slots_.empty()) {
    id = free_slots_.back();
    free_slots_.pop_back();
  } else {
    records_.emplace_back();
  }
  const uint64_t seq = next_seq_++;
  records_[id] =
      Record{ptr, static_cast<size_t>(bytes), bytes, category, std::move(name), seq, true};
  if (track_largest_) by_size_.insert({bytes, seq, id});
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
  REMAT_ASSERT(id < records_.size() && records_[id].live, "double free of pool allocation {}", id);
  Record& r = records_[id];
  live_.total_bytes -= r.bytes;
  live_.by_category[static_cast<size_t>(r.category)] -= r.bytes;
  allocator_->deallocate(r.ptr, r.raw_bytes);
  if (track_largest_) by_size_.erase({r.bytes, r.seq, id});
  r.live = false;
  r.name.clear();
  free_slots_.push_back(id);
}

void MemoryPool::fill_largest(MemorySnapshot& snap) const {
  if (!track_largest_) return scan_largest(snap);
  snap.largest.clear();
  for (const SizeKey& k : by_size_) {
    if (snap.largest.size() >= kLargestTracked) break;
    const Record& r = records_[k.slot];
    snap.largest.push_back({r.name, r.category, r.bytes});
  }
}

// Without the index (the planner's binary searches): one pass, for the rare snapshot they take.
void MemoryPool::scan_largest(MemorySnapshot& snap) const {
  std::vector<const Record*> live;
  for (const Record& r : records_)
    if (r.live) live.push_back(&r);
  const size_t n = std::min(live.size(), kLargestTracked);
  std::partial_sort(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(n), live.end(),
                    [](const Record* a, const Record* b) {
                      return SizeKey{a->bytes, a->seq, 0} < SizeKey{b->bytes, b->seq, 0};
                    });
  snap.largest.clear();
  for (size_t i = 0; i < n; ++i)
    snap.largest.push_back({live[i]->name, live[i]->category, live[i]->bytes});
}

void MemoryPool::set_track_largest(bool on) {
  if (on == track_largest_) return;
  track_largest_ = on;
  by_size_.clear();
  if (on)
    for (uint64_t slot = 0; slot < records_.size(); ++slot)
      if (records_[slot].live) by_size_.insert({records_[slot].bytes, records_[slot].seq, slot});
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
    if (b)
      cats += fmt::format("{}{} {}", cats.empty() ? "" : ", ",
                          mem_category_name(static_cast<MemCategory>(i)), format_bytes(b));
  }
  std::string what = device_refused
                         ? fmt::format("the {} refused {} more", space_.name, format_bytes(bytes))
                         : fmt::format("live {} + {} > budget {}", format_bytes(live_.total_bytes),
                                       format_bytes(bytes), format_bytes(budget_));
  throw OutOfMemory(
      fmt::format("[memory] out of memory on the {} during {} allocating {} {} ({}, {}): "
                  "{}; live: {}. {}",
                  space_.name, phase_, name, t.shape_str(), mem_category_name(c),
                  format_bytes(bytes), what, cats.empty() ? "nothing" : cats, space_.fix));
}

}  // namespace remat
