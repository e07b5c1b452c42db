// Op test of fill: every element of the tensor and none past it, for small fills (plain stores)
// and fills past the streaming threshold (non-temporal stores, engine/cpu/cpu_backend.cpp), at
// sizes that leave each thread's share off a vector boundary, on 1 and 2 threads; on CUDA, the
// 16-byte vector and scalar paths, past the grid's last stride.
#include <algorithm>

#include "tests/ops/op_test.h"

namespace remat::test {

TEST_CASE("fill: every element, none past the tensor, small and streaming sizes", "[ops]") {
  for (const int threads : {1, 2}) {
    CpuBackend be(kTestBudgetBytes, threads);
    // 1 MiB + 3 floats (plain), 4 MiB + 13 and 6 MiB + 7 floats (streaming: 2 threads split
    // them at odd offsets).
    for (const int64_t n : {(1 << 18) + 3, (1 << 20) + 13, 3 * (1 << 19) + 7}) {
      INFO(threads << " threads, " << n << " floats");
      // One tensor with a guard after it: the fill must stop at n.
      Buffer b = make_filled(be, {n + 64}, -1.0f);
      const Tensor head(b.f32(), {n}, DType::F32);
      be.fill(head, 2.5f);
      const float* p = b.f32();
      CHECK(std::all_of(p, p + n, [](float v) { return v == 2.5f; }));
      CHECK(std::all_of(p + n, p + n + 64, [](float v) { return v == -1.0f; }));
      be.fill(head, 0.0f);
      CHECK(std::all_of(p, p + n, [](float v) { return v == 0.0f; }));
      // Off a vector boundary from its first element (a view into a tensor).
      const Tensor odd(b.f32() + 1, {n - 1}, DType::F32);
      be.fill(odd, 7.0f);
      CHECK(p[0] == 0.0f);
      CHECK(std::all_of(p + 1, p + n, [](float v) { return v == 7.0f; }));
      CHECK(std::all_of(p + n, p + n + 64, [](float v) { return v == -1.0f; }));
    }
  }
}

#if REMAT_TEST_CUDA_ROWS
TEST_CASE("fill on CUDA: every element and none past the tensor, in 16-byte vectors and scalars",
          "[gpu][pointwise]") {
  // 8003: whole 16-byte groups and a tail of 3. 2^27 + 19: more groups than the grid's 65536 x
  // 256 threads (8 bf16 or 4 f32/i32 each), so threads stride. Offset 1 element into the block:
  // the scalar path. The 64 elements after the tensor keep their -1s.
  const DType dtype = GENERATE(DType::F32, DType::BF16, DType::I32);
  const int64_t n = GENERATE(int64_t{8003}, (int64_t{1} << 27) + 19);
  const int64_t offset = GENERATE(int64_t{0}, int64_t{1});
  CAPTURE(dtype_name(dtype), n, offset);
  cuda::CudaBackend gpu(DeviceConfig{}, DType::BF16);
  Buffer b = gpu.pool().allocate({offset + n + 64}, dtype, MemCategory::Transient, "test");
  gpu.fill(b, -1.0f);
  gpu.fill(Tensor(static_cast<char*>(b.tensor().data) + offset * dtype_size(dtype), {n}, dtype),
           3.0f);
  std::vector<char> raw(b.tensor().bytes());
  gpu.download(raw.data(), b);
  auto value = [&](size_t i) -> float {
    if (dtype == DType::I32)
      return static_cast<float>(reinterpret_cast<const int32_t*>(raw.data())[i]);
    if (dtype == DType::BF16)
      return from_bf16_bits(reinterpret_cast<const uint16_t*>(raw.data())[i]);
    return reinterpret_cast<const float*>(raw.data())[i];
  };
  size_t wrong = 0;
  for (size_t i = 0; i < static_cast<size_t>(offset + n + 64); ++i) {
    const bool inside = i >= static_cast<size_t>(offset) && i < static_cast<size_t>(offset + n);
    wrong += value(i) != (inside ? 3.0f : -1.0f);
  }
  CHECK(wrong == 0);
}
#endif

}  // namespace remat::test
