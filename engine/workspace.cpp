// Op workspaces (see engine/workspace.h).
#include "engine/workspace.h"

#include <algorithm>

#include "engine/error.h"
#include "engine/ops/loss.h"

namespace remat {

OpWorkspace::OpWorkspace(MemoryPool& pool, const WorkspaceList& list) {
  parts_.reserve(list.size());
  for (const WorkspacePart& p : list)
    parts_.emplace_back(p.name, pool.allocate(p.shape, p.dtype, MemCategory::Workspace, p.name));
}

OpWorkspace::~OpWorkspace() {
  while (!parts_.empty()) parts_.pop_back();  // last allocated, first freed
}

const Buffer* OpWorkspace::find(std::string_view name) const {
  for (const auto& [n, buf] : parts_)
    if (name == n) return &buf;
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
