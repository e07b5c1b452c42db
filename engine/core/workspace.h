// Op workspaces, declared once. An op's workspace is the scratch memory it holds from the pool
// for its own duration (category workspace): a GEMM's library workspace, an attention tile
// block, a chunk of LM-head logits. Each backend states what each op needs as a pure function
// of the op's arguments, `workspace(args, target) -> [{name, dtype, shape}]`, in a header with no
// device code (engine/core/cpu_workspace.h, engine/core/cuda_workspace.h). Backend
// (engine/core/backend.cpp) allocates that list, in order, before it calls the op's implementation,
// which only uses the parts it is handed. The count backend (what the planner runs) allocates the
// list of the backend it stands in for and computes nothing, so a plan's workspace bytes are the
// real run's by construction: there is no second copy of any formula to keep in step.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "engine/core/error.h"
#include "engine/core/memory_pool.h"
#include "engine/core/tensor.h"

namespace remat {

/// Which backend's workspace rules apply, and what they depend on besides the op's arguments.
enum class DeviceKind : uint8_t { Cpu, Cuda };
inline const char* device_name(DeviceKind d) {
  return d == DeviceKind::Cuda ? "cuda" : "cpu";
}
struct WorkspaceTarget {
  DeviceKind device = DeviceKind::Cpu;
  int threads = 1;  // cpu: OpenMP threads (attention keeps one tile block per thread)
};

/// One pool allocation an op holds while it runs.
struct WorkspacePart {
  const char* name = nullptr;  // the pool record's name: "gemm.workspace", "attn.workspace", ...
  DType dtype = DType::F32;
  Dims shape;
};

/// An op's parts, held inline rather than in a heap vector: every op call builds one, and the
/// planner's dry runs make millions of op calls at long sequences (two heap lists per call,
/// this and OpWorkspace's, were ~5% of `plan`'s time at 6M tokens).
class WorkspaceList {
 public:
  /// The most parts any rule asks for (the CUDA linear backward's with LoRA adapters and dropout:
  /// the weight's copy, the GEMM workspace, h, dh, the dropped input, the bf16 A and B).
  static constexpr size_t kMaxParts = 8;

  WorkspaceList() = default;
  WorkspaceList(std::initializer_list<WorkspacePart> parts) {
    for (const WorkspacePart& p : parts) push_back(p);
  }
  void push_back(const WorkspacePart& p) {
    REMAT_ASSERT(size_ < kMaxParts, "op workspace: more than {} parts ({})", kMaxParts, p.name);
    parts_[size_++] = p;
  }
  const WorkspacePart* begin() const { return parts_.data(); }
  const WorkspacePart* end() const { return parts_.data() + size_; }

 private:
  std::array<WorkspacePart, kMaxParts> parts_{};
  size_t size_ = 0;
};

/// The parts of a WorkspaceList, allocated (the count backend's have fake addresses).
class OpWorkspace {
 public:
  OpWorkspace(MemoryPool& pool, const WorkspaceList& list);
  ~OpWorkspace();
  OpWorkspace(const OpWorkspace&) = delete;
  OpWorkspace& operator=(const OpWorkspace&) = delete;
  /// The part named `name`, or nullptr when the rule did not ask for it this time.
  const Buffer* find(std::string_view name) const;
  /// The part named `name`; it must be there.
  const Buffer& at(std::string_view name) const;

 private:
  std::array<const char*, WorkspaceList::kMaxParts> names_{};
  std::array<Buffer, WorkspaceList::kMaxParts> buffers_;
  size_t size_ = 0;
};

/// The LM-head loss's chunk of logits, (chunk_rows, V) f32, on every backend.
struct LmHeadLossArgs;
WorkspacePart logits_chunk_part(const LmHeadLossArgs& a);

}  // namespace remat
