// Device helpers shared by the backend's .cu files: bf16/float conversion, launch geometry and
// deterministic warp/block reductions (fixed shuffle trees, so the same bits every run).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cstdint>

namespace remat::cuda::kern {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_f32(float x) {
  return x;
}
__device__ __forceinline__ float to_f32(bf16 x) {
  return __bfloat162float(x);
}
template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float x) {
  return __float2bfloat16(x);
}

constexpr int kThreads = 256;

/// Blocks for a grid-stride loop over n items: enough to fill any current GPU, capped.
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (1 << 16) ? (1 << 16) : b));
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Rows [begin, end) of chunk k when `rows` rows are split into n_chunks near-equal chunks
/// (the column reductions' first pass: kernels.cuh, ColumnReduce).
struct RowRange {
  int64_t begin, end;
};
__device__ __forceinline__ RowRange chunk_rows(int64_t rows, int64_t n_chunks, int64_t k) {
  const int64_t per = (rows + n_chunks - 1) / n_chunks;
  const int64_t begin = k * per < rows ? k * per : rows;
  return {begin, begin + per < rows ? begin + per : rows};
}
/// Fewest rows per chunk worth a block of its own (8 row phases of 8 rows each).
constexpr int64_t kMinChunkRows = 64;
/// dst (cols) += sum over k of partials (chunks, cols), in chunk order (elementwise.cu).
void add_chunk_partials(float* dst, const float* partials, int64_t chunks, int64_t cols,
                        cudaStream_t s);

/// Block-wide reduction (sum or max) of one float per thread; every thread gets the result.
/// blockDim.x must be a multiple of 32 and at most 1024.
template <bool kMax>
__device__ float block_reduce(float v) {
  __shared__ float warp_vals[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();  // warp_vals may still be read by a previous call
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  float r = lane < n_warps ? warp_vals[lane] : (kMax ? -CUDART_INF_F : 0.0f);
  r = kMax ? warp_max(r) : warp_sum(r);
  return r;
}

/// Calls f(float{}) or f(bf16{}): launchers write one generic lambda,
///   dispatch_act(is_bf16, [&](auto tag) { using T = decltype(tag); kernel<T><<<...>>>(...); });
template <typename F>
inline void dispatch_act(bool is_bf16, F&& f) {
  if (is_bf16)
    f(bf16{});
  else
    f(float{});
}

}  // namespace remat::cuda::kern
