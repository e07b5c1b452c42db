// Re-executing with a chosen OpenMP wait policy (see engine/cpu/openmp_wait.h).
#include "engine/cpu/openmp_wait.h"

#include <alloca.h>
#include <sys/auxv.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>

namespace remat::cpu {

namespace {

bool starts_with(const char* entry, const char* prefix) {
  return std::strncmp(entry, prefix, std::strlen(prefix)) == 0;
}

bool chooses_wait_policy(const char* entry) {
  return starts_with(entry, "OMP_WAIT_POLICY=") || starts_with(entry, "GOMP_SPINCOUNT=");
}

// Under valgrind (its preload libraries are in LD_PRELOAD) the exec would leave the tool.
bool under_valgrind(const char* entry) {
  return starts_with(entry, "LD_PRELOAD=") && std::strstr(entry, "vgpreload") != nullptr;
}

constexpr const char* kMarkerName = "REMAT_TRAIN_SET_WAIT_POLICY=";

// `setting` ("NAME=value") and the marker added to envp, then execve; see the header.
void reexec_with(char** argv, char** envp, char* setting) {
  if (argv == nullptr || envp == nullptr) return;
  // Started as `ld-linux-x86-64.so.2 remat-train ...`: /proc/self/exe is the loader, which would
  // take the first argument for the program.
  if (getauxval(AT_BASE) == 0) return;
  std::size_t n = 0;
  for (; envp[n] != nullptr; ++n)
    if (chooses_wait_policy(envp[n]) || under_valgrind(envp[n])) return;
  // On the stack: before libc's initializer the heap is best left alone, and execve copies it.
  auto** env = static_cast<char**>(alloca((n + 3) * sizeof(char*)));
  std::size_t kept = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (!starts_with(envp[i], kMarkerName)) env[kept++] = envp[i];  // one marker, not two
  static char kMarker[] = "REMAT_TRAIN_SET_WAIT_POLICY=1";          // for --version: who chose it
  env[kept] = setting;
  env[kept + 1] = kMarker;
  env[kept + 2] = nullptr;
  execve("/proc/self/exe", argv, env);  // returns only on failure
}

}  // namespace

void reexec_with_short_openmp_spin(int /*argc*/, char** argv, char** envp) {
  static char kShortSpin[] = "GOMP_SPINCOUNT=3000";  // the header says why 3000
  reexec_with(argv, envp, kShortSpin);
}

void reexec_with_passive_openmp_wait(int /*argc*/, char** argv, char** envp) {
  static char kPassive[] = "OMP_WAIT_POLICY=passive";
  reexec_with(argv, envp, kPassive);
}

}  // namespace remat::cpu
