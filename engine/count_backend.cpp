// Count backend (see engine/count_backend.h).
#include "engine/count_backend.h"

#include <fmt/format.h>

#include <cstring>

#include "engine/cpu/cpu_backend.h"

namespace remat {
namespace {

// Fake, never-dereferenced, distinct and aligned addresses.
class FakeAllocator : public DeviceAllocator {
 public:
  void* allocate(size_t bytes) override {
    void* p = reinterpret_cast<void*>(next_);
    next_ += (bytes + MemoryPool::kAlignment - 1) / MemoryPool::kAlignment * MemoryPool::kAlignment;
    return p;
  }
  void deallocate(void*, size_t) override {}

 private:
  uintptr_t next_ = uintptr_t{1} << 40;
};

}  // namespace

CountBackend::CountBackend(CountTarget target, uint64_t budget_bytes)
    : Backend(std::make_unique<MemoryPool>(std::make_unique<FakeAllocator>(), budget_bytes)),
      target_(std::move(target)) {}

std::string CountBackend::describe() const {
  return fmt::format("count (dry run for {}, {} activations)", target_.device,
                     dtype_name(target_.act_dtype));
}

void CountBackend::download(void* host, const Tensor& src) { std::memset(host, 0, src.bytes()); }

void CountBackend::allocate_attention_workspace(const Tensor& qkv, int n_head, float rope_theta,
                                                bool backward) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3;
  if (target_.device == "cpu") {
    const int64_t floats =
        cpu::attention_workspace_floats(T, C / n_head, target_.threads, rope_theta > 0);
    Buffer ws = pool().allocate({floats}, DType::F32, MemCategory::Workspace, "attn.workspace");
    return;
  }
  const uint64_t bytes = cuda_attention_workspace_bytes(B, T, C, n_head, target_.act_dtype,
                                                       rope_theta > 0, backward);
  if (bytes) {
    Buffer ws = pool().allocate({static_cast<int64_t>(bytes / 4)}, DType::F32,
                                MemCategory::Workspace, "attn.workspace");
  }
}

void CountBackend::attention_forward_impl(const AttentionForwardArgs& a) {
  allocate_attention_workspace(a.qkv, a.n_head, a.rope_theta, false);
}

void CountBackend::attention_backward_impl(const AttentionBackwardArgs& a) {
  allocate_attention_workspace(a.qkv, a.n_head, a.rope_theta, true);
}

void CountBackend::allocate_gemm_workspace(int64_t OC, int64_t C, bool needs_weight_copy) {
  if (!is_cuda()) return;
  Buffer weight;
  const uint64_t wbytes = needs_weight_copy ? cuda_weight_copy_bytes(OC, C, target_.act_dtype) : 0;
  if (wbytes) weight = pool().allocate({OC, C}, DType::BF16, MemCategory::Workspace, "gemm.weight_bf16");
  Buffer ws = pool().allocate({static_cast<int64_t>(kCudaGemmWorkspaceBytes / 2)}, DType::BF16,
                              MemCategory::Workspace, "gemm.workspace");
}

void CountBackend::linear_forward_impl(const LinearForwardArgs& a) {
  allocate_gemm_workspace(a.weight.dim(0), a.weight.dim(-1), true);
}

void CountBackend::linear_backward_impl(const LinearBackwardArgs& a) {
  allocate_gemm_workspace(a.weight.dim(0), a.weight.dim(-1), !a.dinp.empty());
}

void CountBackend::embedding_backward_impl(const EmbeddingBackwardArgs& a) {
  if (!is_cuda()) return;
  const uint64_t bytes = cuda_embedding_backward_workspace_bytes(a.tokens.numel());
  Buffer ws = pool().allocate({static_cast<int64_t>(bytes / 4)}, DType::I32, MemCategory::Workspace,
                              "embedding.buckets");
}

// The CUDA loss head casts the tied weight once per call, then allocates the GEMM workspace
// and the logits chunk (engine/cuda/cuda_backend.cpp does the same, in the same order).
void CountBackend::lm_head_loss_impl(const LmHeadLossArgs& a) {
  Buffer weight, ws;
  if (is_cuda()) {
    const int64_t V = a.weight.dim(0), C = a.weight.dim(1);
    if (cuda_weight_copy_bytes(V, C, target_.act_dtype))
      weight = pool().allocate({V, C}, DType::BF16, MemCategory::Workspace, "gemm.weight_bf16");
    ws = pool().allocate({static_cast<int64_t>(kCudaGemmWorkspaceBytes / 2)}, DType::BF16,
                         MemCategory::Workspace, "gemm.workspace");
  }
  Buffer chunk = allocate_logits_chunk(a);
}

}  // namespace remat
