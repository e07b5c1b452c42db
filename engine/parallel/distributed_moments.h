// The interface a checkpoint reads and writes sharded optimizer state through
// (engine/training/checkpoint.h), implemented by ZeRO-1's ShardedAdamW
// (engine/parallel/sharded_adamw.h): declared here, with the ranks, so that the parallel code never
// includes the trainer's checkpoints.
#pragma once

#include "engine/model.h"

namespace remat {

/// AdamW moments spread over the ranks (parallel.shard_optimizer; engine/parallel/sharded_adamw.h).
/// A checkpoint holds them whole, so that it resumes on any number of ranks, sharded or not:
/// rank 0 gathers each one while it writes, and each rank loads its own part on resume.
class DistributedMoments {
 public:
  virtual ~DistributedMoments() = default;
  /// Collective (every rank, the parameters in model order, m before v): moment `moment` (0: m,
  /// 1: v) of `p` reaches rank 0's `whole` (host memory, p's shape); other ranks pass nullptr.
  virtual void gather(const Param& p, int moment, float* whole) = 0;
  /// This rank's part of moment `moment` of `p`, from all of it (`whole`, host memory).
  virtual void load(const Param& p, int moment, const float* whole) = 0;
};

}  // namespace remat
