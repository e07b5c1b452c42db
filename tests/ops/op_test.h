// What every op test (tests/ops/test_<op>.cpp) includes: the shared helpers and tolerances
// (tests/test_util.h) and, in the gpu test binary (REMAT_TEST_CUDA_ROWS), the CUDA rows' fixture
// (tests/ops/backend_rows.h).
#pragma once

#include <cstring>
#include <numbers>
#include <tuple>

#include "engine/core/nf4.h"
#include "tests/test_util.h"
#if REMAT_TEST_CUDA_ROWS
#include "tests/ops/backend_rows.h"
#endif

namespace remat::test {

/// The backend the CPU sections test: the specification every other backend is checked against.
using cpu::CpuBackend;

/// A (rows, C) frozen weight stored as `dtype` (bf16 or NF4, lora.base) on `be`, from f32 values.
inline Buffer packed_weight(Backend& be, int64_t rows, int64_t C, DType dtype,
                            const std::vector<float>& v) {
  Buffer w = be.pool().allocate({rows, C}, dtype, MemCategory::Weights, "frozen");
  std::vector<uint8_t> stored(w.tensor().bytes());
  encode_weight(dtype, v.data(), rows * C, stored.data());
  be.upload(w, stored.data());
  return w;
}
/// The f32 values a weight stored as `dtype` from `v` decodes to.
inline std::vector<float> decoded(DType dtype, const std::vector<float>& v) {
  const auto n = static_cast<int64_t>(v.size());
  std::vector<uint8_t> stored(Tensor(nullptr, {n}, dtype).bytes());
  encode_weight(dtype, v.data(), n, stored.data());
  std::vector<float> back(v.size());
  decode_weight(dtype, stored.data(), n, 0, n, back.data());
  return back;
}
inline const std::vector<DType> kPackedWeights = {DType::BF16, DType::NF4, DType::NF4DQ};

}  // namespace remat::test
