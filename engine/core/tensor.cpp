// Tensor helpers: element counts, reshaped views, printing.
#include "engine/core/tensor.h"

#include <fmt/format.h>

namespace remat {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::I32:
      return "i32";
    case DType::NF4:
      return "nf4";
    case DType::NF4DQ:
      return "nf4 (double quant)";
  }
  return "?";
}

Tensor::Tensor(void* ptr, const Dims& dims, DType type) : data(ptr), shape(dims), dtype(type) {}

int64_t Tensor::numel() const {
  if (ndim() == 0) return 0;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string Tensor::shape_str() const {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? "," : "", shape[i]);
  return s + ")";
}

Tensor Tensor::view(const Dims& dims) const {
  Tensor t(data, dims, dtype);
  REMAT_ASSERT(t.numel() == numel(), "view {} of tensor {} changes the element count",
               t.shape_str(), shape_str());
  return t;
}

Tensor Tensor::row_range(int64_t first, int64_t count) const {
  REMAT_ASSERT(first >= 0 && count >= 0 && first + count <= rows(),
               "rows [{}, {}) of tensor {} are out of range", first, first + count, shape_str());
  const int64_t width = dim(-1);
  char* base = static_cast<char*>(data);
  return Tensor(base ? base + first * width * static_cast<int64_t>(dtype_size(dtype)) : nullptr,
                {count, width}, dtype);
}

}  // namespace remat
