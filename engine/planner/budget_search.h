#pragma once
// The planner's searches: the largest sequence length, batch size or number of heavier blocks
// whose dry-run peak fits a budget. Each probe is a whole dry run (one counted training step),
// so the number of probes is what `plan` and `fit` cost: a 4096-layer model must still plan in
// about a second.
#include <cstdint>
#include <functional>
#include <optional>

namespace remat {

/// One probe of a search: the peak bytes of a dry run at x.
struct PeakProbe {
  int64_t x = 0;
  uint64_t peak = 0;
};

using PeakAt = std::function<uint64_t(int64_t)>;

/// The largest x in [ok.x, bad.x) with peak_at(x) <= budget, given ok.peak <= budget <
/// bad.peak and peak_at non-decreasing. Exact for any such function; probes the crossing of
/// the straight line through the bracket first, so a peak that is affine in x (as the peak is
/// in seq_len, batch size and block counts, up to allocation rounding) takes two or three
/// probes where bisection takes log2 of the range.
int64_t largest_fitting_between(PeakProbe ok, PeakProbe bad, uint64_t budget,
                                const PeakAt& peak_at);

/// The largest x in [1, hi] with peak_at(x) <= budget; 0 when peak_at(1) > budget.
/// Brackets the answer by extrapolating from the probes that fit (at least doubling x each
/// time, so a curved peak still brackets in log2(hi) probes), then calls
/// largest_fitting_between. `known` is a probe the caller already has (the configured value's
/// dry run), used instead of probing x = 2.
int64_t largest_fitting(int64_t hi, uint64_t budget, const PeakAt& peak_at,
                        std::optional<PeakProbe> known = std::nullopt);

}  // namespace remat
