// Catch2 (v2) main for the CPU test binary. The BLAS kernel is selected first, as remat-train's
// own main does, so every test runs the kernel a user's run would.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "engine/cpu/blas_kernel.h"

int main(int argc, char** argv) {
  remat::cpu::select_blas_kernel();
  return Catch::Session().run(argc, argv);
}
