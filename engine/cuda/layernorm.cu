// LayerNorm forward/backward kernels (eps 1e-5, biased variance, as engine/cpu/layernorm.cpp).
// Our own kernels rather than cuDNN's NORM_FORWARD/NORM_BACKWARD, deliberately:
//   * the backend contract accumulates (dinp +=, dweight/dbias +=) while cuDNN's backward
//     overwrites dX, dscale and dbias, which would cost three scratch tensors and add kernels;
//   * the saved statistics are one (N, 2) f32 tensor (mean, rstd interleaved), not cuDNN's two;
//   * fixed-order reductions make recomputation bitwise reproducible, which remat relies on.
// LayerNorm is memory-bound (a few bytes per FLOP), so a plain warp-per-row kernel is close to
// the bandwidth limit and a fused library op would gain little.
#include "engine/cuda/device_common.cuh"
#include "engine/cuda/kernels.cuh"

namespace remat::cuda::kern {
namespace {

constexpr float kLayerNormEps = 1e-5f;
constexpr int kRowsPerBlock = kThreads / 32;

// One warp per row (8 rows per block); lanes stride over C. Mean first, then the centred
// variance (two passes over the row, the second from L1/L2), as the CPU reference does.
template <typename T>
__global__ void layernorm_forward_kernel(T* out, float* stats, const T* inp, const float* w,
                                         const float* b, int64_t N, int64_t C) {
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* x = inp + row * C;
  float sum = 0;
  for (int64_t c = lane; c < C; c += 32) sum += to_f32(x[c]);
  const float mean = warp_sum(sum) / static_cast<float>(C);
  float var = 0;
  for (int64_t c = lane; c < C; c += 32) {
    const float d = to_f32(x[c]) - mean;
    var += d * d;
  }
  const float rstd = 1.0f / sqrtf(warp_sum(var) / static_cast<float>(C) + kLayerNormEps);
  T* y = out + row * C;
  for (int64_t c = lane; c < C; c += 32)
    y[c] = from_f32<T>((to_f32(x[c]) - mean) * rstd * w[c] + b[c]);
  if (lane == 0) {
    stats[2 * row] = mean;
    stats[2 * row + 1] = rstd;
  }
}

// Input gradient, one warp per row, with xhat = (x - mean) rstd and g = dout * w:
//   dinp += rstd (g - mean(g) - xhat mean(g xhat)).
template <typename T>
__global__ void layernorm_backward_dinp_kernel(T* dinp, const T* dout, const T* inp, const float* w,
                                               const float* stats, int64_t N, int64_t C) {
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const float mean = stats[2 * row], rstd = stats[2 * row + 1];
  const T* x = inp + row * C;
  const T* dy = dout + row * C;
  float g_sum = 0, gx_sum = 0;
  for (int64_t c = lane; c < C; c += 32) {
    const float g = to_f32(dy[c]) * w[c];
    g_sum += g;
    gx_sum += g * (to_f32(x[c]) - mean) * rstd;
  }
  const float g_mean = warp_sum(g_sum) / static_cast<float>(C);
  const float gx_mean = warp_sum(gx_sum) / static_cast<float>(C);
  T* dx = dinp + row * C;
  for (int64_t c = lane; c < C; c += 32) {
    const float xhat = (to_f32(x[c]) - mean) * rstd;
    const float d = rstd * (to_f32(dy[c]) * w[c] - g_mean - xhat * gx_mean);
    dx[c] = from_f32<T>(to_f32(dx[c]) + d);
  }
}

// Parameter gradients over one row chunk (grid: 32-channel slices x row chunks, as
// column_sum_kernel in elementwise.cu): block (32, 8) owns 32 channels; threadIdx.y strides over
// the chunk's rows; the 8 partials are added in a fixed order, then written to row blockIdx.y of
// the (chunks, C) partials dw, db (`accumulate`: added, when the one chunk writes the gradient).
template <typename T>
__global__ void layernorm_backward_params_kernel(float* dw, float* db, const T* dout, const T* inp,
                                                 const float* stats, int64_t N, int64_t C,
                                                 bool accumulate) {
  __shared__ float part_w[8][33], part_b[8][33];
  const int64_t c = blockIdx.x * int64_t{32} + threadIdx.x;
  const RowRange rr = chunk_rows(N, gridDim.y, blockIdx.y);
  float acc_w = 0, acc_b = 0;
  if (c < C) {
    for (int64_t r = rr.begin + threadIdx.y; r < rr.end; r += 8) {
      const float d = to_f32(dout[r * C + c]);
      acc_w += d * (to_f32(inp[r * C + c]) - stats[2 * r]) * stats[2 * r + 1];
      acc_b += d;
    }
  }
  part_w[threadIdx.y][threadIdx.x] = acc_w;
  part_b[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float tw = 0, tb = 0;
    for (int k = 0; k < 8; ++k) {
      tw += part_w[k][threadIdx.x];
      tb += part_b[k][threadIdx.x];
    }
    const int64_t i = blockIdx.y * C + c;
    dw[i] = accumulate ? dw[i] + tw : tw;
    db[i] = accumulate ? db[i] + tb : tb;
  }
}

}  // namespace

void layernorm_forward(const LayerNormForwardParams& p, cudaStream_t s) {
  const unsigned grid = static_cast<unsigned>((p.N + kRowsPerBlock - 1) / kRowsPerBlock);
  dispatch_act(p.bf16, [&](auto tag) {
    using T = decltype(tag);
    layernorm_forward_kernel<T><<<grid, kThreads, 0, s>>>(
        static_cast<T*>(p.out), p.stats, static_cast<const T*>(p.inp), p.weight, p.bias, p.N, p.C);
  });
}

// The parameter gradients go through the backend's scratch as (chunks, C) partials of dweight
// followed by those of dbias, then the second pass adds each in chunk order.
void layernorm_backward(const LayerNormBackwardParams& p, const ColumnReduce& r, cudaStream_t s) {
  void* dinp = p.dinp;
  float *dweight = p.dweight, *dbias = p.dbias;
  const void *dout = p.dout, *inp = p.inp;
  const float *weight = p.weight, *stats = p.stats;
  const int64_t N = p.N, C = p.C;
  const bool is_bf16 = p.bf16;
  const unsigned grid = static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
  const int64_t chunks = column_chunks(N, C, 2, r);
  const dim3 pblock(32, 8),
      pgrid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(chunks));
  float* pw = chunks == 1 ? dweight : r.scratch;
  float* pb = chunks == 1 ? dbias : r.scratch + chunks * C;
  dispatch_act(is_bf16, [&](auto tag) {
    using T = decltype(tag);
    layernorm_backward_dinp_kernel<T>
        <<<grid, kThreads, 0, s>>>(static_cast<T*>(dinp), static_cast<const T*>(dout),
                                   static_cast<const T*>(inp), weight, stats, N, C);
    if (!dweight) return;  // a frozen LayerNorm: no parameter gradients
    layernorm_backward_params_kernel<T><<<pgrid, pblock, 0, s>>>(
        pw, pb, static_cast<const T*>(dout), static_cast<const T*>(inp), stats, N, C, chunks == 1);
  });
  if (chunks == 1 || !dweight) return;
  add_chunk_partials(dweight, pw, chunks, C, s);
  add_chunk_partials(dbias, pb, chunks, C, s);
}

}  // namespace remat::cuda::kern
