// RMSNorm and the per-head q/k RMSNorm (engine/core/ops/rmsnorm.h), as engine/cpu/rmsnorm.cpp: the
// statistics in float whatever the activation dtype, out = w * act(x * rstd) (the normalized row
// rounded to the activation dtype before the weight multiplies it, as transformers'
// LlamaRMSNorm), and with xhat = x rstd, g = dout w:
//   dx = rstd (g - xhat mean(g xhat)),  dweight += sum over rows of dout xhat.
// Both ops are one layout: each row holds `heads` segments of `hs` values, the first `normed`
// normalized (the first `first` of them by w_first, the rest by w_second), the others copied.
// RMSNorm is one segment per row; the q/k norm is NH + 2 KVH heads per row, NH + KVH of them
// normalized. One warp per segment, as layernorm.cu's warp per row (memory-bound, a few FLOPs per
// byte). The weight gradients are column sums over the segments of one weight, through the
// backend's ColumnReduce (row chunks, then chunk order): no atomics, the same bits every run.
#include "engine/cuda/device_common.cuh"
#include "engine/cuda/norm_kernels.cuh"

namespace remat::cuda::kern {
namespace {

constexpr int kSegmentsPerBlock = kThreads / 32;

struct Segments {
  int64_t rows;    // N
  int64_t stride;  // elements per row
  int64_t hs;      // values per segment
  int64_t heads;   // segments per row
  int64_t normed;  // segments [0, normed) are normalized; rstd is (rows, normed)
  int64_t first;   // normalized segments [0, first) take w_first, [first, normed) w_second
};

// Forward, one warp per segment (8 per block); lanes stride over the segment's values. The sum
// of squares goes to the lanes, then warp_sum's fixed tree; the second pass re-reads x (L1/L2).
template <typename T>
__global__ void rms_forward_kernel(T* out, float* rstd, const T* inp, const float* w_first,
                                   const float* w_second, Segments sg, float eps) {
  const int64_t seg = blockIdx.x * int64_t{kSegmentsPerBlock} + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (seg >= sg.rows * sg.heads) return;  // the whole warp: warp_sum below has every lane
  const int64_t r = seg / sg.heads, h = seg - r * sg.heads;
  const T* x = inp + r * sg.stride + h * sg.hs;
  T* y = out + r * sg.stride + h * sg.hs;
  if (h >= sg.normed) {
    for (int64_t c = lane; c < sg.hs; c += 32) y[c] = x[c];
    return;
  }
  const float* w = h < sg.first ? w_first : w_second;
  float ss = 0;
  for (int64_t c = lane; c < sg.hs; c += 32) {
    const float v = to_f32(x[c]);
    ss += v * v;
  }
  const float rs = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(sg.hs) + eps);
  for (int64_t c = lane; c < sg.hs; c += 32)
    y[c] = from_f32<T>(w[c] * to_f32(from_f32<T>(to_f32(x[c]) * rs)));
  if (lane == 0) rstd[r * sg.normed + h] = rs;
}

// Input gradient, one warp per segment: written (`accumulate` false) or added (the residual
// stream); the copied segments pass dout through.
template <typename T>
__global__ void rms_backward_dinp_kernel(T* dinp, const T* dout, const T* inp, const float* w_first,
                                         const float* w_second, const float* rstd, Segments sg,
                                         bool accumulate) {
  const int64_t seg = blockIdx.x * int64_t{kSegmentsPerBlock} + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (seg >= sg.rows * sg.heads) return;
  const int64_t r = seg / sg.heads, h = seg - r * sg.heads;
  const int64_t off = r * sg.stride + h * sg.hs;
  const T* x = inp + off;
  const T* dy = dout + off;
  T* dx = dinp + off;
  if (h >= sg.normed) {
    for (int64_t c = lane; c < sg.hs; c += 32)
      dx[c] = from_f32<T>(accumulate ? to_f32(dx[c]) + to_f32(dy[c]) : to_f32(dy[c]));
    return;
  }
  const float* w = h < sg.first ? w_first : w_second;
  const float rs = rstd[r * sg.normed + h];
  float gx = 0;
  for (int64_t c = lane; c < sg.hs; c += 32) gx += to_f32(dy[c]) * w[c] * to_f32(x[c]) * rs;
  const float gx_mean = warp_sum(gx) / static_cast<float>(sg.hs);
  for (int64_t c = lane; c < sg.hs; c += 32) {
    const float d = rs * (to_f32(dy[c]) * w[c] - to_f32(x[c]) * rs * gx_mean);
    dx[c] = from_f32<T>(accumulate ? to_f32(dx[c]) + d : d);
  }
}

// One weight's gradient over one chunk of its segments: the segments [h0, h0 + nh) of every row
// are rows * nh virtual rows of hs columns, virtual row j = r nh + (h - h0). Grid (32-column
// slices, chunks of virtual rows), block (32, 8), as layernorm_backward_params_kernel:
// threadIdx.y strides over the chunk's virtual rows, the 8 partials are added in a fixed order
// and written to row blockIdx.y of the (chunks, hs) partials (`accumulate`: added, when the one
// chunk writes the gradient itself).
template <typename T>
__global__ void rms_weight_grad_kernel(float* dw, const T* dout, const T* inp, const float* rstd,
                                       Segments sg, int64_t h0, int64_t nh, bool accumulate) {
  __shared__ float part[8][33];
  const int64_t c = blockIdx.x * int64_t{32} + threadIdx.x;
  const RowRange rr = chunk_rows(sg.rows * nh, gridDim.y, blockIdx.y);
  float acc = 0;
  if (c < sg.hs) {
    // (r, h) of virtual row j, advanced by 8 virtual rows = q8 rows and r8 heads per step
    // (one 64-bit division per thread, not one per value).
    int64_t j = rr.begin + threadIdx.y;
    int64_t r = j / nh, h = j - r * nh;
    const int64_t q8 = 8 / nh, r8 = 8 - q8 * nh;
    for (; j < rr.end; j += 8) {
      const int64_t i = r * sg.stride + (h0 + h) * sg.hs + c;
      acc += to_f32(dout[i]) * to_f32(inp[i]) * rstd[r * sg.normed + h0 + h];
      r += q8;
      h += r8;
      if (h >= nh) {
        h -= nh;
        ++r;
      }
    }
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < sg.hs) {
    float total = 0;
    for (int k = 0; k < 8; ++k) total += part[k][threadIdx.x];
    const int64_t i = blockIdx.y * sg.hs + c;
    dw[i] = accumulate ? dw[i] + total : total;
  }
}

unsigned segment_blocks(const Segments& sg) {
  return static_cast<unsigned>((sg.rows * sg.heads + kSegmentsPerBlock - 1) / kSegmentsPerBlock);
}

void rms_forward(void* out, float* rstd, const void* inp, const float* w_first,
                 const float* w_second, const Segments& sg, float eps, bool is_bf16,
                 cudaStream_t s) {
  if (sg.rows == 0) return;  // a grid of 0 blocks is a launch error
  dispatch_act(is_bf16, [&](auto tag) {
    using T = decltype(tag);
    rms_forward_kernel<T><<<segment_blocks(sg), kThreads, 0, s>>>(
        static_cast<T*>(out), rstd, static_cast<const T*>(inp), w_first, w_second, sg, eps);
  });
}

// dw += the sum over the segments [h0, h0 + nh) of every row: one pass straight into dw, or row
// chunks into the scratch and a second pass adding them in chunk order. Two gradients reduced one
// after the other share the scratch: the stream orders the second's first pass after the first's
// second pass.
void rms_weight_grad(float* dw, const void* dout, const void* inp, const float* rstd,
                     const Segments& sg, int64_t h0, int64_t nh, bool is_bf16,
                     const ColumnReduce& r, cudaStream_t s) {
  if (dw == nullptr) return;  // a frozen weight
  const int64_t chunks = column_chunks(sg.rows * nh, sg.hs, 1, r);
  const dim3 block(32, 8),
      grid(static_cast<unsigned>((sg.hs + 31) / 32), static_cast<unsigned>(chunks));
  float* partials = chunks == 1 ? dw : r.scratch;
  dispatch_act(is_bf16, [&](auto tag) {
    using T = decltype(tag);
    rms_weight_grad_kernel<T><<<grid, block, 0, s>>>(partials, static_cast<const T*>(dout),
                                                     static_cast<const T*>(inp), rstd, sg, h0, nh,
                                                     chunks == 1);
  });
  if (chunks > 1) add_chunk_partials(dw, partials, chunks, sg.hs, s);
}

void rms_backward_dinp(void* dinp, const void* dout, const void* inp, const float* w_first,
                       const float* w_second, const float* rstd, const Segments& sg,
                       bool accumulate, bool is_bf16, cudaStream_t s) {
  dispatch_act(is_bf16, [&](auto tag) {
    using T = decltype(tag);
    rms_backward_dinp_kernel<T><<<segment_blocks(sg), kThreads, 0, s>>>(
        static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp), w_first,
        w_second, rstd, sg, accumulate);
  });
}

Segments rmsnorm_segments(int64_t N, int64_t C) {
  return {N, C, C, 1, 1, 1};  // one segment per row, normalized by the one weight
}

Segments qk_segments(int64_t N, int64_t NH, int64_t KVH, int64_t HS) {
  // q heads, then k heads (normalized), then v heads (copied)
  return {N, (NH + 2 * KVH) * HS, HS, NH + 2 * KVH, NH + KVH, NH};
}

}  // namespace

void rmsnorm_forward(const RmsNormForwardParams& p, cudaStream_t s) {
  rms_forward(p.out, p.rstd, p.inp, p.weight, p.weight, rmsnorm_segments(p.N, p.C), p.eps, p.bf16,
              s);
}

void rmsnorm_backward(const RmsNormBackwardParams& p, const ColumnReduce& r, cudaStream_t s) {
  const Segments sg = rmsnorm_segments(p.N, p.C);
  if (sg.rows == 0) return;
  rms_backward_dinp(p.dinp, p.dout, p.inp, p.weight, p.weight, p.rstd, sg, true, p.bf16, s);
  rms_weight_grad(p.dweight, p.dout, p.inp, p.rstd, sg, 0, 1, p.bf16, r, s);
}

void qk_norm_forward(const QkNormForwardParams& p, cudaStream_t s) {
  rms_forward(p.out, p.rstd, p.inp, p.q_weight, p.k_weight, qk_segments(p.N, p.NH, p.KVH, p.HS),
              p.eps, p.bf16, s);
}

void qk_norm_backward(const QkNormBackwardParams& p, const ColumnReduce& r, cudaStream_t s) {
  const Segments sg = qk_segments(p.N, p.NH, p.KVH, p.HS);
  if (sg.rows == 0) return;
  rms_backward_dinp(p.dinp, p.dout, p.inp, p.q_weight, p.k_weight, p.rstd, sg, false, p.bf16, s);
  rms_weight_grad(p.dq_weight, p.dout, p.inp, p.rstd, sg, 0, p.NH, p.bf16, r, s);
  rms_weight_grad(p.dk_weight, p.dout, p.inp, p.rstd, sg, p.NH, p.KVH, p.bf16, r, s);
}

}  // namespace remat::cuda::kern
