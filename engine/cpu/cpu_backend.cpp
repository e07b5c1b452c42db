// CPU backend: construction, BLAS detection, data movement, pointwise ops, embedding, MSE and
// the optimizer. GEMM-based ops live in gemm.cpp, LayerNorm in layernorm.cpp, attention in
// attention.cpp.
#include "engine/cpu/cpu_backend.h"

#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "engine/cpu/blas_kernel.h"
#include "engine/rng.h"

extern "C" {
// OpenBLAS extensions (declared in its cblas.h as well; repeated so other BLAS builds fail loudly
// at link time rather than silently losing the kernel report).
char* openblas_get_config(void);
void openblas_set_num_threads(int);
}

namespace remat::cpu {
namespace {

class HostAllocator : public DeviceAllocator {
 public:
  void* allocate(size_t bytes) override {
    return std::aligned_alloc(MemoryPool::kAlignment, bytes);
  }
  void deallocate(void* ptr, size_t) override { std::free(ptr); }
};

// Elementwise loops split rows across threads with a static schedule; 0.5 MiB per chunk keeps
// tiny tensors on one thread.
constexpr int64_t kGrain = 1 << 17;

}  // namespace

int default_threads() {
  return omp_get_num_procs();
}

std::unique_ptr<DeviceAllocator> make_host_allocator() {
  return std::make_unique<HostAllocator>();
}

BlasInfo blas_info() {
  const BlasKernelChoice& kernel = select_blas_kernel();
  BlasInfo info;
  std::string config = openblas_get_config();
  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY USE_OPENMP Zen MAX_THREADS=64"
  auto sp = config.find(' ', config.find(' ') + 1);
  info.library = config.substr(0, sp);
  if (config.find("USE_OPENMP") != std::string::npos) info.library += " (OpenMP)";
  info.core = kernel.core;
  info.chosen_by = kernel.chosen_by;
  if (kernel.below_cpu())
    info.warning = fmt::format(
        "BELOW THIS CPU: the {} kernel does not use the CPU's wider vectors (~2-5x slower); unset "
        "OPENBLAS_CORETYPE",
        kernel.core);
  return info;
}

CpuBackend::CpuBackend(uint64_t budget_bytes, int threads)
    : Backend(std::make_unique<MemoryPool>(make_host_allocator(), budget_bytes)) {
  select_blas_kernel();  // before the first BLAS call
  threads_ = threads > 0 ? threads : default_threads();
  omp_set_num_threads(threads_);
  openblas_set_num_threads(threads_);
}

std::string CpuBackend::describe() const {
  const BlasInfo b = blas_info();
  return fmt::format("cpu, {} threads, {} {} kernel{}", threads_, b.library, b.core,
                     b.warning.empty() ? "" : " (" + b.warning + ")");
}

void CpuBackend::upload(const Tensor& dst, const void* host) {
  std::memcpy(dst.data, host, dst.bytes());
}

void CpuBackend::download(void* host, const Tensor& src) {
  std::memcpy(host, src.data, src.bytes());
}

void CpuBackend::fill_impl(const Tensor& t, float value) {
  const int64_t n = t.numel();
  if (t.dtype == DType::I32) {
    int32_t* p = t.i32();
    std::fill(p, p + n, static_cast<int32_t>(value));
    return;
  }
  float* p = t.f32();
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

void CpuBackend::copy_impl(const Tensor& dst, const Tensor& src) {
  std::memcpy(dst.data, src.data, src.bytes());
}

void CpuBackend::add_impl(const Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t n = out.numel();
  float* o = out.f32();
  const float* x = a.f32();
  const float* y = b.f32();
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

// GELU, tanh approximation (GPT-2).
// reference: https://pytorch.org/docs/stable/generated/torch.nn.GELU.html
static constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

void CpuBackend::activation_forward_impl(const ActivationForwardArgs& a) {
  const int64_t n = a.inp.numel();
  const float* x = a.inp.f32();
  float* y = a.out.f32();
  if (a.kind == Activation::Relu) {
#pragma omp parallel for schedule(static) if (n > kGrain)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0 ? x[i] : 0.0f;
    return;
  }
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    float u = kGeluScale * (v + 0.044715f * v * v * v);
    y[i] = 0.5f * v * (1.0f + std::tanh(u));
  }
}

void CpuBackend::activation_backward_impl(const ActivationBackwardArgs& a) {
  const int64_t n = a.inp.numel();
  const float* x = a.inp.f32();
  const float* dy = a.dout.f32();
  float* dx = a.dinp.f32();  // may alias dy: each element reads dy[i] before writing dx[i]
  if (a.kind == Activation::Relu) {
#pragma omp parallel for schedule(static) if (n > kGrain)
    for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0 ? dy[i] : 0.0f;
    return;
  }
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    float u = kGeluScale * (v + 0.044715f * v * v * v);
    float th = std::tanh(u);
    float sech2 = 1.0f - th * th;
    float du = kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + th) + 0.5f * v * sech2 * du);
  }
}

void CpuBackend::embedding_forward_impl(const EmbeddingForwardArgs& a) {
  const int64_t B = a.tokens.dim(0), T = a.tokens.dim(1), C = a.wte.dim(1), V = a.wte.dim(0);
  const int32_t* tok = a.tokens.i32();
  const float* wte = a.wte.f32();
  const float* wpe = a.wpe.empty() ? nullptr : a.wpe.f32();
  float* out = a.out.f32();
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int32_t id = tok[bt];
    REMAT_ASSERT(id >= 0 && id < V, "embedding_forward: token {} outside vocabulary {}", id, V);
    const float* e = wte + id * C;
    float* o = out + bt * C;
    if (wpe) {
      const float* p = wpe + (bt % T) * C;
      for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
    } else {
      for (int64_t c = 0; c < C; ++c) o[c] = e[c];
    }
  }
}

// Scatter-add without atomics: each thread owns a slice of channels for every row, so rows with
// the same token never race and the summation order is fixed (deterministic).
void CpuBackend::embedding_backward_impl(const EmbeddingBackwardArgs& a, const OpWorkspace&) {
  const int64_t B = a.tokens.dim(0), T = a.tokens.dim(1), C = a.dwte.dim(1);
  const int32_t* tok = a.tokens.i32();
  const float* dout = a.dout.f32();
  float* dwte = a.dwte.f32();
  float* dwpe = a.dwpe.empty() ? nullptr : a.dwpe.f32();
  constexpr int64_t kSlice = 16;
  const int64_t n_slices = (C + kSlice - 1) / kSlice;
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < n_slices; ++s) {
    const int64_t c0 = s * kSlice, c1 = std::min(C, c0 + kSlice);
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const float* d = dout + bt * C;
      float* w = dwte + static_cast<int64_t>(tok[bt]) * C;
      for (int64_t c = c0; c < c1; ++c) w[c] += d[c];
      if (dwpe) {
        float* p = dwpe + (bt % T) * C;
        for (int64_t c = c0; c < c1; ++c) p[c] += d[c];
      }
    }
  }
}

void CpuBackend::mse_loss_impl(const MseLossArgs& a) {
  const int64_t N = a.inp.rows(), D = a.inp.dim(-1);
  const float* x = a.inp.f32();
  const float* y = a.target.f32();
  float* dx = a.dinp.f32();
  float* loss = a.losses.f32();
  const float g = 2.0f * a.loss_scale / static_cast<float>(D);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    double acc = 0;
    for (int64_t j = 0; j < D; ++j) {
      const float diff = x[i * D + j] - y[i * D + j];
      acc += static_cast<double>(diff) * diff;
      dx[i * D + j] = g * diff;
    }
    loss[i] = static_cast<float>(acc / static_cast<double>(D));
  }
}

void CpuBackend::dropout_impl(const DropoutArgs& a) {
  const int64_t n = a.inp.numel();
  const float* x = a.inp.f32();
  float* y = a.out.f32();
  const float scale = 1.0f / (1.0f - a.p);
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i)
    y[i] = rng_uniform(a.seed, a.stream, static_cast<uint64_t>(i)) >= a.p ? x[i] * scale : 0.0f;
}

// Fixed chunking (independent of the thread count) and an in-order final sum: the result is
// the same bits on every run and every thread count.
double CpuBackend::sum_squares_impl(std::span<const Tensor> tensors) {
  constexpr int64_t kChunk = 1 << 16;
  double total = 0;
  for (const Tensor& t : tensors) {
    const float* p = t.f32();
    const int64_t n = t.numel();
    const int64_t n_chunks = (n + kChunk - 1) / kChunk;
    std::vector<double> partial(static_cast<size_t>(n_chunks));
#pragma omp parallel for schedule(static) if (n_chunks > 1)
    for (int64_t c = 0; c < n_chunks; ++c) {
      double acc = 0;
      const int64_t e = std::min(n, (c + 1) * kChunk);
      for (int64_t i = c * kChunk; i < e; ++i) acc += static_cast<double>(p[i]) * p[i];
      partial[static_cast<size_t>(c)] = acc;
    }
    for (double v : partial) total += v;
  }
  return total;
}

// AdamW with decoupled weight decay (Loshchilov & Hutter).
// reference: https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html
void CpuBackend::adamw_update_impl(const AdamWArgs& a) {
  const int64_t n = a.param.numel();
  float* p = a.param.f32();
  const float* g = a.grad.f32();
  float* m = a.m.f32();
  float* v = a.v.f32();
  const float bc1 = 1.0f - std::pow(a.beta1, static_cast<float>(a.step));
  const float bc2 = 1.0f - std::pow(a.beta2, static_cast<float>(a.step));
#pragma omp parallel for schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * a.grad_scale;
    m[i] = a.beta1 * m[i] + (1.0f - a.beta1) * gi;
    v[i] = a.beta2 * v[i] + (1.0f - a.beta2) * gi * gi;
    const float mhat = m[i] / bc1;
    const float vhat = v[i] / bc2;
    p[i] -= a.lr * (mhat / (std::sqrt(vhat) + a.eps) + a.weight_decay * p[i]);
  }
}

}  // namespace remat::cpu
