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
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/memory_pool.h"
#include "engine/model.h"
#include "engine/parallel/communicator.h"
#include "engine/parallel/gradient_sync.h"

namespace remat::parallel {

class GradientReducer final : public GradientSync {
 public:
  /// `comm` may be null for a dry run with `ranks` ranks: the slots are allocated, nothing is
  /// exchanged. Buckets hold at most `bucket_bytes` of gradients.
  GradientReducer(Backend& be, Model& model, Communicator* comm, int ranks, uint64_t bucket_bytes);
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;
  ~GradientReducer() override;

  /// The gradients of block `block` are final (after its backward).
  void block_done(size_t block) override;
  /// Every gradient is final (after the stem): the rest starts, and all buckets complete. Each
  /// gradient then holds the sum over the ranks.
  void finish() override;
  /// Bytes each rank sends per step (the shards it hands out, then its own shard to every rank).
  uint64_t sent_bytes_per_step() const override;
  const char* describe() const override { return "summed in rank order over MPI"; }
  size_t n_buckets() const { return buckets_.size(); }

 private:
  struct Segment {
    Param* param;
    int64_t offset, count;  // floats of param->grad
  };
  struct Bucket {
    std::vector<Segment> segments;
    int64_t floats = 0;
    std::vector<int> counts, displs;  // each rank's shard of the bucket
    Request request;
    // Idle -> Exchanging (shards out) -> Summed (this rank's shard added) -> Gathering -> Idle
    enum class State { Idle, Exchanging, Summed, Gathering } state = State::Idle;
  };
  void start(size_t k);
  void poll(size_t k);
  void sum_and_gather(size_t k);
  void complete(size_t k);
  void add_copies(size_t k);
  void unpack(size_t k);
  void start_stage(size_t stage);

  Communicator* comm_;
  int ranks_, rank_;
  std::vector<Bucket> buckets_;
  // Per stage (each block, then the rest): its buckets [first, second).
  std::vector<std::pair<size_t, size_t>> stage_buckets_;
  size_t started_ = 0;  // buckets started this step
  Buffer slots_[2];     // each: the packed bucket, then the shards received
};

}  // namespace remat::parallel
