// Kernels of attention over chunks (engine/core/ops/attention.h; host side in
// engine/cuda/attention.cpp): the forward's merge of one (query chunk, key chunk) pair into its
// query chunk's running output and log-sum-exp, and the strided row sums and casts of the
// backward's f32 accumulators. All memory-bound, one thread per element with grid-stride loops, no
// atomics (every element has one writer per launch), so the results repeat run to run.
#include "engine/cuda/device_common.cuh"
#include "engine/cuda/kernels.cuh"

namespace remat::cuda::kern {
namespace {

// One thread per element of o (n rows of NH HS): the weights of its head and row from the old
// and the pair's lse. lse itself is updated by the next kernel, after every element has read it.
__global__ void merge_out_kernel(float* o, const float* lse, int64_t lse_stride, const bf16* o_ij,
                                 const float* lse_ij, int64_t n, int64_t NH, int64_t HS,
                                 bool first) {
  const int64_t C = NH * HS, total = n * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = to_f32(o_ij[i]);
    if (first) {
      o[i] = x;
      continue;
    }
    const int64_t t = i / C, h = (i % C) / HS;
    const float a = lse[h * lse_stride + t], b = lse_ij[h * n + t];
    if (b == -CUDART_INF_F) continue;  // no visible key (never, for causal pairs)
    const float m = fmaxf(a, b);
    const float l = m + logf(expf(a - m) + expf(b - m));
    o[i] = expf(a - l) * o[i] + expf(b - l) * x;
  }
}

// One thread per (head, row): lse' as merge_out_kernel's weights used it.
__global__ void merge_lse_kernel(float* lse, int64_t lse_stride, const float* lse_ij, int64_t n,
                                 int64_t NH, bool first) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < NH * n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t h = i / n, t = i % n;
    const float a = lse[h * lse_stride + t], b = lse_ij[i];
    if (first) {
      lse[h * lse_stride + t] = b;
      continue;
    }
    if (b == -CUDART_INF_F) continue;
    const float m = fmaxf(a, b);
    lse[h * lse_stride + t] = m + logf(expf(a - m) + expf(b - m));
  }
}

__global__ void add_rows_kernel(float* dst, int64_t ld_dst, const bf16* src, int64_t ld_src,
                                int64_t rows, int64_t cols) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * cols;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * ld_dst + c] += to_f32(src[r * ld_src + c]);
  }
}

template <typename T>
__global__ void cast_rows_kernel(T* dst, int64_t ld_dst, const float* src, int64_t ld_src,
                                 int64_t rows, int64_t cols) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * cols;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * ld_dst + c] = from_f32<T>(src[r * ld_src + c]);
  }
}

}  // namespace

void attention_merge(float* o, float* lse, int64_t lse_stride, const void* o_ij,
                     const float* lse_ij, int64_t n, int64_t NH, int64_t HS, bool first,
                     cudaStream_t s) {
  merge_out_kernel<<<grid_for(n * NH * HS), kThreads, 0, s>>>(
      o, lse, lse_stride, static_cast<const bf16*>(o_ij), lse_ij, n, NH, HS, first);
  merge_lse_kernel<<<grid_for(n * NH), kThreads, 0, s>>>(lse, lse_stride, lse_ij, n, NH, first);
}

void add_rows(float* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows,
              int64_t cols, cudaStream_t s) {
  add_rows_kernel<<<grid_for(rows * cols), kThreads, 0, s>>>(
      dst, ld_dst, static_cast<const bf16*>(src), ld_src, rows, cols);
}

void cast_rows(void* dst, bool dst_bf16, int64_t ld_dst, const float* src, int64_t ld_src,
               int64_t rows, int64_t cols, cudaStream_t s) {
  if (dst_bf16)
    cast_rows_kernel<<<grid_for(rows * cols), kThreads, 0, s>>>(static_cast<bf16*>(dst), ld_dst,
                                                                src, ld_src, rows, cols);
  else
    cast_rows_kernel<<<grid_for(rows * cols), kThreads, 0, s>>>(static_cast<float*>(dst), ld_dst,
                                                                src, ld_src, rows, cols);
}

}  // namespace remat::cuda::kern
