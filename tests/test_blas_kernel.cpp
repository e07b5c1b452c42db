// The BLAS kernel is chosen from the CPU's vector ISA, never left at a generic fallback on a CPU
// with AVX2 or AVX-512 (engine/cpu/blas_kernel.h); a kernel forced below the CPU is reported.
#include <catch2/catch.hpp>
#include <cstdlib>

#include "engine/cpu/blas_kernel.h"
#include "engine/cpu/cpu_backend.h"
#include "tests/cli_util.h"

using namespace remat::cpu;
using Catch::Matchers::Contains;

TEST_CASE("OpenBLAS core names map to the ISA of their SGEMM kernels", "[blas]") {
  CHECK(kernel_isa("SkylakeX") == VectorIsa::Avx512);
  CHECK(kernel_isa("Cooperlake") == VectorIsa::Avx512);
  CHECK(kernel_isa("Haswell") == VectorIsa::Avx2);
  CHECK(kernel_isa("Zen") == VectorIsa::Avx2);
  for (const char* generic : {"Prescott", "Core2", "Nehalem", "Sandybridge", "unknown"})
    CHECK(kernel_isa(generic) == VectorIsa::Sse);
}

TEST_CASE("the kernel in use is as wide as the CPU's vectors unless OPENBLAS_CORETYPE forces it",
          "[blas]") {
  const BlasKernelChoice& k = select_blas_kernel();
  INFO("kernel " << k.core << ", chosen by " << k.chosen_by);
  CHECK(k.cpu_isa == detect_cpu_isa());
  CHECK(k.kernel_isa == kernel_isa(k.core));
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (forced && *forced) {
    CHECK(k.chosen_by == "OPENBLAS_CORETYPE");
  } else {
    CHECK(k.kernel_isa >= k.cpu_isa);
    CHECK_FALSE(k.below_cpu());
    CHECK(blas_info().warning.empty());
  }
}

TEST_CASE(
    "remat-train --version names the kernel and who chose it, and warns of a forced generic kernel",
    "[blas][smoke]") {
  const remat::test::CliResult plain = remat::test::run_binary("--version", true);
  REQUIRE(plain.code == 0);
  CHECK_THAT(plain.out, Contains("CPU kernel ") && Contains("(chosen by "));
  if (detect_cpu_isa() == VectorIsa::Sse) return;  // nothing wider to fall below
  // The variable must reach the binary itself, so run_binary's `cd DIR && BIN` gets `env`.
  const remat::test::CliResult forced =
      remat::test::run_binary("--version", true, "OPENBLAS_CORETYPE=Prescott");
  REQUIRE(forced.code == 0);
  CHECK_THAT(forced.out, Contains("CPU kernel Prescott (chosen by OPENBLAS_CORETYPE)") &&
                             Contains("warning: BELOW THIS CPU"));
}
