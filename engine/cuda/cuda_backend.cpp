// CUDA backend: device setup, the stream-ordered allocator, versions, data movement and the op
// implementations (each enqueues kernels / library calls on the one stream, then finish_op()).
// The kernels are in elementwise.cu and layernorm.cu, GEMMs in gemm.cpp, attention in
// attention.cpp; shapes and the += / = contract are those of engine/backend.h.
#include "engine/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cudnn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/cuda/attention.h"
#include "engine/cuda/check.h"
#include "engine/cuda/gemm.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/workspace.h"
#include "engine/cuda_api.h"
#include "engine/units.h"

namespace remat::cuda {

// The device and the stream every op runs on; shared by the backend and its allocator, so the
// stream outlives the pool's last free.
struct DeviceState {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaDeviceProp prop{};
  uint64_t budget_bytes = 0;
  uint64_t total_bytes = 0;
  bool use_mem_pools = true;  // cudaDevAttrMemoryPoolsSupported: else cudaMalloc/cudaFree
  ~DeviceState() {
    if (stream) {
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
  }
};

namespace {

// Kept free for what the libraries allocate outside the pool (cuBLASLt/cuDNN internals, kernel
// local memory) when device.memory is not set.
constexpr uint64_t kLibraryReserveBytes = uint64_t{512} << 20;

// Partial sums of the two-pass column reductions (bias and LayerNorm parameter gradients):
// 1 MiB outside the pool, like the libraries' own handles (kLibraryReserveBytes), because it
// is allocated once and never changes size. kern::column_chunks never asks for more.
constexpr int64_t kReduceScratchFloats = int64_t{1} << 18;

// Stream-ordered allocation from the device's default memory pool, with its release threshold
// at the maximum so freed blocks stay cached (no cudaMalloc/cudaFree synchronisation per step).
// Devices without memory pools (cudaDevAttrMemoryPoolsSupported = 0: some vGPU and MIG setups,
// older drivers) get cudaMalloc/cudaFree; the MemoryPool above accounts the same bytes either way.
class CudaAllocator : public DeviceAllocator {
 public:
  explicit CudaAllocator(std::shared_ptr<DeviceState> dev) : dev_(std::move(dev)) {}
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e =
        dev_->use_mem_pools ? cudaMallocAsync(&p, bytes, dev_->stream) : cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear it: the pool reports OutOfMemory, the context is fine
      return nullptr;
    }
    REMAT_CUDA_CHECK(e);
    return p;
  }
  // Called from destructors: must not throw; a failure here shows up at the next checked call.
  void deallocate(void* ptr, size_t) override {
    if (dev_->use_mem_pools) {
      (void)cudaFreeAsync(ptr, dev_->stream);
      return;
    }
    // cudaFree is not ordered on our stream: kernels still using the buffer must finish first.
    (void)cudaStreamSynchronize(dev_->stream);
    (void)cudaFree(ptr);
  }

 private:
  std::shared_ptr<DeviceState> dev_;
};

std::string version_triplet(int v, int major_div, int minor_div) {
  return fmt::format("{}.{}.{}", v / major_div, (v % major_div) / minor_div, v % minor_div);
}

// Keeps freed blocks of the device's default pool cached; false when the device has no memory
// pools (cudaMallocAsync would fail there).
bool setup_mem_pool(int device) {
  int supported = 0;
  REMAT_CUDA_CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device));
  if (!supported) return false;
  cudaMemPool_t mem_pool = nullptr;
  REMAT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&mem_pool, device));
  uint64_t threshold = UINT64_MAX;
  REMAT_CUDA_CHECK(cudaMemPoolSetAttribute(mem_pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  return true;
}

std::shared_ptr<DeviceState> open_device(const DeviceConfig& cfg) {
  if (device_count() == 0)
    throw BackendError(
        "[cuda] no CUDA device found (cudaGetDeviceCount). Fix: check nvidia-smi, "
        "or set device.backend = \"cpu\"");
  const size_t cudnn_v = cudnnGetVersion();
  if (cudnn_v < 90000)
    throw BackendError(fmt::format(
        "[cuda] cuDNN {} is too old: remat-train needs cuDNN 9 (loaded from the library path). "
        "Fix: point LD_LIBRARY_PATH at a cuDNN 9 install, e.g. PyTorch's nvidia/cudnn/lib",
        version_triplet(static_cast<int>(cudnn_v), 10000, 100)));
  if (cudnn_v == 91000 || cudnn_v == 91001)
    throw BackendError(
        "[cuda] cuDNN 9.10.0/9.10.1 have known bugs in bf16 fused attention "
        "(cudnn-frontend blocks them). Fix: use another cuDNN 9 release");
  auto dev = std::make_shared<DeviceState>();
  REMAT_CUDA_CHECK(cudaSetDevice(dev->device));
  REMAT_CUDA_CHECK(cudaGetDeviceProperties(&dev->prop, dev->device));
  if (dev->prop.major < 8)
    throw BackendError(
        fmt::format("[cuda] {} is sm_{}{}; the CUDA backend needs sm_80 or newer "
                    "(cuDNN flash attention, bf16). Fix: device.backend = \"cpu\"",
                    dev->prop.name, dev->prop.major, dev->prop.minor));
  REMAT_CUDA_CHECK(cudaStreamCreateWithFlags(&dev->stream, cudaStreamNonBlocking));
  dev->use_mem_pools = setup_mem_pool(dev->device);
  size_t free_b = 0, total_b = 0;
  REMAT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  dev->total_bytes = total_b;
  dev->budget_bytes =
      cfg.memory_bytes ? cfg.memory_bytes
                       : (free_b > kLibraryReserveBytes ? free_b - kLibraryReserveBytes : free_b);
  return dev;
}

bool is_bf16(const Tensor& t) {
  return t.dtype == DType::BF16;
}

char* byte_ptr(const Tensor& t, int64_t elem_offset) {
  return static_cast<char*>(t.data) + elem_offset * static_cast<int64_t>(dtype_size(t.dtype));
}

}  // namespace

// ---- the cuda_api.h entry points ----

bool is_built() {
  return true;
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no GPU: not an error for "auto"
    return 0;
  }
  return n;
}

std::string version_string() {
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);  // 0 without a driver
  (void)cudaGetLastError();
  return fmt::format("CUDA runtime {}.{}{}, cuBLASLt {}, cuDNN {} (built with {})", runtime / 1000,
                     (runtime % 1000) / 10,
                     driver ? fmt::format(" (driver {}.{})", driver / 1000, (driver % 1000) / 10)
                            : std::string(" (no driver)"),
                     version_triplet(static_cast<int>(cublasLtGetVersion()), 10000, 100),
                     version_triplet(static_cast<int>(cudnnGetVersion()), 10000, 100),
                     version_triplet(CUDNN_VERSION, 10000, 100));
}

std::unique_ptr<Backend> make_backend(const DeviceConfig& cfg) {
  return std::make_unique<CudaBackend>(cfg,
                                       cfg.precision == Precision::Fp32 ? DType::F32 : DType::BF16);
}

// ---- construction ----

CudaBackend::CudaBackend(const DeviceConfig& cfg, DType act_dtype)
    : CudaBackend(act_dtype, open_device(cfg)) {}

CudaBackend::CudaBackend(DType act_dtype, std::shared_ptr<DeviceState> dev)
    : Backend(
          std::make_unique<MemoryPool>(std::make_unique<CudaAllocator>(dev), dev->budget_bytes)),
      dev_(std::move(dev)),
      act_(act_dtype) {
  REMAT_ASSERT(act_ == DType::BF16 || act_ == DType::F32, "cuda: activations must be bf16 or f32");
  gemm_ = std::make_unique<GemmEngine>(dev_->stream);
  attn_ = std::make_unique<AttentionEngine>(dev_->stream,
                                            static_cast<int64_t>(kCudnnPlanWorkspaceBytes));
  REMAT_CUDA_CHECK(cudaMalloc(&reduce_.scratch, kReduceScratchFloats * sizeof(float)));
  reduce_.floats = kReduceScratchFloats;
  reduce_.target_blocks = 4 * dev_->prop.multiProcessorCount;  // a few waves' worth per SM
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(dev_->stream);
  if (partials_) cudaFreeHost(partials_);
  if (reduce_.scratch) cudaFree(reduce_.scratch);
}

int64_t CudaBackend::attention_plan_workspace_bytes(int64_t B, int64_t NH, int64_t T, int64_t HS,
                                                    bool backward) {
  return attn_->plan_workspace_bytes({B, NH, T, HS}, backward);
}

cudaStream_t CudaBackend::stream() const {
  return dev_->stream;
}

std::string CudaBackend::describe() const {
  const cudaDeviceProp& p = dev_->prop;
  return fmt::format("cuda:{} {} (sm_{}{}, {} SMs, {}{}), {} activations, {}", dev_->device, p.name,
                     p.major, p.minor, p.multiProcessorCount, format_bytes(dev_->total_bytes),
                     dev_->use_mem_pools ? "" : ", no memory pools: cudaMalloc", dtype_name(act_),
                     version_string());
}

void CudaBackend::finish_op() {
  REMAT_CUDA_CHECK(cudaGetLastError());
  if (detail::sync_after_each_op()) REMAT_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void CudaBackend::synchronize() {
  REMAT_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void CudaBackend::upload(const Tensor& dst, const void* host) {
  // From pageable memory the call returns once `host` has been staged, so it may be reused.
  REMAT_CUDA_CHECK(cudaMemcpyAsync(dst.data, host, dst.bytes(), cudaMemcpyHostToDevice, stream()));
  finish_op();
}

void CudaBackend::download(void* host, const Tensor& src) {
  REMAT_CUDA_CHECK(cudaMemcpyAsync(host, src.data, src.bytes(), cudaMemcpyDeviceToHost, stream()));
  REMAT_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

// ---- data movement and pointwise ----

void CudaBackend::fill_impl(const Tensor& t, float value) {
  if (t.dtype == DType::I32)
    kern::fill_i32(static_cast<int32_t*>(t.data), t.numel(), static_cast<int32_t>(value), stream());
  else
    kern::fill(t.data, t.numel(), value, is_bf16(t), stream());
  finish_op();
}

void CudaBackend::copy_impl(const Tensor& dst, const Tensor& src) {
  if (dst.dtype == src.dtype) {
    REMAT_CUDA_CHECK(
        cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDeviceToDevice, stream()));
  } else {
    REMAT_ASSERT(dst.dtype != DType::I32 && src.dtype != DType::I32, "copy: {} into {}",
                 dtype_name(src.dtype), dtype_name(dst.dtype));
    kern::cast(dst.data, is_bf16(dst), src.data, is_bf16(src), src.numel(), stream());
  }
  finish_op();
}

void CudaBackend::add_impl(const Tensor& out, const Tensor& a, const Tensor& b) {
  REMAT_ASSERT(out.dtype == a.dtype && a.dtype == b.dtype, "add: mixed dtypes");
  kern::add(out.data, a.data, b.data, out.numel(), is_bf16(out), stream());
  finish_op();
}

void CudaBackend::activation_forward_impl(const ActivationForwardArgs& a) {
  kern::activation_forward(a.out.data, a.inp.data, a.inp.numel(), a.kind == Activation::Gelu,
                           is_bf16(a.inp), stream());
  finish_op();
}

void CudaBackend::activation_backward_impl(const ActivationBackwardArgs& a) {
  kern::activation_backward(a.dinp.data, a.dout.data, a.inp.data, a.inp.numel(),
                            a.kind == Activation::Gelu, is_bf16(a.inp), stream());
  finish_op();
}

// ---- GEMM-based ops ----
// Row-major (R, Cc) is column-major (Cc, R) with ld Cc, so with W (OC, C):
//   out (N, OC) = inp W^T  ->  D (OC x N) = W^T[cm (C x OC), T] . inp[cm (C x N)]
//   dinp (N, C) = dout W   ->  D (C x N)  = W[cm (C x OC)] . dout[cm (OC x N)]
//   dW (OC, C) += dout^T inp -> D (C x OC) = inp[cm (C x N)] . dout[cm (OC x N), T]

const void* CudaBackend::gemm_weight(const Tensor& weight, const OpWorkspace& ws) {
  const Buffer* copy = ws.find("gemm.weight_bf16");
  if (!copy) return weight.data;
  kern::cast(copy->tensor().data, true, weight.data, false, weight.numel(), stream());
  return copy->tensor().data;
}

void CudaBackend::linear_forward_impl(const LinearForwardArgs& a, const OpWorkspace& ws) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), OC = a.weight.dim(0);
  const bool bf = is_bf16(a.inp);
  const void* w = gemm_weight(a.weight, ws);
  void* wsp = ws.at("gemm.workspace").tensor().data;
  float beta = a.accumulate ? 1.0f : 0.0f;
  // Bias first, then the GEMM accumulates onto it (as the CPU does): one rounding of the sum.
  // TODO(cuda): cuBLASLt's BIAS epilogue would save this pass over out (#5).
  if (!a.bias.empty()) {
    kern::bias_rows(a.out.data, a.bias.f32(), N, OC, !a.accumulate, is_bf16(a.out), stream());
    beta = 1.0f;
  }
  gemm_->matmul(OC, N, C, {w, bf, C, true}, {a.inp.data, bf, C, false}, a.out.data, is_bf16(a.out),
                OC, beta, wsp, kGemmWorkspaceBytes);
  finish_op();
}

void CudaBackend::linear_backward_impl(const LinearBackwardArgs& a, const OpWorkspace& ws) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), OC = a.weight.dim(0);
  const bool bf = is_bf16(a.dout);
  const void* w = gemm_weight(a.weight, ws);  // the bf16 copy only when dinp is wanted
  void* wsp = ws.at("gemm.workspace").tensor().data;
  if (!a.dinp.empty())
    gemm_->matmul(C, N, OC, {w, bf, C, false}, {a.dout.data, bf, OC, false}, a.dinp.data,
                  is_bf16(a.dinp), C, 0.0f, wsp, kGemmWorkspaceBytes);
  // f32 output, beta 1: the weight gradient accumulates in fp32 straight from bf16 operands.
  gemm_->matmul(C, OC, N, {a.inp.data, bf, C, false}, {a.dout.data, bf, OC, true}, a.dweight.data,
                false, C, 1.0f, wsp, kGemmWorkspaceBytes);
  if (!a.dbias.empty())
    kern::column_sum_add(a.dbias.f32(), a.dout.data, N, OC, bf, reduce_, stream());
  finish_op();
}

// Per chunk of rows: logits (rows, V) f32 = x W^T; the softmax cross-entropy kernel writes the
// losses and overwrites the logits with (softmax - onehot) * scale (bf16 in place at ld 2V when
// the GEMMs are bf16: see kern::softmax_xent); then dinp = dlogits W and dW += dlogits^T x.
void CudaBackend::lm_head_loss_impl(const LmHeadLossArgs& a, const OpWorkspace& ws) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), V = a.weight.dim(0);
  const bool bf = is_bf16(a.inp);
  const void* w = gemm_weight(a.weight, ws);
  const Buffer& chunk = ws.at("lm_head.logits_chunk");
  void* wsp = ws.at("gemm.workspace").tensor().data;
  float* logits = chunk.f32();
  const int64_t R = chunk.tensor().dim(0), ld_grad = bf ? 2 * V : V;
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t rows = std::min(R, N - r0);
    const void* x = byte_ptr(a.inp, r0 * C);
    gemm_->matmul(V, rows, C, {w, bf, C, true}, {x, bf, C, false}, logits, false, V, 0.0f, wsp,
                  kGemmWorkspaceBytes);
    kern::softmax_xent(logits, a.targets.i32() + r0, a.losses.f32() + r0, rows, V, a.loss_scale, bf,
                       stream());
    gemm_->matmul(C, rows, V, {w, bf, C, false}, {logits, bf, ld_grad, false},
                  byte_ptr(a.dinp, r0 * C), is_bf16(a.dinp), C, 0.0f, wsp, kGemmWorkspaceBytes);
    gemm_->matmul(C, V, rows, {x, bf, C, false}, {logits, bf, ld_grad, true}, a.dweight.data, false,
                  C, 1.0f, wsp, kGemmWorkspaceBytes);
  }
  finish_op();
}

// ---- LayerNorm ----

void CudaBackend::layernorm_forward_impl(const LayerNormForwardArgs& a) {
  kern::layernorm_forward(a.out.data, a.stats.f32(), a.inp.data, a.weight.f32(), a.bias.f32(),
                          a.inp.rows(), a.inp.dim(-1), is_bf16(a.inp), stream());
  finish_op();
}

void CudaBackend::layernorm_backward_impl(const LayerNormBackwardArgs& a) {
  kern::layernorm_backward(a.dinp.data, a.dweight.f32(), a.dbias.f32(), a.dout.data, a.inp.data,
                           a.weight.f32(), a.stats.f32(), a.inp.rows(), a.inp.dim(-1),
                           is_bf16(a.inp), reduce_, stream());
  finish_op();
}

// ---- attention ----
// cuDNN reads q, k, v straight from a bf16 (B, T, 3C) buffer. With bf16 activations and no RoPE
// that is qkv itself; otherwise a staging copy in the workspace holds bf16 q, k (rotated) and v.
// The backward rotates again (the same bits as the forward), and maps the gradients with
// respect to rotated q, k back through R^T (and to f32 if needed) afterwards.

namespace {

// Pointers into the one "attn.workspace" part, in AttentionWorkspaceLayout's order.
struct AttnScratch {
  void *qkv = nullptr, *out = nullptr, *dout = nullptr, *dqkv = nullptr;
  float *dq_accum = nullptr, *softmax_sum = nullptr;
  void* cudnn_plan = nullptr;  // kCudnnPlanWorkspaceBytes for cuDNN's plan
};

AttnScratch carve(const OpWorkspace& ws, const AttentionWorkspaceLayout& w) {
  AttnScratch s;
  const Buffer& buf = ws.at("attn.workspace");
  REMAT_ASSERT(buf.tensor().bytes() >= w.total(), "attention: workspace of {} bytes, {} needed",
               buf.tensor().bytes(), w.total());
  char* p = static_cast<char*>(buf.tensor().data);
  auto take = [&p](uint64_t bytes) -> void* {
    void* r = bytes ? p : nullptr;
    p += bytes;
    return r;
  };
  s.qkv = take(w.qkv_bf16);
  s.out = take(w.out_bf16);
  s.dout = take(w.dout_bf16);
  s.dqkv = take(w.dqkv_bf16);
  s.dq_accum = static_cast<float*>(take(w.dq_accum));
  s.softmax_sum = static_cast<float*>(take(w.softmax_sum));
  s.cudnn_plan = take(w.cudnn_plan);
  return s;
}

}  // namespace

void CudaBackend::attention_forward_impl(const AttentionForwardArgs& a, const OpWorkspace& ws) {
  const int64_t B = a.qkv.dim(0), T = a.qkv.dim(1), C = a.out.dim(2), NH = a.n_head;
  const bool bf = is_bf16(a.qkv), rope = a.rope_theta > 0;
  AttnScratch s = carve(ws, attention_workspace_layout(a.qkv, NH, rope, false));
  const void* qkv = a.qkv.data;
  if (s.qkv) {
    kern::rope_apply(s.qkv, true, a.qkv.data, bf, B * T, T, C, NH, a.rope_theta, false, stream());
    qkv = s.qkv;
  }
  void* out = s.out ? s.out : a.out.data;
  attn_->forward({B, NH, T, C / NH}, {qkv, out, a.lse.f32()}, s.cudnn_plan);
  if (s.out) kern::cast(a.out.data, is_bf16(a.out), s.out, true, B * T * C, stream());
  finish_op();
}

void CudaBackend::attention_backward_impl(const AttentionBackwardArgs& a, const OpWorkspace& ws) {
  const int64_t B = a.qkv.dim(0), T = a.qkv.dim(1), C = a.out.dim(2), NH = a.n_head;
  const bool bf = is_bf16(a.qkv), rope = a.rope_theta > 0;
  AttnScratch s = carve(ws, attention_workspace_layout(a.qkv, NH, rope, true));
  const void* qkv = a.qkv.data;
  if (s.qkv) {
    kern::rope_apply(s.qkv, true, a.qkv.data, bf, B * T, T, C, NH, a.rope_theta, false, stream());
    qkv = s.qkv;
  }
  const void* out = a.out.data;
  const void* dout = a.dout.data;
  if (s.out) {
    kern::cast(s.out, true, a.out.data, is_bf16(a.out), B * T * C, stream());
    out = s.out;
  }
  if (s.dout) {
    kern::cast(s.dout, true, a.dout.data, is_bf16(a.dout), B * T * C, stream());
    dout = s.dout;
  }
  void* dqkv = s.dqkv ? s.dqkv : a.dqkv.data;
  attn_->backward({B, NH, T, C / NH},
                  {qkv, out, dout, a.lse.f32(), dqkv, s.dq_accum, s.softmax_sum}, s.cudnn_plan);
  // dq, dk are gradients with respect to the rotated q, k: apply R^T (in place when dqkv is
  // bf16); with f32 activations this is also the cast out of the bf16 staging buffer.
  if (rope || s.dqkv)
    kern::rope_apply(a.dqkv.data, is_bf16(a.dqkv), dqkv, true, B * T, T, C, NH, a.rope_theta, true,
                     stream());
  finish_op();
}

// ---- embedding ----

void CudaBackend::embedding_forward_impl(const EmbeddingForwardArgs& a) {
  const int64_t B = a.tokens.dim(0), T = a.tokens.dim(1), C = a.wte.dim(1), V = a.wte.dim(0);
  kern::embedding_forward(a.out.data, a.tokens.i32(), a.wte.f32(),
                          a.wpe.empty() ? nullptr : a.wpe.f32(), B * T, T, C, V, is_bf16(a.out),
                          stream());
  finish_op();
}

// The scatter-add dwte[token] += dout row is made deterministic without atomics by bucketing
// rows by token on the host (a counting sort of the B*T token ids, downloaded: one small sync per
// step), then one GPU block column per distinct token sums its rows in order.
void CudaBackend::embedding_backward_impl(const EmbeddingBackwardArgs& a, const OpWorkspace& ws) {
  const int64_t B = a.tokens.dim(0), T = a.tokens.dim(1), C = a.dwte.dim(1), V = a.dwte.dim(0);
  const int64_t N = B * T;
  std::vector<int32_t> tokens(static_cast<size_t>(N));
  download(tokens.data(), a.tokens);
  std::vector<int32_t> count(static_cast<size_t>(V) + 1, 0);
  for (int32_t t : tokens) {
    REMAT_ASSERT(t >= 0 && t < V, "embedding_backward: token {} outside vocabulary {}", t, V);
    ++count[static_cast<size_t>(t) + 1];
  }
  // host buffer: order (N) | starts (n_buckets + 1)
  std::vector<int32_t> host(static_cast<size_t>(2 * N + 1), 0);
  std::vector<int32_t> next(static_cast<size_t>(V), 0);
  int64_t n_buckets = 0;
  {
    int32_t pos = 0;
    for (int64_t v = 0; v < V; ++v) {
      next[static_cast<size_t>(v)] = pos;
      if (count[static_cast<size_t>(v) + 1] > 0) host[static_cast<size_t>(N + n_buckets++)] = pos;
      pos += count[static_cast<size_t>(v) + 1];
    }
    host[static_cast<size_t>(N + n_buckets)] = pos;
  }
  for (int64_t i = 0; i < N; ++i)  // ascending i: each bucket lists its rows in order
    host[static_cast<size_t>(next[static_cast<size_t>(tokens[static_cast<size_t>(i)])]++)] =
        static_cast<int32_t>(i);
  const Buffer& buckets = ws.at("embedding.buckets");
  REMAT_CUDA_CHECK(cudaMemcpyAsync(buckets.tensor().data, host.data(),
                                   static_cast<size_t>(N + n_buckets + 1) * 4,
                                   cudaMemcpyHostToDevice, stream()));
  const int32_t* order = static_cast<const int32_t*>(buckets.tensor().data);
  kern::embedding_backward_wte(a.dwte.f32(), a.dout.data, a.tokens.i32(), order, order + N,
                               n_buckets, C, is_bf16(a.dout), stream());
  if (!a.dwpe.empty())
    kern::embedding_backward_wpe(a.dwpe.f32(), a.dout.data, B, T, C, is_bf16(a.dout), stream());
  finish_op();
}

// ---- losses and optimizer ----

void CudaBackend::mse_loss_impl(const MseLossArgs& a) {
  kern::mse_loss(a.losses.f32(), a.dinp.data, a.inp.data, a.target.f32(), a.inp.rows(),
                 a.inp.dim(-1), a.loss_scale, is_bf16(a.inp), stream());
  finish_op();
}

void CudaBackend::dropout_impl(const DropoutArgs& a) {
  kern::dropout(a.out.data, a.inp.data, a.inp.numel(), a.p, a.seed, a.stream, is_bf16(a.inp),
                stream());
  finish_op();
}

// Deterministic: a fixed grid per tensor writes double partials straight into pinned host
// memory; after one sync the host adds them in order.
double CudaBackend::sum_squares_impl(std::span<const Tensor> tensors) {
  const size_t need = tensors.size() * kern::kSumSquaresBlocks;
  if (need > partials_capacity_) {
    if (partials_) REMAT_CUDA_CHECK(cudaFreeHost(partials_));
    partials_ = nullptr;
    REMAT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&partials_), need * sizeof(double),
                                   cudaHostAllocMapped));
    partials_capacity_ = need;
  }
  double* dev_partials = nullptr;
  REMAT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_partials), partials_, 0));
  for (size_t i = 0; i < tensors.size(); ++i)
    kern::sum_squares_partials(tensors[i].f32(), tensors[i].numel(),
                               dev_partials + i * kern::kSumSquaresBlocks, stream());
  finish_op();
  synchronize();
  double total = 0;
  for (size_t i = 0; i < need; ++i) total += partials_[i];
  return total;
}

void CudaBackend::adamw_update_impl(const AdamWArgs& a) {
  const float bc1 = 1.0f - std::pow(a.beta1, static_cast<float>(a.step));
  const float bc2 = 1.0f - std::pow(a.beta2, static_cast<float>(a.step));
  kern::adamw(a.param.f32(), a.grad.f32(), a.m.f32(), a.v.f32(), a.param.numel(), a.lr, a.beta1,
              a.beta2, a.eps, a.weight_decay, a.grad_scale, bc1, bc2, stream());
  finish_op();
}

}  // namespace remat::cuda
