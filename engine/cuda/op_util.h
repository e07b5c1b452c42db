// Small helpers the CUDA ops share (host code). Internal to engine/cuda.
#pragma once

#include <cstdint>

#include "engine/core/tensor.h"

namespace remat::cuda {

inline bool is_bf16(const Tensor& t) {
  return t.dtype == DType::BF16;
}

/// Address of element `elem_offset` of `t`, whatever its dtype.
inline char* byte_ptr(const Tensor& t, int64_t elem_offset) {
  return static_cast<char*>(t.data) + elem_offset * static_cast<int64_t>(dtype_size(t.dtype));
}

}  // namespace remat::cuda
