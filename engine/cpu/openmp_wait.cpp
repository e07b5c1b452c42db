// Re-executing with passive OpenMP waits (see engine/cpu/openmp_wait.h).
#include "engine/cpu/openmp_wait.h"

#include <alloca.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>

namespace remat::cpu {

namespace {

bool chooses_wait_policy(const char* entry) {
  return std::strncmp(entry, "OMP_WAIT_POLICY=", 16) == 0 ||
         std::strncmp(entry, "GOMP_SPINCOUNT=", 15) == 0;
}

}  // namespace

void reexec_with_passive_openmp_wait(int /*argc*/, char** argv, char** envp) {
  if (argv == nullptr || envp == nullptr) return;
  std::size_t n = 0;
  for (; envp[n] != nullptr; ++n)
    if (chooses_wait_policy(envp[n])) return;
  // On the stack: before libc's initializer the heap is best left alone, and execve copies it.
  auto** env = static_cast<char**>(alloca((n + 3) * sizeof(char*)));
  std::memcpy(env, envp, n * sizeof(char*));
  static char kPassive[] = "OMP_WAIT_POLICY=passive";
  static char kMarker[] = "REMAT_TRAIN_SET_WAIT_POLICY=1";  // for --version: who chose it
  env[n] = kPassive;
  env[n + 1] = kMarker;
  env[n + 2] = nullptr;
  execve("/proc/self/exe", argv, env);  // returns only on failure
}

}  // namespace remat::cpu
