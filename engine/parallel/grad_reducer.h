// Data parallel: the sum over ranks of every parameter gradient, started while the backward pass
// is still running. A parameter's gradient is final once the last op that writes it is done: a
// block's after that block's backward, the stem's and every parameter outside the blocks (the
// tied embedding, the final LayerNorm) after the stem. The executor reports each of those moments
// (forward_backward's GradsReady); the reducer then starts exchanging that part of the gradients.
//
// Gradients travel in buckets of at most parallel.bucket_bytes, filled in the order the backward
// finishes them (a large parameter spans several buckets). A bucket is packed into one of two
// fixed slots, each rank receives every rank's copy of its shard of the bucket, adds them in rank
// order (the same bits on every rank), and the shards are gathered back and unpacked. Two slots
// bound the memory: bucket k waits for bucket k - 2 before it takes its slot. The slots are
// allocated once, in the pool (category grads), so a dry run predicts them to the byte.
//
// With a sharded optimizer (parallel.shard_optimizer, ZeRO-1) the reduction stops half way: each
// rank keeps the sum of its own shard of every bucket (written back into those floats of the
// gradients) and nothing is gathered. After the update of those shards (engine/parallel/
// sharded_adamw.h) the buckets carry the updated weights instead: each rank's shard, gathered.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/memory_pool.h"
#include "engine/model.h"
#include "engine/parallel/communicator.h"
#include "engine/parallel/gradient_sync.h"

namespace remat::parallel {

class GradientReducer final : public ShardedGradientSync {
 public:
  /// `comm` may be null for a dry run of rank `rank` of `ranks`: the slots are allocated, nothing
  /// is exchanged. Buckets hold at most `bucket_bytes` of gradients. `shard_only`: each rank keeps
  /// the sums of its shards only (a sharded optimizer; see above).
  GradientReducer(Backend& be, Model& model, Communicator* comm, int ranks, int rank,
                  uint64_t bucket_bytes, bool shard_only = false);
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;
  ~GradientReducer() override;

  /// The gradients of block `block` are final (after its backward).
  void block_done(size_t block) override;
  /// Every gradient is final (after the stem): the rest starts, and all buckets complete. Each
  /// gradient then holds the sum over the ranks (shard_only: the floats of this rank's shards).
  void finish() override;
  /// Bytes each rank sends per step (the shards it hands out, then its own shard to every rank).
  uint64_t sent_bytes_per_step() const override;
  const char* describe() const override { return "summed in rank order over MPI"; }
  size_t n_buckets() const override { return buckets_.size(); }
  const BucketLayout& bucket(size_t k) const override { return buckets_[k]; }
  int rank() const override { return rank_; }
  int ranks() const override { return ranks_; }
  bool shard_only() const { return shard_only_; }

  /// shard_only only.
  void start_weight_gather(size_t k) override;
  void finish_weight_gathers() override;

 private:
  struct Bucket : BucketLayout {
    Request request;
    // Idle -> Exchanging (shards out) -> Summed (this rank's shard added) -> Gathering -> Idle
    enum class State { Idle, Exchanging, Summed, Gathering } state = State::Idle;
    Buffer Param::*gathered = &Param::grad;  // what the gather in flight carries
  };
  void start(size_t k);
  void poll(size_t k);
  void sum_and_gather(size_t k);
  void complete(size_t k);
  void add_copies(size_t k);
  void unpack(size_t k);
  void keep_shard(size_t k);
  void start_stage(size_t stage);

  Communicator* comm_;
  int ranks_, rank_;
  bool shard_only_;
  std::vector<Bucket> buckets_;
  // Per stage (each block, then the rest): its buckets [first, second).
  std::vector<std::pair<size_t, size_t>> stage_buckets_;
  size_t started_ = 0;  // buckets started this step
  Buffer slots_[2];     // each: the packed bucket, then the shards received
};

}  // namespace remat::parallel
