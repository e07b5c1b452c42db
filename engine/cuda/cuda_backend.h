// The CUDA backend: bf16 (or f32) activations with fp32 accumulation and fp32 master weights.
// cuBLASLt for GEMMs (gemm.cpp), cuDNN's fused flash attention (cudnn_attention.cpp), our own
// kernels for LayerNorm and the pointwise ops (layernorm.cu, elementwise.cu). Everything runs in
// order on one stream (copies to and from the host pool on a second one, see remat.offload);
// device memory comes from the MemoryPool through a stream-ordered allocator
// (cudaMallocAsync on a pool that keeps freed memory cached), so a Buffer freed on the host
// while kernels still use it is safe: the free is ordered after them on the stream. (Devices
// without memory pools fall back to cudaMalloc, and cudaFree after a stream sync.) Outside the
// pool: the libraries' handles and 1 MiB of reduction scratch, within kLibraryReserveBytes.
//
// Weights in bf16 mode: every GEMM op casts its f32 weight into a bf16 copy from the pool
// (category workspace, "gemm.weight_bf16") for the duration of the op, instead of keeping a
// persistent bf16 shadow per parameter. Why: a shadow can go stale through any path that writes
// a weight (AdamW, upload, checkpoint load, fill), and keeping 2 bytes/param alive all the time
// costs more memory than the largest single transient copy; the cast reads 6 bytes per weight per
// use, negligible next to the GEMM at the sequence lengths this tool is for. The planner models
// the copy (engine/core/cuda_workspace.h lists it as part of each GEMM op's workspace), so
// predicted and measured peaks agree.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/core/backend.h"
#include "engine/cuda/cudnn_attention.h"
#include "engine/cuda/kernels.cuh"

namespace remat::cuda {

class GemmEngine;
struct DeviceState;

class CudaBackend final : public Backend {
 public:
  /// Device 0. Budget: cfg.memory_bytes, or the device's free memory minus a reserve for the
  /// libraries' own allocations. Throws BackendError without a usable device.
  explicit CudaBackend(const DeviceConfig& cfg, DType act_dtype = DType::BF16);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  std::string describe() const override;
  DType act_dtype() const override { return act_; }
  WorkspaceTarget workspace_target() const override { return {DeviceKind::Cuda, 1}; }
  /// cuDNN's backward takes O and computes D itself.
  bool attention_backward_needs_out() const override { return true; }

  /// Host -> device, ordered on the backend's stream; `host` may be reused on return.
  void upload(const Tensor& dst, const void* host) override;
  /// Device -> host; waits for every op enqueued before it.
  void download(void* host, const Tensor& src) override;
  /// Through pinned staging memory (see PendingDownloads in cuda_backend.cpp).
  void download_async(void* host, const Tensor& src) override;
  void discard_downloads() noexcept override;
  /// Waits until every enqueued op has finished (timing, tests); completes download_async.
  void synchronize() override;
  /// The workspace cuDNN's attention plan for this shape needs, in bytes (builds the plan once;
  /// the tests compare it with cudnn_plan_reserve_bytes). Throws BackendError when no engine
  /// config has a plan within that reserve.
  int64_t attention_plan_workspace_bytes(const AttentionShape& s, bool backward);
  /// Every engine config cuDNN offers for this attention shape (AttentionEngine::survey).
  std::vector<EngineOption> attention_engine_survey(int64_t B, int64_t NH, int64_t T, int64_t HS,
                                                    bool backward);

 protected:
  void copy_to_host_impl(const Tensor& dst, const Tensor& src, CopyTicket t) override;
  void copy_to_device_impl(const Tensor& dst, const Tensor& src, CopyTicket t) override;
  void wait_copy_impl(CopyTicket t) override;
  void fill_host_impl(const Tensor& t, float value) override;
  void fill_impl(const Tensor& t, float value) override;
  void copy_impl(const Tensor& dst, const Tensor& src) override;
  void linear_forward_impl(const LinearForwardArgs& a, const OpWorkspace& ws) override;
  void linear_backward_impl(const LinearBackwardArgs& a, const OpWorkspace& ws) override;
  void layernorm_forward_impl(const LayerNormForwardArgs& a) override;
  void layernorm_backward_impl(const LayerNormBackwardArgs& a) override;
  void rmsnorm_forward_impl(const RmsNormForwardArgs& a) override;
  void rmsnorm_backward_impl(const RmsNormBackwardArgs& a) override;
  void qk_norm_forward_impl(const QkNormForwardArgs& a) override;
  void qk_norm_backward_impl(const QkNormBackwardArgs& a) override;
  void attention_forward_impl(const AttentionForwardArgs& a, const OpWorkspace& ws) override;
  void attention_backward_impl(const AttentionBackwardArgs& a, const OpWorkspace& ws) override;
  void attention_delta_impl(const AttentionDeltaArgs& a) override;
  void activation_forward_impl(const ActivationForwardArgs& a) override;
  void activation_backward_impl(const ActivationBackwardArgs& a) override;
  void swiglu_forward_impl(const SwiGluForwardArgs& a) override;
  void swiglu_backward_impl(const SwiGluBackwardArgs& a) override;
  void add_impl(const Tensor& out, const Tensor& a, const Tensor& b) override;
  void embedding_forward_impl(const EmbeddingForwardArgs& a) override;
  void embedding_backward_impl(const EmbeddingBackwardArgs& a, const OpWorkspace& ws) override;
  void lm_head_loss_impl(const LmHeadLossArgs& a, const OpWorkspace& ws) override;
  void mse_loss_impl(const MseLossArgs& a) override;
  // Context parallel runs on the CPU backend: these refuse (engine/cuda/ring_attention.cpp).
  void ring_split_impl(const RingSplitArgs& a) override;
  void ring_merge_grad_impl(const RingMergeGradArgs& a) override;
  void ring_block_forward_impl(const RingBlockForwardArgs& a) override;
  void ring_finish_impl(const RingFinishArgs& a) override;
  void ring_block_backward_impl(const RingBlockBackwardArgs& a) override;
  void dropout_impl(const DropoutArgs& a) override;
  double sum_squares_impl(std::span<const Tensor> tensors) override;
  void adamw_update_impl(const AdamWArgs& a) override;
  void adamw_updates_impl(std::span<const AdamWArgs> all) override;
  void fill_zero_impl(std::span<const Tensor> tensors) override;

 private:
  CudaBackend(DType act_dtype, std::shared_ptr<DeviceState> dev);
  cudaStream_t stream() const;
  /// The stream of every NCCL communicator's work on this device (nccl_sync.cpp).
  cudaStream_t comm_stream() const;
  /// Shared memory one block may opt in to on this device (cudaDeviceProp), in bytes.
  int64_t max_shared_memory_per_block() const;
  /// Checks the launches of the op just enqueued; with REMAT_CUDA_SYNC=1 also waits for them.
  void finish_op();
  /// The weight a GEMM reads: the workspace's copy in the GEMM's dtype ("gemm.weight_bf16" or
  /// "gemm.weight_f32", cast or NF4-dequantised here) when the op's rule asked for one, else the
  /// weight itself (an f32 weight for an f32 GEMM, a bf16 frozen base for a bf16 one).
  const void* gemm_weight(const Tensor& weight, const OpWorkspace& ws);
  /// dst (the weight's shape, bf16 or f32) = the NF4 weight decoded (engine/cuda/nf4.cu).
  void nf4_dequantize(const Tensor& dst, const Tensor& weight);
  /// LoRA's GEMM operands (lora.cpp): A and B as the GEMMs read them (bf16 copies for bf16
  /// activations), the adapter's input (dropped when dropout is on), and h = s x A^T, computed.
  struct LoraOperands {
    bool bf = false;
    const void *a = nullptr, *b = nullptr, *x = nullptr;
    void* h = nullptr;
    void* wsp = nullptr;  // the GEMM workspace
  };
  LoraOperands lora_operands(const Tensor& inp, const Tensor& a, const Tensor& b, float scale,
                             const LoraDropout& d, const OpWorkspace& ws);
  /// A linear's adapters after its base GEMM: out's columns += s h B^T (lora.cpp).
  void lora_forward_terms(const LinearLora& l, const Tensor& out, const Tensor& inp,
                          const OpWorkspace& ws);
  /// After the base dinp GEMM: dB, dA accumulated, and each adapter's share added to dinp.
  void lora_backward_terms(const LinearBackwardArgs& a, const OpWorkspace& ws);

  /// Enqueues one device <-> host-pool copy on the copy stream and records its event under `t`.
  void enqueue_copy(const Tensor& dst, const Tensor& src, CopyTicket t);
  cudaEvent_t take_event();

  friend class NcclGradientSync;  // runs NCCL on a stream ordered after this one's ops
  friend class NcclShardedSync;   // likewise, for ZeRO-1
  friend class NcclRingChannel;   // likewise, for context parallel's ring

  /// After a sync: copies each download_async's staged bytes to its destination.
  void finish_downloads();
  /// Forgets the tokens copy of embedding_forward if [data, data + bytes) overlaps them.
  void forget_tokens_if_overlapping(const void* data, size_t bytes);

  std::shared_ptr<DeviceState> dev_;
  DType act_;
  cudaEvent_t compute_ready_ = nullptr;          // re-recorded before each copy
  std::map<uint64_t, cudaEvent_t> copy_events_;  // ticket -> its copy's completion
  std::vector<cudaEvent_t> free_events_;
  std::unique_ptr<GemmEngine> gemm_;
  std::unique_ptr<AttentionEngine> attn_;
  double* partials_ = nullptr;  // pinned, device-mapped host memory for sum_squares partials
  size_t partials_capacity_ = 0;
  kern::ColumnReduce reduce_;  // scratch of the bias / LayerNorm parameter-gradient reductions
  // download_async: pinned staging (grown, kept) and the copies to finish after the next sync.
  struct PendingDownload {
    void* host;
    size_t offset, bytes;
  };
  char* staging_ = nullptr;
  size_t staging_capacity_ = 0, staging_used_ = 0;
  std::vector<PendingDownload> pending_downloads_;
  // Pinned host memory that copies on the stream read or write, grown on demand and kept. Freed
  // after ~CudaBackend's body has synchronized the streams.
  struct PinnedBuffer {
    char* host = nullptr;
    size_t capacity = 0;  // bytes
    cudaEvent_t last_copy = nullptr;
    PinnedBuffer() = default;
    PinnedBuffer(const PinnedBuffer&) = delete;
    PinnedBuffer& operator=(const PinnedBuffer&) = delete;
    ~PinnedBuffer();
    /// Room for `bytes`; a buffer too small is replaced once its last copy is done.
    void reserve(size_t bytes);
    /// Marks the copy just enqueued on `s` as the buffer's last.
    void record(cudaStream_t s);
    /// Waits for the last copy (none yet: returns at once).
    void wait() const;
  };
  // The tokens embedding_forward saw (`tokens_device`, `tokens_bytes`), copied to pinned memory as
  // the step starts, so that the embedding backward buckets them on the host without waiting for
  // the device (embedding.cpp).
  PinnedBuffer tokens_copy_;
  const void* tokens_device_ = nullptr;
  size_t tokens_bytes_ = 0;
  // The embedding backward's bucket table on its way to the device: pinned, so the upload does
  // not wait for the stream (a pageable one may); refilled once its last upload is done.
  PinnedBuffer buckets_upload_;
};

}  // namespace remat::cuda
