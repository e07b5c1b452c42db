// The vectorized 2^x of the CPU kernels (exp2_ps, engine/cpu/vector_math.h: the attention
// softmax, the LM-head loss, GELU's tanh). Its bits are pinned by a scalar model of the same
// steps: clamp, round to nearest, the polynomial of engine/cpu/exp2_poly.h by single-rounding
// FMAs, times 2^n. exp2_ps and its AVX-512 twin (engine/cpu/attention_gemm_avx512.cpp) add n to
// the exponent field instead, so both must equal this model for the attention kernels to give
// the same bits on either ISA.
#include <bit>
#include <catch2/catch.hpp>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "engine/cpu/exp2_poly.h"
#include "engine/cpu/vector_math.h"

using namespace remat::cpu;

namespace {

// exp2_ps step by step in scalar float arithmetic (std::fma rounds once, as the vector FMA).
float exp2_model(float x) {
  const float xm = x > -126.0f ? x : -126.0f;  // max_ps(x, lo): NaN -> -126
  const float xc = xm < 127.0f ? xm : 127.0f;  // min_ps(xm, hi)
  const float n = std::nearbyint(xc);          // ties to even (default mode)
  const float r = xc - n;
  float p = kExp2Poly[0];
  for (int k = 1; k < kExp2PolyTerms; ++k) p = std::fma(p, r, kExp2Poly[k]);
  const float y = p * std::ldexp(1.0f, static_cast<int>(n));
  return x >= -126.0f ? y : 0.0f;  // false for NaN
}

// Every stride-th float bit pattern from +0 to 130, with both signs, plus the edges where the
// clamp and the rounding change, and the special values.
std::vector<float> sample_floats(uint32_t stride) {
  std::vector<float> xs;
  const uint32_t hi = std::bit_cast<uint32_t>(130.0f);
  for (uint32_t bits = 0; bits <= hi; bits += stride) {
    xs.push_back(std::bit_cast<float>(bits));
    xs.push_back(-std::bit_cast<float>(bits));
  }
  for (const float edge : {-126.0f, -125.5f, -124.5f, -0.5f, 0.5f, 126.5f, 127.0f, 128.0f}) {
    xs.push_back(edge);
    xs.push_back(std::nextafter(edge, -1000.0f));
    xs.push_back(std::nextafter(edge, 1000.0f));
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (const float special : {inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::denorm_min(), 1e30f, -1e30f})
    xs.push_back(special);
  return xs;
}

// The sample and exp2_ps of it, made once for both tests.
struct Evaluated {
  std::vector<float> xs, ys;
};
const Evaluated& evaluated() {
  static const Evaluated e = [] {
    Evaluated out{sample_floats(251), {}};
    out.ys.resize(out.xs.size());
    exp2_floats(out.xs.data(), out.ys.data(), static_cast<int64_t>(out.xs.size()));
    return out;
  }();
  return e;
}

}  // namespace

TEST_CASE("exp2_ps gives the bits of its scalar model, 2^n applied by a multiply",
          "[vector_math]") {
  REQUIRE(std::fegetround() == FE_TONEAREST);
  const auto& [xs, ys] = evaluated();
  int64_t differ = 0;
  for (size_t i = 0; i < xs.size(); ++i)
    if (std::bit_cast<uint32_t>(ys[i]) != std::bit_cast<uint32_t>(exp2_model(xs[i]))) {
      if (differ++ < 5)
        UNSCOPED_INFO("x = " << xs[i] << ": exp2_ps " << ys[i] << ", model " << exp2_model(xs[i]));
    }
  INFO(xs.size() << " inputs");
  CHECK(differ == 0);
}

TEST_CASE("exp2_ps is within 1 ulp of 2^x on [-126, 127], 0 below, 0 for NaN", "[vector_math]") {
  const auto& [xs, ys] = evaluated();
  double worst_ulp = 0;
  float worst_x = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const float x = xs[i], y = ys[i];
    if (std::isnan(x) || x < -126.0f) {
      CHECK(std::bit_cast<uint32_t>(y) == 0u);  // +0, not -0 or NaN
      continue;
    }
    if (x > 127.0f) {
      CHECK(y == std::ldexp(1.0f, 127));
      continue;
    }
    const double exact = std::exp2(static_cast<double>(x));
    const double ulp = std::ldexp(1.0, std::ilogb(exact) - 23);  // of the float nearest exact
    const double err = std::fabs(static_cast<double>(y) - exact) / ulp;
    if (err > worst_ulp) {
      worst_ulp = err;
      worst_x = x;
    }
  }
  INFO("worst at x = " << worst_x);
  CHECK(worst_ulp < 1.0);
}
