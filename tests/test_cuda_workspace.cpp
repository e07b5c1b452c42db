// The CUDA backend's pure rules (engine/core/cuda_workspace.h), checked without a GPU: the chunks
// attention runs in never end in a 1-token chunk, and the reserve for cuDNN's plan workspace
// follows the call's shapes. The planner evaluates both on any machine; the gpu rows
// [attention][chunks] and [cudnn_workspace] check them against cuDNN itself.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "engine/core/cpu_workspace.h"
#include "engine/core/cuda_workspace.h"
#include "engine/core/tensor.h"

namespace remat {
namespace {

Tensor qkv_of(int64_t B, int64_t T, int64_t W) {
  return Tensor(reinterpret_cast<void*>(256), Dims{B, T, W}, DType::BF16);
}

}  // namespace

TEST_CASE("CUDA attention chunks never leave a last chunk of one token", "[chunks][cuda_rules]") {
  // T = 129 in chunks of 128 would be 128 + 1: the 1 x 1 causal pair cuDNN's backward refuses.
  const AttentionChunks ch = cuda::attention_chunks(qkv_of(2, 129, 3 * 48), 128);
  CHECK(ch.L == 127);
  CHECK(ch.count() == 2);
  CHECK(ch.length(1) == 2);
  // Where 127 divides T - 1 as well (T = 128 x 127 + 1), one more token off.
  CHECK(cuda::attention_chunks(qkv_of(1, 128 * 127 + 1, 192), 128).L == 126);
  // A tail of two or more, and one chunk, are kept as they are.
  CHECK(cuda::attention_chunks(qkv_of(1, 130, 192), 128).L == 128);
  CHECK(cuda::attention_chunks(qkv_of(1, 128, 192), 128).L == 128);
  CHECK_FALSE(cuda::attention_chunks(qkv_of(1, 1, 192), 64).chunked());
  // Every length a config can give (multiples of 64) against every T around its multiples: one
  // token off where the tail would be one token (L - 1 divides none of these T - 1), else as given.
  for (int64_t L = 64; L <= 512; L += 64)
    for (int64_t k = 1; k <= 5; ++k)
      for (int64_t T : {k * L - 1, k * L, k * L + 1, k * L + 2}) {
        CAPTURE(L, T);
        const AttentionChunks c = cuda::attention_chunks(qkv_of(1, T, 192), L);
        CHECK(c.chunked() == (T > L));
        if (!c.chunked()) continue;
        CHECK(c.length(c.count() - 1) >= 2);
        CHECK(c.L == (T % L == 1 ? L - 1 : L));
      }
  // The automatic chunks past cuDNN's span (W = 6144: Llama-3.1-8B from 349,526 tokens) keep the
  // rule too, over a stretch of lengths.
  for (int64_t T = 349526; T < 349526 + 4096; ++T) {
    const AttentionChunks c = cuda::attention_chunks(qkv_of(1, T, 6144), 0);
    REQUIRE(c.chunked());
    if (c.length(c.count() - 1) < 2) FAIL("T = " << T << ": a last chunk of one token");
  }
  // The rule is the CUDA backend's: the CPU's kernels take a 1-token chunk as it comes.
  CHECK(cpu::attention_chunks(qkv_of(2, 129, 3 * 48), 128).L == 128);
}

TEST_CASE("the reserve for cuDNN's plan workspace follows the attention call's shapes",
          "[cuda_rules][planner]") {
  constexpr uint64_t MiB = uint64_t{1} << 20;
  // Multi-head attention, and every forward: the base 32 MiB, at any length.
  CHECK(cuda::cudnn_plan_reserve_bytes(1, 12, 12, 32768, 64, true) == 32 * MiB);
  CHECK(cuda::cudnn_plan_reserve_bytes(1, 32, 8, 65536, 128, false) == 32 * MiB);
  // Grouped-query backward: each query head's dK and dV, bf16, before the sum over its group.
  // Llama-3.1-8B (32 query heads, 8 key/value heads of 128): 32 MiB each at 4k keys, 512 MiB at
  // 64k, for each batch row.
  CHECK(cuda::cudnn_plan_reserve_bytes(1, 32, 8, 4096, 128, true) == (32 + 64) * MiB);
  CHECK(cuda::cudnn_plan_reserve_bytes(1, 32, 8, 65536, 128, true) == (32 + 1024) * MiB);
  CHECK(cuda::cudnn_plan_reserve_bytes(2, 32, 8, 4096, 128, true) == (32 + 128) * MiB);
  // The attention workspace holds the reserve of the largest call it makes: the whole batch
  // unchunked, one pair of L keys over chunks.
  const Tensor qkv = qkv_of(2, 4096, (32 + 2 * 8) * 128);
  CHECK(cuda::attention_workspace_layout(qkv, 32, 8, true, true, 0).cudnn_plan ==
        cuda::cudnn_plan_reserve_bytes(2, 32, 8, 4096, 128, true));
  CHECK(cuda::attention_workspace_layout(qkv, 32, 8, true, true, 1024).cudnn_plan ==
        cuda::cudnn_plan_reserve_bytes(1, 32, 8, 1024, 128, true));
  CHECK(cuda::attention_workspace_layout(qkv, 32, 8, true, false, 0).cudnn_plan == 32 * MiB);
}

TEST_CASE(
    "a GEMM on CUDA reads its weight in the GEMM's dtype, through a copy only when it differs",
    "[cuda_rules][nf4]") {
  // lora.base = "bf16": a bf16 GEMM reads the frozen weight as it is (no per-GEMM cast); an f32
  // weight (full fine-tuning) is cast into "gemm.weight_bf16"; an NF4 one dequantised into it; and
  // f32 activations read f32 copies of a bf16 or NF4 weight ("gemm.weight_f32").
  const auto parts = [](DType weight, DType act, bool forward = true) {
    const Tensor w(reinterpret_cast<void*>(256), Dims{64, 32}, weight);
    const Tensor x(reinterpret_cast<void*>(256), Dims{5, 32}, act);
    const Tensor y(reinterpret_cast<void*>(256), Dims{5, 64}, act);
    const WorkspaceList l =
        forward
            ? cuda::workspace(LinearForwardArgs{y, x, w}, WorkspaceTarget{DeviceKind::Cuda})
            : cuda::workspace(
                  LinearBackwardArgs{.dinp = {}, .dweight = {}, .dout = y, .inp = x, .weight = w},
                  WorkspaceTarget{DeviceKind::Cuda});
    std::vector<std::string> names;
    for (const WorkspacePart& p : l)
      if (std::string(p.name) != "gemm.workspace") names.push_back(p.name);
    return names;
  };
  using V = std::vector<std::string>;
  CHECK(parts(DType::BF16, DType::BF16) == V{});
  CHECK(parts(DType::F32, DType::BF16) == V{"gemm.weight_bf16"});
  CHECK(parts(DType::NF4DQ, DType::BF16) == V{"gemm.weight_bf16"});
  CHECK(parts(DType::NF4, DType::BF16) == V{"gemm.weight_bf16"});
  CHECK(parts(DType::F32, DType::F32) == V{});
  CHECK(parts(DType::BF16, DType::F32) == V{"gemm.weight_f32"});
  CHECK(parts(DType::NF4DQ, DType::F32) == V{"gemm.weight_f32"});
  // A backward without dinp reads no weight (a frozen one has no gradient GEMM either).
  CHECK(parts(DType::NF4DQ, DType::BF16, false) == V{});
  CHECK(parts(DType::F32, DType::BF16, false) == V{});
}

}  // namespace remat
