// Data parallel's one duty toward the trainer: every parameter gradient summed over the ranks
// by the end of the backward, with the sums started as the backward finishes each block's
// gradients. Two implementations: GradientReducer (host memory, MPI: the CPU backend and every dry
// run of a CPU target) and the CUDA backend's NCCL all-reduce (engine/cuda/nccl_sync.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/model.h"

namespace remat::parallel {

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  /// Block `block`'s parameter gradients are final (after its backward).
  virtual void block_done(size_t block) = 0;
  /// Every gradient is final (after the stem); on return each one holds the sum over the ranks
  /// (on an asynchronous backend: ordered before every op enqueued after this call).
  virtual void finish() = 0;
  /// Gradient bytes this rank sends per step.
  virtual uint64_t sent_bytes_per_step() const = 0;
  /// "rank-order sums over MPI" or "NCCL all-reduce": for the banner.
  virtual const char* describe() const = 0;
};

/// The backward stage after which gradient `param_name` is final: its block ("blocks.<i>."), or
/// `n_blocks` (the end of the backward) for every parameter outside the blocks (the tied
/// embedding gets its last gradient from the stem, the final LayerNorm its only one from the head).
inline size_t gradient_stage(const std::string& param_name, size_t n_blocks) {
  size_t block = 0;
  if (std::sscanf(param_name.c_str(), "blocks.%zu.", &block) == 1 && block < n_blocks) return block;
  return n_blocks;
}

/// `model`'s parameters by gradient_stage: one list per block, then the rest (model order within).
inline std::vector<std::vector<Param*>> params_by_stage(Model& model) {
  std::vector<std::vector<Param*>> stages(model.n_blocks() + 1);
  for (Param& p : model.params()) stages[gradient_stage(p.name, model.n_blocks())].push_back(&p);
  return stages;
}

/// Bytes a bandwidth-optimal all-reduce (reduce-scatter, then all-gather) of `bytes` sends from
/// each of `ranks` ranks: 2 (ranks - 1) / ranks of them.
inline uint64_t allreduce_sent_bytes(uint64_t bytes, int ranks) {
  return ranks <= 1 ? 0
                    : 2 * (bytes / static_cast<uint64_t>(ranks)) * static_cast<uint64_t>(ranks - 1);
}

}  // namespace remat::parallel
