// Data-parallel gradient sums (see engine/parallel/grad_reducer.h).
#include "engine/parallel/grad_reducer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "engine/core/error.h"

namespace remat::parallel {

GradientReducer::GradientReducer(Backend& be, Model& model, Communicator* comm, int ranks, int rank,
                                 uint64_t bucket_bytes, bool shard_only)
    : comm_(comm), ranks_(ranks), rank_(comm ? comm->rank() : rank), shard_only_(shard_only) {
  REMAT_ASSERT(!comm || comm->size() == ranks, "reducer for {} ranks on a communicator of {}",
               ranks, comm ? comm->size() : 0);
  BucketPlan plan = plan_buckets(model, ranks, bucket_bytes, ShardSplit::Balanced);
  buckets_.resize(plan.buckets.size());
  for (size_t k = 0; k < buckets_.size(); ++k)
    static_cast<BucketLayout&>(buckets_[k]) = std::move(plan.buckets[k]);
  stage_buckets_ = std::move(plan.stage_buckets);
  const int64_t largest = plan.largest_floats;
  // The packed bucket, then the `ranks` copies of this rank's shard (at most largest + ranks).
  for (int s = 0; s < 2; ++s)
    slots_[s] = be.pool().allocate({2 * largest + ranks}, DType::F32, MemCategory::Grads,
                                   fmt::format("grad_reduce.slot{}", s));
}

GradientReducer::~GradientReducer() {
  // An error mid-step: no exchange may still write into a slot that is about to be freed.
  if (!comm_) return;
  for (Bucket& b : buckets_)
    if (b.state == Bucket::State::Exchanging || b.state == Bucket::State::Gathering) try {
        comm_->wait(b.request);
      } catch (...) {  // the error already unwinding is the one to report
      }
}

void GradientReducer::block_done(size_t block) {
  if (!comm_) return;
  for (size_t k = 0; k < started_; ++k) poll(k);  // lets MPI progress the earlier ones
  start_stage(block);
}

void GradientReducer::finish() {
  if (!comm_) return;
  start_stage(stage_buckets_.size() - 1);  // everything outside the blocks
  REMAT_ASSERT(started_ == buckets_.size(), "reducer: {} of {} buckets started", started_,
               buckets_.size());
  for (size_t k = 0; k < buckets_.size(); ++k) complete(k);
  started_ = 0;
}

void GradientReducer::start_stage(size_t stage) {
  for (size_t k = stage_buckets_[stage].first; k < stage_buckets_[stage].second; ++k) {
    REMAT_ASSERT(k == started_, "reducer: bucket {} started out of order (next is {})", k,
                 started_);
    start(k);
    ++started_;
  }
}

// MPI matches collectives by the order in which each rank starts them, so every rank starts them
// in one fixed order whatever finishes first: exchange 0; then, for each next bucket k, the
// gather of bucket k - 1 and the exchange of bucket k. Tests only finish what is in flight.
// shard_only starts no gathers here: only the exchanges, in bucket order, and bucket k waits for
// nothing but its slot.
void GradientReducer::start(size_t k) {
  if (k >= 2) complete(k - 2);  // its slot is this bucket's
  if (k >= 1) {
    if (shard_only_)
      poll(k - 1);
    else
      sum_and_gather(k - 1);
  }
  Bucket& b = buckets_[k];
  float* slot = slots_[k % 2].f32();
  for (const BucketLayout::Segment& s : b.segments)
    std::memcpy(slot + s.at, s.param->grad.f32() + s.offset,
                static_cast<size_t>(s.count) * sizeof(float));
  b.request = comm_->start_exchange(slot, b.counts, b.displs, slot + b.floats);
  b.state = Bucket::State::Exchanging;
}

void GradientReducer::poll(size_t k) {
  Bucket& b = buckets_[k];
  if (b.state == Bucket::State::Exchanging && comm_->test(b.request)) add_copies(k);
  if (b.state == Bucket::State::Summed && shard_only_) keep_shard(k);
  if (b.state == Bucket::State::Gathering && comm_->test(b.request)) unpack(k);
}

void GradientReducer::sum_and_gather(size_t k) {
  Bucket& b = buckets_[k];
  if (b.state == Bucket::State::Exchanging) {
    comm_->wait(b.request);
    add_copies(k);
  }
  if (b.state != Bucket::State::Summed) return;
  if (shard_only_) return keep_shard(k);
  b.request = comm_->start_allgather(slots_[k % 2].f32(), b.counts, b.displs);
  b.gathered = &Param::grad;
  b.state = Bucket::State::Gathering;
}

void GradientReducer::complete(size_t k) {
  sum_and_gather(k);
  Bucket& b = buckets_[k];
  if (b.state != Bucket::State::Gathering) return;
  comm_->wait(b.request);
  unpack(k);
}

// This rank's shard of bucket k: every rank's copy, added in rank order.
void GradientReducer::add_copies(size_t k) {
  Bucket& b = buckets_[k];
  float* slot = slots_[k % 2].f32();
  const int64_t c = b.counts[static_cast<size_t>(rank_)];
  const float* copies = slot + b.floats;
  float* out = slot + b.displs[static_cast<size_t>(rank_)];
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < c; ++i) {
    float acc = copies[i];
    for (int p = 1; p < ranks_; ++p) acc += copies[p * c + i];
    out[i] = acc;
  }
  b.state = Bucket::State::Summed;
}

void GradientReducer::unpack(size_t k) {
  Bucket& b = buckets_[k];
  const float* slot = slots_[k % 2].f32();
  for (const BucketLayout::Segment& s : b.segments)
    std::memcpy((s.param->*b.gathered).f32() + s.offset, slot + s.at,
                static_cast<size_t>(s.count) * sizeof(float));
  b.state = Bucket::State::Idle;
}

// shard_only: this rank's summed shard goes back into those floats of the gradients.
void GradientReducer::keep_shard(size_t k) {
  Bucket& b = buckets_[k];
  const float* slot = slots_[k % 2].f32();
  const int64_t lo = b.displs[static_cast<size_t>(rank_)];
  for_each_overlap(b, lo, lo + b.counts[static_cast<size_t>(rank_)],
                   [&](const BucketLayout::Segment& s, int64_t first, int64_t n) {
                     std::memcpy(s.param->grad.f32() + s.offset + (first - s.at), slot + first,
                                 static_cast<size_t>(n) * sizeof(float));
                   });
  b.state = Bucket::State::Idle;
}

void GradientReducer::start_weight_gather(size_t k) {
  REMAT_ASSERT(shard_only_, "weight gather without a sharded optimizer");
  if (!comm_) return;
  if (k >= 2) complete(k - 2);  // its slot is this bucket's
  if (k >= 1) poll(k - 1);      // lets MPI move it on while this rank updates
  Bucket& b = buckets_[k];
  float* slot = slots_[k % 2].f32();
  const int64_t lo = b.displs[static_cast<size_t>(rank_)];
  for_each_overlap(b, lo, lo + b.counts[static_cast<size_t>(rank_)],
                   [&](const BucketLayout::Segment& s, int64_t first, int64_t n) {
                     std::memcpy(slot + first, s.param->value.f32() + s.offset + (first - s.at),
                                 static_cast<size_t>(n) * sizeof(float));
                   });
  b.request = comm_->start_allgather(slot, b.counts, b.displs);
  b.gathered = &Param::value;
  b.state = Bucket::State::Gathering;
}

void GradientReducer::finish_weight_gathers() {
  if (!comm_) return;
  for (size_t k = buckets_.size() >= 2 ? buckets_.size() - 2 : 0; k < buckets_.size(); ++k)
    complete(k);
}

uint64_t GradientReducer::sent_bytes_per_step() const {
  uint64_t floats = 0;
  for (const Bucket& b : buckets_) {
    const auto mine = static_cast<uint64_t>(b.counts[static_cast<size_t>(rank_)]);
    floats += static_cast<uint64_t>(b.floats) - mine;    // the other ranks' shards
    floats += mine * static_cast<uint64_t>(ranks_ - 1);  // this rank's sum, to each
  }
  return floats * sizeof(float);
}

}  // namespace remat::parallel
