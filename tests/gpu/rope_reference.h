// The RoPE kernel as engine/cuda/elementwise.cu had it before it computed each angle once per row:
// one thread per rotation pair, the same double sincos and float expressions, each product and
// sum rounded explicitly in both files (__fmul_rn, __fadd_rn: no FMA contraction can make them
// differ). test_kernels.cpp checks kern::rope_apply against it bit for bit.
#pragma once

#include <cuda_runtime.h>

#include "engine/cuda/kernels.cuh"

namespace remat::test {

/// kern::rope_apply's contract, one thread per pair of q and k and per element pair of v.
void rope_reference(const cuda::kern::RopeParams& p, cudaStream_t s);

}  // namespace remat::test
