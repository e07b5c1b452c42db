// The op tests' rows for every backend besides the CPU. Each tests/ops/test_<op>.cpp checks the
// CPU backend against double references and central differences; its last section runs the same
// cases on CUDA and compares with the CPU backend, which those tests made the specification.
// The op files are compiled twice: into remat_tests (CPU only) and, when the CUDA backend is
// built, into remat_gpu_tests with REMAT_TEST_CUDA_ROWS=1, which adds the CUDA rows. That binary
// exits 77 (ctest: skipped) without a device, so CUDA rows never run on a machine without one.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/cuda/cuda_backend.h"
#include "tests/test_util.h"

namespace remat::test {

// ---- tolerances of CUDA against the CPU backend (both fp32 references are checked above) ----

/// f32 elementwise ops: same formulas, different libm (tanhf, expf) and summation order.
inline constexpr Tolerance kCudaF32Pointwise{.rtol = 1e-5, .atol = 1e-5};
/// f32 reductions over rows and GEMMs: cuBLASLt and OpenBLAS sum in different orders.
inline constexpr Tolerance kCudaF32Gemm{.rtol = 1e-4, .atol = 1e-4};
/// bf16 storage keeps 8 significant bits: one rounding of the output is 2^-9 relative.
inline constexpr Tolerance kCudaBf16Pointwise{.rtol = 1e-2, .atol = 1e-2};
/// bf16 GEMM and normalisation outputs: fp32 accumulation of bf16 products, one output rounding.
inline constexpr Tolerance kCudaBf16Gemm{.rtol = 3e-2, .atol = 3e-2};
/// Attention always runs in bf16 inside cuDNN (f32 activations are staged through bf16), so both
/// activation types share this; gradients also carry the bf16 probabilities.
inline constexpr Tolerance kCudaAttention{.rtol = 3e-2, .atol = 3e-2};
/// Parameter gradients accumulated in fp32 from bf16 operands, summed over all rows.
inline constexpr Tolerance kCudaBf16ParamGrad{.rtol = 5e-2, .atol = 5e-2};

/// Activation types every CUDA row runs with.
inline const std::vector<DType> kCudaActivationTypes = {DType::F32, DType::BF16};

// ---- bf16 on the host ----

/// Rounds to nearest even, as __float2bfloat16 does.
inline uint16_t to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
inline float from_bf16_bits(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// `v` rounded to bf16 (and widened back), as a bf16 tensor stores it.
inline std::vector<float> bf16_values(std::vector<float> v) {
  for (float& x : v) x = from_bf16_bits(to_bf16_bits(x));
  return v;
}

/// N(0, scale^2) host values, deterministic in (seed, stream).
inline std::vector<float> host_randn(int64_t n, uint64_t stream, double scale = 1.0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(scale * rng_normal(kSeed, stream, i));
  return v;
}

/// A tensor of `dtype` on any backend holding `host` (rounded to bf16 on the host when asked).
inline Buffer upload(Backend& be, const Dims& shape, DType dtype, const std::vector<float>& host) {
  Buffer b = be.pool().allocate(shape, dtype, MemCategory::Transient, "test");
  REQUIRE(static_cast<size_t>(b.tensor().numel()) == host.size());
  if (dtype == DType::BF16) {
    std::vector<uint16_t> h(host.size());
    for (size_t i = 0; i < host.size(); ++i) h[i] = to_bf16_bits(host[i]);
    be.upload(b, h.data());
  } else {
    be.upload(b, host.data());
  }
  return b;
}

inline Buffer upload_i32(Backend& be, const std::vector<int64_t>& shape,
                         const std::vector<int32_t>& host) {
  Buffer b = be.pool().allocate(shape, DType::I32, MemCategory::Transient, "test");
  be.upload(b, host.data());
  return b;
}

/// A host copy of any backend's f32 or bf16 tensor, as floats.
inline std::vector<float> fetch(Backend& be, const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::BF16) {
    std::vector<uint16_t> h(out.size());
    be.download(h.data(), t);
    for (size_t i = 0; i < h.size(); ++i) out[i] = from_bf16_bits(h[i]);
  } else {
    be.download(out.data(), t);
  }
  return out;
}

/// A tensor of `shape` that starts `offset` elements into a fresh block of `be`'s pool, holding
/// `host` (rounded to bf16 when dtype is): a pool block is 256-byte aligned, so offset 1 leaves
/// the data pointer off every 16-byte boundary and the CUDA pointwise kernels take their scalar
/// path, while offset 0 gives them their 16-byte vectors.
struct Placed {
  Buffer block;
  Tensor t;
  operator const Tensor&() const { return t; }  // NOLINT: used where a view is, as Buffer is
};
inline Placed upload_at(Backend& be, const std::vector<int64_t>& shape, DType dtype, int64_t offset,
                        const std::vector<float>& host) {
  Placed p{be.pool().allocate({static_cast<int64_t>(host.size()) + offset}, dtype,
                              MemCategory::Transient, "test"),
           {}};
  p.t =
      Tensor(static_cast<char*>(p.block.tensor().data) + offset * dtype_size(dtype), shape, dtype);
  REQUIRE(static_cast<size_t>(p.t.numel()) == host.size());
  if (dtype == DType::BF16) {
    std::vector<uint16_t> h(host.size());
    for (size_t i = 0; i < host.size(); ++i) h[i] = to_bf16_bits(host[i]);
    be.upload(p.t, h.data());
  } else {
    be.upload(p.t, host.data());
  }
  return p;
}

/// Whether two host copies hold the same bits; the report names the first difference.
inline Closeness identical_bits(const std::vector<float>& got, const std::vector<float>& want,
                                std::string_view what) {
  Closeness c;
  if (got.size() != want.size()) {
    c.ok = false;
    c.report = fmt::format("{}: {} elements, want {}", what, got.size(), want.size());
    return c;
  }
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      c.ok = false;
      c.report = fmt::format("{}: first difference at [{}]: got {:.9g}, want {:.9g}", what, i,
                             got[i], want[i]);
      return c;
    }
  c.report = fmt::format("{}: {} elements, same bits", what, got.size());
  return c;
}

/// A CUDA backend for the whole process, one per activation type, for the rows of a GENERATE
/// table that would each build their own: cuDNN builds a plan per attention call shape (0.1-1 s
/// each), and a new backend starts with none, so a test of a hundred rows would build the same
/// plans again in each (and the GPU check caps each tag's run). Rows that share one meet its plan
/// cache as a training run's calls do. Never destroyed: a static's destructor would release
/// the cuBLAS and cuDNN handles after the CUDA runtime has shut down at exit.
inline std::shared_ptr<cuda::CudaBackend> process_cuda_backend(DType activations) {
  static auto* backends = new std::map<DType, std::shared_ptr<cuda::CudaBackend>>();
  std::shared_ptr<cuda::CudaBackend>& b = (*backends)[activations];
  if (!b) b = std::make_shared<cuda::CudaBackend>(DeviceConfig{}, activations);
  return b;
}

/// One CPU and one CUDA backend. Inputs go to both, rounded to bf16 first when the GPU stores
/// bf16 activations, so that a row measures only the op's own error.
struct CudaRow {
  DType act;
  cpu::CpuBackend cpu{kTestBudgetBytes, kTestThreads};
  std::shared_ptr<cuda::CudaBackend> gpu;

  /// A CUDA backend of its own.
  explicit CudaRow(DType activations)
      : act(activations), gpu(std::make_shared<cuda::CudaBackend>(DeviceConfig{}, activations)) {}
  /// The given CUDA backend, e.g. process_cuda_backend's.
  CudaRow(DType activations, std::shared_ptr<cuda::CudaBackend> shared)
      : act(activations), gpu(std::move(shared)) {}
  bool bf16() const { return act == DType::BF16; }
  Tolerance pick(Tolerance f32, Tolerance bf16_tol) const { return bf16() ? bf16_tol : f32; }

  /// `v` as the GPU stores activations: rounded to bf16 when it stores bf16.
  std::vector<float> stored(std::vector<float> v) const {
    return bf16() ? bf16_values(std::move(v)) : v;
  }
  /// Activation values: host_randn, bf16-representable when the GPU stores bf16.
  std::vector<float> act_values(int64_t n, uint64_t stream, double scale = 1.0) const {
    return stored(host_randn(n, stream, scale));
  }
  /// act_values whose first entries are `edges` (a pointwise op's special inputs; as many as
  /// fit in n), as stored.
  template <class Edges>
  std::vector<float> act_values_from(const Edges& edges, int64_t n, uint64_t stream,
                                     double scale = 1.0) const {
    std::vector<float> v = host_randn(n, stream, scale);
    std::copy_n(std::begin(edges), std::min<int64_t>(n, std::size(edges)), v.begin());
    return stored(std::move(v));
  }
  /// The same values as an activation tensor on each backend (f32 on the CPU).
  std::pair<Buffer, Buffer> act_pair(const std::vector<int64_t>& shape,
                                     const std::vector<float>& host) {
    return {upload(cpu, shape, DType::F32, host), upload(*gpu, shape, act, host)};
  }
  /// The same values as an f32 tensor (weights, gradients, optimizer state) on each backend.
  std::pair<Buffer, Buffer> f32_pair(const std::vector<int64_t>& shape,
                                     const std::vector<float>& host) {
    return {upload(cpu, shape, DType::F32, host), upload(*gpu, shape, DType::F32, host)};
  }
  std::pair<Buffer, Buffer> zeros_act(const std::vector<int64_t>& shape) {
    return act_pair(shape, std::vector<float>(static_cast<size_t>(numel(shape)), 0.0f));
  }
  std::pair<Buffer, Buffer> zeros_f32(const std::vector<int64_t>& shape) {
    return f32_pair(shape, std::vector<float>(static_cast<size_t>(numel(shape)), 0.0f));
  }
  /// CHECKs that the GPU tensor matches the CPU one under `tol`.
  void check_same(const Buffer& on_cpu, const Buffer& on_gpu, Tolerance tol, const char* what) {
    CHECK(allclose(fetch(*gpu, on_gpu), fetch(cpu, on_cpu), tol, what));
  }

 private:
  static int64_t numel(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

/// The rows of a pointwise op's CUDA test: `check(r, N, tol)` for each row count N of `rows`
/// with each activation type, r a fresh CudaRow, tol the pointwise tolerance of its type.
template <class Check>
void for_each_pointwise_row(const std::vector<int64_t>& rows, const Check& check) {
  for (const int64_t N : rows)
    for (const DType act : kCudaActivationTypes) {
      CAPTURE(N, dtype_name(act));
      CudaRow r(act);
      check(r, N, r.pick(kCudaF32Pointwise, kCudaBf16Pointwise));
    }
}

}  // namespace remat::test
