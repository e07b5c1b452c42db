// Op workspaces (see engine/core/workspace.h).
#include "engine/core/workspace.h"

#include <algorithm>

#include "engine/core/error.h"
#include "engine/core/ops/loss.h"

namespace remat {

OpWorkspace::OpWorkspace(MemoryPool& pool, const WorkspaceList& list) {
  for (const WorkspacePart& p : list) {
    buffers_[size_] = pool.allocate(p.shape, p.dtype, MemCategory::Workspace, p.name);
    names_[size_++] = p.name;
  }
}

OpWorkspace::~OpWorkspace() {
  while (size_ > 0) buffers_[--size_].reset();  // last allocated, first freed
}

const Buffer* OpWorkspace::find(std::string_view name) const {
  for (size_t i = 0; i < size_; ++i)
    if (name == names_[i]) return &buffers_[i];
  return nullptr;
}

const Buffer& OpWorkspace::at(std::string_view name) const {
  const Buffer* b = find(name);
  REMAT_ASSERT(b != nullptr, "op workspace: no part named {}", name);
  return *b;
}

WorkspacePart logits_chunk_part(const LmHeadLossArgs& a) {
  const int64_t N = a.inp.rows(), V = a.weight.dim(0);
  const int64_t rows = a.chunk_rows > 0 ? std::min(a.chunk_rows, N) : N;
  return {"lm_head.logits_chunk", DType::F32, {rows, V}};
}

}  // namespace remat
