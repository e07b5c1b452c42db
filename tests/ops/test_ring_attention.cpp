// Op test of ring attention's local pieces (engine/core/ops/ring_attention.h) and of the ring that
// runs them (engine/parallel/context_ring.h). The ring of C ranks, played in one process step by
// step as the ranks would (each rank's queries against every rank's kv in ring order, each kv
// block's dk | dv accumulated by the ranks in ring order), gives the single-device flash
// attention's output, log-sum-exp and dqkv at every position, with and without RoPE, for sequence
// lengths that 2C does not divide. ContextRing itself, one thread per rank passing its blocks
// through host memory, gives the same. The CUDA rows run both on the GPU against the CPU. Plus the
// layout and the closed-form pair count the planner uses.
#include <condition_variable>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <thread>

#include "engine/core/token_positions.h"
#include "engine/parallel/context_ring.h"
#include "tests/ops/op_test.h"

namespace remat::test {
namespace {

using parallel::context_positions;

// Rows `pos` of a (B, T, cols) host tensor, in local order.
std::vector<float> gather_rows(const std::vector<float>& all, int64_t B, int64_t T, int64_t cols,
                               const std::vector<int64_t>& pos) {
  std::vector<float> out;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t p : pos)
      out.insert(out.end(), all.begin() + (b * T + p) * cols, all.begin() + (b * T + p + 1) * cols);
  return out;
}
// The same for a (B, NH, T) tensor.
std::vector<float> gather_heads(const std::vector<float>& all, int64_t B, int64_t NH, int64_t T,
                                const std::vector<int64_t>& pos) {
  std::vector<float> out;
  for (int64_t bh = 0; bh < B * NH; ++bh)
    for (int64_t p : pos) out.push_back(all[static_cast<size_t>(bh * T + p)]);
  return out;
}

// N(0, 1) values, deterministic in (kSeed, stream).
std::vector<float> host_values(int64_t n, uint64_t stream) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(rng_normal(kSeed, stream, i));
  return v;
}

// A tensor of `dtype` on any backend holding `host` (rounded to bf16 on the host when asked), and
// a host copy of one. No Catch2 assertions inside: the ring's ranks call them from their own
// threads, where Catch2 may not be used; a misuse throws, and the test reports it.
Buffer put(Backend& be, const std::vector<int64_t>& shape, DType dtype,
           const std::vector<float>& host) {
  Buffer b = be.pool().allocate(shape, dtype, MemCategory::Transient, "test");
  if (static_cast<size_t>(b.tensor().numel()) != host.size())
    throw std::logic_error("put: the host values do not fill the tensor");
  if (dtype == DType::F32) {
    be.upload(b, host.data());
    return b;
  }
#if REMAT_TEST_CUDA_ROWS
  std::vector<uint16_t> bits(host.size());
  for (size_t i = 0; i < host.size(); ++i) bits[i] = to_bf16_bits(host[i]);
  be.upload(b, bits.data());
  return b;
#else
  throw std::logic_error("put: bf16 tensors only in the CUDA rows");
#endif
}
std::vector<float> get(Backend& be, const Tensor& t) {
#if REMAT_TEST_CUDA_ROWS
  return fetch(be, t);
#else
  std::vector<float> out(static_cast<size_t>(t.numel()));
  be.download(out.data(), t);
  return out;
#endif
}
Buffer filled(Backend& be, const std::vector<int64_t>& shape, DType dtype, float value) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return put(be, shape, dtype, std::vector<float>(static_cast<size_t>(n), value));
}

// One attention problem: the whole sequence's qkv and dout, and how many ranks split it. KVH
// key/value heads (as many as query heads unless set), RoPE scaled when `scaling` says.
struct RingProblem {
  int64_t B, NH, T, HS;
  int ranks;
  float theta;
  std::vector<float> qkv, dout;  // (B, T, W), (B, T, C)
  int64_t KVH = 0;
  RopeScaling scaling{};
  std::vector<int32_t> doc_start{};            // (B, T) global document starts; empty: causal
  int64_t C() const { return NH * HS; }        // q's and out's width
  int64_t K() const { return KVH * HS; }       // the keys' and the values'
  int64_t W() const { return C() + 2 * K(); }  // qkv's
  int nh() const { return static_cast<int>(NH); }
  int n_kv() const { return KVH == NH ? 0 : static_cast<int>(KVH); }
  TokenPositions positions(int rank) const { return context_positions(T, ranks, rank); }
  /// The document starts of `pos` (a rank's positions) on `be`, or an empty buffer (causal).
  Buffer docs(Backend& be, const std::vector<int64_t>& pos) const {
    if (doc_start.empty()) return Buffer{};
    std::vector<int32_t> local;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t : pos) local.push_back(doc_start[static_cast<size_t>(b * T + t)]);
    Buffer buf = be.pool().allocate({B, static_cast<int64_t>(pos.size())}, DType::I32,
                                    MemCategory::Transient, "test.doc_start");
    be.upload(buf, local.data());
    return buf;
  }
};
RingProblem make_problem(int64_t B, int64_t NH, int64_t T, int64_t HS, int ranks, float theta,
                         int64_t KVH = 0, RopeScaling scaling = {}) {
  RingProblem p{B, NH, T, HS, ranks, theta, {}, {}, KVH > 0 ? KVH : NH, scaling};
  p.qkv = host_values(B * T * p.W(), 91);
  p.dout = host_values(B * T * p.C(), 92);
  return p;
}

// What each rank ends with, in its local token order, and the bytes it counted as sent to the
// next rank.
struct RankResult {
  std::vector<float> out, lse, dqkv;
  double ring_bytes = 0;
};

// The single-device attention of the whole problem on the CPU, cut into each rank's tokens.
std::vector<RankResult> single_device(const RingProblem& p) {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const int64_t C = p.C(), W = p.W();
  Buffer qkv = put(be, {p.B, p.T, W}, DType::F32, p.qkv);
  Buffer dout = put(be, {p.B, p.T, C}, DType::F32, p.dout);
  Buffer out = make_tensor(be, {p.B, p.T, C}), lse = make_tensor(be, {p.B, p.NH, p.T});
  Buffer dqkv = make_tensor(be, {p.B, p.T, W});
  std::vector<int64_t> all(static_cast<size_t>(p.T));
  std::iota(all.begin(), all.end(), int64_t{0});
  const Buffer docs = p.docs(be, all);
  be.attention_forward({.out = out,
                        .lse = lse,
                        .qkv = qkv,
                        .n_head = p.nh(),
                        .rope_theta = p.theta,
                        .n_kv_head = p.n_kv(),
                        .rope_scaling = p.scaling,
                        .doc_start = docs});
  be.attention_backward({.dqkv = dqkv,
                         .dout = dout,
                         .qkv = qkv,
                         .out = out,
                         .lse = lse,
                         .n_head = p.nh(),
                         .rope_theta = p.theta,
                         .n_kv_head = p.n_kv(),
                         .rope_scaling = p.scaling,
                         .doc_start = docs});
  const auto out_h = to_host(out), lse_h = to_host(lse), dqkv_h = to_host(dqkv);
  std::vector<RankResult> r;
  for (int i = 0; i < p.ranks; ++i) {
    const std::vector<int64_t> pos = p.positions(i).list();
    r.push_back({gather_rows(out_h, p.B, p.T, C, pos), gather_heads(lse_h, p.B, p.NH, p.T, pos),
                 gather_rows(dqkv_h, p.B, p.T, W, pos)});
  }
  return r;
}

struct RingRank {
  TokenPositions pos;
  Buffer qkv, dout, q, kv, acc, out, lse, row_sum, delta, dq, dkv, dqkv, docs;
};

// The ring's ops played on `be` in one thread, with activations (qkv, dout, out, dqkv) of type
// `act` and everything that travels or accumulates in f32, as ContextRing holds them.
std::vector<RankResult> play_ring_ops(Backend& be, DType act, const RingProblem& p) {
  const int64_t B = p.B, NH = p.NH, C = p.C(), W = p.W(), K2 = 2 * p.K();
  const int nh = p.nh(), n_kv = p.n_kv();
  std::vector<RingRank> r(static_cast<size_t>(p.ranks));
  for (int i = 0; i < p.ranks; ++i) {
    RingRank& k = r[static_cast<size_t>(i)];
    k.pos = p.positions(i);
    const std::vector<int64_t> pos = k.pos.list();
    const int64_t Tl = k.pos.tokens();
    k.qkv = put(be, {B, Tl, W}, act, gather_rows(p.qkv, B, p.T, W, pos));
    k.dout = put(be, {B, Tl, C}, act, gather_rows(p.dout, B, p.T, C, pos));
    k.q = make_tensor(be, {B, Tl, C});
    k.kv = make_tensor(be, {B, Tl, K2});
    k.acc = filled(be, {B, Tl, C}, DType::F32, 0.0f);
    k.out = filled(be, {B, Tl, C}, act, 7.0f);  // [=]: the 7s must go
    k.lse = filled(be, {B, NH, Tl}, DType::F32, -std::numeric_limits<float>::infinity());
    k.row_sum = filled(be, {B, NH, Tl}, DType::F32, 0.0f);
    k.docs = p.docs(be, pos);
    be.ring_split({k.q, k.kv, k.qkv, nh, p.theta, k.pos, n_kv, p.scaling, k.docs});
  }
  // Forward: rank i meets kv of ranks i, i - 1, ... (ring order).
  for (int i = 0; i < p.ranks; ++i) {
    RingRank& k = r[static_cast<size_t>(i)];
    for (int s = 0; s < p.ranks; ++s) {
      const RingRank& src = r[static_cast<size_t>(((i - s) % p.ranks + p.ranks) % p.ranks)];
      be.ring_block_forward(
          {k.acc, k.lse, k.row_sum, k.q, src.kv, nh, k.pos, src.pos, n_kv, k.docs});
    }
    be.ring_finish({k.out, k.acc, k.lse, k.lse, k.row_sum, nh});
  }
  // Backward: block j's accumulator visits ranks j, j + 1, ... in ring order.
  for (RingRank& k : r) {
    k.delta = make_tensor(be, {B, NH, k.pos.tokens()});
    be.attention_delta({k.delta, k.dout, k.out, nh});
    k.dq = filled(be, {B, k.pos.tokens(), C}, DType::F32, 0.0f);
    k.dkv = filled(be, {B, k.pos.tokens(), K2}, DType::F32, 0.0f);
  }
  for (int j = 0; j < p.ranks; ++j)
    for (int s = 0; s < p.ranks; ++s) {
      RingRank& k = r[static_cast<size_t>((j + s) % p.ranks)];
      RingRank& src = r[static_cast<size_t>(j)];
      be.ring_block_backward(
          {k.dq, src.dkv, k.q, src.kv, k.dout, k.lse, k.delta, nh, k.pos, src.pos, n_kv, k.docs});
    }
  std::vector<RankResult> res;
  for (RingRank& k : r) {
    k.dqkv = filled(be, {B, k.pos.tokens(), W}, act, 7.0f);  // [=]
    be.ring_merge_grad({k.dqkv, k.dq, k.dkv, nh, p.theta, k.pos, n_kv, p.scaling, k.docs});
    res.push_back({get(be, k.out), get(be, k.lse), get(be, k.dqkv)});
  }
  return res;
}

// The ranks of a ring in one process, one thread each: what rank r starts sending is staged in
// host memory at once and lands in rank r + 1's buffer when that rank waits for it. Every rank
// starts the same exchanges in the same order (ContextRing's contract), so rank r's k-th
// exchange receives rank r - 1's k-th block.
class LocalRing {
 public:
  explicit LocalRing(int ranks) : ranks_(ranks), inbox_(static_cast<size_t>(ranks)) {}

  // A rank that failed wakes the others, which would otherwise wait for its blocks forever.
  void fail() {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = true;
    cv_.notify_all();
  }

  class Channel final : public parallel::RingChannel {
   public:
    Channel(LocalRing& ring, int rank, Backend& be) : ring_(ring), rank_(rank), be_(be) {}
    int rank() const override { return rank_; }
    int size() const override { return ring_.ranks_; }
    parallel::Request start(const float* send, int64_t n_send, float* recv,
                            int64_t n_recv) override {
      std::vector<float> block(static_cast<size_t>(n_send));
      be_.download(block.data(), Tensor(const_cast<float*>(send), {n_send}, DType::F32));
      const int64_t id = ++started_;
      ring_.post((rank_ + 1) % ring_.ranks_, id, std::move(block));
      into_[id] = {recv, n_recv};
      return {id};
    }
    void wait(parallel::Request& r) override {
      if (r.id == 0) return;
      const auto [recv, n] = into_.at(r.id);
      std::vector<float> block = ring_.take(rank_, r.id);
      if (static_cast<int64_t>(block.size()) != n)
        throw std::logic_error("ring: a block of another size than the receiver expects");
      be_.upload(Tensor(recv, {n}, DType::F32), block.data());
      into_.erase(r.id);
      r.id = 0;
    }

   private:
    LocalRing& ring_;
    int rank_;
    Backend& be_;
    int64_t started_ = 0;
    std::map<int64_t, std::pair<float*, int64_t>> into_;
  };

 private:
  void post(int to, int64_t id, std::vector<float> block) {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_[static_cast<size_t>(to)][id] = std::move(block);
    cv_.notify_all();
  }
  std::vector<float> take(int rank, int64_t id) {
    std::unique_lock<std::mutex> lock(mu_);
    auto& box = inbox_[static_cast<size_t>(rank)];
    cv_.wait(lock, [&] { return broken_ || box.count(id) > 0; });
    if (box.count(id) == 0) throw std::runtime_error("ring: another rank failed");
    std::vector<float> block = std::move(box[id]);
    box.erase(id);
    return block;
  }

  int ranks_;
  bool broken_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::map<int64_t, std::vector<float>>> inbox_;
};

// ContextRing's forward and backward on every rank at once, one thread and one backend (from
// `make_backend`) per rank, as the attention of a GPT block calls them.
template <class MakeBackend>
std::vector<RankResult> run_context_ring(MakeBackend make_backend, DType act,
                                         const RingProblem& p) {
  LocalRing ring(p.ranks);
  std::vector<RankResult> res(static_cast<size_t>(p.ranks));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(p.ranks));
  auto rank_main = [&](int i) {
    try {
      std::unique_ptr<Backend> be = make_backend();
      LocalRing::Channel channel(ring, i, *be);
      parallel::ContextRing cr(&channel, p.ranks, i, p.T);
      const std::vector<int64_t> pos = cr.positions().list();
      const int64_t B = p.B, NH = p.NH, C = p.C(), W = p.W(), Tl = cr.positions().tokens();
      const int nh = p.nh();
      Buffer qkv = put(*be, {B, Tl, W}, act, gather_rows(p.qkv, B, p.T, W, pos));
      Buffer dout = put(*be, {B, Tl, C}, act, gather_rows(p.dout, B, p.T, C, pos));
      Buffer out = filled(*be, {B, Tl, C}, act, 7.0f), lse = make_tensor(*be, {B, NH, Tl});
      Buffer dqkv = filled(*be, {B, Tl, W}, act, 7.0f);
      const Buffer docs = p.docs(*be, pos);
      cr.forward(*be, {.out = out,
                       .lse = lse,
                       .qkv = qkv,
                       .n_head = nh,
                       .rope_theta = p.theta,
                       .n_kv_head = p.n_kv(),
                       .rope_scaling = p.scaling,
                       .doc_start = docs});
      Buffer delta;
      if (!be->attention_backward_needs_out()) {
        delta = make_tensor(*be, {B, NH, Tl});
        be->attention_delta({delta, dout, out, nh});
      }
      cr.backward(*be, {.dqkv = dqkv,
                        .dout = dout,
                        .qkv = qkv,
                        .out = delta.empty() ? out.tensor() : Tensor{},
                        .lse = lse,
                        .n_head = nh,
                        .rope_theta = p.theta,
                        .delta = delta,
                        .n_kv_head = p.n_kv(),
                        .rope_scaling = p.scaling,
                        .doc_start = docs});
      res[static_cast<size_t>(i)] = {get(*be, out), get(*be, lse), get(*be, dqkv),
                                     be->cost(be->phase()).ring_bytes};
    } catch (...) {
      errors[static_cast<size_t>(i)] = std::current_exception();
      ring.fail();
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < p.ranks; ++i) threads.emplace_back(rank_main, i);
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return res;
}

void check_ranks(const std::vector<RankResult>& got, const std::vector<RankResult>& want,
                 Tolerance act_tol, Tolerance lse_tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(allclose(got[i].out, want[i].out, act_tol, "out"));
    CHECK(allclose(got[i].lse, want[i].lse, lse_tol, "lse"));
    CHECK(allclose(got[i].dqkv, want[i].dqkv, act_tol, "dqkv"));
  }
}

// T = 101 with C = 2 or 3: chunks of 25/26 and 16/17 tokens (2C divides no T here); T = 200
// crosses 64-token tiles inside one chunk; C = 1 is the plain causal case.
struct RingShape {
  int64_t T;
  int ranks;
};
const std::vector<RingShape> kRingShapes = {{101, 2}, {101, 3}, {200, 2}, {37, 1}};

}  // namespace

TEST_CASE("ring attention over C ranks gives single-device attention at every position",
          "[ops][parallel]") {
  const float theta = GENERATE(0.0f, 10000.0f);
  const RingShape shape = GENERATE(from_range(kRingShapes));
  CAPTURE(shape.T, shape.ranks, theta);
  const RingProblem p = make_problem(2, 2, shape.T, 16, shape.ranks, theta);
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  check_ranks(play_ring_ops(be, DType::F32, p), single_device(p), kTolAttention, kTolAttention);
}

TEST_CASE("the context ring's schedule over ranks in threads gives single-device attention",
          "[ops][parallel]") {
  // ContextRing's forward and backward as a GPT block calls them, with its double buffers, the
  // order of its exchanges and the accumulators' trip home, each rank on its own thread.
  const float theta = GENERATE(0.0f, 10000.0f);
  const int ranks = GENERATE(2, 3);
  CAPTURE(ranks, theta);
  const RingProblem p = make_problem(2, 2, 101, 16, ranks, theta);
  auto cpu = [] { return std::make_unique<CpuBackend>(kTestBudgetBytes, 1); };
  check_ranks(run_context_ring(cpu, DType::F32, p), single_device(p), kTolAttention, kTolAttention);
}

/// Llama 3's rescaling with a short original context (32 tokens), so that it changes most
/// angles at these sequence lengths.
const RopeScaling kRingLlama3{.kind = RopeScaling::Llama3,
                              .factor = 8.0,
                              .low_freq_factor = 1.0,
                              .high_freq_factor = 4.0,
                              .original_context = 32};

namespace {

// The ring's ops played rank by rank, and ContextRing with a thread per rank (more than one rank),
// each against the single-device attention of `p`.
void check_played_and_threaded(const RingProblem& p) {
  const std::vector<RankResult> want = single_device(p);
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  check_ranks(play_ring_ops(be, DType::F32, p), want, kTolAttention, kTolAttention);
  if (p.ranks > 1) {
    auto cpu = [] { return std::make_unique<CpuBackend>(kTestBudgetBytes, 1); };
    check_ranks(run_context_ring(cpu, DType::F32, p), want, kTolAttention, kTolAttention);
  }
}

}  // namespace

TEST_CASE("ring attention with grouped-query heads gives single-device attention at every position",
          "[ops][parallel][attention]") {
  // 4 query heads over 2 key/value heads and over 1 (multi-query), RoPE plain and llama3-scaled:
  // the ops played rank by rank, and ContextRing with a thread per rank.
  const int64_t KVH = GENERATE(int64_t{2}, int64_t{1});
  const int rope = GENERATE(0, 1, 2);  // none, plain, llama3-scaled
  const RingShape shape = GENERATE(from_range(kRingShapes));
  CAPTURE(KVH, rope, shape.T, shape.ranks);
  check_played_and_threaded(make_problem(2, 4, shape.T, 16, shape.ranks, rope > 0 ? 10000.0f : 0.0f,
                                         KVH, rope == 2 ? kRingLlama3 : RopeScaling{}));
}

TEST_CASE("ring attention over C ranks with documents gives single-device document attention",
          "[ops][parallel][documents]") {
  // Documents that start inside one rank's chunk and end in another's, one-token documents, and
  // a row that is one document: the ops played rank by rank and ContextRing with a thread per
  // rank, grouped-query heads, RoPE restarting at each document's start.
  const RingShape shape = GENERATE(from_range(kRingShapes));
  const float theta = GENERATE(0.0f, 10000.0f);
  CAPTURE(shape.T, shape.ranks, theta);
  RingProblem p = make_problem(2, 4, shape.T, 16, shape.ranks, theta, 2);
  const int64_t T = shape.T;
  p.doc_start = document_starts({{1, T / 3, T - 1 - T / 3}, {T}});
  check_played_and_threaded(p);
}

/// yarn (factor 1.208 on cos and sin) and dynamic NTK (its base grown for the run's length) at
/// the same short original context.
const RopeScaling kRingYarn{.kind = RopeScaling::Yarn, .factor = 8.0, .original_context = 32};
RopeScaling ring_dynamic(int64_t T) {
  return {.kind = RopeScaling::Dynamic, .factor = 4.0, .original_context = 32, .seq_len = T};
}

TEST_CASE("ring attention with yarn and dynamic rope scaling gives single-device attention",
          "[ops][parallel][attention][rope]") {
  // Each rank rotates its tokens at their global positions with the run's frequencies and
  // attention factor: the ring's split and merge-gradient ops as the attention op's table.
  const int kind = GENERATE(0, 1);  // yarn, dynamic
  const RingShape shape = GENERATE(from_range(kRingShapes));
  CAPTURE(kind, shape.T, shape.ranks);
  const RingProblem p = make_problem(2, 4, shape.T, 16, shape.ranks, 10000.0f, 2,
                                     kind == 0 ? kRingYarn : ring_dynamic(shape.T));
  const std::vector<RankResult> want = single_device(p);
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  check_ranks(play_ring_ops(be, DType::F32, p), want, kTolAttention, kTolAttention);
}

TEST_CASE("the context ring sends the key/value heads only: NH / KVH times less than multi-head",
          "[ops][parallel][attention]") {
  // The same problem with 4 key/value heads (multi-head), 2 and 1: every block that travels
  // (kv forward and backward, and the dk | dv accumulators) is 2 KVH HS floats per token.
  const int ranks = GENERATE(2, 3);
  CAPTURE(ranks);
  auto cpu = [] { return std::make_unique<CpuBackend>(kTestBudgetBytes, 1); };
  std::vector<double> sent;  // rank 0's bytes, by KVH
  for (int64_t KVH : {4, 2, 1}) {
    const RingProblem p = make_problem(1, 4, 101, 16, ranks, 10000.0f, KVH);
    const std::vector<RankResult> got = run_context_ring(cpu, DType::F32, p);
    sent.push_back(got[0].ring_bytes);
  }
  CHECK(sent[0] > 0);
  CHECK(sent[1] == sent[0] / 2);
  CHECK(sent[2] == sent[0] / 4);
}

#if REMAT_TEST_CUDA_ROWS
namespace {

// The ring's ops on one CUDA backend and, when `with_ring`, the context ring with a backend per
// rank, against the single-device attention on the CPU. The inputs are rounded to bf16 first when
// the GPU stores bf16 activations, so that a row measures the kernels' own error: f32 tiles in
// another summation order, and one rounding of out and dqkv to bf16.
void check_ring_on_cuda(RingProblem p, DType act, bool with_ring) {
  if (act == DType::BF16)
    for (std::vector<float>* v : {&p.qkv, &p.dout})
      for (float& x : *v) x = from_bf16_bits(to_bf16_bits(x));
  const std::vector<RankResult> want = single_device(p);
  const Tolerance act_tol = act == DType::BF16 ? kCudaBf16Pointwise : kCudaF32Gemm;
  {
    cuda::CudaBackend gpu(DeviceConfig{}, act);
    check_ranks(play_ring_ops(gpu, act, p), want, act_tol, kCudaF32Gemm);
  }
  if (with_ring) {
    auto make_gpu = [act] { return std::make_unique<cuda::CudaBackend>(DeviceConfig{}, act); };
    check_ranks(run_context_ring(make_gpu, act, p), want, act_tol, kCudaF32Gemm);
  }
}

}  // namespace

TEST_CASE("ring attention's ops and the context ring on CUDA match the CPU", "[gpu][ring]") {
  const float theta = GENERATE(0.0f, 10000.0f);
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  const int64_t HS = GENERATE(16, 128);  // fewer than 32 lanes' columns, and four per lane
  const RingShape shape = GENERATE(from_range(kRingShapes));
  CAPTURE(shape.T, shape.ranks, theta, HS, dtype_name(act));
  // The ring itself (a backend per rank) on fewer cases.
  check_ring_on_cuda(make_problem(2, 2, shape.T, HS, shape.ranks, theta), act,
                     shape.ranks > 1 && HS == 16);
}

TEST_CASE("ring attention's ops with yarn rope scaling on CUDA match the CPU", "[gpu][rope]") {
  // The split and merge-gradient kernels multiply cos and sin by yarn's attention factor.
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  const RingShape shape = GENERATE(from_range(kRingShapes));
  CAPTURE(shape.T, shape.ranks, dtype_name(act));
  check_ring_on_cuda(make_problem(2, 4, shape.T, 16, shape.ranks, 10000.0f, 2, kRingYarn), act,
                     false);
}

TEST_CASE("ring attention with grouped-query heads on CUDA matches the CPU", "[gpu][ring]") {
  // 4 query heads over 2 and over 1 key/value head, RoPE none or llama3-scaled: the ops, and the
  // ring with a backend per rank when there are several.
  const int rope = GENERATE(0, 2);  // none, llama3-scaled
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  const int64_t KVH = GENERATE(int64_t{2}, int64_t{1});
  const RingShape shape = GENERATE(from_range(kRingShapes));
  CAPTURE(shape.T, shape.ranks, rope, KVH, dtype_name(act));
  check_ring_on_cuda(make_problem(2, 4, shape.T, 16, shape.ranks, rope > 0 ? 10000.0f : 0.0f, KVH,
                                  rope == 2 ? kRingLlama3 : RopeScaling{}),
                     act, shape.ranks > 1);
}
#endif

TEST_CASE("the context layout gives each rank one early and one late chunk", "[ops][parallel]") {
  // 10 tokens over 2 ranks: chunks [0,2) [2,5) [5,7) [7,10); rank 0 holds 0 and 3, rank 1 1 and 2.
  CHECK(context_positions(10, 2, 0).ranges ==
        std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {7, 3}});
  CHECK(context_positions(10, 2, 1).ranges ==
        std::vector<std::pair<int64_t, int64_t>>{{2, 3}, {5, 2}});
  // Every position exactly once, and the causal work within one pair per rank of each other.
  for (int ranks : {1, 2, 3, 8}) {
    const int64_t T = 1000;
    std::vector<int> seen(static_cast<size_t>(T), 0);
    double lo = 1e30, hi = 0, total = 0;
    TokenPositions all{{{0, T}}};
    for (int r = 0; r < ranks; ++r) {
      const TokenPositions p = context_positions(T, ranks, r);
      const std::vector<int64_t> list = p.list();
      for (int64_t x : list) ++seen[static_cast<size_t>(x)];
      // The counts the data sources take from the ranges (the copy task's second half) match
      // the list's, and for_each walks the same positions in the same order.
      for (int64_t from : {int64_t{0}, T / 3, T / 2, T / 2 + 1, T - 1, T})
        CHECK(p.count_from(from) ==
              std::count_if(list.begin(), list.end(), [&](int64_t x) { return x >= from; }));
      std::vector<int64_t> walked;
      p.for_each([&](int64_t j, int64_t x) {
        CHECK(j == static_cast<int64_t>(walked.size()));
        walked.push_back(x);
      });
      CHECK(walked == list);
      const double work = causal_pairs(p, all);
      lo = std::min(lo, work);
      hi = std::max(hi, work);
      total += work;
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    CHECK(total == static_cast<double>(T) * (T + 1) / 2);
    CHECK(hi - lo <= 2.0 * T);  // balanced: a token or two of difference per rank
  }
}
}  // namespace remat::test
