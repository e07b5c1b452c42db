// Op test of fill: every element of the tensor and none past it, for small fills (plain stores)
// and fills past the streaming threshold (non-temporal stores, engine/cpu/cpu_backend.cpp), at
// sizes that leave each thread's share off a vector boundary, on 1 and 2 threads.
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

}  // namespace remat::test
