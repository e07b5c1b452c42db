// Data parallel's one duty toward the trainer: every parameter gradient summed over the ranks
// by the end of the backward, with the sums started as the backward finishes each block's
// gradients. Implementations: GradientReducer (host memory, MPI: the CPU backend and every dry run
// of a CPU target, sharded or not), the CUDA backend's NCCL all-reduce and NCCL reduce-scatter for
// a sharded optimizer (engine/cuda/nccl_sync.cpp), and their plans for dry runs of CUDA targets
// (engine/training/trainer.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/memory_pool.h"
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

/// `model`'s trainable parameters by gradient_stage: one list per block, then the rest (model
/// order within). A frozen parameter has no gradient to sum.
inline std::vector<std::vector<Param*>> params_by_stage(Model& model) {
  std::vector<std::vector<Param*>> stages(model.n_blocks() + 1);
  for (Param& p : model.params())
    if (p.trainable()) stages[gradient_stage(p.name, model.n_blocks())].push_back(&p);
  return stages;
}

/// One bucket of gradients: its place in the parameters and how its floats split over the ranks.
struct BucketLayout {
  struct Segment {
    Param* param;
    int64_t offset, count;  // floats of the parameter: bucket floats [at, at + count)
    int64_t at;
  };
  std::vector<Segment> segments;
  int64_t floats = 0;
  std::vector<int> counts, displs;  // each rank's shard of the bucket: [displs[q], + counts[q])
  // ShardSplit::Equal: each rank's span of the padded slot (displs[q] = q x span), the count every
  // collective takes; a shard holds fewer floats (counts[q]) where the bucket runs out.
  int64_t span = 0;
};

/// How a bucket's floats split over the ranks. Balanced (the host reducer): the first
/// floats % ranks ranks hold one float more. Equal (NCCL, whose reduce-scatter and all-gather take
/// one count for every rank): shards of ceil(floats / ranks) rounded up to kShardAlignFloats (so
/// that every rank's shard starts 256-byte aligned in the slot), the last ones short or empty;
/// the bucket is padded to ranks x that in its slot.
enum class ShardSplit { Balanced, Equal };
inline constexpr int64_t kShardAlignFloats = 64;

/// The buckets of `model`'s gradients, at most `bucket_bytes` each, filled in the order the
/// backward finishes them (a large parameter spans several), and each stage's range of them.
struct BucketPlan {
  std::vector<BucketLayout> buckets;
  std::vector<std::pair<size_t, size_t>> stage_buckets;  // per stage: buckets [first, second)
  int64_t largest_floats = 0;                            // of any bucket, padding included
};
BucketPlan plan_buckets(Model& model, int ranks, uint64_t bucket_bytes, ShardSplit split);

/// What of `b`'s segments falls in its floats [lo, hi): f(segment, first bucket float, count) for
/// each overlap, in bucket order.
template <class F>
void for_each_overlap(const BucketLayout& b, int64_t lo, int64_t hi, F f) {
  for (const BucketLayout::Segment& s : b.segments) {
    const int64_t first = std::max(lo, s.at), last = std::min(hi, s.at + s.count);
    if (first < last) f(s, first, last - first);
  }
}

/// A gradient sync for a sharded optimizer (ZeRO-1; engine/parallel/sharded_adamw.h): after
/// finish(), each rank's gradients hold the sums of its shard of every bucket only. Once the
/// optimizer has updated those floats of the weights, the shards are gathered to every rank.
class ShardedGradientSync : public GradientSync {
 public:
  virtual size_t n_buckets() const = 0;
  virtual const BucketLayout& bucket(size_t k) const = 0;
  virtual int rank() const = 0;
  virtual int ranks() const = 0;
  /// This rank's shard of bucket k's weights is updated (on an asynchronous backend: enqueued);
  /// it goes to every rank. Called for k = 0, 1, ... in order, then finish_weight_gathers(), after
  /// which every weight is the updated one (ordered before every op enqueued later).
  virtual void start_weight_gather(size_t k) = 0;
  virtual void finish_weight_gathers() = 0;
};

/// Bytes a bandwidth-optimal all-reduce (reduce-scatter, then all-gather) of `bytes` sends from
/// each of `ranks` ranks: 2 (ranks - 1) / ranks of them.
inline uint64_t allreduce_sent_bytes(uint64_t bytes, int ranks) {
  return ranks <= 1 ? 0
                    : 2 * (bytes / static_cast<uint64_t>(ranks)) * static_cast<uint64_t>(ranks - 1);
}

/// What every equal-shard sync shares (NCCL's, engine/cuda/nccl_sync.cpp, and the plan of it for
/// dry runs, engine/training/trainer.cpp): the buckets split in ShardSplit::Equal over `ranks`,
/// this rank's place, one slot of the largest padded bucket in the pool (category grads), and the
/// bytes sent.
class EqualShardSync : public ShardedGradientSync {
 public:
  EqualShardSync(Backend& be, Model& model, int rank, int ranks, uint64_t bucket_bytes);
  uint64_t sent_bytes_per_step() const override { return sent_; }
  size_t n_buckets() const override { return plan_.buckets.size(); }
  const BucketLayout& bucket(size_t k) const override { return plan_.buckets[k]; }
  int rank() const override { return rank_; }
  int ranks() const override { return ranks_; }

 protected:
  int rank_, ranks_;
  BucketPlan plan_;
  Buffer slot_;  // a base member: it outlives whatever a derived sync has in flight on it
  uint64_t sent_ = 0;
};

}  // namespace remat::parallel
