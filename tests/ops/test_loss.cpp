// Op test of the losses: the fused, chunked LM head + cross-entropy against a naive double
// reference, chunked = unchunked, central differences of the mean loss; the MLP's MSE. Against the
// CPU backend, the specification every other backend is checked against; tolerances and shared
// helpers: tests/test_util.h.
#include "tests/ops/op_test.h"

namespace remat::test {

namespace {

constexpr int64_t kLmN = 37, kLmC = 24, kLmV = 50;
/// Chunk rows every backend runs: unchunked, and two chunks that leave a partial last chunk.
const std::vector<int64_t> kLmChunkRows = {0, 8, 16};

struct LmHeadShape {
  int64_t N, C, V;
};

/// Inputs of one LM-head call: N rows of C channels, a V x C weight, targets in [0, V), drawn
/// from RNG streams `stream`, `stream` + 1 and + 2.
struct LmHeadCase {
  LmHeadShape shape;
  Buffer inp, weight, targets;
  explicit LmHeadCase(Backend& be, LmHeadShape s = {kLmN, kLmC, kLmV}, uint64_t stream = 121)
      : shape(s),
        inp(make_randn(be, {s.N, s.C}, kSeed, stream)),
        weight(make_randn(be, {s.V, s.C}, kSeed, stream + 1, 0.3)),
        targets(make_ids(be, {s.N}, static_cast<int32_t>(s.V), kSeed, stream + 2)) {}

  /// The op's arguments on this case's inputs, the mean loss's scale and `chunk_rows`.
  LmHeadLossArgs args(const Tensor& losses, const Tensor& dinp, const Tensor& dweight,
                      int64_t chunk_rows) const {
    return {.losses = losses,
            .dinp = dinp,
            .dweight = dweight,
            .inp = inp,
            .weight = weight,
            .targets = targets,
            .loss_scale = 1.0f / static_cast<float>(shape.N),
            .chunk_rows = chunk_rows};
  }
};

struct LmHeadResult {
  std::vector<float> losses, dinp, dweight;
};

LmHeadResult run_lm_head(Backend& be, const LmHeadCase& c, int64_t chunk_rows) {
  Buffer losses = make_filled(be, {kLmN}, 7.0f);
  Buffer dinp = make_filled(be, {kLmN, kLmC}, 7.0f);
  Buffer dweight = make_randn(be, {kLmV, kLmC}, kSeed, 124);  // [+=]: same prefill every run
  be.lm_head_loss(c.args(losses, dinp, dweight, chunk_rows));
  return {to_host(losses), to_host(dinp), to_host(dweight)};
}

/// The LM head in double, row by row: logits = inp W^T, loss = logsumexp - logit[target], and
/// the gradients of scale * sum(loss): dinp, and dweight added onto `dweight` (the op's prefill).
struct LmHeadReference {
  std::vector<double> losses, dinp, dweight;
};
LmHeadReference lm_head_reference(const float* inp, const float* weight, const int32_t* targets,
                                  int64_t N, int64_t C, int64_t V, double scale,
                                  std::vector<double> dweight) {
  LmHeadReference r{std::vector<double>(static_cast<size_t>(N)),
                    std::vector<double>(static_cast<size_t>(N * C), 0.0), std::move(dweight)};
  std::vector<double> logits(static_cast<size_t>(V));
  for (int64_t n = 0; n < N; ++n) {
    double mx = -INFINITY;
    for (int64_t v = 0; v < V; ++v) {
      double acc = 0;
      for (int64_t k = 0; k < C; ++k)
        acc += static_cast<double>(inp[n * C + k]) * weight[v * C + k];
      logits[static_cast<size_t>(v)] = acc;
      mx = std::max(mx, acc);
    }
    double sum = 0;
    for (double l : logits) sum += std::exp(l - mx);
    const double lse = mx + std::log(sum);
    const int32_t t = targets[n];
    if (t == kIgnoredTarget) continue;  // not trained: loss 0, no gradient
    r.losses[static_cast<size_t>(n)] = lse - logits[static_cast<size_t>(t)];
    for (int64_t v = 0; v < V; ++v) {
      const double g =
          (std::exp(logits[static_cast<size_t>(v)] - lse) - (v == t ? 1.0 : 0.0)) * scale;
      for (int64_t k = 0; k < C; ++k) {
        r.dinp[static_cast<size_t>(n * C + k)] += g * weight[v * C + k];
        r.dweight[static_cast<size_t>(v * C + k)] += g * inp[n * C + k];
      }
    }
  }
  return r;
}

// The op on `c` in chunks of `chunk` rows against the double reference; returns the op's results.
LmHeadResult check_lm_head_against_reference(CpuBackend& be, const LmHeadCase& c, int64_t chunk) {
  const LmHeadResult got = run_lm_head(be, c, chunk);
  Buffer prefill = make_randn(be, {kLmV, kLmC}, kSeed, 124);
  const LmHeadReference want =
      lm_head_reference(c.inp.f32(), c.weight.f32(), c.targets.tensor().i32(), kLmN, kLmC, kLmV,
                        static_cast<double>(1.0f / kLmN), to_double(prefill));
  CHECK(allclose(got.losses, want.losses, kTolReduction, "losses"));
  CHECK(allclose(got.dinp, want.dinp, kTolReduction, "dinp"));
  CHECK(allclose(got.dweight, want.dweight, kTolReduction, "dweight"));
  return got;
}

}  // namespace

TEST_CASE("lm head loss matches a naive double reference", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  LmHeadCase c(be);
  const int64_t chunk = GENERATE(from_range(kLmChunkRows));
  CAPTURE(chunk);
  check_lm_head_against_reference(be, c, chunk);
}

TEST_CASE("lm head loss: an ignored target's row has loss 0 and adds nothing to any gradient",
          "[ops][documents]") {
  // Every third target ignored (a loss mask, a document's end): the reference skips those rows.
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  LmHeadCase c(be);
  for (int64_t n = 0; n < kLmN; n += 3) c.targets.tensor().i32()[n] = kIgnoredTarget;
  const int64_t chunk = GENERATE(from_range(kLmChunkRows));
  CAPTURE(chunk);
  const LmHeadResult got = check_lm_head_against_reference(be, c, chunk);
  for (int64_t n = 0; n < kLmN; n += 3) {
    CHECK(got.losses[static_cast<size_t>(n)] == 0.0f);
    for (int64_t k = 0; k < kLmC; ++k) CHECK(got.dinp[static_cast<size_t>(n * kLmC + k)] == 0.0f);
  }
}

TEST_CASE("chunked lm head loss equals the unchunked one for dividing and non-dividing chunks",
          "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  LmHeadCase c(be);
  const LmHeadResult whole = run_lm_head(be, c, 0);
  const int64_t chunk = GENERATE(int64_t{1}, int64_t{8}, int64_t{37}, int64_t{100});
  CAPTURE(chunk);
  // The logits workspace is one chunk: (min(chunk, N), V) f32, measured by the pool.
  const uint64_t live = be.pool().live_bytes();
  be.pool().reset_peak();
  const LmHeadResult got = run_lm_head(be, c, chunk);
  const uint64_t outputs = MemoryPool::accounted_bytes(kLmN * 4) +         // losses
                           MemoryPool::accounted_bytes(kLmN * kLmC * 4) +  // dinp
                           MemoryPool::accounted_bytes(kLmV * kLmC * 4);   // dweight
  CHECK(be.pool().peak_bytes() - live - outputs ==
        MemoryPool::accounted_bytes(static_cast<size_t>(std::min(chunk, kLmN) * kLmV * 4)));
  CHECK(allclose(got.losses, whole.losses, kTolChunkedLoss, "losses"));
  CHECK(allclose(got.dinp, whole.dinp, kTolChunkedLoss, "dinp"));
  CHECK(allclose(got.dweight, whole.dweight, kTolChunkedLoss, "dweight"));
}

TEST_CASE("lm head loss gradients match central differences of the mean cross-entropy", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kFdThreads);
  LmHeadCase c(be);
  Buffer losses = make_tensor(be, {kLmN});
  Buffer dinp = make_tensor(be, {kLmN, kLmC});
  Buffer dweight = make_filled(be, {kLmV, kLmC}, 0.0f);
  Buffer scratch = make_tensor(be, {kLmV, kLmC});
  auto args = [&](const Tensor& dw) { return c.args(losses, dinp, dw, 8); };
  be.lm_head_loss(args(dweight));
  const std::vector<float> got_dinp = to_host(dinp);
  auto mean_loss = [&] {
    be.lm_head_loss(args(scratch));
    double acc = 0;
    for (int64_t n = 0; n < kLmN; ++n) acc += losses.f32()[n];
    return acc / kLmN;
  };
  CHECK(allclose(got_dinp, central_differences(c.inp.f32(), kLmN * kLmC, kFdEps, mean_loss),
                 kTolGradcheck, "dinp"));
  CHECK(allclose(to_host(dweight),
                 central_differences(c.weight.f32(), kLmV * kLmC, kFdEps, mean_loss), kTolGradcheck,
                 "dweight"));
}

TEST_CASE(
    "lm head loss over a long vocabulary: dinp by vocabulary slabs, same bits for 1 and 2 "
    "threads",
    "[ops]") {
  // V >= 8192: the CPU's dinp = dlogits W runs as 8 vocabulary slabs summed in order
  // (engine/core/cpu_workspace.h), into the slabs' own workspace. 8197 splits unevenly, and 13 rows
  // in chunks of 8 leave a partial chunk.
  constexpr int64_t N = 13, C = 24, V = 8197, kChunk = 8;
  static_assert(V >= cpu::kLmHeadSlabMinVocab);
  std::vector<float> got_dinp[2];
  for (int threads : {1, 2}) {
    CpuBackend be(kTestBudgetBytes, threads);
    const LmHeadCase c(be, {N, C, V}, 141);
    Buffer losses = make_filled(be, {N}, 7.0f);
    Buffer dinp = make_filled(be, {N, C}, 7.0f);
    Buffer dweight = make_filled(be, {V, C}, 0.0f);
    const uint64_t live = be.pool().live_bytes();
    be.pool().reset_peak();
    be.lm_head_loss(c.args(losses, dinp, dweight, kChunk));
    // The workspace the pool measured: the logits chunk and 7 slabs' partial dinp chunks.
    CHECK(be.pool().peak_bytes() - live ==
          MemoryPool::accounted_bytes(kChunk * V * 4) +
              MemoryPool::accounted_bytes((cpu::kLmHeadSlabs - 1) * kChunk * C * 4));
    got_dinp[threads - 1] = to_host(dinp);
    if (threads == 2) continue;
    const LmHeadReference want =
        lm_head_reference(c.inp.f32(), c.weight.f32(), c.targets.tensor().i32(), N, C, V,
                          static_cast<double>(1.0f / N), std::vector<double>(V * C, 0.0));
    CHECK(allclose(to_host(losses), want.losses, kTolReduction, "losses"));
    CHECK(allclose(got_dinp[0], want.dinp, kTolReduction, "dinp"));
  }
  CHECK(bitwise_equal({got_dinp[0]}, {got_dinp[1]}));
}

TEST_CASE("lm head loss with a frozen bf16 head computes what the f32 head of its values does",
          "[ops][lora]") {
  // A LoRA run's frozen LM head under lora.base = "bf16" or "nf4" is bf16 (engine/model.h): the
  // CPU decodes it once per call into the op's workspace ("gemm.weight_f32"), so the same
  // products, bit for bit, on the short and the slabbed (V >= 8192) vocabulary.
  const LmHeadShape shape = GENERATE(LmHeadShape{kLmN, kLmC, kLmV}, LmHeadShape{13, 24, 8197});
  CAPTURE(shape.N, shape.C, shape.V);
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  LmHeadCase plain(be, shape, 151);
  const std::vector<float> values = to_host(plain.weight);
  be.upload(plain.weight, decoded(DType::BF16, values).data());
  LmHeadCase packed(be, shape, 151);
  packed.weight = packed_weight(be, shape.V, shape.C, DType::BF16, values);
  std::vector<float> got[2][2];  // [packed][losses, dinp]
  uint64_t workspace[2] = {};
  for (const LmHeadCase* c : {&plain, &packed}) {
    const bool is_packed = c == &packed;
    Buffer losses = make_filled(be, {shape.N}, 7.0f);
    Buffer dinp = make_filled(be, {shape.N, shape.C}, 7.0f);
    const uint64_t live = be.pool().live_bytes();
    be.pool().reset_peak();
    be.lm_head_loss(c->args(losses, dinp, Tensor(), 8));
    workspace[is_packed] = be.pool().peak_bytes() - live;
    got[is_packed][0] = to_host(losses);
    got[is_packed][1] = to_host(dinp);
  }
  CHECK(got[1][0] == got[0][0]);
  CHECK(got[1][1] == got[0][1]);
  // The decoded copy, (V, C) f32, is the only workspace the bf16 head adds.
  CHECK(workspace[1] - workspace[0] ==
        MemoryPool::accounted_bytes(static_cast<size_t>(shape.V * shape.C * 4)));
}

namespace {

/// The rows whose largest double-precision logit leads the next by more than `margin`, with its
/// index: where any correct argmax must agree.
std::vector<std::pair<int64_t, int32_t>> clear_argmax(const LmHeadCase& c, double margin) {
  const LmHeadShape s = c.shape;
  std::vector<std::pair<int64_t, int32_t>> out;
  for (int64_t n = 0; n < s.N; ++n) {
    double best = -INFINITY, second = -INFINITY;
    int32_t at = -1;
    for (int64_t v = 0; v < s.V; ++v) {
      double acc = 0;
      for (int64_t k = 0; k < s.C; ++k)
        acc += static_cast<double>(c.inp.f32()[n * s.C + k]) * c.weight.f32()[v * s.C + k];
      if (acc > best) {
        second = best;
        best = acc;
        at = static_cast<int32_t>(v);
      } else {
        second = std::max(second, acc);
      }
    }
    if (best - second > margin) out.push_back({n, at});
  }
  return out;
}

}  // namespace

TEST_CASE("lm head loss writes each row's argmax when asked, and the same losses", "[ops][eval]") {
  // eval --passkey's exact match reads it. Every row whose top logit leads by 1e-3 (most of
  // them) has the reference's index, in every chunking; asking changes no loss or gradient bit.
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const LmHeadCase c(be);
  const auto want = clear_argmax(c, 1e-3);
  REQUIRE(want.size() > kLmN / 2);
  for (const int64_t chunk : kLmChunkRows) {
    CAPTURE(chunk);
    const LmHeadResult plain = run_lm_head(be, c, chunk);
    Buffer losses = make_filled(be, {kLmN}, 7.0f);
    Buffer dinp = make_filled(be, {kLmN, kLmC}, 7.0f);
    Buffer dweight = make_randn(be, {kLmV, kLmC}, kSeed, 124);
    Buffer argmax = make_tensor(be, {kLmN}, DType::I32);
    LmHeadLossArgs a = c.args(losses, dinp, dweight, chunk);
    a.argmax = argmax;
    be.lm_head_loss(a);
    for (const auto& [n, v] : want) CHECK(argmax.tensor().i32()[n] == v);
    CHECK(bitwise_equal({to_host(losses), to_host(dinp), to_host(dweight)},
                        {plain.losses, plain.dinp, plain.dweight}));
  }
}

TEST_CASE("lm head loss's argmax is the first of equal largest logits", "[ops][eval]") {
  // Argmax decoding (torch.argmax, std::max_element) takes the first of a tie: rows of zeros give
  // every logit 0, so every row's prediction is token 0.
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  LmHeadCase c(be);
  be.fill(c.inp, 0.0f);
  Buffer losses = make_tensor(be, {kLmN}), dinp = make_tensor(be, {kLmN, kLmC});
  Buffer dweight = make_filled(be, {kLmV, kLmC}, 0.0f);
  Buffer argmax = make_tensor(be, {kLmN}, DType::I32);
  std::fill(argmax.tensor().i32(), argmax.tensor().i32() + kLmN, 7);
  LmHeadLossArgs a = c.args(losses, dinp, dweight, 8);
  a.argmax = argmax;
  be.lm_head_loss(a);
  for (int64_t n = 0; n < kLmN; ++n) CHECK(argmax.tensor().i32()[n] == 0);
}

/// The MSE shapes every backend runs.
struct MseShape {
  int64_t N, D;
};
// D = 23: two 8-wide passes and a tail of 7; 512: the MLP tutorial's width, no tail.
const std::vector<MseShape> kMseShapes = {{7, 13}, {11, 23}, {5, 512}};

TEST_CASE("mse loss matches a double reference", "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const auto [N, D] = GENERATE(from_range(kMseShapes));
  CAPTURE(N, D);
  const float scale = 1.0f / N;
  Buffer inp = make_randn(be, {N, D}, kSeed, 131);
  Buffer target = make_randn(be, {N, D}, kSeed, 132);
  Buffer losses = make_filled(be, {N}, 7.0f);
  Buffer dinp = make_filled(be, {N, D}, 7.0f);
  be.mse_loss({.losses = losses, .dinp = dinp, .inp = inp, .target = target, .loss_scale = scale});
  std::vector<double> want_loss(N, 0.0), want_dinp;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < D; ++j) {
      const double diff = static_cast<double>(inp.f32()[n * D + j]) - target.f32()[n * D + j];
      want_loss[static_cast<size_t>(n)] += diff * diff / D;
      want_dinp.push_back(2.0 * static_cast<double>(scale) * diff / D);
    }
  CHECK(allclose(to_host(losses), want_loss, kTolReduction, "losses"));
  CHECK(allclose(to_host(dinp), want_dinp, kTolPointwise, "dinp"));
}

#if REMAT_TEST_CUDA_ROWS
TEST_CASE("fused chunked lm head loss on CUDA matches the CPU", "[gpu][lm_head]") {
  const int64_t chunk = GENERATE(from_range(kLmChunkRows));
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  const bool ignored = GENERATE(false, true);  // every third target not trained (kIgnoredTarget)
  CAPTURE(chunk, dtype_name(act), ignored);
  CudaRow r(act);
  const int64_t N = kLmN, C = kLmC, V = kLmV;
  auto [x_c, x_g] = r.act_pair({N, C}, r.act_values(N * C, 121));
  auto [w_c, w_g] = r.f32_pair({V, C}, host_randn(V * C, 122, 0.3));
  Buffer ids = make_ids(r.cpu, {N}, static_cast<int32_t>(V), kSeed, 123);
  std::vector<int32_t> host_ids(ids.tensor().i32(), ids.tensor().i32() + N);
  if (ignored)
    for (int64_t n = 0; n < N; n += 3) host_ids[static_cast<size_t>(n)] = kIgnoredTarget;
  Buffer t_c = upload_i32(r.cpu, {N}, host_ids), t_g = upload_i32(*r.gpu, {N}, host_ids);
  auto [l_c, l_g] = r.zeros_f32({N});
  auto [dx_c, dx_g] = r.zeros_act({N, C});
  auto [dw_c, dw_g] = r.f32_pair({V, C}, host_randn(V * C, 124));  // += : start from nonzero
  const float scale = 1.0f / static_cast<float>(N);
  r.cpu.lm_head_loss({l_c, dx_c, dw_c, x_c, w_c, t_c, scale, chunk});
  r.gpu->lm_head_loss({l_g, dx_g, dw_g, x_g, w_g, t_g, scale, chunk});
  r.check_same(l_c, l_g, r.pick(kCudaF32Gemm, kCudaBf16Gemm), "losses");
  r.check_same(dx_c, dx_g, r.pick(kCudaF32Gemm, kCudaBf16Gemm), "dinp");
  r.check_same(dw_c, dw_g, r.pick(kCudaF32Gemm, kCudaBf16ParamGrad), "dweight (+=)");
}

TEST_CASE("a frozen bf16 lm head on CUDA computes what the f32 head of its values does",
          "[gpu][lm_head][lora]") {
  // bf16 GEMMs read the bf16 head as it is where an f32 head goes through its bf16 copy: the
  // same operand bits, so the same results; f32 GEMMs read the bf16 head's f32 copy.
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  CAPTURE(dtype_name(act));
  CudaRow r(act);
  const int64_t N = kLmN, C = kLmC, V = kLmV;
  const std::vector<float> values = decoded(DType::BF16, host_randn(V * C, 122, 0.3));
  Buffer x = upload(*r.gpu, {N, C}, act, r.act_values(N * C, 121));
  Buffer plain = upload(*r.gpu, {V, C}, DType::F32, values);
  Buffer packed = packed_weight(*r.gpu, V, C, DType::BF16, values);
  Buffer ids = make_ids(r.cpu, {N}, static_cast<int32_t>(V), kSeed, 123);
  const std::vector<int32_t> host_ids(ids.tensor().i32(), ids.tensor().i32() + N);
  Buffer t = upload_i32(*r.gpu, {N}, host_ids);
  std::vector<float> got[2][2];  // [packed][losses, dinp]
  for (const Buffer* w : {&plain, &packed}) {
    Buffer losses = upload(*r.gpu, {N}, DType::F32, std::vector<float>(N, 7.0f));
    Buffer dinp = upload(*r.gpu, {N, C}, act, std::vector<float>(N * C, 7.0f));
    r.gpu->lm_head_loss({losses, dinp, Tensor(), x, *w, t, 1.0f / static_cast<float>(N), 16});
    got[w == &packed][0] = fetch(*r.gpu, losses);
    got[w == &packed][1] = fetch(*r.gpu, dinp);
  }
  CHECK(identical_bits(got[1][0], got[0][0], "losses"));
  CHECK(identical_bits(got[1][1], got[0][1], "dinp"));
}

TEST_CASE("the lm head's argmax on CUDA matches the CPU's", "[gpu][lm_head][eval]") {
  // Wherever the top logit leads by more than either backend's rounding of the logits (bf16
  // GEMMs: 0.05 on logits of order 1), both pick it; ties pick the first on both.
  const int64_t chunk = GENERATE(from_range(kLmChunkRows));
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  CAPTURE(chunk, dtype_name(act));
  CudaRow r(act);
  const LmHeadCase c(r.cpu);
  const auto want = clear_argmax(c, act == DType::BF16 ? 0.05 : 1e-3);
  REQUIRE(want.size() > kLmN / 3);
  auto [x_c, x_g] = r.act_pair({kLmN, kLmC}, to_host(c.inp));
  auto [w_c, w_g] = r.f32_pair({kLmV, kLmC}, to_host(c.weight));
  const std::vector<int32_t> ids(c.targets.tensor().i32(), c.targets.tensor().i32() + kLmN);
  Buffer t_g = upload_i32(*r.gpu, {kLmN}, ids);
  auto [l_c, l_g] = r.zeros_f32({kLmN});
  auto [dx_c, dx_g] = r.zeros_act({kLmN, kLmC});
  auto [dw_c, dw_g] = r.zeros_f32({kLmV, kLmC});
  Buffer a_g = upload_i32(*r.gpu, {kLmN}, std::vector<int32_t>(kLmN, -1));
  LmHeadLossArgs a{l_g, dx_g, dw_g, x_g, w_g, t_g, 1.0f / kLmN, chunk};
  a.argmax = a_g;
  r.gpu->lm_head_loss(a);
  std::vector<int32_t> got(kLmN);
  r.gpu->download(got.data(), a_g);
  for (const auto& [n, v] : want) CHECK(got[static_cast<size_t>(n)] == v);
  // Zero inputs: every logit 0, every row's first index.
  Buffer zeros = r.zeros_act({kLmN, kLmC}).second;
  a.inp = zeros;
  r.gpu->lm_head_loss(a);
  r.gpu->download(got.data(), a_g);
  for (int32_t v : got) CHECK(v == 0);
}

TEST_CASE("mse loss on CUDA matches the CPU", "[gpu][optimizer]") {
  const auto [N, D] = GENERATE(from_range(kMseShapes));
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  CAPTURE(N, D, dtype_name(act));
  CudaRow r(act);
  auto [x_c, x_g] = r.act_pair({N, D}, r.act_values(N * D, 131));
  auto [y_c, y_g] = r.f32_pair({N, D}, host_randn(N * D, 132));
  auto [l_c, l_g] = r.zeros_f32({N});
  auto [d_c, d_g] = r.zeros_act({N, D});
  r.cpu.mse_loss({l_c, d_c, x_c, y_c, 0.5f});
  r.gpu->mse_loss({l_g, d_g, x_g, y_g, 0.5f});
  r.check_same(l_c, l_g, kCudaF32Gemm, "losses");
  r.check_same(d_c, d_g, r.pick(kCudaF32Pointwise, kCudaBf16Pointwise), "dinp");
}
#endif

}  // namespace remat::test
