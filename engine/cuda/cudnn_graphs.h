// Host-only checks of the CUDA backend's cuDNN operation graphs, for the CPU test binary:
// operation graphs finalize without a GPU (finalizing needs only the cuDNN library, not a device),
// which catches wiring, dtype-enum and missing-attribute mistakes on CI machines with no device;
// and which cuDNN releases the graphs are correct on. Engine support, plans and numerics still
// need a GPU (tests/gpu).
#pragma once

#include <cstdint>
#include <string>

namespace remat::cuda {

/// Builds and finalizes the causal attention forward and backward operation graphs for this
/// shape, KVH key/value heads (0: NH) (no handle, no device). Returns a one-line summary ("fwd 14
/// ops, bwd 22 ops"; 24 with grouped-query heads, whose dK and dV are reduced over each group);
/// throws BackendError with cuDNN's reason when a graph does not finalize. Tk > 0 and causal =
/// false: the graphs of an off-diagonal pair of attention over chunks (T queries against Tk keys,
/// no mask: 4 ops fewer each).
std::string check_attention_graphs_finalize(int64_t B, int64_t NH, int64_t T, int64_t HS,
                                            int64_t KVH = 0, int64_t Tk = 0, bool causal = true);

/// Why the CUDA backend refuses the cuDNN of version `version` (cudnnGetVersion's number, 91900
/// for 9.19.0), or "" when it takes it: one line naming the version and the fix. Refused: before
/// 9.0; 9.10.0 and 9.10.1 (known bugs in fp16/bf16 fused attention: cudnn-frontend blocks them);
/// and everything before 9.15.1, whose attention backward gives NaN when the key length is not a
/// multiple of 128 unless the graph has a padding mask (cudnn-frontend adds one up to 9.15.0,
/// s_kv % 128 != 0; our graphs have none, and a mask only an old release needs could not be
/// tested on the cuDNN the device runs).
std::string cudnn_version_refusal(int64_t version);

}  // namespace remat::cuda
