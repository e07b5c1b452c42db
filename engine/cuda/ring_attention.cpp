// Ring attention (engine/core/ops/ring_attention.h) on CUDA: the ops' tensors as raw pointers for
// the kernels of ring_attention.cu. The ring itself (engine/parallel/context_ring.h) passes the
// blocks between ranks with NCCL (engine/cuda/nccl_sync.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "engine/core/error.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/op_util.h"
#include "engine/cuda/ring_kernels.cuh"

namespace remat::cuda {

namespace {

kern::RingPositions device_positions(const TokenPositions& pos) {
  if (pos.ranges.size() > static_cast<size_t>(kern::kMaxRingRanges))
    throw BackendError(
        fmt::format("ring attention on CUDA takes at most {} position ranges per "
                    "rank, got {}",
                    kern::kMaxRingRanges, pos.ranges.size()));
  kern::RingPositions d;
  d.n = static_cast<int>(pos.ranges.size());
  for (size_t r = 0; r < pos.ranges.size(); ++r) {
    d.start[r] = pos.ranges[r].first;
    d.length[r] = pos.ranges[r].second;
  }
  return d;
}

// The kernels keep 32-row tiles of every head in shared memory: refuse a head size whose tiles
// do not fit this device, with the fix, instead of a failed launch.
void check_head_size(int64_t HS, int64_t smem_bytes, int64_t limit) {
  if (HS > kern::kRingMaxHeadSize || smem_bytes > limit)
    throw BackendError(fmt::format(
        "[parallel] ring attention on CUDA: head size {} needs {} bytes of shared memory per "
        "block (this device allows {}; head sizes up to {}). Fix: more heads (model.n_head), or "
        "parallel.context = 1",
        HS, smem_bytes, limit, kern::kRingMaxHeadSize));
}

}  // namespace

void CudaBackend::ring_split_impl(const RingSplitArgs& a) {
  refuse_documents(a.doc_start, "ring_split");
  const int64_t C = a.q.dim(-1);
  kern::ring_split({.q = a.q.f32(),
                    .kv = a.kv.f32(),
                    .qkv = a.qkv.data,
                    .B = a.qkv.dim(0),
                    .T = a.qkv.dim(1),
                    .C = C,
                    .NH = a.n_head,
                    .KVH = kv_heads(a.n_head, a.n_kv_head),
                    .freq = rope_frequencies(C / a.n_head, a.rope_theta, a.rope_scaling,
                                             "[parallel] ring attention:"),
                    .pos = device_positions(a.pos),
                    .bf16 = is_bf16(a.qkv)},
                   stream());
  finish_op();
}

void CudaBackend::ring_merge_grad_impl(const RingMergeGradArgs& a) {
  refuse_documents(a.doc_start, "ring_merge_grad");
  const int64_t C = a.dq.dim(-1);
  kern::ring_merge_grad({.dqkv = a.dqkv.data,
                         .dq = a.dq.f32(),
                         .dkv = a.dkv.f32(),
                         .B = a.dqkv.dim(0),
                         .T = a.dqkv.dim(1),
                         .C = C,
                         .NH = a.n_head,
                         .KVH = kv_heads(a.n_head, a.n_kv_head),
                         .freq = rope_frequencies(C / a.n_head, a.rope_theta, a.rope_scaling,
                                                  "[parallel] ring attention:"),
                         .pos = device_positions(a.pos),
                         .bf16 = is_bf16(a.dqkv)},
                        stream());
  finish_op();
}

void CudaBackend::ring_block_forward_impl(const RingBlockForwardArgs& a) {
  refuse_documents(a.q_doc_start, "ring_block_forward");
  const int64_t C = a.q.dim(2), HS = C / a.n_head;
  check_head_size(HS, kern::ring_forward_smem_bytes(HS), max_shared_memory_per_block());
  kern::ring_block_forward({.acc = a.acc.f32(),
                            .row_max = a.row_max.f32(),
                            .row_sum = a.row_sum.f32(),
                            .q = a.q.f32(),
                            .kv = a.kv.f32(),
                            .B = a.q.dim(0),
                            .Tq = a.q.dim(1),
                            .Tk = a.kv.dim(1),
                            .C = C,
                            .NH = a.n_head,
                            .KVH = kv_heads(a.n_head, a.n_kv_head),
                            .q_pos = device_positions(a.q_pos),
                            .k_pos = device_positions(a.k_pos)},
                           stream());
  finish_op();
}

void CudaBackend::ring_finish_impl(const RingFinishArgs& a) {
  kern::ring_finish({.out = a.out.data,
                     .acc = a.acc.f32(),
                     .lse = a.lse.f32(),
                     .row_max = a.row_max.f32(),
                     .row_sum = a.row_sum.f32(),
                     .B = a.out.dim(0),
                     .T = a.out.dim(1),
                     .C = a.out.dim(2),
                     .NH = a.n_head,
                     .bf16 = is_bf16(a.out)},
                    stream());
  finish_op();
}

void CudaBackend::ring_block_backward_impl(const RingBlockBackwardArgs& a) {
  refuse_documents(a.q_doc_start, "ring_block_backward");
  const int64_t C = a.q.dim(2), HS = C / a.n_head;
  check_head_size(HS, kern::ring_backward_smem_bytes(HS), max_shared_memory_per_block());
  kern::ring_block_backward({.dq = a.dq.f32(),
                             .dkv = a.dkv.f32(),
                             .q = a.q.f32(),
                             .kv = a.kv.f32(),
                             .dout = a.dout.data,
                             .lse = a.lse.f32(),
                             .delta = a.delta.f32(),
                             .B = a.q.dim(0),
                             .Tq = a.q.dim(1),
                             .Tk = a.kv.dim(1),
                             .C = C,
                             .NH = a.n_head,
                             .KVH = kv_heads(a.n_head, a.n_kv_head),
                             .q_pos = device_positions(a.q_pos),
                             .k_pos = device_positions(a.k_pos),
                             .bf16 = is_bf16(a.dout)},
                            stream());
  finish_op();
}

}  // namespace remat::cuda
