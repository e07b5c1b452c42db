// Kernel-level checks of engine/cuda/elementwise.cu where no op exposes a kernel whole: RoPE
// (inside attention) against the per-pair kernel it replaced (tests/gpu/rope_reference.cu), bit
// for bit, for every head layout, type pair and direction, in place and not, and against a
// double-precision rotation at positions past 10^6; bias_rows (the linear's fallback where
// cuBLASLt has no bias epilogue) on its 16-byte and scalar paths against the host's bits. The
// kernels run on the legacy default stream between device-wide syncs, since the backend's own
// stream is not exposed.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/core/ops/rope.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/op_util.h"
#include "tests/gpu/rope_reference.h"
#include "tests/ops/backend_rows.h"

namespace remat::test {
namespace {

using cuda::kern::RopeFrequencies;
using cuda::kern::RopeParams;

/// Runs `launch` once the backend's uploads are done, and waits for it.
template <typename F>
void launch_and_wait(F launch) {
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  launch();
  REQUIRE(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

RopeFrequencies frequencies(int64_t HS, double theta, const RopeScaling& scaling = {}) {
  return cuda::rope_frequencies(HS, static_cast<float>(theta), scaling, "[test]");
}

using RopeLauncher = void (*)(const RopeParams&, cudaStream_t);

/// dst of one `launch` on a fresh upload of `src`: in place, that upload itself; else a tensor
/// that starts as 7s, so that an element the kernel skips shows.
std::vector<float> rope_run(Backend& gpu, RopeParams p, const std::vector<float>& src,
                            bool in_place, RopeLauncher launch) {
  const int64_t n = static_cast<int64_t>(src.size());
  const Buffer s = upload(gpu, {n}, p.src_bf16 ? DType::BF16 : DType::F32, src);
  const Buffer d = in_place ? Buffer()
                            : upload(gpu, {n}, p.dst_bf16 ? DType::BF16 : DType::F32,
                                     std::vector<float>(src.size(), 7.0f));
  p.src = s.tensor().data;
  p.dst = in_place ? s.tensor().data : d.tensor().data;
  launch_and_wait([&] { launch(p, nullptr); });
  return fetch(gpu, in_place ? s.tensor() : d.tensor());
}

struct RopeShape {
  int64_t B, T, NH, KVH, HS;
};
// GPT-2's 12 heads (multi-head: 24 rotated heads, 6 steps of 4), grouped-query at HS = 128 (10
// rotated: 2 steps and 2 single heads), multi-query at the largest head size, 256 (5 rotated),
// HS = 16 with 3 query and 3 key heads (6 rotated: one step and 2 single heads), and HS = 2: one
// pair per head, 8 rotated heads.
const std::vector<RopeShape> kRopeShapes = {
    {2, 37, 12, 12, 64}, {1, 67, 8, 2, 128}, {1, 33, 4, 1, 256}, {3, 5, 3, 3, 16}, {2, 9, 5, 3, 2}};

/// Llama 3's rescaling with a short original context, so that the tested positions see all three
/// frequency bands (tests/ops/test_attention.cpp's kLlama3Short).
const RopeScaling kLlama3Short{.kind = RopeScaling::Llama3,
                               .factor = 8.0,
                               .low_freq_factor = 1.0,
                               .high_freq_factor = 4.0,
                               .original_context = 32};
/// The other scalings at the same short context (tests/ops/test_attention.cpp's rows): yarn's
/// factor 1.208 on cos and sin, and dynamic NTK's base grown for 200 positions.
const RopeScaling kYarnShort{.kind = RopeScaling::Yarn, .factor = 8.0, .original_context = 32};
const std::vector<RopeScaling> kScalings = {
    {.kind = RopeScaling::Linear, .factor = 4.0},
    {.kind = RopeScaling::Dynamic, .factor = 4.0, .original_context = 32, .seq_len = 200},
    kYarnShort,
    kLlama3Short};

}  // namespace

TEST_CASE(
    "RoPE on CUDA gives the per-pair kernel's bits: every head layout, type pair, direction and "
    "frequency table, in place and not",
    "[gpu][rope]") {
  const RopeShape sh = GENERATE(from_range(kRopeShapes));
  CAPTURE(sh.B, sh.T, sh.NH, sh.KVH, sh.HS);
  cuda::CudaBackend gpu(DeviceConfig{}, DType::BF16);
  const int64_t n = sh.B * sh.T * (sh.NH + 2 * sh.KVH) * sh.HS;
  const std::vector<float> values = host_randn(n, 61);
  const RopeFrequencies tables[] = {frequencies(sh.HS, 0), frequencies(sh.HS, 10000),
                                    frequencies(sh.HS, 10000, kLlama3Short),
                                    frequencies(sh.HS, 10000, kYarnShort)};
  for (const RopeFrequencies& freq : tables)
    for (bool dst_bf16 : {false, true})
      for (bool src_bf16 : {false, true})
        for (bool inverse : {false, true})
          for (bool in_place : {false, true}) {
            if (in_place && dst_bf16 != src_bf16) continue;  // one storage: one type
            CAPTURE(freq.n, dst_bf16, src_bf16, inverse, in_place);
            const RopeParams p{nullptr, dst_bf16, nullptr, src_bf16, sh.B * sh.T, sh.T,
                               sh.NH,   sh.KVH,   sh.HS,   inverse,  freq};
            CHECK(identical_bits(rope_run(gpu, p, values, in_place, cuda::kern::rope_apply),
                                 rope_run(gpu, p, values, in_place, rope_reference), "dst"));
          }
}

TEST_CASE("RoPE on CUDA at positions past 10^6 matches a double rotation and the per-pair kernel",
          "[gpu][rope]") {
  // One sequence of 2^20 + 5 rows at Llama 3's theta: pair 0's angle is the position itself, up
  // to 1.05e6 radians, where only a double angle keeps its phase. HS = 8 with 2 query heads and
  // one key/value head keeps a row at 32 elements.
  const int64_t T = (int64_t{1} << 20) + 5, NH = 2, KVH = 1, HS = 8, half = HS / 2;
  const int64_t W = (NH + 2 * KVH) * HS;
  const double theta = 500000;
  cuda::CudaBackend gpu(DeviceConfig{}, DType::BF16);
  const std::vector<double> inv = rope_inv_freq(HS, theta);
  const std::vector<float> values = host_randn(T * W, 62);
  for (bool bf16 : {false, true})
    for (bool inverse : {false, true}) {
      CAPTURE(bf16, inverse);
      const std::vector<float> src = bf16 ? bf16_values(values) : values;
      const RopeParams p{
          nullptr, bf16, nullptr, bf16, T, T, NH, KVH, HS, inverse, frequencies(HS, theta)};
      const std::vector<float> got = rope_run(gpu, p, src, false, cuda::kern::rope_apply);
      CHECK(identical_bits(got, rope_run(gpu, p, src, false, rope_reference), "dst"));
      std::vector<double> want(src.begin(), src.end());  // v, and anything not rotated: copied
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < half; ++i) {
          const double angle = static_cast<double>(t) * inv[static_cast<size_t>(i)];
          const double cs = static_cast<float>(std::cos(angle));
          const double sn =
              (inverse ? -1 : 1) * static_cast<double>(static_cast<float>(std::sin(angle)));
          for (int64_t h = 0; h < NH + KVH; ++h) {
            const size_t i0 = static_cast<size_t>(t * W + h * HS + i), i1 = i0 + half;
            want[i0] = src[i0] * cs - src[i1] * sn;
            want[i1] = src[i0] * sn + src[i1] * cs;
          }
        }
      CHECK(allclose(got, want, bf16 ? kCudaBf16Pointwise : kCudaF32Pointwise, "dst"));
    }
}

TEST_CASE("RoPE on CUDA with each scaling type rotates by the CPU table's cos and sin",
          "[gpu][rope]") {
  // The frequencies and yarn's attention factor reach the kernel: its output against the rotation
  // by the CPU attention's table (engine/core/ops/rope.h's RopeAngles::cos_sin), f32 in and out.
  // The device's double sincos may round a cos or sin to the neighbouring float, so within f32
  // pointwise tolerance rather than bit for bit.
  const int64_t B = 2, T = 200, NH = 4, KVH = 2, HS = 16, half = HS / 2;
  const int64_t W = (NH + 2 * KVH) * HS;
  cuda::CudaBackend gpu(DeviceConfig{}, DType::F32);
  const std::vector<float> values = host_randn(B * T * W, 63);
  for (const RopeScaling& s : kScalings)
    for (bool inverse : {false, true}) {
      CAPTURE(rope_type_name(s.kind), inverse);
      const RopeAngles angles = rope_angles(HS, 10000.0, s);
      const RopeParams p{nullptr,
                         false,
                         nullptr,
                         false,
                         B * T,
                         T,
                         NH,
                         KVH,
                         HS,
                         inverse,
                         frequencies(HS, 10000.0, s)};
      REQUIRE(p.freq.attention_factor == angles.attention_factor);
      const std::vector<float> got = rope_run(gpu, p, values, false, cuda::kern::rope_apply);
      std::vector<double> want(values.begin(), values.end());
      std::vector<float> cs(half), sn(half);
      for (int64_t row = 0; row < B * T; ++row) {
        angles.cos_sin(row % T, cs.data(), sn.data());
        for (int64_t h = 0; h < NH + KVH; ++h)
          for (int64_t i = 0; i < half; ++i) {
            const size_t i0 = static_cast<size_t>(row * W + h * HS + i), i1 = i0 + half;
            const double c = cs[static_cast<size_t>(i)];
            const double n = (inverse ? -1 : 1) * static_cast<double>(sn[static_cast<size_t>(i)]);
            want[i0] = values[i0] * c - values[i1] * n;
            want[i1] = values[i0] * n + values[i1] * c;
          }
      }
      CHECK(allclose(got, want, kCudaF32Pointwise, "dst"));
    }
}

TEST_CASE(
    "bias_rows on CUDA: 16-byte groups across row ends and the scalar path store the host's bits",
    "[gpu][pointwise]") {
  // cols 5 and 13: groups of 8 bf16 or 4 f32 span row ends (one division per group, then the
  // column wraps); 8: whole groups per row; 771: long rows and a tail. out one element past a
  // block's start: the scalar path. Each element is one float add (or the bias alone) rounded
  // once to the storage type, which the host repeats exactly.
  const auto [rows, cols] =
      GENERATE(table<int64_t, int64_t>({{7, 5}, {33, 8}, {65, 13}, {3, 771}}));
  CAPTURE(rows, cols);
  cuda::CudaBackend gpu(DeviceConfig{}, DType::BF16);
  const std::vector<float> bias = host_randn(cols, 72);
  const Buffer b = upload(gpu, {cols}, DType::F32, bias);
  for (DType dtype : {DType::F32, DType::BF16})
    for (bool overwrite : {true, false})
      for (int64_t offset : {0, 1}) {
        CAPTURE(dtype_name(dtype), overwrite, offset);
        const bool bf16 = dtype == DType::BF16;
        std::vector<float> before = host_randn(rows * cols, 71);
        if (bf16) before = bf16_values(before);
        const Placed out = upload_at(gpu, {rows * cols}, dtype, offset, before);
        launch_and_wait([&] {
          cuda::kern::bias_rows(out.t.data, b.f32(), rows, cols, overwrite, bf16, nullptr);
        });
        std::vector<float> want(before.size());
        for (size_t i = 0; i < want.size(); ++i) {
          const float bi = bias[i % static_cast<size_t>(cols)];
          want[i] = overwrite ? bi : before[i] + bi;
        }
        CHECK(identical_bits(fetch(gpu, out), bf16 ? bf16_values(want) : want, "out"));
      }
}

}  // namespace remat::test
