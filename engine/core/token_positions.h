// Which global positions of a sequence a rank holds. Kept as ranges, never as one entry per
// token: the data sources and the planner's dry runs build one per run, and at millions of tokens
// a list cost `plan` half its time in allocation and page faults.
//
// Context parallel's layout (context_positions): the sequence is cut into 2 x ranks chunks (sizes
// differ by at most one token) and rank r holds chunks r and 2 x ranks - 1 - r, one early and one
// late, so that every rank attends over about the same number of (query, key) pairs under the
// causal mask. A pure function of its arguments: the config (local_seq_len), the data sources and
// the ring (engine/parallel/context_ring.h) all call it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace remat {

/// The global positions of a rank's T local tokens: ranges [start, start + length), in order.
struct TokenPositions {
  std::vector<std::pair<int64_t, int64_t>> ranges;

  int64_t tokens() const {
    int64_t n = 0;
    for (const auto& r : ranges) n += r.second;
    return n;
  }
  /// How many of the positions are >= first.
  int64_t count_from(int64_t first) const {
    int64_t n = 0;
    for (const auto& [start, len] : ranges)
      n += std::max<int64_t>(0, start + len - std::max(start, first));
    return n;
  }
  /// Calls f(local index, global position) for every token, in local order.
  template <class F>
  void for_each(F&& f) const {
    int64_t j = 0;
    for (const auto& [start, len] : ranges)
      for (int64_t p = start; p < start + len; ++p) f(j++, p);
  }
  /// Every position in local order.
  std::vector<int64_t> list() const {
    std::vector<int64_t> out;
    out.reserve(static_cast<size_t>(tokens()));
    for_each([&](int64_t, int64_t p) { out.push_back(p); });
    return out;
  }
};

}  // namespace remat

namespace remat::parallel {

/// The global positions rank `rank` of `ranks` holds of a `seq_len`-token sequence.
TokenPositions context_positions(int64_t seq_len, int ranks, int rank);

}  // namespace remat::parallel
