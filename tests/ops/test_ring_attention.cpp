// Op test of ring attention's local pieces (engine/ops/ring_attention.h): the ring of C ranks,
// played in one process step by step as the ranks would (each rank's queries against every
// rank's kv in ring order, each kv block's dk | dv accumulated by the ranks in ring order), gives
// the single-device flash attention's output, log-sum-exp and dqkv at every position, with and
// without RoPE, for sequence lengths that 2C does not divide. Plus the layout and the closed-form
// pair count the planner uses.
#include "engine/parallel/layout.h"
#include "tests/ops/op_test.h"

namespace remat::test {
namespace {

using parallel::context_positions;

struct RingRank {
  TokenPositions pos;
  Buffer qkv, dout, q, kv, out, lse, row_sum, delta, dq, dkv, dqkv;
};

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

void check_ring(int64_t B, int64_t NH, int64_t T, int64_t HS, int ranks, float theta) {
  CAPTURE(B, NH, T, HS, ranks, theta);
  CpuBackend be(kTestBudgetBytes, 2);
  const int64_t C = NH * HS;
  const int nh = static_cast<int>(NH);
  // The single-device reference.
  Buffer qkv = make_randn(be, {B, T, 3 * C}, kSeed, 91),
         dout = make_randn(be, {B, T, C}, kSeed, 92);
  Buffer out = make_tensor(be, {B, T, C}), lse = make_tensor(be, {B, NH, T});
  Buffer dqkv = make_tensor(be, {B, T, 3 * C});
  be.attention_forward({.out = out, .lse = lse, .qkv = qkv, .n_head = nh, .rope_theta = theta});
  be.attention_backward({.dqkv = dqkv,
                         .dout = dout,
                         .qkv = qkv,
                         .out = out,
                         .lse = lse,
                         .n_head = nh,
                         .rope_theta = theta});
  const auto qkv_h = to_host(qkv), dout_h = to_host(dout), out_h = to_host(out),
             lse_h = to_host(lse), dqkv_h = to_host(dqkv);

  std::vector<RingRank> r(static_cast<size_t>(ranks));
  for (int i = 0; i < ranks; ++i) {
    RingRank& k = r[static_cast<size_t>(i)];
    k.pos = context_positions(T, ranks, i);
    const std::vector<int64_t> p = k.pos.list();
    const int64_t Tl = k.pos.tokens();
    k.qkv = make_tensor(be, {B, Tl, 3 * C});
    be.upload(k.qkv, gather_rows(qkv_h, B, T, 3 * C, p).data());
    k.dout = make_tensor(be, {B, Tl, C});
    be.upload(k.dout, gather_rows(dout_h, B, T, C, p).data());
    k.q = make_tensor(be, {B, Tl, C});
    k.kv = make_tensor(be, {B, Tl, 2 * C});
    k.out = make_filled(be, {B, Tl, C}, 0.0f);
    k.lse = make_filled(be, {B, NH, Tl}, -std::numeric_limits<float>::infinity());
    k.row_sum = make_filled(be, {B, NH, Tl}, 0.0f);
    be.ring_split({k.q, k.kv, k.qkv, nh, theta, k.pos});
  }
  // Forward: rank i meets kv of ranks i, i - 1, ... (ring order).
  for (int i = 0; i < ranks; ++i) {
    RingRank& k = r[static_cast<size_t>(i)];
    for (int s = 0; s < ranks; ++s) {
      const RingRank& src = r[static_cast<size_t>(((i - s) % ranks + ranks) % ranks)];
      be.ring_block_forward({k.out, k.lse, k.row_sum, k.q, src.kv, nh, k.pos, src.pos});
    }
    be.ring_finish({k.out, k.lse, k.lse, k.row_sum, nh});
    const std::vector<int64_t> p = k.pos.list();
    CHECK(allclose(to_host(k.out), gather_rows(out_h, B, T, C, p), kTolAttention, "out"));
    CHECK(allclose(to_host(k.lse), gather_heads(lse_h, B, NH, T, p), kTolAttention, "lse"));
  }
  // Backward: block j's accumulator visits ranks j, j + 1, ... in ring order.
  for (RingRank& k : r) {
    k.delta = make_tensor(be, {B, NH, k.pos.tokens()});
    be.attention_delta({k.delta, k.dout, k.out, nh});
    k.dq = make_filled(be, {B, k.pos.tokens(), C}, 0.0f);
    k.dkv = make_filled(be, {B, k.pos.tokens(), 2 * C}, 0.0f);
  }
  for (int j = 0; j < ranks; ++j)
    for (int s = 0; s < ranks; ++s) {
      RingRank& k = r[static_cast<size_t>((j + s) % ranks)];
      RingRank& src = r[static_cast<size_t>(j)];
      be.ring_block_backward(
          {k.dq, src.dkv, k.q, src.kv, k.dout, k.lse, k.delta, nh, k.pos, src.pos});
    }
  for (RingRank& k : r) {
    k.dqkv = make_filled(be, {B, k.pos.tokens(), 3 * C}, 7.0f);  // [=]: the 7s must go
    be.ring_merge_grad({k.dqkv, k.dq, k.dkv, nh, theta, k.pos});
    CHECK(allclose(to_host(k.dqkv), gather_rows(dqkv_h, B, T, 3 * C, k.pos.list()), kTolAttention,
                   "dqkv"));
  }
}

}  // namespace

TEST_CASE("ring attention over C ranks gives single-device attention at every position",
          "[ops][parallel]") {
  const float theta = GENERATE(0.0f, 10000.0f);
  // T = 101 with C = 2 or 3: chunks of 25/26 and 16/17 tokens (2C divides no T here); T = 200
  // crosses 64-token tiles inside one chunk; C = 1 is the plain causal case.
  const auto [T, ranks] = GENERATE(table<int64_t, int>({{101, 2}, {101, 3}, {200, 2}, {37, 1}}));
  check_ring(2, 2, T, 16, ranks, theta);
}

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
      for (int64_t x : p.list()) ++seen[static_cast<size_t>(x)];
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
