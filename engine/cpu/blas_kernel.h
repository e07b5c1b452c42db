// Which OpenBLAS kernel the GEMMs run, chosen from the CPU's feature bits rather than its model
// name. Debian's OpenBLAS (DYNAMIC_ARCH) picks its kernel from the CPUID family/model table; on
// a VM or a CPU newer than the library it can fall back to the generic Prescott kernel even where
// AVX-512 is present: measured here SGEMM 2048^3 on 2 threads runs at ~45 GFLOP/s with Prescott,
// ~155 with Haswell (AVX2) and ~257 with SkylakeX (AVX-512). The library re-selects its kernel
// when asked (gotoblas_dynamic_quit/init, which read OPENBLAS_CORETYPE), so at start-up, before
// any BLAS call, remat-train asks for the kernel of the best vector ISA this CPU and its OS
// support. A user's own OPENBLAS_CORETYPE always wins.
#pragma once

#include <string>

namespace remat::cpu {

/// The vector ISA classes OpenBLAS has SGEMM kernels for, weakest first.
enum class VectorIsa { Sse, Avx2, Avx512 };

/// What start-up selection did, for --version and the banner.
struct BlasKernelChoice {
  std::string core;                    // the kernel in use now, as OpenBLAS names it ("SkylakeX")
  std::string chosen_by;               // "OpenBLAS (CPU model)", "remat-train (cpuid: AVX-512)" or
                                       // "OPENBLAS_CORETYPE"
  VectorIsa cpu_isa = VectorIsa::Sse;  // the best this CPU and OS support
  VectorIsa kernel_isa = VectorIsa::Sse;  // what the kernel in use needs
  /// True when the kernel is below what the CPU supports (only possible when the user forced
  /// it with OPENBLAS_CORETYPE, or with a BLAS that cannot re-select).
  bool below_cpu() const { return kernel_isa < cpu_isa; }
};

/// Best vector ISA of this CPU, from cpuid feature bits and the OS's saved register state.
VectorIsa detect_cpu_isa();

/// The ISA class an OpenBLAS core name's SGEMM kernel uses (unknown names count as Sse).
VectorIsa kernel_isa(const std::string& core);

/// Selects the kernel once per process (later calls return the first result). Call before any
/// BLAS call and before threads start: main() and the test runner do.
const BlasKernelChoice& select_blas_kernel();

/// The machine's SGEMM rate in FLOP/s: the best of 3 single n^3 calls on `threads` threads (after
/// one warm-up) of the library the GEMM tiles run on (gemm_route), with its own threading. The
/// floor a training step's GEMMs are measured against (fit's estimates, `remat-train bench`).
double measure_sgemm_flops(int threads, int n = 1024);

}  // namespace remat::cpu
