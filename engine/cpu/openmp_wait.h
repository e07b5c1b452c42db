// How idle OpenMP threads wait, chosen before any library loads. OpenBLAS (its OpenMP build),
// oneDNN and our kernels share libgomp's one thread pool, and a training step opens thousands of
// parallel regions (SmolLM2-135M at 512 tokens: ~1,600 a full step, ~2,900 a LoRA step). Between
// two regions a worker either spins or sleeps:
// - libgomp's default spins ~300,000 times (milliseconds) before sleeping: beside one competing
//   process each barrier waits for a descheduled sibling: on a 2-core machine copy.toml took 264
//   ms a step, against 28 with sleeping threads and 17 alone (and tests side by side under ctest
//   -j2 ran up to 30x slower);
// - passive sleeps at once: robust, but every region pays a futex wake-up;
// - a short spin (GOMP_SPINCOUNT=3000: ~0.1-0.2 ms with Intel's ~140-cycle `pause`) catches the
//   next region of a step, which follows within microseconds, and then sleeps.
// Measured on the 2-core Xeon VM (2026-12-07, docs/performance.md, "One thread pool"): the short
// spin made the SmolLM2-135M step 5% (full) and 8% (LoRA) faster than passive, alone; beside one
// busy process it cost 6% on that step and 21% on copy.toml's tiny ops, and beside two it was
// faster than passive. So remat-train runs with the short spin and the test binary (many
// processes side by side under ctest -j2) with passive.
// libgomp reads the variables once, when it loads, and has no call to change them later: so the
// process executes itself again with the variable set. It does so before any library's
// initializer has run (an entry in the executable's .preinit_array): from main(), the second
// process paid every initializer twice. Not when started through the dynamic loader by hand or
// under valgrind, where /proc/self/exe is not the program (setting the variable by hand then does
// what the re-exec would).
#pragma once

#include <cstddef>  // through the C library's headers: __GLIBC__ where it applies

namespace remat::cpu {

/// When the environment `envp` chooses no wait policy (OMP_WAIT_POLICY, GOMP_SPINCOUNT),
/// executes /proc/self/exe again with `argv` and `envp` plus GOMP_SPINCOUNT=3000 and
/// REMAT_TRAIN_SET_WAIT_POLICY=1 (so --version can say who chose the policy; an inherited one is
/// replaced). Returns only when there is nothing to do or the exec failed (then the process runs
/// with libgomp's default).
/// Meant to run from .preinit_array, through REMAT_OPENMP_WAIT_BEFORE_LIBRARIES: libc has not
/// set `environ` yet there, so it reads `envp` and allocates nothing on the heap.
void reexec_with_short_openmp_spin(int argc, char** argv, char** envp);
/// The same with OMP_WAIT_POLICY=passive: the test binary's choice.
void reexec_with_passive_openmp_wait(int argc, char** argv, char** envp);

}  // namespace remat::cpu

/// Expanded once at namespace scope in an executable's main file, with `reexec` one of the two
/// functions above: the dynamic linker calls it before it runs any shared library's initializer.
/// (In a static library's object the entry would be linked only if something else pulled that
/// object in.) glibc passes (argc, argv, envp) to .preinit_array functions; elsewhere nothing is
/// registered.
#if defined(__GLIBC__)
#define REMAT_OPENMP_WAIT_BEFORE_LIBRARIES(reexec)                                    \
  __attribute__((section(".preinit_array"), used)) static void (*remat_preinit_wait)( \
      int, char**, char**) = reexec
#else
#define REMAT_OPENMP_WAIT_BEFORE_LIBRARIES(reexec) static_assert(true)
#endif
