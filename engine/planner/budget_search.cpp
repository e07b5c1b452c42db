#include "engine/planner/budget_search.h"

#include <algorithm>

#include "engine/core/error.h"

namespace remat {

namespace {

// Where the straight line through a and b reaches the budget (rounded down). long double holds
// the products (bytes up to 2^64 times x up to 2^40) without overflow.
long double crossing(PeakProbe a, PeakProbe b, uint64_t budget) {
  const long double slope = (static_cast<long double>(b.peak) - static_cast<long double>(a.peak)) /
                            static_cast<long double>(b.x - a.x);
  if (slope <= 0) return -1;  // flat between a and b: no crossing to aim at
  return static_cast<long double>(a.x) +
         (static_cast<long double>(budget) - static_cast<long double>(a.peak)) / slope;
}

int64_t clamp_to(long double v, int64_t lo, int64_t hi) {
  if (!(v >= static_cast<long double>(lo))) return lo;  // also catches NaN
  if (v >= static_cast<long double>(hi)) return hi;
  return static_cast<int64_t>(v);
}

}  // namespace

int64_t largest_fitting_between(PeakProbe ok, PeakProbe bad, uint64_t budget,
                                const PeakAt& peak_at) {
  REMAT_ASSERT(ok.x < bad.x && ok.peak <= budget && bad.peak > budget,
               "largest_fitting_between: not a bracket");
  // One interpolation probe lands next to the answer when the peak is close to affine; from
  // there, galloping (1, 2, 4, ... away from it) toward the other end of the bracket closes it
  // within allocation rounding, and bisection finishes. A curved peak costs at most about
  // twice the probes of plain bisection; an affine one, two.
  enum class Next { Interpolate, GallopUp, GallopDown, Bisect };
  Next next = Next::Interpolate;
  int64_t step = 1;
  while (bad.x - ok.x > 1) {
    int64_t x = ok.x + (bad.x - ok.x) / 2;
    if (next == Next::Interpolate) x = clamp_to(crossing(ok, bad, budget), ok.x + 1, bad.x - 1);
    if (next == Next::GallopUp) x = std::min(ok.x + step, bad.x - 1);
    if (next == Next::GallopDown) x = std::max(bad.x - step, ok.x + 1);
    const PeakProbe p{x, peak_at(x)};
    const bool fits = p.peak <= budget;
    (fits ? ok : bad) = p;
    if (next == Next::Interpolate) {
      next = fits ? Next::GallopUp : Next::GallopDown;
    } else if (next != Next::Bisect) {
      const bool same_side = fits == (next == Next::GallopUp);
      if (same_side)
        step *= 2;
      else
        next = Next::Bisect;
    }
  }
  return ok.x;
}

int64_t largest_fitting(int64_t hi, uint64_t budget, const PeakAt& peak_at,
                        std::optional<PeakProbe> known) {
  if (hi < 1) return 0;
  PeakProbe ok{1, peak_at(1)};
  if (ok.peak > budget) return 0;
  PeakProbe prev = ok;
  // The next probe: at least double, and aim just past the crossing extrapolated from the last
  // two probes that fit, so that an affine peak is bracketed tightly (and the next probe, by
  // interpolation, is the answer itself).
  auto next_after = [&](PeakProbe a, PeakProbe b) {
    const int64_t doubled = b.x > hi / 2 ? hi : 2 * b.x;
    return std::max(doubled, clamp_to(crossing(a, b, budget) + 1, b.x + 1, hi));
  };
  int64_t x = std::min<int64_t>(2, hi);
  if (known && known->x > 1 && known->x <= hi) {
    if (known->peak > budget) return largest_fitting_between(ok, *known, budget, peak_at);
    ok = *known;
    if (ok.x == hi) return hi;
    x = next_after(prev, ok);
  }
  while (x > ok.x) {
    const PeakProbe p{x, peak_at(x)};
    if (p.peak > budget) return largest_fitting_between(ok, p, budget, peak_at);
    prev = ok;
    ok = p;
    if (ok.x == hi) return hi;
    x = next_after(prev, ok);
  }
  return ok.x;
}

}  // namespace remat
