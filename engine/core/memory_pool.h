// The memory pool: every byte a run uses on the compute device goes through it (weights,
// gradients, optimizer state, saved activations, checkpoints, transient buffers, workspaces).
// It keeps live and peak bytes per category, enforces the budget (device.memory) and throws
// OutOfMemory with the breakdown. Its numbers are the ones the tool prints and the planner
// predicts: the planner runs the same code on a pool whose allocator hands out fake addresses.
//
// Accounting unit: every allocation is rounded up to kAlignment bytes, on every device, so
// that predicted and measured bytes are the same integers.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/tensor.h"

namespace remat {

enum class MemCategory : uint8_t {
  Weights,      // parameters
  Grads,        // parameter gradients
  Optimizer,    // AdamW moments
  Activations,  // tensors saved for the backward pass (and recomputed ones)
  Checkpoints,  // segment inputs kept by a remat policy
  Transient,    // activation gradients, the loss head's outputs, batch tokens
  Workspace,    // scratch space inside ops
  kCount
};
constexpr int kNumMemCategories = static_cast<int>(MemCategory::kCount);
const char* mem_category_name(MemCategory c);

/// Raw storage of one memory space. Implementations: host memory (cpu, and the host pool of
/// offloading), fake addresses (count), stream-ordered device memory and pinned host memory (cuda).
class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;
  /// Returns `bytes` of storage aligned to MemoryPool::kAlignment, or nullptr when the device
  /// itself is out of memory (the pool turns that into OutOfMemory).
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
};

struct LiveTensorInfo {
  std::string name;
  MemCategory category = MemCategory::Transient;
  uint64_t bytes = 0;
};

/// What was live at one moment: the total, per category, the phase label and the largest tensors.
struct MemorySnapshot {
  uint64_t total_bytes = 0;
  std::array<uint64_t, kNumMemCategories> by_category{};
  std::string phase;
  std::vector<LiveTensorInfo> largest;  // descending by bytes, at most kLargestTracked
};

class MemoryPool;

/// Owning handle of one pool allocation (RAII, move-only). Gives a Tensor view of its storage.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void reset();
  bool empty() const { return pool_ == nullptr; }
  const Tensor& tensor() const { return tensor_; }
  operator const Tensor&() const { return tensor_; }  // NOLINT: a Buffer is used where a view is
  float* f32() const { return tensor_.f32(); }

 private:
  friend class MemoryPool;
  MemoryPool* pool_ = nullptr;
  uint64_t id_ = 0;
  Tensor tensor_;
};

class MemoryPool {
 public:
  static constexpr size_t kAlignment = 256;
  static constexpr size_t kLargestTracked = 6;

  /// Which memory a pool holds, as its out-of-memory message names it, with that message's fix.
  struct Space {
    const char* name;  // "device" | "host"
    const char* fix;
  };
  static constexpr Space kDeviceSpace{
      "device",
      "Fix: try remat.policy = \"full\", a smaller train.batch_size or train.seq_len, or a larger "
      "device.memory; `remat-train plan` shows what fits."};
  static constexpr Space kHostSpace{
      "host",
      "Fix: raise device.host_memory (pinned host memory for offloaded tensors), or offload less "
      "(remat.offload); `remat-train plan` shows what fits."};

  MemoryPool(std::unique_ptr<DeviceAllocator> allocator, uint64_t budget_bytes,
             Space space = kDeviceSpace);
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  /// Allocates a tensor; throws OutOfMemory when the budget (or the device) cannot hold it.
  /// `name` is what out-of-memory messages and the planner's "largest tensors" show.
  Buffer allocate(const Dims& shape, DType dtype, MemCategory category, std::string name);
  static uint64_t accounted_bytes(size_t bytes) {
    return (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }

  uint64_t budget_bytes() const { return budget_; }
  uint64_t live_bytes() const { return live_.total_bytes; }
  uint64_t peak_bytes() const { return peak_.total_bytes; }
  uint64_t live_bytes(MemCategory c) const { return live_.by_category[static_cast<size_t>(c)]; }
  /// Live bytes per category at the moment of the overall peak (they add up to peak_bytes()).
  const MemorySnapshot& peak_snapshot() const { return peak_; }
  MemorySnapshot live_snapshot() const;

  /// Labels what the run is doing ("forward", "backward block 3", ...); recorded with the peak.
  void set_phase(std::string phase) { phase_ = std::move(phase); }
  const std::string& phase() const { return phase_; }
  /// Starts a new peak measurement from what is live now.
  void reset_peak();
  /// Whether the peak snapshot lists the largest live tensors (costs O(kLargestTracked) per new
  /// peak; the planner's binary searches turn it off).
  void set_track_largest(bool on);

 private:
  friend class Buffer;
  void release(uint64_t id);
  void fill_largest(MemorySnapshot& snap) const;
  [[noreturn]] void throw_oom(const std::string& name, const Tensor& t, MemCategory c,
                              uint64_t bytes, bool device_refused) const;

  struct Record {
    void* ptr = nullptr;
    size_t raw_bytes = 0;
    uint64_t bytes = 0;
    MemCategory category = MemCategory::Transient;
    std::string name;
    uint64_t seq = 0;  // allocation order: ties in "largest" list the older tensor first
    bool live = false;
  };
  // The largest-first index of live allocations: (bytes descending, seq ascending) -> slot.
  struct SizeKey {
    uint64_t bytes, seq, slot;
    bool operator<(const SizeKey& o) const {
      return bytes != o.bytes ? bytes > o.bytes : seq < o.seq;
    }
  };
  void scan_largest(MemorySnapshot& snap) const;
  std::unique_ptr<DeviceAllocator> allocator_;
  uint64_t budget_;
  Space space_;
  // Records live in slots (a Buffer's id is its slot) reused through a free list: O(1) per
  // allocation and release. While the largest tensors are tracked, by_size_ indexes the live
  // ones largest first, so a new peak lists them in O(kLargestTracked) and allocate/release stay
  // O(log n). (Scanning every record at each new peak made setup quadratic in n_layer.)
  std::vector<Record> records_;
  std::vector<uint64_t> free_slots_;
  uint64_t next_seq_ = 0;
  std::set<SizeKey> by_size_;
  MemorySnapshot live_;
  MemorySnapshot peak_;
  std::string phase_ = "setup";
  bool track_largest_ = true;
};

}  // namespace remat
