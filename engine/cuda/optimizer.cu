// The optimizer's kernels: AdamW, the sum of squares of the global gradient norm, and the zeroing
// of the gradients before a step, each for one tensor or for many in a few launches. A step
// touches every parameter (147 tensors for GPT-2 124M) three times; one launch per tensor made
// ~440 small launches a step, so the multi-tensor kernels take a group of tensor descriptors by
// value in their parameters (under 4 KB, the limit on kernel parameters before CUDA 12.1) and
// pick their tensor from the block index. Per element the math is that of the single-tensor
// kernels, written once, so the bits do not depend on how tensors are grouped.
#include <algorithm>

#include "engine/cuda/device_common.cuh"
#include "engine/cuda/kernels.cuh"

namespace remat::cuda::kern {
namespace {

// ---- block -> tensor map of the multi-tensor kernels ----

// Tensor k of a group owns blocks [first[k], first[k + 1]) of a 1-D grid: grid_for(n) blocks, as
// its own launch would have, so the threads' share of elements stays what it was.
template <int kMax>
struct BlockMap {
  unsigned first[kMax + 1] = {};
  int count = 0;

  void add(int64_t n) {
    first[count + 1] = first[count] + grid_for(n);
    ++count;
  }
  unsigned blocks() const { return first[count]; }
  // The tensor whose range holds `block`: the last k with first[k] <= block (binary search).
  __device__ int tensor_of(unsigned block) const {
    int lo = 0, hi = count - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (first[mid] <= block)
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  }
};

// A grid-stride loop over one tensor's elements in the blocks `map` gave it.
struct TensorLoop {
  int64_t begin, stride;
};
template <int kMax>
__device__ TensorLoop tensor_loop(const BlockMap<kMax>& map, int k) {
  const unsigned block = blockIdx.x - map.first[k], blocks = map.first[k + 1] - map.first[k];
  return {block * int64_t{blockDim.x} + threadIdx.x, int64_t{blocks} * blockDim.x};
}

// ---- AdamW ----

// AdamW with decoupled weight decay, as engine/cpu/adamw.cpp, on element i. Both kernels below
// call it, so a batched update has the bits of a single one.
__device__ __forceinline__ void adamw_element(const AdamWParams& a, int64_t i) {
  const float gi = a.grad[i] * a.grad_scale;
  const float mi = a.beta1 * a.m[i] + (1.0f - a.beta1) * gi;
  const float vi = a.beta2 * a.v[i] + (1.0f - a.beta2) * gi * gi;
  a.m[i] = mi;
  a.v[i] = vi;
  const float mhat = mi / a.bias_corr1, vhat = vi / a.bias_corr2;
  a.param[i] -= a.lr * (mhat / (sqrtf(vhat) + a.eps) + a.weight_decay * a.param[i]);
}

__global__ void adamw_kernel(AdamWParams a) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < a.n;
       i += int64_t{gridDim.x} * blockDim.x)
    adamw_element(a, i);
}

// A group's updates, with their own hyperparameters each (weight decay differs by parameter).
struct AdamWGroup {
  AdamWParams t[kAdamWPerLaunch];
  BlockMap<kAdamWPerLaunch> map;
};
static_assert(sizeof(AdamWGroup) <= 4096, "kernel parameters: 4 KB at most");

__global__ void adamw_multi_kernel(AdamWGroup g) {
  const int k = g.map.tensor_of(blockIdx.x);
  const AdamWParams a = g.t[k];
  const TensorLoop loop = tensor_loop(g.map, k);
  for (int64_t i = loop.begin; i < a.n; i += loop.stride) adamw_element(a, i);
}

// ---- sum of squares ----

// Fixed grid per tensor (kSumSquaresBlocks x kSumSquaresThreads, blockIdx.y the tensor): each
// thread a grid-stride partial in double, then a fixed-order tree in shared memory; the host adds
// the block partials in order. The same partials, in the same places, as one launch per tensor.
struct SumSquaresGroup {
  DeviceFloats t[kSumSquaresPerLaunch];
};
static_assert(sizeof(SumSquaresGroup) + sizeof(double*) <= 4096, "kernel parameters: 4 KB at most");

__global__ void sum_squares_kernel(SumSquaresGroup g, double* partials) {
  __shared__ double part[kSumSquaresThreads];
  const float* x = g.t[blockIdx.y].data;
  const int64_t n = g.t[blockIdx.y].n;
  double acc = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    acc += static_cast<double>(x[i]) * x[i];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kSumSquaresThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.y * int64_t{gridDim.x} + blockIdx.x] = part[0];
}

// ---- zeroing ----

struct ZeroGroup {
  DeviceFloats t[kZeroPerLaunch];
  BlockMap<kZeroPerLaunch> map;
};
static_assert(sizeof(ZeroGroup) <= 4096, "kernel parameters: 4 KB at most");

__global__ void zero_kernel(ZeroGroup g) {
  const int k = g.map.tensor_of(blockIdx.x);
  float* p = g.t[k].data;
  const int64_t n = g.t[k].n;
  const TensorLoop loop = tensor_loop(g.map, k);
  for (int64_t i = loop.begin; i < n; i += loop.stride) p[i] = 0.0f;
}

// Calls launch(first, end) for each group of at most kGroup consecutive items of `count`.
template <int kGroup, class Launch>
void for_each_group(int64_t count, Launch&& launch) {
  for (int64_t first = 0; first < count; first += kGroup)
    launch(first, std::min(count, first + kGroup));
}

}  // namespace

// ---- launchers ----

void adamw(const AdamWParams& p, cudaStream_t s) {
  adamw_kernel<<<grid_for(p.n), kThreads, 0, s>>>(p);
}

void adamw_multi(const AdamWParams* updates, int64_t count, cudaStream_t s) {
  for_each_group<kAdamWPerLaunch>(count, [&](int64_t first, int64_t end) {
    AdamWGroup g{};
    for (int64_t i = first; i < end; ++i) {
      g.t[g.map.count] = updates[i];
      g.map.add(updates[i].n);
    }
    adamw_multi_kernel<<<g.map.blocks(), kThreads, 0, s>>>(g);
  });
}

void sum_squares_partials(const DeviceFloats* tensors, int64_t count, double* partials,
                          cudaStream_t s) {
  for_each_group<kSumSquaresPerLaunch>(count, [&](int64_t first, int64_t end) {
    SumSquaresGroup g{};
    std::copy(tensors + first, tensors + end, g.t);
    const dim3 grid(kSumSquaresBlocks, static_cast<unsigned>(end - first));
    sum_squares_kernel<<<grid, kSumSquaresThreads, 0, s>>>(g, partials + first * kSumSquaresBlocks);
  });
}

void zero_multi(const DeviceFloats* tensors, int64_t count, cudaStream_t s) {
  for_each_group<kZeroPerLaunch>(count, [&](int64_t first, int64_t end) {
    ZeroGroup g{};
    for (int64_t i = first; i < end; ++i) {
      g.t[g.map.count] = tensors[i];
      g.map.add(tensors[i].n);
    }
    zero_kernel<<<g.map.blocks(), kThreads, 0, s>>>(g);
  });
}

}  // namespace remat::cuda::kern
