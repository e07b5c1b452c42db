// Context parallel: every row's sequence is split over the `ranks` ranks of a context group
// (engine/core/token_positions.h: two chunks per rank, one early and one late, for balanced causal
// work), and attention becomes a ring. Every token-wise op (embedding, LayerNorm, the GEMMs, the
// loss) runs on the rank's own tokens unchanged; only attention needs the others'.
//
// Ring attention, forward: each rank splits its qkv into q and kv = k | v (RoPE applied at the
// tokens' global positions), then for `ranks` steps attends its queries to the kv it holds while
// passing that kv on to rank r + 1 and receiving rank r - 1's, folding each step into a running
// online softmax (engine/core/ops/ring_attention.h) and finishing with the same output and
// log-sum-exp as single-device flash attention. Backward: the kv blocks travel the same way with a
// dk | dv accumulator beside them; each rank adds its queries' share, and after the last step one
// more hop brings every accumulator home, summed by the ranks in ring order.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/ops/ring_attention.h"
#include "engine/core/token_positions.h"
#include "engine/parallel/communicator.h"

namespace remat::parallel {

/// How ring blocks travel between the ranks of a context group: each start() sends to the next
/// rank and receives from the previous one, on the memory the backend computes in. MPI moves host
/// memory (the CPU backend: make_mpi_ring_channel); NCCL moves device memory on a stream of its
/// own, ordered after the compute stream's work so far and before its later work by events
/// (cuda::make_nccl_ring_channel). Every rank starts its exchanges in the same order.
class RingChannel {
 public:
  virtual ~RingChannel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Non-blocking: `n_send` floats of `send` to rank + 1 and `n_recv` floats from rank - 1 into
  /// `recv`. Neither buffer may be touched until wait() on the returned request.
  virtual Request start(const float* send, int64_t n_send, float* recv, int64_t n_recv) = 0;
  /// The exchange is done for whatever runs after this call (on an asynchronous backend: the
  /// compute ops enqueued after it).
  virtual void wait(Request& r) = 0;
};

/// The ring over `comm` (the context group) with MPI point-to-point messages on host memory.
std::unique_ptr<RingChannel> make_mpi_ring_channel(Communicator& comm);

class ContextRing {
 public:
  /// `channel` joins the context group (its size is `ranks`), or null for a dry run of rank
  /// `rank`: the same allocations and op counts, no exchange.
  ContextRing(RingChannel* channel, int ranks, int rank, int64_t seq_len);
  int ranks() const { return ranks_; }
  int rank() const { return rank_; }
  const TokenPositions& positions() const { return pos_[static_cast<size_t>(rank_)]; }

  /// attention_forward over the ring: `a` holds this rank's tokens (B, T_local, ...).
  void forward(Backend& be, const AttentionForwardArgs& a) const;
  /// attention_backward over the ring (with `delta`, or `out` to form it).
  void backward(Backend& be, const AttentionBackwardArgs& a) const;

 private:
  int64_t tokens(int r) const { return pos_[static_cast<size_t>(r)].tokens(); }
  int64_t max_tokens() const;
  /// The rank whose kv this rank holds at ring step s.
  int source(int s) const { return ((rank_ - s) % ranks_ + ranks_) % ranks_; }

  RingChannel* channel_;
  int ranks_, rank_;
  std::vector<TokenPositions> pos_;  // every rank's
};

}  // namespace remat::parallel
