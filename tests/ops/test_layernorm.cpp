// Op test of LayerNorm and, through the same checks, of RMSNorm (its own cases, the q/k norm and
// the rounding of the normalized row are in tests/ops/test_rmsnorm.cpp): forward against a double
// reference, backward against central differences and a double reference, and dinp += as the
// residual stream. Against the CPU backend, the specification every other backend is checked
// against; the call's fixture, reference and checks: tests/ops/norm_call.h; tolerances and shared
// helpers: tests/test_util.h (through tests/ops/op_test.h).
#include "tests/ops/norm_call.h"

namespace remat::test {

TEST_CASE("layernorm and rmsnorm forward match a double reference", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const NormRow row = GENERATE(from_range(norm_rows()));
  CAPTURE(norm_name(row.kind), row.shape.N, row.shape.C);
  NormCall n(be, row.kind, row.shape.N, row.shape.C, 21, 0.0f);
  check_norm_forward(n);
}

TEST_CASE("layernorm and rmsnorm backward match central differences and add into dinp", "[ops]") {
  const ref::Norm kind = GENERATE(ref::Norm::Layer, ref::Norm::Rms);
  CAPTURE(norm_name(kind));
  CpuBackend be(kTestBudgetBytes, kFdThreads);
  // C > 32: two channel slices in the parameter-gradient pass. [+=]: dinp is the residual
  // stream, the 0.5 must stay; the parameter gradients add too.
  NormCall n(be, kind, 5, 37, 31, 0.5f);
  check_norm_backward_central_differences(n);
}

TEST_CASE("layernorm backward matches a double reference on many rows and channel slices",
          "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  NormCall ln(be, ref::Norm::Layer, 64, 200, 41, 0.0f);
  check_norm_backward(ln, kTolReduction);
}

#if REMAT_TEST_CUDA_ROWS
TEST_CASE("layernorm forward and backward on CUDA match the CPU (dinp accumulates)",
          "[gpu][layernorm]") {
  check_norm_cuda_rows(ref::Norm::Layer, kLayerNormShapes);
}
#endif

}  // namespace remat::test
