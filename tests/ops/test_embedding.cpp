// Op test of the token (+ position) embedding: gather forward, scatter-add backward with repeated
// tokens.
// Against the CPU backend, the specification every other backend is checked against;
// tolerances and shared helpers: tests/test_util.h.
#include <cstring>
#include <numbers>
#include <tuple>

#include "tests/test_util.h"

namespace remat::test {
namespace {

using cpu::CpuBackend;

}  // namespace

TEST_CASE("embedding forward gathers token rows and adds position rows", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const bool use_wpe = GENERATE(true, false);
  CAPTURE(use_wpe);
  const int64_t B = 3, T = 5, V = 4, C = 37, maxT = 8;
  Buffer tokens = make_ids(be, {B, T}, static_cast<int32_t>(V), kSeed, 101);
  Buffer wte = make_randn(be, {V, C}, kSeed, 102);
  Buffer wpe = make_randn(be, {maxT, C}, kSeed, 103);
  Buffer out = make_filled(be, {B, T, C}, 7.0f);
  be.embedding_forward(
      {.out = out, .tokens = tokens, .wte = wte, .wpe = use_wpe ? wpe.tensor() : Tensor()});
  std::vector<float> want;  // the same single float add as the kernel: exact
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const float e = wte.f32()[tokens.tensor().i32()[b * T + t] * C + c];
        want.push_back(use_wpe ? e + wpe.f32()[t * C + c] : e);
      }
  CHECK(allclose(to_host(out), want, kTolExact, "out"));
}

TEST_CASE("embedding backward scatter-adds repeated tokens into dwte and dwpe", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const bool use_wpe = GENERATE(true, false);
  CAPTURE(use_wpe);
  // 15 tokens over a vocabulary of 5: repeats are certain; C = 37 crosses 16-channel slices.
  const int64_t B = 3, T = 5, V = 5, C = 37, maxT = 8;
  Buffer tokens = make_ids(be, {B, T}, 4, kSeed, 111);  // id 4 never occurs: its row stays
  Buffer dout = make_randn(be, {B, T, C}, kSeed, 112);
  Buffer dwte = make_randn(be, {V, C}, kSeed, 113);
  Buffer dwpe = make_randn(be, {maxT, C}, kSeed, 114);
  std::vector<double> want_wte = to_double(dwte), want_wpe = to_double(dwpe);  // [+=]
  be.embedding_backward(
      {.dwte = dwte, .dwpe = use_wpe ? dwpe.tensor() : Tensor(), .dout = dout, .tokens = tokens});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const double d = dout.f32()[(b * T + t) * C + c];
        want_wte[static_cast<size_t>(tokens.tensor().i32()[b * T + t] * C + c)] += d;
        if (use_wpe) want_wpe[static_cast<size_t>(t * C + c)] += d;
      }
  CHECK(allclose(to_host(dwte), want_wte, kTolReduction, "dwte"));
  CHECK(allclose(to_host(dwpe), want_wpe, use_wpe ? kTolReduction : kTolExact, "dwpe"));
}

}  // namespace remat::test
