// The test entry point of engine/cpu/vector_math.h.
#include "engine/cpu/vector_math.h"

#include <algorithm>
#include <cmath>

namespace remat::cpu {

void exp2_floats(const float* x, float* y, int64_t n) {
#if defined(__AVX2__) && defined(__FMA__)
  for (int64_t i = 0; i < n; i += 8) {
    const int64_t lanes = std::min<int64_t>(8, n - i);
    alignas(32) float in[8] = {}, out[8];
    std::copy(x + i, x + i + lanes, in);
    _mm256_store_ps(out, exp2_ps(_mm256_load_ps(in)));
    std::copy(out, out + lanes, y + i);
  }
#else
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] >= -126.0f ? std::exp2(std::min(x[i], 127.0f)) : 0.0f;
#endif
}

}  // namespace remat::cpu
