// Context parallel's layout (engine/core/token_positions.h says why two chunks a rank).
#include "engine/core/token_positions.h"

namespace remat::parallel {

TokenPositions context_positions(int64_t seq_len, int ranks, int rank) {
  const int64_t n = 2 * static_cast<int64_t>(ranks);
  auto chunk = [&](int64_t i) {
    const int64_t start = i * seq_len / n, end = (i + 1) * seq_len / n;
    return std::pair<int64_t, int64_t>{start, end - start};
  };
  TokenPositions p;
  p.ranges = {chunk(rank), chunk(n - 1 - rank)};
  return p;
}

}  // namespace remat::parallel
