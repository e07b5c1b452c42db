// ZeRO-1 AdamW (see engine/parallel/sharded_adamw.h).
#include "engine/parallel/sharded_adamw.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "engine/core/error.h"
#include "engine/parallel/communicator.h"

namespace remat::parallel {

ShardedAdamW::ShardedAdamW(Backend& be, ShardedGradientSync& reducer, Communicator* comm)
    : be_(be), reducer_(reducer), comm_(comm) {
  const auto r = static_cast<size_t>(reducer.rank());
  pieces_.resize(reducer.n_buckets());
  for (size_t k = 0; k < reducer.n_buckets(); ++k) {
    const BucketLayout& b = reducer.bucket(k);
    const int64_t lo = b.displs[r], shard_at = floats_;
    for (const BucketLayout::Segment& s : b.segments) places_[s.param].push_back({k, &s, shard_at});
    for_each_overlap(
        b, lo, lo + b.counts[r], [&](const BucketLayout::Segment& s, int64_t first, int64_t n) {
          pieces_[k].push_back({s.param, s.offset + (first - s.at), n, shard_at + (first - lo)});
        });
    floats_ += b.counts[r];
  }
  // At least one float: a rank may own none (a small model over many ranks).
  MemoryPool& pool = be.pool();
  const int64_t n = std::max<int64_t>(floats_, 1);
  m_ = pool.allocate({n}, DType::F32, MemCategory::Optimizer, "adam_m (this rank's shard)");
  v_ = pool.allocate({n}, DType::F32, MemCategory::Optimizer, "adam_v (this rank's shard)");
  be.fill(m_, 0.0f);
  be.fill(v_, 0.0f);
}

Tensor ShardedAdamW::slice(const Buffer& b, int64_t offset, int64_t count) const {
  return Tensor(static_cast<float*>(b.tensor().data) + offset, {count}, DType::F32);
}

double ShardedAdamW::grad_sum_squares() {
  std::vector<Tensor> shards;
  for (const std::vector<Piece>& bucket : pieces_)
    for (const Piece& p : bucket) shards.push_back(slice(p.param->grad, p.offset, p.count));
  const double mine = shards.empty() ? 0.0 : be_.sum_squares(shards);  // a rank may own none
  return comm_ ? sum_over_ranks(*comm_, {mine})[0] : mine;
}

// Bucket by bucket: the update of bucket k's shard (its pieces in one batched call), then its
// gather, which travels while bucket k + 1 updates.
void ShardedAdamW::update(const AdamWArgs& hyper) {
  std::vector<AdamWArgs> updates;
  for (size_t k = 0; k < pieces_.size(); ++k) {
    updates.clear();
    for (const Piece& p : pieces_[k]) {
      AdamWArgs a = hyper;
      a.param = slice(p.param->value, p.offset, p.count);
      a.grad = slice(p.param->grad, p.offset, p.count);
      a.m = slice(m_, p.at, p.count);
      a.v = slice(v_, p.at, p.count);
      if (!p.param->use_decay) a.weight_decay = 0.0f;
      updates.push_back(a);
    }
    be_.adamw_update(updates);
    reducer_.start_weight_gather(k);
  }
  reducer_.finish_weight_gathers();
}

// Segment by segment: every rank sends what it holds of the segment, rank 0 places each part
// where it belongs in the parameter. Moments on a device pass through host memory first.
void ShardedAdamW::gather(const Param& p, int moment, float* whole) {
  REMAT_ASSERT(comm_ != nullptr, "checkpoint gather in a dry run");
  const Buffer& moments = moment_buffer(moment);
  const int ranks = reducer_.ranks();
  std::vector<int> counts(static_cast<size_t>(ranks)), displs(static_cast<size_t>(ranks));
  for (const SegmentPlace& place : places_.at(&p)) {
    const BucketLayout& b = reducer_.bucket(place.bucket);
    const BucketLayout::Segment& s = *place.segment;
    const float* send = nullptr;
    int n = 0;
    for (int q = 0; q < ranks; ++q) {
      const int64_t lo = b.displs[static_cast<size_t>(q)];
      const int64_t first = std::max(lo, s.at);
      const int64_t last = std::min(lo + b.counts[static_cast<size_t>(q)], s.at + s.count);
      const int64_t count = std::max<int64_t>(0, last - first);
      counts[static_cast<size_t>(q)] = static_cast<int>(count);
      displs[static_cast<size_t>(q)] = static_cast<int>(s.offset + (first - s.at));
      if (q == reducer_.rank() && count > 0) {
        const Tensor mine = slice(moments, place.shard_at + (first - lo), count);
        send = mine.f32();
        if (!be_.device_is_host()) {
          host_.resize(static_cast<size_t>(count));
          be_.download(host_.data(), mine);
          send = host_.data();
        }
        n = static_cast<int>(count);
      }
    }
    comm_->gather(send, n, whole, counts, displs, 0);
  }
}

void ShardedAdamW::load(const Param& p, int moment, const float* whole) {
  const Buffer& shard = moment_buffer(moment);
  const auto* bytes = reinterpret_cast<const unsigned char*>(whole);  // a file's, maybe unaligned
  for_each_piece_of(p, [&](const Piece& piece) {
    be_.upload(slice(shard, piece.at, piece.count),
               bytes + static_cast<size_t>(piece.offset) * sizeof(float));
  });
}

bool ShardedAdamW::grad_finite(const Param& p) {
  std::vector<Tensor> mine;
  for_each_piece_of(
      p, [&](const Piece& piece) { mine.push_back(slice(p.grad, piece.offset, piece.count)); });
  return mine.empty() || std::isfinite(be_.sum_squares(mine));
}

}  // namespace remat::parallel
