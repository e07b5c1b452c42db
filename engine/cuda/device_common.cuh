// Device helpers shared by the backend's .cu files: bf16/float conversion, launch geometry,
// loops over 16-byte vectors for the pointwise kernels and deterministic warp/block reductions
// (fixed shuffle trees, so the same bits every run).
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

// ---- pointwise loops over 16-byte vectors ----
// One thread per 2- or 4-byte element leaves a memory-bound kernel short of the bandwidth a
// 16-byte access per thread reaches; the per-element math stays the scalar loop's, so the vector
// and scalar paths give the same bits.

/// Elements of T per 16-byte access.
template <typename T>
constexpr int kVecElems = static_cast<int>(16 / sizeof(T));

/// N elements of T, loaded and stored whole: one 16-byte access, or two when N of a wider type
/// ride along with a narrower one (cast's 8 floats).
template <typename T, int N>
struct alignas(N * sizeof(T) < 16 ? N * sizeof(T) : 16) Pack {
  T v[N];
};

/// Whether every pointer allows 16-byte accesses (a pool block does; a view at an odd offset
/// may not).
template <typename... P>
inline bool aligned16(const P*... p) {
  return ((reinterpret_cast<uintptr_t>(p) % 16 == 0) && ...);
}

/// Grid-stride loop over [0, n): vec(i) for each whole group of N elements starting at i (a
/// multiple of N) when `vectors`, then scalar(i) for the elements after the last whole group
/// (every element when not `vectors`). A grid of (n / N) threads gives each one group.
template <int N, typename Vec, typename Scalar>
__device__ __forceinline__ void for_each_vector(int64_t n, bool vectors, Vec vec, Scalar scalar) {
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t groups = vectors ? n / N : 0;
  for (int64_t g = first; g < groups; g += stride) vec(g * N);
  for (int64_t i = groups * N + first; i < n; i += stride) scalar(i);
}

template <int N, typename T>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}

// The vector step of map_elements: the packs are arguments, so all of them are loaded before
// any element is stored.
template <int N, typename To, typename F, typename... Ti>
__device__ __forceinline__ void map_pack(To* out, int64_t i, const F& f, const Pack<Ti, N>&... x) {
  Pack<To, N> y;
#pragma unroll
  for (int k = 0; k < N; ++k) y.v[k] = from_f32<To>(f(i + k, to_f32(x.v[k])...));
  *reinterpret_cast<Pack<To, N>*>(out + i) = y;
}

/// out[i] = from_f32(f(i, to_f32(in[i])...)) for i < n, in groups of N when `vectors` (every
/// pointer 16-byte aligned: aligned16). A thread reads its elements before it writes them and no
/// other thread touches them, so out may alias any input.
template <int N, typename To, typename F, typename... Ti>
__device__ __forceinline__ void map_elements(To* out, int64_t n, bool vectors, const F& f,
                                             const Ti*... in) {
  for_each_vector<N>(
      n, vectors, [&](int64_t i) { map_pack<N>(out, i, f, load_pack<N>(in + i)...); },
      [&](int64_t i) { out[i] = from_f32<To>(f(i, to_f32(in[i])...)); });
}

/// Blocks for a pointwise kernel of n elements in groups of N: one group per thread.
inline unsigned grid_for_vectors(int64_t n, int N) {
  return grid_for((n + N - 1) / N);
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
