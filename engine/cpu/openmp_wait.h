// OpenMP threads that spin at barriers turn one competing process into an 8-10x slowdown on a
// 2-core machine (each barrier waits for a descheduled sibling). Measured here (copy.toml, median
// ms/step, alone | beside one busy loop): default 63 | 272, OMP_WAIT_POLICY=passive 68 | 134 (the
// 2x that losing half the cores costs); tests side by side under ctest -j2 ran up to 30x slower.
// libgomp reads the variable once, when it loads, and has no call to change it later: so the
// process executes itself again with the variable set. It does so before any library's
// initializer has run (an entry in the executable's .preinit_array): from main(), the second
// process paid every initializer twice. Not when started through the dynamic loader by hand or
// under valgrind, where /proc/self/exe is not the program (OMP_WAIT_POLICY=passive then does
// what the re-exec would).
#pragma once

#include <cstddef>  // through the C library's headers: __GLIBC__ where it applies

namespace remat::cpu {

/// When the environment `envp` chooses no wait policy (OMP_WAIT_POLICY, GOMP_SPINCOUNT),
/// executes /proc/self/exe again with `argv` and `envp` plus OMP_WAIT_POLICY=passive and
/// REMAT_TRAIN_SET_WAIT_POLICY=1 (so --version can say who chose the policy; an inherited one is
/// replaced). Returns only when there is nothing to do or the exec failed (then the process runs
/// with the default policy).
/// Meant to run from .preinit_array, through REMAT_PASSIVE_OPENMP_WAIT_BEFORE_LIBRARIES: libc
/// has not set `environ` yet there, so it reads `envp` and allocates nothing on the heap.
void reexec_with_passive_openmp_wait(int argc, char** argv, char** envp);

}  // namespace remat::cpu

/// Expanded once at namespace scope in an executable's main file: the dynamic linker calls
/// reexec_with_passive_openmp_wait before it runs any shared library's initializer. (In a static
/// library's object the entry would be linked only if something else pulled that object in.)
/// glibc passes (argc, argv, envp) to .preinit_array functions; elsewhere nothing is registered.
#if defined(__GLIBC__)
#define REMAT_PASSIVE_OPENMP_WAIT_BEFORE_LIBRARIES()                                  \
  __attribute__((section(".preinit_array"), used)) static void (*remat_preinit_wait)( \
      int, char**, char**) = remat::cpu::reexec_with_passive_openmp_wait
#else
#define REMAT_PASSIVE_OPENMP_WAIT_BEFORE_LIBRARIES() static_assert(true)
#endif
