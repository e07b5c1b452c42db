// Catch2 (v2) main for the CPU test binary. As remat-train's own main does, it runs its OpenMP
// threads passive (engine/cpu/openmp_wait.h: spinning threads made tests side by side under
// ctest -j2 up to 30x slower; the whole suite took 295 s at -j2, 205 s at -j1, and 118 s at -j2
// with passive threads), then selects the BLAS kernel, so every test runs the kernel a user's run
// would. The remat-train processes tests start inherit the setting; the test of remat-train's own
// choice (test_cli.cpp) unsets it.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "engine/cpu/blas_kernel.h"
#include "engine/cpu/openmp_wait.h"

REMAT_OPENMP_WAIT_BEFORE_LIBRARIES(remat::cpu::reexec_with_passive_openmp_wait);

int main(int argc, char** argv) {
  remat::cpu::select_blas_kernel();
  return Catch::Session().run(argc, argv);
}
