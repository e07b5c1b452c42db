// Op test of the token (+ position) embedding: gather forward, scatter-add backward with repeated
// tokens; on CUDA, the forward's 16-byte and scalar paths.
// Against the CPU backend, the specification every other backend is checked against;
// tolerances and shared helpers: tests/test_util.h (through tests/ops/op_test.h).
#include <algorithm>

#include "tests/ops/op_test.h"

namespace remat::test {

/// The shapes every backend runs. Token ids are drawn from [0, n_id) with n_id < V: repeats are
/// certain (15 tokens over 4 ids, 39 over 11) and the rows from n_id on never occur, so their
/// gradient must stay as it was. C = 37 and 40 cross 16-channel slices.
struct EmbeddingShape {
  int64_t B, T, V, C, maxT;
  int32_t n_id;
};
const std::vector<EmbeddingShape> kEmbeddingShapes = {{3, 5, 5, 37, 8, 4}, {3, 13, 57, 40, 16, 11}};

TEST_CASE("embedding forward gathers token and position rows, backward scatter-adds repeats",
          "[ops]") {
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const auto [B, T, V, C, maxT, n_id] = GENERATE(from_range(kEmbeddingShapes));
  const bool use_wpe = GENERATE(true, false);
  CAPTURE(B, T, V, C, use_wpe);
  Buffer tokens = make_ids(be, {B, T}, n_id, kSeed, 101);
  const int32_t* id = tokens.tensor().i32();
  Buffer wte = make_randn(be, {V, C}, kSeed, 102);
  Buffer wpe = make_randn(be, {maxT, C}, kSeed, 103);
  const Tensor wpe_or_none = use_wpe ? wpe.tensor() : Tensor();

  Buffer out = make_filled(be, {B, T, C}, 7.0f);  // [=]: the 7s must disappear
  be.embedding_forward({.out = out, .tokens = tokens, .wte = wte, .wpe = wpe_or_none});
  std::vector<float> want;  // the same single float add as the kernel: exact
  for (int64_t i = 0; i < B * T; ++i)
    for (int64_t c = 0; c < C; ++c) {
      const float e = wte.f32()[id[i] * C + c];
      want.push_back(use_wpe ? e + wpe.f32()[(i % T) * C + c] : e);
    }
  CHECK(allclose(to_host(out), want, kTolExact, "out"));

  // The gradients are added onto the weights themselves ([+=]): rows never used stay as they are.
  Buffer dout = make_randn(be, {B, T, C}, kSeed, 112);
  std::vector<double> want_wte = to_double(wte), want_wpe = to_double(wpe);
  be.embedding_backward({.dwte = wte, .dwpe = wpe_or_none, .dout = dout, .tokens = tokens});
  for (int64_t i = 0; i < B * T; ++i)
    for (int64_t c = 0; c < C; ++c) {
      const double d = dout.f32()[i * C + c];
      want_wte[static_cast<size_t>(id[i] * C + c)] += d;
      if (use_wpe) want_wpe[static_cast<size_t>((i % T) * C + c)] += d;
    }
  CHECK(allclose(to_host(wte), want_wte, kTolReduction, "dwte"));
  CHECK(allclose(to_host(wpe), want_wpe, use_wpe ? kTolReduction : kTolExact, "dwpe"));
}

TEST_CASE("embedding forward reads a frozen bf16 token table as its decoded rows, bit for bit",
          "[ops][lora]") {
  // A LoRA run's frozen token table under lora.base = "bf16" or "nf4" is bf16 (engine/model.h).
  CpuBackend be(kTestBudgetBytes, kTestThreads);
  const auto [B, T, V, C, maxT, n_id] = GENERATE(from_range(kEmbeddingShapes));
  const bool use_wpe = GENERATE(true, false);
  CAPTURE(B, T, V, C, use_wpe);
  const Buffer tokens = make_ids(be, {B, T}, n_id, kSeed, 101);
  const std::vector<float> values = to_host(make_randn(be, {V, C}, kSeed, 102));
  const Buffer packed = packed_weight(be, V, C, DType::BF16, values);
  const Buffer plain = make_tensor(be, {V, C});
  be.upload(plain, decoded(DType::BF16, values).data());
  const Buffer wpe = make_randn(be, {maxT, C}, kSeed, 103);
  const Tensor wpe_or_none = use_wpe ? wpe.tensor() : Tensor();
  Buffer out_packed = make_filled(be, {B, T, C}, 7.0f),
         out_plain = make_filled(be, {B, T, C}, 8.0f);
  be.embedding_forward({out_packed, tokens, packed, wpe_or_none});
  be.embedding_forward({out_plain, tokens, plain, wpe_or_none});
  CHECK(to_host(out_packed) == to_host(out_plain));
  CHECK(to_host(out_plain) != to_host(make_filled(be, {B, T, C}, 8.0f)));  // really written
}

#if REMAT_TEST_CUDA_ROWS
TEST_CASE("embedding forward and deterministic scatter-add backward on CUDA match the CPU",
          "[gpu][embedding]") {
  const auto [B, T, V, C, maxT, n_id] = GENERATE(from_range(kEmbeddingShapes));
  const bool use_wpe = GENERATE(true, false);
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  CAPTURE(B, T, V, C, use_wpe, dtype_name(act));
  CudaRow r(act);
  Buffer ids = make_ids(r.cpu, {B, T}, n_id, kSeed, 101);
  const int32_t* id = ids.tensor().i32();
  const std::vector<int32_t> host_ids(id, id + B * T);
  Buffer t_c = upload_i32(r.cpu, {B, T}, host_ids), t_g = upload_i32(*r.gpu, {B, T}, host_ids);
  auto [wte_c, wte_g] = r.f32_pair({V, C}, host_randn(V * C, 102));
  auto [wpe_c, wpe_g] = r.f32_pair({maxT, C}, host_randn(maxT * C, 103));
  const Tensor wpe_on_cpu = use_wpe ? wpe_c.tensor() : Tensor();
  const Tensor wpe_on_gpu = use_wpe ? wpe_g.tensor() : Tensor();
  auto [o_c, o_g] = r.zeros_act({B, T, C});
  r.cpu.embedding_forward({o_c, t_c, wte_c, wpe_on_cpu});
  r.gpu->embedding_forward({o_g, t_g, wte_g, wpe_on_gpu});
  r.check_same(o_c, o_g, r.pick(kCudaF32Pointwise, kCudaBf16Pointwise), "out");
  auto [d_c, d_g] = r.act_pair({B, T, C}, r.act_values(B * T * C, 112));
  r.cpu.embedding_backward({wte_c, wpe_on_cpu, d_c, t_c});  // += onto the weights themselves
  r.gpu->embedding_backward({wte_g, wpe_on_gpu, d_g, t_g});
  r.check_same(wte_c, wte_g, kCudaF32Gemm, "dwte (+=)");
  r.check_same(wpe_c, wpe_g, kCudaF32Gemm, "dwpe (+=)");
  // The backward buckets the tokens from the forward's pinned copy. New tokens uploaded into the
  // same tensor without a forward must not be read from that stale copy.
  std::vector<int32_t> other(host_ids.rbegin(), host_ids.rend());
  std::rotate(other.begin(), other.begin() + 1, other.end());
  r.cpu.upload(t_c, other.data());
  r.gpu->upload(t_g, other.data());
  r.cpu.embedding_backward({wte_c, wpe_on_cpu, d_c, t_c});
  r.gpu->embedding_backward({wte_g, wpe_on_gpu, d_g, t_g});
  r.check_same(wte_c, wte_g, kCudaF32Gemm, "dwte (+=, tokens uploaded after the forward)");
}

TEST_CASE("embedding forward on CUDA: 16-byte groups and the scalar path store the CPU's bits",
          "[gpu][embedding]") {
  // C = 64: a row is whole groups (8 bf16 or 4 f32), read as 16-byte pieces of wte and wpe when
  // out starts on 16 bytes; out one element past a block's start takes the scalar path. Both
  // store the CPU's sums rounded once to the activation type. A token outside the vocabulary
  // gives a NaN row on either path.
  const int64_t B = 2, T = 9, V = 50, C = 64, maxT = 16;
  // A frozen LoRA base's bf16 table (lora.base) reads as the f32 table of its decoded values.
  const bool use_wpe = GENERATE(true, false);
  const DType act = GENERATE(from_range(kCudaActivationTypes));
  const DType table = GENERATE(DType::F32, DType::BF16);
  CAPTURE(use_wpe, dtype_name(act), dtype_name(table));
  CudaRow r(act);
  Buffer ids = make_ids(r.cpu, {B, T}, static_cast<int32_t>(V), kSeed, 104);
  const int32_t* id = ids.tensor().i32();
  std::vector<int32_t> host_ids(id, id + B * T);
  Buffer t_c = upload_i32(r.cpu, {B, T}, host_ids), t_g = upload_i32(*r.gpu, {B, T}, host_ids);
  const std::vector<float> values = host_randn(V * C, 105);
  auto [wte_c, wte_g] = r.f32_pair({V, C}, table == DType::F32 ? values : decoded(table, values));
  if (table != DType::F32) wte_g = packed_weight(*r.gpu, V, C, table, values);
  auto [wpe_c, wpe_g] = r.f32_pair({maxT, C}, host_randn(maxT * C, 106));
  const Tensor wpe_on_cpu = use_wpe ? wpe_c.tensor() : Tensor();
  const Tensor wpe_on_gpu = use_wpe ? wpe_g.tensor() : Tensor();
  Buffer o_c = r.zeros_act({B, T, C}).first;
  r.cpu.embedding_forward({o_c, t_c, wte_c, wpe_on_cpu});
  const std::vector<float> want = r.stored(to_host(o_c)), zeros(B * T * C, 0.0f);
  host_ids[3] = static_cast<int32_t>(V);  // row 3: outside the vocabulary
  Buffer bad_g = upload_i32(*r.gpu, {B, T}, host_ids);
  for (int64_t offset : {0, 1}) {
    CAPTURE(offset);
    const Placed o = upload_at(*r.gpu, {B, T, C}, act, offset, zeros);
    r.gpu->embedding_forward({o, t_g, wte_g, wpe_on_gpu});
    CHECK(identical_bits(fetch(*r.gpu, o), want, "out"));
    r.gpu->embedding_forward({o, bad_g, wte_g, wpe_on_gpu});
    const std::vector<float> got = fetch(*r.gpu, o);
    CHECK(std::all_of(got.begin() + 3 * C, got.begin() + 4 * C,
                      [](float v) { return std::isnan(v); }));
    CHECK(std::none_of(got.begin(), got.begin() + 3 * C, [](float v) { return std::isnan(v); }));
  }
}
#endif

}  // namespace remat::test
