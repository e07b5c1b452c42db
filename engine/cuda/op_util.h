// Small helpers the CUDA ops share (host code). Internal to engine/cuda.
#pragma once

#include <fmt/format.h>

#include <cstdint>

#include "engine/core/error.h"
#include "engine/core/tensor.h"

namespace remat::cuda {

inline bool is_bf16(const Tensor& t) {
  return t.dtype == DType::BF16;
}

/// Address of element `elem_offset` of `t`, whatever its dtype.
inline char* byte_ptr(const Tensor& t, int64_t elem_offset) {
  return static_cast<char*>(t.data) + elem_offset * static_cast<int64_t>(dtype_size(t.dtype));
}

/// Documents (data.attention = "document": an op's doc_start) have no CUDA kernels yet; the train
/// command refuses such a run before it starts, and the ops once more, in one line.
inline void refuse_documents(const Tensor& doc_start, const char* op) {
  if (!doc_start.empty())
    throw BackendError(fmt::format(
        "[cuda] {}: data.attention = \"document\" has no CUDA kernel yet (docs/gpu.md). Fix: set "
        "device.backend = \"cpu\", or data.attention = \"causal\"",
        op));
}

}  // namespace remat::cuda
