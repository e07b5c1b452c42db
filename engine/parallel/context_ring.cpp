// Context parallel: ring attention (see engine/parallel/context_ring.h).
#include "engine/parallel/context_ring.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "engine/core/error.h"

namespace remat::parallel {

namespace {

class MpiRingChannel final : public RingChannel {
 public:
  explicit MpiRingChannel(Communicator& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  Request start(const float* send, int64_t n_send, float* recv, int64_t n_recv) override {
    const int r = comm_.rank(), n = comm_.size();
    return comm_.start_sendrecv(send, n_send, (r + 1) % n, recv, n_recv, (r + n - 1) % n);
  }
  void wait(Request& r) override { comm_.wait(r); }

 private:
  Communicator& comm_;
};

}  // namespace

std::unique_ptr<RingChannel> make_mpi_ring_channel(Communicator& comm) {
  return std::make_unique<MpiRingChannel>(comm);
}

ContextRing::ContextRing(RingChannel* channel, int ranks, int rank, int64_t seq_len)
    : channel_(channel), ranks_(ranks), rank_(rank) {
  REMAT_ASSERT(!channel || (channel->size() == ranks && channel->rank() == rank),
               "context ring: rank {} of {} on a channel's rank {} of {}", rank, ranks,
               channel ? channel->rank() : 0, channel ? channel->size() : 0);
  for (int r = 0; r < ranks; ++r) pos_.push_back(context_positions(seq_len, ranks, r));
}

int64_t ContextRing::max_tokens() const {
  int64_t m = 0;
  for (int r = 0; r < ranks_; ++r) m = std::max(m, tokens(r));
  return m;
}

namespace {

// A (B, T, cols) f32 tensor over the first B * T * cols floats of `buf` (blocks from other ranks
// differ in length by a token or two; the travel buffers are sized for the longest).
Tensor rows_of(const Buffer& buf, int64_t B, int64_t T, int64_t cols) {
  return Tensor(buf.tensor().data, {B, T, cols}, DType::F32);
}

// Width of a kv block's rows: the keys and values of KVH heads of HS = C / NH (grouped-query
// attention sends its KVH heads, not one per query head).
int64_t kv_width(int64_t C, int n_head, int n_kv_head) {
  return 2 * kv_heads(n_head, n_kv_head) * (C / n_head);
}

}  // namespace

void ContextRing::forward(Backend& be, const AttentionForwardArgs& a) const {
  MemoryPool& pool = be.pool();
  const int64_t B = a.out.dim(0), T = a.out.dim(1), C = a.out.dim(2), Tmax = max_tokens();
  const int64_t KV = kv_width(C, a.n_head, a.n_kv_head);
  REMAT_ASSERT(T == tokens(rank_), "ring attention: {} local tokens, the layout gives {}", T,
               tokens(rank_));
  Buffer q = pool.allocate({B, T, C}, DType::F32, MemCategory::Transient, "ring.q");
  Buffer kv[2] = {pool.allocate({B, Tmax, KV}, DType::F32, MemCategory::Transient, "ring.kv0"),
                  pool.allocate({B, Tmax, KV}, DType::F32, MemCategory::Transient, "ring.kv1")};
  Buffer row_sum =
      pool.allocate({B, a.n_head, T}, DType::F32, MemCategory::Transient, "ring.row_sum");
  // The running sum is f32 whatever the activations are: in out itself when that is f32.
  Buffer acc_buf;
  if (a.out.dtype != DType::F32)
    acc_buf = pool.allocate({B, T, C}, DType::F32, MemCategory::Transient, "ring.acc");
  const Tensor acc = acc_buf.empty() ? a.out : acc_buf.tensor();
  be.ring_split({q, rows_of(kv[0], B, T, KV), a.qkv, a.n_head, a.rope_theta, positions(),
                 a.n_kv_head, a.rope_scaling, a.doc_start});
  be.fill(acc, 0.0f);
  be.fill(a.lse, -std::numeric_limits<float>::infinity());  // the running max until the finish
  be.fill(row_sum, 0.0f);
  for (int s = 0; s < ranks_; ++s) {
    const int src = source(s), cur = s % 2;
    Request pass;
    if (s + 1 < ranks_) {  // hand this kv on while attending to it
      const int64_t n_out = B * tokens(src) * KV, n_in = B * tokens(source(s + 1)) * KV;
      be.count_ring_bytes(4.0 * static_cast<double>(n_out));
      if (channel_) pass = channel_->start(kv[cur].f32(), n_out, kv[1 - cur].f32(), n_in);
    }
    be.ring_block_forward({acc, a.lse, row_sum, q, rows_of(kv[cur], B, tokens(src), KV), a.n_head,
                           positions(), pos_[static_cast<size_t>(src)], a.n_kv_head, a.doc_start});
    if (channel_) channel_->wait(pass);
  }
  be.ring_finish({a.out, acc, a.lse, a.lse, row_sum, a.n_head});
}

void ContextRing::backward(Backend& be, const AttentionBackwardArgs& a) const {
  MemoryPool& pool = be.pool();
  const int64_t B = a.dout.dim(0), T = a.dout.dim(1), C = a.dout.dim(2), Tmax = max_tokens();
  const int64_t KV = kv_width(C, a.n_head, a.n_kv_head);
  Buffer delta_buf;
  Tensor delta = a.delta;
  if (delta.empty()) {  // a backend that keeps O (the count backend planning CUDA): D from it
    delta_buf = pool.allocate({B, a.n_head, T}, DType::F32, MemCategory::Transient, "attn.delta");
    be.attention_delta({delta_buf, a.dout, a.out, a.n_head});
    delta = delta_buf;
  }
  Buffer q = pool.allocate({B, T, C}, DType::F32, MemCategory::Transient, "ring.q");
  Buffer dq = pool.allocate({B, T, C}, DType::F32, MemCategory::Transient, "ring.dq");
  Buffer kv[2] = {pool.allocate({B, Tmax, KV}, DType::F32, MemCategory::Transient, "ring.kv0"),
                  pool.allocate({B, Tmax, KV}, DType::F32, MemCategory::Transient, "ring.kv1")};
  Buffer dkv[2] = {pool.allocate({B, Tmax, KV}, DType::F32, MemCategory::Transient, "ring.dkv0"),
                   pool.allocate({B, Tmax, KV}, DType::F32, MemCategory::Transient, "ring.dkv1")};
  be.ring_split({q, rows_of(kv[0], B, T, KV), a.qkv, a.n_head, a.rope_theta, positions(),
                 a.n_kv_head, a.rope_scaling, a.doc_start});
  be.fill(dq, 0.0f);
  be.fill(rows_of(dkv[0], B, T, KV), 0.0f);
  for (int s = 0; s < ranks_; ++s) {
    const int src = source(s), cur = s % 2;
    const int64_t n_out = B * tokens(src) * KV;
    const int64_t n_in = B * tokens(s + 1 < ranks_ ? source(s + 1) : rank_) * KV;
    // The kv block moves on while this rank works on it (the backward only reads it) ...
    Request values;
    if (s + 1 < ranks_) {
      be.count_ring_bytes(4.0 * static_cast<double>(n_out));
      if (channel_) values = channel_->start(kv[cur].f32(), n_out, kv[1 - cur].f32(), n_in);
    }
    const Tensor dkv_src = rows_of(dkv[cur], B, tokens(src), KV);
    be.ring_block_backward({dq, dkv_src, q, rows_of(kv[cur], B, tokens(src), KV), a.dout, a.lse,
                            delta, a.n_head, positions(), pos_[static_cast<size_t>(src)],
                            a.n_kv_head, a.doc_start});
    // ... and its accumulator follows once this rank has added to it, holding the sum of the
    // ranks it has visited; after the last step it goes home to rank src. Every rank starts the
    // two exchanges in this order, which is how MPI and NCCL match them.
    if (ranks_ > 1) {
      be.count_ring_bytes(4.0 * static_cast<double>(n_out));
      if (channel_) {
        Request grads = channel_->start(dkv[cur].f32(), n_out, dkv[1 - cur].f32(), n_in);
        channel_->wait(grads);
      }
    }
    if (channel_) channel_->wait(values);
  }
  // After `ranks` steps and hops, this rank's own accumulator is in buffer ranks % 2 (buffer 0
  // when there was no hop at all).
  const Buffer& mine = ranks_ == 1 ? dkv[0] : dkv[ranks_ % 2];
  be.ring_merge_grad({a.dqkv, dq, rows_of(mine, B, T, KV), a.n_head, a.rope_theta, positions(),
                      a.n_kv_head, a.rope_scaling, a.doc_start});
}

}  // namespace remat::parallel
