// Helpers for op-level tests: one `allclose` that explains a mismatch (max abs/rel error, the
// first mismatching index, a few got/want pairs), the named tolerances every op test uses, a CPU
// backend, pool-allocated tensors filled from the counter-based RNG (engine/core/rng.h) and central
// differences. Tensors of the CPU backend are host memory, so tests read them through t.f32().
//
// Usage: CHECK(allclose(got, want, kTolReduction, "dweight")) — Catch2 prints the report on failure
// (and with -s on success, which is how the tolerances below were calibrated).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/rng.h"
#include "engine/cpu/cpu_backend.h"

namespace remat::test {

// ---- tolerances ----

/// |got - want| <= atol * (atol_scaled_by_max ? max|want| : 1) + rtol * |want|, elementwise.
/// Scaling atol by the largest reference entry is for gradients, whose rounding noise is set by
/// the scale of the whole tensor, not by the size of each entry.
struct Tolerance {
  double rtol = 0;
  double atol = 0;
  bool atol_scaled_by_max = false;
};

/// The kernel does the same float operations as the reference (a copy, one add, a mask).
inline constexpr Tolerance kTolExact{0, 0};
/// A few float operations per element against a double reference. GELU's 1 + tanh(u) cancels
/// for negative inputs, so its relative error grows there; the absolute error stays ~1e-7.
inline constexpr Tolerance kTolPointwise{2e-6, 2e-7};
/// GELU's derivative in float: 0.5 (1 + tanh) and 0.5 x (1 - tanh^2) du both cancel in the tails
/// (|x| ~ 3-5), where the two terms nearly cancel each other too; the absolute error there is
/// ~1e-7 |x|^2 |dout| (7e-7 measured with N(0, 2^2) inputs), inherent to the float formula.
inline constexpr Tolerance kTolGeluBackward{2e-6, 2e-6};
/// Float reductions (dot products, row/column sums, GEMMs) of up to ~1000 O(1) terms against a
/// double reference: rounding grows like sqrt(terms) * 6e-8 relative to the terms' magnitude.
inline constexpr Tolerance kTolReduction{1e-5, 1e-5};
/// Float sums over thousands of rows (weight and bias gradients over N = 5000) against double:
/// entries that cancel to O(1) out of terms whose sum reaches O(100) carry the rounding of the
/// large partial sums, so the error is set by the tensor's largest entry (5e-7 of it measured,
/// linear dweight over 5000 rows); this leaves 4x.
inline constexpr Tolerance kTolLongReduction{1e-5, 2e-6, true};
/// Flash attention in float against double: two chained reductions over up to T = 1000 keys
/// (scores, then the weighted sum of v), an online-softmax rescale per key tile, and for the
/// gradients a difference dp - D of nearly equal terms. Inputs are N(0, 1); the largest error
/// measured is 2e-6 of the largest entry (dk, T = 1000), so this leaves 5x.
inline constexpr Tolerance kTolAttention{1e-5, 1e-5, true};
/// Central differences of a float32 op: the loss is summed in double, but each output carries
/// float rounding (~6e-8 relative), which the quotient divides by 2*eps ~ 2e-2; the truncation
/// error is O(eps^2). The largest error measured is 4.5e-5 of the largest gradient entry (LM-head
/// dweight), so this leaves 4x, and stays far below the error of any wrong term (a sign, a
/// missing factor, a dropped row or tile).
inline constexpr Tolerance kTolGradcheck{2e-4, 2e-4, true};
/// Issue 4: the chunked LM-head loss equals the unchunked one within 1e-6 relative. Chunking
/// changes the summation order of dweight (one GEMM per chunk), so entries that cancel to near
/// zero are compared relative to the tensor's largest entry.
inline constexpr Tolerance kTolChunkedLoss{1e-6, 1e-6, true};

/// Step of the central differences, absolute: inputs are O(1) (N(0, 1) or near it), so this is
/// ~1e-2 relative to the values — large enough that float rounding of the outputs stays well
/// below the difference, small enough that the O(eps^2) truncation error does too.
inline constexpr double kFdEps = 1e-2;

// ---- allclose ----

/// Result of allclose: converts to bool, prints its report (Catch2 shows it on failure).
struct Closeness {
  bool ok = true;
  std::string report;
  explicit operator bool() const { return ok; }
};
inline std::ostream& operator<<(std::ostream& os, const Closeness& c) {
  return os << c.report;
}

/// Compares two ranges of numbers (float or double) elementwise under `tol`. NaN never matches.
template <class Got, class Want>
Closeness allclose(const Got& got, const Want& want, Tolerance tol, std::string_view what = "") {
  constexpr int kPairsShown = 4;
  Closeness c;
  const size_t n = std::size(got);
  if (n != std::size(want)) {
    c.ok = false;
    c.report = fmt::format("allclose({}): sizes differ: got {} elements, want {}", what, n,
                           std::size(want));
    return c;
  }
  double max_want = 0;
  for (size_t i = 0; i < n; ++i)
    max_want = std::max(max_want, std::abs(static_cast<double>(want[i])));
  const double atol = tol.atol * (tol.atol_scaled_by_max ? max_want : 1.0);
  double max_abs = 0, max_rel = 0;
  size_t i_abs = 0, i_rel = 0, n_bad = 0;
  std::string pairs;
  for (size_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    const double d = std::abs(g - w);
    const bool bad = !(d <= atol + tol.rtol * std::abs(w));  // NaN: bad
    if (bad && n_bad++ < kPairsShown)
      pairs += fmt::format("\n  [{}] got {:.9g} want {:.9g}", i, g, w);
    if (!(d <= max_abs)) {
      max_abs = d;
      i_abs = i;
    }
    const double r = w != 0 ? d / std::abs(w) : (d != 0 ? INFINITY : 0);
    if (!(r <= max_rel)) {
      max_rel = r;
      i_rel = i;
    }
  }
  c.ok = n_bad == 0;
  c.report = fmt::format(
      "allclose({}): {} of {} mismatch (rtol {:g}, atol {:g}{}); max abs err {:.3g} at [{}], "
      "max rel err {:.3g} at [{}], max |want| {:.3g}{}{}",
      what, n_bad, n, tol.rtol, atol, tol.atol_scaled_by_max ? " = atol x max|want|" : "", max_abs,
      i_abs, max_rel, i_rel, max_want, n_bad ? "; first mismatches:" : "", pairs);
  return c;
}

// ---- backend and tensors ----

/// Threads of the test backends that compare with double references: the CI machine has 2
/// cores, and two threads exercise the parallel split of every op. Each CpuBackend sets
/// OpenMP's (process-global) thread count when it is built.
inline constexpr int kTestThreads = 2;
/// Threads of the central-difference tests: they run thousands of tiny ops, and on a loaded
/// machine every OpenMP or BLAS barrier of a tiny parallel op can cost a scheduler tick (one such
/// test took 30 s instead of 0.5 s with 2 threads at load 8). The threaded paths are covered by
/// the reference tests.
inline constexpr int kFdThreads = 1;
/// Large enough for every op test; the pool counts bytes, it does not reserve them.
inline constexpr uint64_t kTestBudgetBytes = 8ull << 30;

/// A tensor from the backend's pool (category Transient unless said otherwise).
inline Buffer make_tensor(Backend& be, const std::vector<int64_t>& shape, DType dtype = DType::F32,
                          MemCategory category = MemCategory::Transient) {
  return be.pool().allocate(shape, dtype, category, "test");
}

/// The helpers below write and read tensors through host pointers: CPU backends only (a CUDA
/// tensor goes through upload and fetch, tests/ops/backend_rows.h).
inline void require_host_memory(const Backend& be) {
  INFO("a host-pointer test helper on the " << be.name() << " backend: use upload / fetch");
  REQUIRE(be.device_is_host());
}

/// An f32 tensor of N(0, scale^2) values, deterministic in (seed, stream).
inline Buffer make_randn(Backend& be, const std::vector<int64_t>& shape, uint64_t seed,
                         uint64_t stream, double scale = 1.0, double offset = 0.0) {
  require_host_memory(be);
  Buffer b = make_tensor(be, shape);
  float* p = b.f32();
  for (int64_t i = 0; i < b.tensor().numel(); ++i)
    p[i] = static_cast<float>(offset + scale * rng_normal(seed, stream, static_cast<uint64_t>(i)));
  return b;
}

/// An f32 tensor with every element equal to `value`.
inline Buffer make_filled(Backend& be, const std::vector<int64_t>& shape, float value) {
  require_host_memory(be);
  Buffer b = make_tensor(be, shape);
  std::fill(b.f32(), b.f32() + b.tensor().numel(), value);
  return b;
}

/// An i32 tensor of uniform ids in [0, n_id).
inline Buffer make_ids(Backend& be, const std::vector<int64_t>& shape, int32_t n_id, uint64_t seed,
                       uint64_t stream) {
  require_host_memory(be);
  Buffer b = make_tensor(be, shape, DType::I32);
  int32_t* p = b.tensor().i32();
  for (int64_t i = 0; i < b.tensor().numel(); ++i)
    p[i] = static_cast<int32_t>(rng_bits(seed, stream, static_cast<uint64_t>(i)) %
                                static_cast<uint64_t>(n_id));
  return b;
}

/// A copy of an f32 tensor's elements.
inline std::vector<float> to_host(const Tensor& t) {
  return std::vector<float>(t.f32(), t.f32() + t.numel());
}
/// The same, widened to double (for references).
inline std::vector<double> to_double(const Tensor& t) {
  return std::vector<double>(t.f32(), t.f32() + t.numel());
}

// ---- finite differences ----

/// L = sum(out * r) in double: the scalar whose gradient with respect to out is r, so running an
/// op's backward with dout = r gives dL/d(input) to compare with central differences.
inline double weighted_sum(const Tensor& out, const Tensor& r) {
  double acc = 0;
  for (int64_t i = 0; i < out.numel(); ++i)
    acc += static_cast<double>(out.f32()[i]) * static_cast<double>(r.f32()[i]);
  return acc;
}

/// Central differences of loss() with respect to each of x[0..n): (L(x+h) - L(x-h)) / (2h).
/// The divisor is the step actually taken in float, so rounding of x +- eps adds no bias.
inline std::vector<double> central_differences(float* x, int64_t n, double eps,
                                               const std::function<double()>& loss) {
  std::vector<double> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float x0 = x[i];
    const float xp = static_cast<float>(x0 + eps), xm = static_cast<float>(x0 - eps);
    x[i] = xp;
    const double lp = loss();
    x[i] = xm;
    const double lm = loss();
    x[i] = x0;
    g[static_cast<size_t>(i)] = (lp - lm) / (static_cast<double>(xp) - static_cast<double>(xm));
  }
  return g;
}

/// Whether two lists of tensors (host copies) are equal bit for bit: what remat and resume promise.
inline bool bitwise_equal(const std::vector<std::vector<float>>& a,
                          const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() ||
        std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}

// ---- shared by the op tests (tests/ops/) ----

inline constexpr uint64_t kSeed = 20240611;

/// (element - prefill) for the += checks: what an accumulating op added.
inline std::vector<double> minus(const Tensor& t, const std::vector<double>& before) {
  std::vector<double> d = to_double(t);
  for (size_t i = 0; i < d.size(); ++i) d[i] -= before[i];
  return d;
}

inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.data, b.data, a.bytes()) == 0;
}

/// Document starts (engine/core/ops/attention.h's doc_start) of rows cut into documents of the
/// given lengths, one list per row (each summing to the row's length): a (rows, T) i32 layout.
inline std::vector<int32_t> document_starts(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<int32_t> out;
  for (const std::vector<int64_t>& lengths : rows) {
    int64_t start = 0;
    for (int64_t n : lengths) {
      for (int64_t i = 0; i < n; ++i) out.push_back(static_cast<int32_t>(start));
      start += n;
    }
  }
  return out;
}

/// A (rows, T) i32 tensor on `be` holding `values`.
inline Buffer make_i32(Backend& be, const std::vector<int64_t>& shape,
                       const std::vector<int32_t>& values) {
  Buffer b = be.pool().allocate(shape, DType::I32, MemCategory::Transient, "test.i32");
  REMAT_ASSERT(b.tensor().numel() == static_cast<int64_t>(values.size()), "make_i32: {} values",
               values.size());
  be.upload(b, values.data());
  return b;
}

}  // namespace remat::test
