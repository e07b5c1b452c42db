// OpenMP threads that spin at barriers turn one competing process into an 8-10x slowdown on a
// 2-core machine (each barrier waits for a descheduled sibling). Measured here (copy.toml, median
// ms/step, alone | beside one busy loop): default 63 | 272, OMP_WAIT_POLICY=passive 68 | 134 (the
// 2x that losing half the cores costs); tests side by side under ctest -j2 ran up to 30x slower.
// libgomp reads the variable once, when it loads, and has no call to change it later.
#pragma once

namespace remat::cpu {

/// When the user has chosen no wait policy (OMP_WAIT_POLICY, GOMP_SPINCOUNT), sets
/// OMP_WAIT_POLICY=passive (and REMAT_TRAIN_SET_WAIT_POLICY, so --version can say who chose it)
/// and re-executes the process with the same arguments. Call first in main(), before anything
/// else has run; returns only when there is nothing to do or the re-exec failed (then the process
/// runs with the default policy).
void prefer_passive_openmp_wait(char** argv);

}  // namespace remat::cpu
