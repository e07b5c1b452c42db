// Sums in a fixed order: a row sum that vectorises, shared by the CPU normalizations (LayerNorm,
// RMSNorm), and the column slices their parameter gradients and Linear's bias gradient sum over
// the rows in.
#pragma once

#include <algorithm>
#include <cstdint>

namespace remat::cpu {

// The sum of term(c) over a row's c in [0, C), in kLanes interleaved partial sums (term c into
// lane c % kLanes, the lanes combined pairwise, then the tail past the last whole group added): a
// fixed order, so the same
// bits on every run and thread count, but kLanes independent adds per step, which the compiler
// turns into vector adds, where one float chain is one add per FMA latency (~4 cycles).
// Measured on GPT-2 124M (1024 x 768 rows, 2 threads, Intel VM): layernorm_forward 0.60 -> 0.25
// ms a call, layernorm_backward 1.01 -> 0.65 ms.
template <class Term>
float lane_sum(int64_t C, Term term) {
  constexpr int kLanes = 16;
  float lane[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= C; c += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += term(c + l);
  float tail = 0;
  for (; c < C; ++c) tail += term(c);
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l) lane[l] += lane[l + width];
  return lane[0] + tail;
}

// Runs `slice(c0, c1)` over the column slices [c0, c1) of kSlice columns that cover [0, C), the
// slices in parallel. Each slice is one thread's, so a column's sum over the rows runs in row
// order whatever the thread count: the same bits on every run.
template <int64_t kSlice, class Slice>
void for_each_column_slice(int64_t C, Slice&& slice) {
  const int64_t n_slices = (C + kSlice - 1) / kSlice;
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < n_slices; ++s) slice(s * kSlice, std::min(C, s * kSlice + kSlice));
}

}  // namespace remat::cpu
