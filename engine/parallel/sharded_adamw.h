// ZeRO-1 (parallel.shard_optimizer): the AdamW moments are spread over the ranks. The gradient
// sync leaves each rank the sum of its shard of every bucket (engine/parallel/grad_reducer.h over
// MPI, engine/cuda/nccl_sync.cpp on CUDA); this class keeps the moments of exactly those floats,
// updates them and those weights, and hands the updated shards back to the sync, which gathers
// them to every rank. Per rank the moments take
// 1/ranks of their unsharded size; the bytes sent per step are those of an all-reduce (the
// gradients' reduce-scatter, then the weights' all-gather).
//
// AdamW is elementwise, so over MPI each float is updated with the same bits as without sharding:
// the summed gradient is the same (one rank-order sum), and so are m, v and the weight. Only the
// gradient norm is summed in another order (per shard, then over the ranks), which can change the
// clipping scale in its last bit when clipping acts. Over NCCL the reduce-scatter adds in another
// order than the all-reduce it replaces, so the runs agree to rounding, not bit for bit.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/memory_pool.h"
#include "engine/model.h"
#include "engine/parallel/communicator.h"
#include "engine/parallel/distributed_moments.h"
#include "engine/parallel/gradient_sync.h"

namespace remat::parallel {

class ShardedAdamW final : public DistributedMoments {
 public:
  /// The moments of `sync`'s shards of this rank, zeroed (category optimizer in the pool). `comm`
  /// (the ranks of `sync`) null: a dry run (the update is counted, nothing is exchanged).
  ShardedAdamW(Backend& be, ShardedGradientSync& sync, Communicator* comm);

  /// The sum of squares of every summed gradient (for the global norm): this rank's shards, then
  /// over the ranks in rank order, so every rank gets the same bits.
  double grad_sum_squares();
  /// AdamW on this rank's shards with the hyperparameters of `hyper` (its tensors are ignored;
  /// weight decay is hyper.weight_decay on parameters with use_decay, else 0), then the updated
  /// weights gathered to every rank.
  void update(const AdamWArgs& hyper);
  /// Whether this rank's summed gradients of `p` (its shards of them) are finite.
  bool grad_finite(const Param& p);
  /// Floats of this rank's shards (its moments hold twice as many).
  int64_t shard_floats() const { return floats_; }

  void gather(const Param& p, int moment, float* whole) override;
  void load(const Param& p, int moment, const float* whole) override;

 private:
  // A run of floats this rank owns: param floats [offset, offset + count) at `at` of the moments.
  struct Piece {
    Param* param;
    int64_t offset, count, at;
  };
  // Where one segment of a parameter sits: bucket k, its segment, and this rank's moments offset
  // of the bucket's shard.
  struct SegmentPlace {
    size_t bucket;
    const BucketLayout::Segment* segment;
    int64_t shard_at;
  };
  Tensor slice(const Buffer& b, int64_t offset, int64_t count) const;
  template <class F>
  void for_each_piece_of(const Param& p, F f) const {
    for (const std::vector<Piece>& bucket : pieces_)
      for (const Piece& piece : bucket)
        if (piece.param == &p) f(piece);
  }
  const Buffer& moment_buffer(int moment) const { return moment == 0 ? m_ : v_; }

  Backend& be_;
  ShardedGradientSync& reducer_;
  std::vector<float> host_;  // a piece of a moment on its way to rank 0 (off a device)
  Communicator* comm_;
  int64_t floats_ = 0;
  std::vector<std::vector<Piece>> pieces_;  // per bucket
  std::map<const Param*, std::vector<SegmentPlace>> places_;
  Buffer m_, v_;
};

}  // namespace remat::parallel
