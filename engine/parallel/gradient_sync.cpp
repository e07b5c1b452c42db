// How gradients are cut into buckets for the sums over ranks (see engine/parallel/gradient_sync.h).
#include "engine/parallel/gradient_sync.h"

namespace remat::parallel {

namespace {

void split_over_ranks(BucketLayout& b, int ranks, ShardSplit split) {
  b.counts.resize(static_cast<size_t>(ranks));
  b.displs.resize(static_cast<size_t>(ranks));
  const int64_t per_rank = (b.floats + ranks - 1) / ranks;
  const int64_t equal = (per_rank + kShardAlignFloats - 1) / kShardAlignFloats * kShardAlignFloats;
  if (split == ShardSplit::Equal) b.span = equal;
  int64_t displ = 0;
  for (int q = 0; q < ranks; ++q) {
    const int64_t c = split == ShardSplit::Balanced
                          ? b.floats / ranks + (q < b.floats % ranks ? 1 : 0)
                          : std::clamp<int64_t>(b.floats - q * equal, 0, equal);
    b.counts[static_cast<size_t>(q)] = static_cast<int>(c);
    b.displs[static_cast<size_t>(q)] =
        static_cast<int>(split == ShardSplit::Balanced ? displ : q * equal);
    displ += c;
  }
}

}  // namespace

BucketPlan plan_buckets(Model& model, int ranks, uint64_t bucket_bytes, ShardSplit split) {
  BucketPlan plan;
  std::vector<BucketLayout>& buckets = plan.buckets;
  const size_t L = model.n_blocks();
  const auto cap = static_cast<int64_t>(std::max<uint64_t>(bucket_bytes / sizeof(float), 1));
  // Stages in the order the backward finishes them: the last block first, the rest at the end.
  std::vector<size_t> order;
  for (size_t i = L; i-- > 0;) order.push_back(i);
  order.push_back(L);
  const std::vector<std::vector<Param*>> by_stage = params_by_stage(model);
  plan.stage_buckets.assign(L + 1, {0, 0});
  for (size_t stage : order) {
    plan.stage_buckets[stage].first = buckets.size();
    bool open = false;
    for (Param* p : by_stage[stage]) {
      const int64_t n = p->grad.tensor().numel();
      for (int64_t off = 0; off < n;) {
        if (!open || buckets.back().floats == cap) buckets.emplace_back(), open = true;
        BucketLayout& b = buckets.back();
        const int64_t take = std::min(n - off, cap - b.floats);
        b.segments.push_back({p, off, take, b.floats});
        b.floats += take;
        off += take;
      }
    }
    plan.stage_buckets[stage].second = buckets.size();
  }
  for (BucketLayout& b : buckets) {
    split_over_ranks(b, ranks, split);
    const int64_t padded =
        split == ShardSplit::Balanced ? b.floats : static_cast<int64_t>(ranks) * b.span;
    plan.largest_floats = std::max(plan.largest_floats, padded);
  }
  return plan;
}

EqualShardSync::EqualShardSync(Backend& be, Model& model, int rank, int ranks,
                               uint64_t bucket_bytes)
    : rank_(rank),
      ranks_(ranks),
      plan_(plan_buckets(model, ranks, bucket_bytes, ShardSplit::Equal)),
      slot_(be.pool().allocate({plan_.largest_floats}, DType::F32, MemCategory::Grads,
                               "grad_reduce.slot")) {
  // A reduce-scatter and an all-gather per bucket, each sending (ranks - 1) padded shards.
  uint64_t floats = 0;
  for (const BucketLayout& b : plan_.buckets)
    floats += 2 * static_cast<uint64_t>(b.span) * static_cast<uint64_t>(ranks - 1);
  sent_ = floats * sizeof(float);
}

}  // namespace remat::parallel
