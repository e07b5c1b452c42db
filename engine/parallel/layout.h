// Context parallel's layout: which tokens of every row each rank of a context group holds. The
// sequence is cut into 2 x ranks chunks (sizes differ by at most one token) and rank r holds
// chunks r and 2 x ranks - 1 - r, one early and one late, so that every rank attends over about
// the same number of (query, key) pairs under the causal mask. A pure function of its arguments:
// the config (local_seq_len), the data sources and the ring (context_ring.h) all call it.
#pragma once

#include <cstdint>

#include "engine/ops/ring_attention.h"

namespace remat::parallel {

/// The global positions rank `rank` of `ranks` holds of a `seq_len`-token sequence.
TokenPositions context_positions(int64_t seq_len, int ranks, int rank);

}  // namespace remat::parallel
