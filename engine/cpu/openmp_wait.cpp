// Re-executing with passive OpenMP waits (see engine/cpu/openmp_wait.h).
#include "engine/cpu/openmp_wait.h"

#include <unistd.h>

#include <cstdlib>

namespace remat::cpu {

void prefer_passive_openmp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return;
  if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  setenv("REMAT_TRAIN_SET_WAIT_POLICY", "1", 1);  // for --version: who chose the policy
  execv("/proc/self/exe", argv);                  // returns only on failure
}

}  // namespace remat::cpu
