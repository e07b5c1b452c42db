// Tensor: a non-owning view (pointer, shape, dtype). Storage comes from the memory pool
// (engine/core/memory_pool.h), which owns; a Tensor only looks. Shapes are row-major, at most 4-D.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine/core/error.h"

namespace remat {

enum class DType : uint8_t { F32, BF16, I32 };

inline size_t dtype_size(DType t) {
  return t == DType::BF16 ? 2 : 4;
}
const char* dtype_name(DType t);

/// A shape of rank 1..4 (0 only for an empty Tensor's, default-constructed), held inline. Every op
/// of every tile builds shapes ({rows, width}), and a heap vector per shape was much of a dry run's
/// time at millions of tokens.
struct Dims {
  std::array<int64_t, 4> d{};
  int n = 0;

  Dims() = default;  // rank 0: the shape of an empty Tensor
  Dims(std::initializer_list<int64_t> dims) { assign(dims.begin(), dims.end()); }
  // Implicit, as the vector parameters it replaced were: stored shapes pass.
  Dims(const std::vector<int64_t>& dims) { assign(dims.data(), dims.data() + dims.size()); }
  const int64_t* begin() const { return d.data(); }
  const int64_t* end() const { return d.data() + n; }
  size_t size() const { return static_cast<size_t>(n); }
  int64_t operator[](size_t i) const { return d[i]; }

 private:
  void assign(const int64_t* first, const int64_t* last) {
    REMAT_ASSERT(last - first >= 1 && last - first <= 4, "tensor rank {} not in 1..4",
                 last - first);
    for (; first != last; ++first) d[static_cast<size_t>(n++)] = *first;
  }
};

struct Tensor {
  void* data = nullptr;
  Dims shape;
  DType dtype = DType::F32;

  Tensor() = default;
  Tensor(void* ptr, const Dims& dims, DType type);

  bool empty() const { return data == nullptr; }
  int ndim() const { return shape.n; }
  int64_t dim(int i) const { return shape[static_cast<size_t>(i < 0 ? ndim() + i : i)]; }
  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  /// Number of rows when the tensor is seen as a (rows, last dim) matrix.
  int64_t rows() const { return ndim() == 0 ? 0 : numel() / dim(-1); }
  std::string shape_str() const;

  float* f32() const {
    REMAT_DCHECK(dtype == DType::F32, "tensor is {} not f32", dtype_name(dtype));
    return static_cast<float*>(data);
  }
  int32_t* i32() const {
    REMAT_DCHECK(dtype == DType::I32, "tensor is {} not i32", dtype_name(dtype));
    return static_cast<int32_t*>(data);
  }
  /// Same storage, other shape (same element count).
  Tensor view(const Dims& dims) const;
  /// Rows [first, first + count) of the tensor seen as a (rows, last dim) matrix, as (count, last).
  Tensor row_range(int64_t first, int64_t count) const;
};

}  // namespace remat
