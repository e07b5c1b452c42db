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

// NF4 and NF4DQ: a frozen base weight in bitsandbytes' 4-bit NormalFloat, its blocks' absmax in
// f32 (NF4) or 8-bit quantised (NF4DQ, double quant); engine/core/nf4.h has the layout. A tensor of
// either has its logical shape, (out, in), and no per-element size: only GEMMs read it, whole.
enum class DType : uint8_t { F32, BF16, I32, NF4, NF4DQ };

inline bool is_nf4(DType t) {
  return t == DType::NF4 || t == DType::NF4DQ;
}
inline size_t dtype_size(DType t) {
  REMAT_ASSERT(!is_nf4(t), "an NF4 tensor has no element size (engine/core/nf4.h)");
  return t == DType::BF16 ? 2 : 4;
}
/// Whether a linear's weight of this dtype is stored below f32 (a frozen base's bf16 or NF4,
/// lora.base): the CPU's GEMMs read an f32 copy of it, made per op in the op's workspace.
inline bool is_packed_weight(DType t) {
  return t == DType::BF16 || is_nf4(t);
}
/// Bytes of n NF4 values: the codes (n/2 bytes, padded to 4), then f32 absmax per 64 (NF4), or u8
/// absmax per 64 (padded to 4), an f32 offset and an f32 absmax per 256 of those (NF4DQ).
constexpr int64_t nf4_bytes(int64_t n, bool double_quant) {
  const auto pad4 = [](int64_t b) { return (b + 3) / 4 * 4; };
  const int64_t blocks = (n + 63) / 64, codes = pad4((n + 1) / 2);
  return double_quant ? pad4(codes + blocks) + 4 + 4 * ((blocks + 255) / 256) : codes + 4 * blocks;
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
  size_t bytes() const {
    if (is_nf4(dtype)) return static_cast<size_t>(nf4_bytes(numel(), dtype == DType::NF4DQ));
    return static_cast<size_t>(numel()) * dtype_size(dtype);
  }
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
