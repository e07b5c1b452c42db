// CUDA backend: device setup, the stream-ordered allocator, versions and data movement. Each op's
// implementation lives in the file named after its engine/core/ops header (linear.cpp,
// layernorm.cpp, attention.cpp, activation.cpp, embedding.cpp, loss.cpp, adamw.cpp); it enqueues
// kernels and library calls on the one stream, then finish_op(). Kernels: elementwise.cu,
// layernorm.cu; GEMMs: gemm.cpp (cuBLASLt); flash attention: cudnn_attention.cpp.
#include "engine/cuda/cuda_backend.h"

#include <cudnn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "engine/core/cuda_workspace.h"
#include "engine/core/machine.h"
#include "engine/core/units.h"
#include "engine/cuda/check.h"
#include "engine/cuda/cublaslt_library.h"
#include "engine/cuda/cudnn_attention.h"
#include "engine/cuda/cudnn_graphs.h"
#include "engine/cuda/gemm.h"
#include "engine/cuda/kernels.cuh"
#include "engine/cuda/op_util.h"
#include "engine/cuda_api.h"
#include "engine/parallel/communicator.h"

namespace remat::cuda {

// The device and the stream every op runs on; shared by the backend and its allocator, so the
// stream outlives the pool's last free.
struct DeviceState {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaStream_t copy_stream = nullptr;  // device <-> host pool copies (remat.offload)
  // Every NCCL communicator's work (engine/cuda/nccl_sync.cpp): one stream, so that the work of
  // two communicators (data parallel's and the context ring's) never runs at once, which NCCL
  // does not support; every rank issues it in the same order.
  cudaStream_t comm_stream = nullptr;
  cudaDeviceProp prop{};
  uint64_t budget_bytes = 0;
  uint64_t host_budget_bytes = 0;  // the host pool's (device.host_memory)
  uint64_t total_bytes = 0;
  bool use_mem_pools = true;  // cudaDevAttrMemoryPoolsSupported: else cudaMalloc/cudaFree
  ~DeviceState() {
    for (cudaStream_t s : {comm_stream, copy_stream, stream})
      if (s) {
        cudaStreamSynchronize(s);
        cudaStreamDestroy(s);
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

// Pinned host memory for the host pool: the copy engines reach it at full PCIe/C2C bandwidth
// without a staging copy, and cudaMemcpyAsync on it is truly asynchronous. Pinning costs
// milliseconds per call and cudaFreeHost synchronizes the device, so freed blocks are cached by
// size and reused (every step allocates the same sizes). The cache is dropped before a new block
// would make the pinned total exceed the pool's budget, so pinned memory never exceeds it.
// Blocks are only ever written by the copy stream and read by copies or the host after a
// synchronize, so reuse is ordered by the copy stream itself.
class PinnedHostAllocator : public DeviceAllocator {
 public:
  explicit PinnedHostAllocator(uint64_t budget_bytes) : budget_(budget_bytes) {}
  ~PinnedHostAllocator() override { drop_cache(); }
  void* allocate(size_t bytes) override {
    auto it = cached_.find(bytes);
    if (it != cached_.end()) {
      void* p = it->second;
      cached_.erase(it);
      cached_bytes_ -= bytes;
      return p;
    }
    if (pinned_bytes_ + bytes > budget_) drop_cache();
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;  // the host pool reports OutOfMemory naming device.host_memory
    }
    REMAT_CUDA_CHECK(e);
    pinned_bytes_ += bytes;
    return p;
  }
  void deallocate(void* ptr, size_t bytes) override {
    cached_.emplace(bytes, ptr);
    cached_bytes_ += bytes;
  }

 private:
  void drop_cache() {
    for (auto& [bytes, p] : cached_) {
      (void)cudaFreeHost(p);
      pinned_bytes_ -= bytes;
    }
    cached_.clear();
    cached_bytes_ = 0;
  }
  uint64_t budget_;
  uint64_t pinned_bytes_ = 0;  // pinned by us: in use plus cached
  uint64_t cached_bytes_ = 0;
  std::multimap<size_t, void*> cached_;
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
  // The cuDNN loaded from the library path, which may not be the one the build saw.
  if (const std::string why = cudnn_version_refusal(static_cast<int64_t>(cudnnGetVersion()));
      !why.empty())
    throw BackendError(why);
  auto dev = std::make_shared<DeviceState>();
  // Several ranks on one node: each drives the node's GPU of its local rank.
  dev->device = parallel::local_rank() % device_count();
  REMAT_CUDA_CHECK(cudaSetDevice(dev->device));
  REMAT_CUDA_CHECK(cudaGetDeviceProperties(&dev->prop, dev->device));
  if (dev->prop.major < 8)
    throw BackendError(
        fmt::format("[cuda] {} is sm_{}{}; the CUDA backend needs sm_80 or newer "
                    "(cuDNN flash attention, bf16). Fix: device.backend = \"cpu\"",
                    dev->prop.name, dev->prop.major, dev->prop.minor));
  REMAT_CUDA_CHECK(cudaStreamCreateWithFlags(&dev->stream, cudaStreamNonBlocking));
  REMAT_CUDA_CHECK(cudaStreamCreateWithFlags(&dev->copy_stream, cudaStreamNonBlocking));
  REMAT_CUDA_CHECK(cudaStreamCreateWithFlags(&dev->comm_stream, cudaStreamNonBlocking));
  dev->use_mem_pools = setup_mem_pool(dev->device);
  size_t free_b = 0, total_b = 0;
  REMAT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  dev->total_bytes = total_b;
  dev->budget_bytes =
      cfg.memory_bytes ? cfg.memory_bytes
                       : (free_b > kLibraryReserveBytes ? free_b - kLibraryReserveBytes : free_b);
  dev->host_budget_bytes = cfg.host_memory_bytes ? cfg.host_memory_bytes : host_memory_bytes();
  return dev;
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
  return fmt::format("CUDA runtime {}.{}{}, cuBLASLt {}, cuDNN {} (built with {}), {}",
                     runtime / 1000, (runtime % 1000) / 10,
                     driver ? fmt::format(" (driver {}.{})", driver / 1000, (driver % 1000) / 10)
                            : std::string(" (no driver)"),
                     cublaslt_version(),
                     version_triplet(static_cast<int>(cudnnGetVersion()), 10000, 100),
                     version_triplet(CUDNN_VERSION, 10000, 100), nccl_version());
}

std::unique_ptr<Backend> make_backend(const DeviceConfig& cfg) {
  return std::make_unique<CudaBackend>(cfg,
                                       cfg.precision == Precision::Fp32 ? DType::F32 : DType::BF16);
}

// ---- construction ----

CudaBackend::CudaBackend(const DeviceConfig& cfg, DType act_dtype)
    : CudaBackend(act_dtype, open_device(cfg)) {}

CudaBackend::CudaBackend(DType act_dtype, std::shared_ptr<DeviceState> dev)
    : Backend(std::make_unique<MemoryPool>(std::make_unique<CudaAllocator>(dev), dev->budget_bytes),
              std::make_unique<MemoryPool>(
                  std::make_unique<PinnedHostAllocator>(dev->host_budget_bytes),
                  dev->host_budget_bytes, MemoryPool::kHostSpace)),
      dev_(std::move(dev)),
      act_(act_dtype) {
  REMAT_ASSERT(act_ == DType::BF16 || act_ == DType::F32, "cuda: activations must be bf16 or f32");
  gemm_ = std::make_unique<GemmEngine>(dev_->stream);
  attn_ = std::make_unique<AttentionEngine>(dev_->stream);
  REMAT_CUDA_CHECK(cudaMalloc(&reduce_.scratch, kReduceScratchFloats * sizeof(float)));
  reduce_.floats = kReduceScratchFloats;
  reduce_.target_blocks = 4 * dev_->prop.multiProcessorCount;  // a few waves' worth per SM
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(dev_->copy_stream);
  cudaStreamSynchronize(dev_->stream);
  for (auto& [id, e] : copy_events_) cudaEventDestroy(e);
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  if (compute_ready_) cudaEventDestroy(compute_ready_);
  if (partials_) cudaFreeHost(partials_);
  if (staging_) cudaFreeHost(staging_);
  if (reduce_.scratch) cudaFree(reduce_.scratch);
}

int64_t CudaBackend::attention_plan_workspace_bytes(const AttentionShape& s, bool backward) {
  return attn_->plan_workspace_bytes(s, backward);
}

std::vector<EngineOption> CudaBackend::attention_engine_survey(int64_t B, int64_t NH, int64_t T,
                                                               int64_t HS, bool backward) {
  return attn_->survey({B, NH, T, HS}, backward);
}

cudaStream_t CudaBackend::stream() const {
  return dev_->stream;
}

cudaStream_t CudaBackend::comm_stream() const {
  return dev_->comm_stream;
}

int64_t CudaBackend::max_shared_memory_per_block() const {
  return static_cast<int64_t>(dev_->prop.sharedMemPerBlockOptin);
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
  finish_downloads();
}

// Pageable destinations would make cudaMemcpyAsync wait for the copy, so the bytes go to pinned
// staging on the stream and reach `host` after the next sync. Staging grows only while nothing
// is pending (a sync first), and is kept: every step downloads the same sizes.
void CudaBackend::download_async(void* host, const Tensor& src) {
  const size_t bytes = src.bytes();
  if (staging_used_ + bytes > staging_capacity_) {
    // Room for what was pending too, so that the same downloads next step need no sync.
    const size_t wanted = staging_used_ + bytes;
    if (!pending_downloads_.empty()) synchronize();
    if (wanted > staging_capacity_) {
      if (staging_) REMAT_CUDA_CHECK(cudaFreeHost(staging_));
      staging_ = nullptr;
      staging_capacity_ = 0;
      REMAT_CUDA_CHECK(
          cudaHostAlloc(reinterpret_cast<void**>(&staging_), wanted, cudaHostAllocDefault));
      staging_capacity_ = wanted;
    }
  }
  REMAT_CUDA_CHECK(
      cudaMemcpyAsync(staging_ + staging_used_, src.data, bytes, cudaMemcpyDefault, stream()));
  pending_downloads_.push_back({host, staging_used_, bytes});
  staging_used_ += bytes;
  finish_op();
}

void CudaBackend::discard_downloads() noexcept {
  (void)cudaStreamSynchronize(stream());  // the copies into staging end before it is reused
  (void)cudaGetLastError();
  pending_downloads_.clear();
  staging_used_ = 0;
}

CudaBackend::PinnedBuffer::~PinnedBuffer() {
  if (host) cudaFreeHost(host);
  if (last_copy) cudaEventDestroy(last_copy);
}

void CudaBackend::PinnedBuffer::reserve(size_t bytes) {
  if (bytes <= capacity) return;
  wait();
  if (host) REMAT_CUDA_CHECK(cudaFreeHost(host));
  host = nullptr;
  capacity = 0;
  REMAT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), bytes, cudaHostAllocDefault));
  capacity = bytes;
}

void CudaBackend::PinnedBuffer::record(cudaStream_t s) {
  if (!last_copy) REMAT_CUDA_CHECK(cudaEventCreateWithFlags(&last_copy, cudaEventDisableTiming));
  REMAT_CUDA_CHECK(cudaEventRecord(last_copy, s));
}

void CudaBackend::PinnedBuffer::wait() const {
  if (last_copy) REMAT_CUDA_CHECK(cudaEventSynchronize(last_copy));
}

void CudaBackend::finish_downloads() {
  for (const PendingDownload& d : pending_downloads_)
    std::memcpy(d.host, staging_ + d.offset, d.bytes);
  pending_downloads_.clear();
  staging_used_ = 0;
}

void CudaBackend::forget_tokens_if_overlapping(const void* data, size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  const auto* t = static_cast<const char*>(tokens_device_);
  if (t && p < t + tokens_bytes_ && t < p + bytes) tokens_device_ = nullptr;
}

// cudaMemcpyDefault (unified addressing tells where each side is): `dst`/`src` may also be a
// host-pool tensor, e.g. offloaded AdamW moments written or read by a checkpoint.
void CudaBackend::upload(const Tensor& dst, const void* host) {
  forget_tokens_if_overlapping(dst.data, dst.bytes());
  // From pageable memory the call returns once `host` has been staged, so it may be reused.
  REMAT_CUDA_CHECK(cudaMemcpyAsync(dst.data, host, dst.bytes(), cudaMemcpyDefault, stream()));
  finish_op();
}

void CudaBackend::download(void* host, const Tensor& src) {
  REMAT_CUDA_CHECK(cudaMemcpyAsync(host, src.data, src.bytes(), cudaMemcpyDefault, stream()));
  synchronize();
}

// ---- device <-> host pool copies: the copy stream, ordered against the compute stream by
// events (never a device-wide sync) ----

cudaEvent_t CudaBackend::take_event() {
  if (!free_events_.empty()) {
    cudaEvent_t e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  REMAT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void CudaBackend::enqueue_copy(const Tensor& dst, const Tensor& src, CopyTicket t) {
  forget_tokens_if_overlapping(dst.data, dst.bytes());
  // The copy starts after everything enqueued on the compute stream so far: the source has been
  // written, and the destination (possibly memory the compute stream just freed) is no longer read.
  if (!compute_ready_)
    REMAT_CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
  REMAT_CUDA_CHECK(cudaEventRecord(compute_ready_, stream()));
  REMAT_CUDA_CHECK(cudaStreamWaitEvent(dev_->copy_stream, compute_ready_, 0));
  REMAT_CUDA_CHECK(
      cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDefault, dev_->copy_stream));
  cudaEvent_t done = take_event();
  REMAT_CUDA_CHECK(cudaEventRecord(done, dev_->copy_stream));
  copy_events_.emplace(t.id, done);
  finish_op();
}

void CudaBackend::copy_to_host_impl(const Tensor& dst, const Tensor& src, CopyTicket t) {
  enqueue_copy(dst, src, t);
}

void CudaBackend::copy_to_device_impl(const Tensor& dst, const Tensor& src, CopyTicket t) {
  enqueue_copy(dst, src, t);
}

void CudaBackend::wait_copy_impl(CopyTicket t) {
  auto it = copy_events_.find(t.id);
  REMAT_ASSERT(it != copy_events_.end(), "cuda: no copy event for ticket {}", t.id);
  // The compute stream (and with it every cudaFreeAsync the pool issues later) waits for the
  // copy; the host does not.
  REMAT_CUDA_CHECK(cudaStreamWaitEvent(stream(), it->second, 0));
  free_events_.push_back(it->second);  // re-recording it later does not affect this wait
  copy_events_.erase(it);
}

void CudaBackend::fill_host_impl(const Tensor& t, float value) {
  // Pinned memory the copy stream may still be reading (a reused block): wait for it first.
  REMAT_CUDA_CHECK(cudaStreamSynchronize(dev_->copy_stream));
  std::fill_n(t.f32(), t.numel(), value);
}

// ---- data movement and pointwise ----

void CudaBackend::fill_impl(const Tensor& t, float value) {
  forget_tokens_if_overlapping(t.data, t.bytes());
  if (t.dtype == DType::I32)
    kern::fill_i32(static_cast<int32_t*>(t.data), t.numel(), static_cast<int32_t>(value), stream());
  else
    kern::fill(t.data, t.numel(), value, is_bf16(t), stream());
  finish_op();
}

void CudaBackend::copy_impl(const Tensor& dst, const Tensor& src) {
  forget_tokens_if_overlapping(dst.data, dst.bytes());
  if (dst.dtype == src.dtype) {
    // Default: either side may be a tensor of the pinned host pool (unified addressing).
    REMAT_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDefault, stream()));
  } else {
    REMAT_ASSERT(dst.dtype != DType::I32 && src.dtype != DType::I32, "copy: {} into {}",
                 dtype_name(src.dtype), dtype_name(dst.dtype));
    kern::cast(dst.data, is_bf16(dst), src.data, is_bf16(src), src.numel(), stream());
  }
  finish_op();
}

}  // namespace remat::cuda
