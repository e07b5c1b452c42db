// Op workspaces, declared once. An op's workspace is the scratch memory it holds from the pool
// for its own duration (category workspace): a GEMM's library workspace, an attention tile
// block, a chunk of LM-head logits. Each backend states what each op needs as a pure function
// of the op's arguments, `workspace(args, target) -> [{name, dtype, shape}]`, in a header with no
// device code (engine/cpu/workspace.h, engine/cuda/workspace.h). Backend (engine/backend.cpp)
// allocates that list, in order, before it calls the op's implementation, which only uses the
// parts it is handed. The count backend (what the planner runs) allocates the list of the
// backend it stands in for and computes nothing, so a plan's workspace bytes are the real
// run's by construction: there is no second copy of any formula to keep in step.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/memory_pool.h"
#include "engine/tensor.h"

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
  const char* name;  // the pool record's name: "gemm.workspace", "attn.workspace", ...
  DType dtype;
  Dims shape;
};
using WorkspaceList = std::vector<WorkspacePart>;

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
  std::vector<std::pair<const char*, Buffer>> parts_;
};

/// The LM-head loss's chunk of logits, (chunk_rows, V) f32, on every backend.
struct LmHeadLossArgs;
WorkspacePart logits_chunk_part(const LmHeadLossArgs& a);

}  // namespace remat
