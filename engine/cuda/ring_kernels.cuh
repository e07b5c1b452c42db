// Launchers of ring attention's CUDA kernels (ring_attention.cu):
// engine/core/ops/ring_attention.h's Args as raw pointers. Internal header of engine/cuda, plain
// C++ like kernels.cuh (same conventions: enqueue on `stream`, the caller checks the launch; `bf16`
// is the storage type of the activation pointers; everything else is float).
//
// The kernels are plain fp32 flash tiles on the CUDA cores (32 queries x 32 keys, one warp per 8
// query rows, one lane per key), not cuDNN: cuDNN's fused attention masks by local index, and a
// ring step's mask compares global positions of two arbitrary token sets. Every output element
// is summed by one thread in one fixed order (no atomics): the same bits every run.
//
// Grouped-query heads: NH query heads of HS over KVH key/value heads, query head h reading
// key/value head h / (NH / KVH). C = NH HS is q's width, K = KVH HS the keys' and the values', so
// kv rows are 2K wide; the kv kernel of the backward owns a key/value head and sums its dk, dv
// over the group's query heads in order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/kernels.cuh"

namespace remat::cuda::kern {

/// A rank's token positions (engine/core/ops/ring_attention.h's TokenPositions) by value, for a
/// kernel's parameters: local token t is the t-th position of the ranges in order.
constexpr int kMaxRingRanges = 4;  // the context layout gives two
struct RingPositions {
  int n = 0;
  int64_t start[kMaxRingRanges] = {};
  int64_t length[kMaxRingRanges] = {};
};
/// The largest head size the kernels take (their tiles live in shared memory).
constexpr int64_t kRingMaxHeadSize = 256;

/// q (B, T, C), kv (B, T, 2K) f32 = qkv (B, T, C + 2K) act split, q and k rotated by RoPE at
/// their global positions with the frequencies `freq` (freq.n = 0: no rotation).
struct RingSplitParams {
  float* q;
  float* kv;
  const void* qkv;
  int64_t B, T, C, NH, KVH;
  RopeFrequencies freq;
  RingPositions pos;
  bool bf16;
};
void ring_split(const RingSplitParams& p, cudaStream_t s);

/// dqkv (B, T, C + 2K) act = dq, dk rotated back (R^T) and dv.
struct RingMergeGradParams {
  void* dqkv;
  const float* dq;
  const float* dkv;
  int64_t B, T, C, NH, KVH;
  RopeFrequencies freq;
  RingPositions pos;
  bool bf16;
};
void ring_merge_grad(const RingMergeGradParams& p, cudaStream_t s);

/// One ring step of the online softmax: (acc, row_max, row_sum) of queries q (at q_pos) folded
/// with the keys and values kv (at k_pos) they may see.
struct RingForwardParams {
  float* acc;
  float* row_max;
  float* row_sum;
  const float* q;
  const float* kv;
  int64_t B, Tq, Tk, C, NH, KVH;
  RingPositions q_pos, k_pos;
};
void ring_block_forward(const RingForwardParams& p, cudaStream_t s);

/// out (act) = acc / row_sum; lse = row_max + log(row_sum) (lse may be row_max).
struct RingFinishParams {
  void* out;
  const float* acc;
  float* lse;
  const float* row_max;
  const float* row_sum;
  int64_t B, T, C, NH;
  bool bf16;
};
void ring_finish(const RingFinishParams& p, cudaStream_t s);

/// One ring step of the flash backward: dq += ..., dkv = dk | dv += ... (dout act, the rest f32).
struct RingBackwardParams {
  float* dq;
  float* dkv;
  const float* q;
  const float* kv;
  const void* dout;
  const float* lse;
  const float* delta;
  int64_t B, Tq, Tk, C, NH, KVH;
  RingPositions q_pos, k_pos;
  bool bf16;
};
void ring_block_backward(const RingBackwardParams& p, cudaStream_t s);

/// Dynamic shared memory the forward / backward kernels need at head size HS, in bytes (the
/// backend checks it against the device's limit before the first launch).
int64_t ring_forward_smem_bytes(int64_t HS);
int64_t ring_backward_smem_bytes(int64_t HS);

}  // namespace remat::cuda::kern
