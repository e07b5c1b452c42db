// How the threads share the calls of one CPU product (engine/cpu/gemm.cpp): each thread first
// runs its own contiguous share of the calls, as `schedule(static)` would, and a thread done with
// its share then takes calls left in the others', as `schedule(dynamic)` would.
//
// Why not one of the two: with its own contiguous rows a thread finds in its cache what it wrote
// in the op before (the elementwise ops split rows the same way), and the product's first tiles
// what the next op reads. On the quiet Intel VM (2026-12-07, 3 alternated pairs each) static
// made SmolLM2-135M's linear ops 3% faster than dynamic (LoRA 797 -> 769 ms a step, full 1013 ->
// 979), but beside one busy loop 6% slower (a LoRA step 2323 -> 2479 ms): a descheduled thread's
// share waits for it. Taking the others' leftovers keeps dynamic's behaviour under load: against
// dynamic, a LoRA step 1225/1216, 1273/1141, 1220/1198 ms alone, 2265/2171 and 2154/2204 beside
// one busy loop (docs/performance.md, "Which thread runs which tile").
//
// Which thread runs a call changes no bit: every call is one single-threaded product of its own.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace remat::cpu {

/// Runs body(i) once for each i in [0, n) on the threads of one parallel region (always opened,
/// even for one call: gemm.cpp relies on an active region). body must not throw.
template <class Body>
void for_each_call_own_share_first(int64_t n, Body&& body) {
  struct alignas(64) Share {  // a cache line each: the threads' claims do not contend
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  // On the stack for up to kOnStack threads: a tiny product's call costs microseconds.
  constexpr int kOnStack = 64;
  const int threads = std::max(1, omp_get_max_threads());
  Share on_stack[kOnStack];
  const std::unique_ptr<Share[]> on_heap(
      threads > kOnStack ? new Share[static_cast<size_t>(threads)] : nullptr);
  Share* share = on_heap ? on_heap.get() : on_stack;
  // The first threads take the extra calls (as schedule(static) does): a product of one call
  // runs on the thread that opened the region, which is already awake.
  const auto begin = [&](int64_t t) { return (n * t + threads - 1) / threads; };
  for (int t = 0; t < threads; ++t) {
    share[t].next.store(begin(t), std::memory_order_relaxed);
    share[t].end = begin(t + 1);
  }
#pragma omp parallel num_threads(threads)
  {
    // Every share, own first: a team smaller than asked for still runs every call.
    const int self = omp_get_thread_num();
    for (int k = 0; k < threads; ++k) {
      Share& s = share[(self + k) % threads];
      for (int64_t i = s.next.fetch_add(1, std::memory_order_relaxed); i < s.end;
           i = s.next.fetch_add(1, std::memory_order_relaxed))
        body(i);
    }
  }
}

}  // namespace remat::cpu
