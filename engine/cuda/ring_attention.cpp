// Ring attention (engine/ops/ring_attention.h) on CUDA: not built. Context parallel exchanges
// keys and values through host memory with MPI and runs on the CPU backend; a run or a test that
// reaches these on a GPU gets this error instead of a wrong answer.
#include "engine/cuda/cuda_backend.h"
#include "engine/error.h"

namespace remat::cuda {

namespace {
[[noreturn]] void refuse(const char* op) {
  throw Error(fmt::format(
      "[parallel] {}: context parallel runs on the CPU backend; the CUDA backend has no ring "
      "attention. Fix: set device.backend = \"cpu\", or parallel.context = 1",
      op));
}
}  // namespace

void CudaBackend::ring_split_impl(const RingSplitArgs&) {
  refuse("ring_split");
}
void CudaBackend::ring_merge_grad_impl(const RingMergeGradArgs&) {
  refuse("ring_merge_grad");
}
void CudaBackend::ring_block_forward_impl(const RingBlockForwardArgs&) {
  refuse("ring_block_forward");
}
void CudaBackend::ring_finish_impl(const RingFinishArgs&) {
  refuse("ring_finish");
}
void CudaBackend::ring_block_backward_impl(const RingBlockBackwardArgs&) {
  refuse("ring_block_backward");
}

}  // namespace remat::cuda
