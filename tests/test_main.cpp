// Catch2 (v2) main for the CPU test binary. The BLAS kernel is selected first, as remat-train's
// own main does, so every test runs the kernel a user's run would.
//
// Like remat-train (cmd/main.cpp), the binary runs with OMP_WAIT_POLICY=passive unless a policy
// was chosen: libgomp reads it only when it loads, so the process sets it and re-executes itself.
// Spinning threads made tests running side by side (ctest -j2 on 2 cores) up to 30x slower
// (the tiny config's 300 steps: 3.9 s alone, 109 s beside other tests); the whole suite took
// 295 s at -j2, 205 s at -j1, and 118 s at -j2 with passive threads. The remat-train processes
// tests start inherit the variable, so they report the policy as the user's; the test of
// remat-train's own choice (test_cli.cpp) unsets it.
#define CATCH_CONFIG_RUNNER
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>

#include "engine/cpu/blas_kernel.h"

int main(int argc, char** argv) {
  if (!std::getenv("OMP_WAIT_POLICY") && !std::getenv("GOMP_SPINCOUNT") &&
      setenv("OMP_WAIT_POLICY", "passive", 1) == 0)
    execv("/proc/self/exe", argv);  // returns only on failure: then the default policy
  remat::cpu::select_blas_kernel();
  return Catch::Session().run(argc, argv);
}
