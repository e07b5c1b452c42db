// The CUDA backend's small kernels: fill/cast, residual add, GELU/ReLU, bias broadcast and bias
// gradient, embedding gather and deterministic scatter-add, MSE, the LM head's softmax
// cross-entropy, AdamW, sum of squares and RoPE. Each is memory-bound and written for clarity:
// grid-stride loops, float math on bf16 or float storage, fixed-order reductions (no atomics),
// so a recomputed activation is bitwise equal to the original and gradients repeat run to run.
// Semantics follow the CPU reference (engine/cpu/*.cpp) op by op.
#include <algorithm>

#include "engine/cuda/device_common.cuh"
#include "engine/cuda/kernels.cuh"
#include "engine/rng.h"

namespace remat::cuda::kern {
namespace {

// ---- data movement and pointwise: one thread per element, grid-stride ----

template <typename T>
__global__ void fill_kernel(T* p, int64_t n, float value) {
  const T v = from_f32<T>(value);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    p[i] = v;
}

__global__ void fill_i32_kernel(int32_t* p, int64_t n, int32_t value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    p[i] = value;
}

template <typename Td, typename Ts>
__global__ void cast_kernel(Td* dst, const Ts* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = from_f32<Td>(to_f32(src[i]));
}

template <typename T>
__global__ void add_kernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
}

template <typename T>
__global__ void dropout_kernel(T* out, const T* inp, int64_t n, float p, float scale, uint64_t seed,
                               uint64_t stream, uint64_t first_index) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = from_f32<T>(rng_uniform(seed, stream, first_index + static_cast<uint64_t>(i)) >= p
                             ? to_f32(inp[i]) * scale
                             : 0.0f);
}

// GELU, tanh approximation (GPT-2), as engine/cpu/cpu_backend.cpp.
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

template <typename T>
__global__ void activation_forward_kernel(T* out, const T* inp, int64_t n, bool gelu) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = to_f32(inp[i]);
    float y;
    if (gelu) {
      const float u = kGeluScale * (x + 0.044715f * x * x * x);
      y = 0.5f * x * (1.0f + tanhf(u));
    } else {
      y = x > 0 ? x : 0.0f;
    }
    out[i] = from_f32<T>(y);
  }
}

template <typename T>
__global__ void activation_backward_kernel(T* dinp, const T* dout, const T* inp, int64_t n,
                                           bool gelu) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = to_f32(inp[i]), dy = to_f32(dout[i]);  // read dout before writing dinp (alias)
    float dx;
    if (gelu) {
      const float u = kGeluScale * (x + 0.044715f * x * x * x);
      const float th = tanhf(u);
      const float sech2 = 1.0f - th * th;
      const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
      dx = dy * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du);
    } else {
      dx = x > 0 ? dy : 0.0f;
    }
    dinp[i] = from_f32<T>(dx);
  }
}

template <typename T>
__global__ void bias_rows_kernel(T* out, const float* bias, int64_t rows, int64_t cols,
                                 bool overwrite) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float b = bias[i % cols];
    out[i] = from_f32<T>(overwrite ? b : to_f32(out[i]) + b);
  }
}

// Column sums over one row chunk. Grid (column slices of 32, row chunks), block (32, 8):
// threadIdx.x picks a column of the slice, threadIdx.y one of 8 row phases; the 8 partials are
// added in a fixed order, then written to out[blockIdx.y * cols + c] (`accumulate`: added to
// it, the single-chunk case writing straight into the gradient).
template <typename T>
__global__ void column_sum_kernel(float* out, const T* x, int64_t rows, int64_t cols,
                                  bool accumulate) {
  __shared__ float part[8][33];
  const int64_t c = blockIdx.x * int64_t{32} + threadIdx.x;
  const RowRange rr = chunk_rows(rows, gridDim.y, blockIdx.y);
  float acc = 0;
  if (c < cols)
    for (int64_t r = rr.begin + threadIdx.y; r < rr.end; r += 8) acc += to_f32(x[r * cols + c]);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0;
    for (int k = 0; k < 8; ++k) total += part[k][threadIdx.x];
    float* o = out + blockIdx.y * cols + c;
    *o = accumulate ? *o + total : total;
  }
}

// Second pass: one thread per column adds the chunks' partials (chunks, cols) in chunk order.
__global__ void add_chunk_partials_kernel(float* dst, const float* partials, int64_t chunks,
                                          int64_t cols) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < cols;
       c += int64_t{gridDim.x} * blockDim.x) {
    float total = 0;
    for (int64_t k = 0; k < chunks; ++k) total += partials[k * cols + c];
    dst[c] += total;
  }
}

// ---- embedding ----

template <typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const float* wte,
                                         const float* wpe, int64_t BT, int64_t T_len, int64_t C,
                                         int64_t V) {
  const int64_t n = BT * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bt = i / C, c = i % C;
    const int32_t id = tokens[bt];
    // The CPU backend asserts; a device assert would kill the context, so a bad token poisons
    // its row with NaN instead, which the loss then reports.
    float v = (id >= 0 && id < V) ? wte[id * C + c] : CUDART_NAN_F;
    if (wpe) v += wpe[(bt % T_len) * C + c];
    out[i] = from_f32<T>(v);
  }
}

// One block column per bucket (a distinct token): threads over channels sum the bucket's rows
// in their listed (ascending) order, then add once into the token's row. No two blocks touch the
// same row of dwte, so no atomics are needed and the sum order is fixed.
template <typename T>
__global__ void embedding_backward_wte_kernel(float* dwte, const T* dout, const int32_t* tokens,
                                              const int32_t* order, const int32_t* starts,
                                              int64_t C) {
  const int64_t c = blockIdx.y * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  const int32_t b0 = starts[blockIdx.x], b1 = starts[blockIdx.x + 1];
  const int64_t token = tokens[order[b0]];
  float acc = 0;
  for (int32_t p = b0; p < b1; ++p) acc += to_f32(dout[int64_t{order[p]} * C + c]);
  dwte[token * C + c] += acc;
}

template <typename T>
__global__ void embedding_backward_wpe_kernel(float* dwpe, const T* dout, int64_t B, int64_t T_len,
                                              int64_t C) {
  const int64_t n = T_len * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float acc = 0;
    for (int64_t b = 0; b < B; ++b) acc += to_f32(dout[b * n + i]);
    dwpe[i] += acc;
  }
}

// ---- losses ----

// One warp per row; 8 rows per block.
template <typename T>
__global__ void mse_loss_kernel(float* losses, T* dinp, const T* inp, const float* target,
                                int64_t N, int64_t D, float scale) {
  const int64_t row = blockIdx.x * int64_t{8} + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const float g = 2.0f * scale / static_cast<float>(D);
  float acc = 0;
  for (int64_t j = lane; j < D; j += 32) {
    const float diff = to_f32(inp[row * D + j]) - target[row * D + j];
    acc += diff * diff;
    dinp[row * D + j] = from_f32<T>(g * diff);
  }
  acc = warp_sum(acc);
  if (lane == 0) losses[row] = acc / static_cast<float>(D);
}

// One block per row of logits. Pass 1: max; pass 2: sum of exp(l - max) (the max keeps exp in
// range); then the gradient. For the bf16 output the row is processed in tiles of blockDim
// elements: a tile is read into registers, the block syncs, then writes bf16 values into bytes
// that belong to f32 elements of this or earlier tiles only (bf16 j lives inside f32 j/2), so no
// thread ever reads an element another thread has overwritten.
constexpr int kXentThreads = 512;

__global__ void softmax_xent_kernel(float* logits, const int32_t* targets, float* losses, int64_t V,
                                    float scale, bool write_bf16) {
  __shared__ float target_logit;
  float* l = logits + blockIdx.x * V;
  const int32_t t = targets[blockIdx.x];
  const bool valid = t >= 0 && t < V;
  if (threadIdx.x == 0) target_logit = valid ? l[t] : CUDART_NAN_F;
  float mx = -CUDART_INF_F;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, l[j]);
  mx = block_reduce<true>(mx);
  float sum = 0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) sum += expf(l[j] - mx);
  sum = block_reduce<false>(sum);  // its internal __syncthreads also publishes target_logit
  const float inv = 1.0f / sum;
  if (threadIdx.x == 0) losses[blockIdx.x] = mx + logf(sum) - target_logit;
  if (!write_bf16) {
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
      l[j] = expf(l[j] - mx) * inv * scale - (j == t ? scale : 0.0f);
    return;
  }
  bf16* d = reinterpret_cast<bf16*>(l);
  for (int64_t j0 = 0; j0 < V; j0 += blockDim.x) {
    const int64_t j = j0 + threadIdx.x;
    float g = 0;
    if (j < V) g = expf(l[j] - mx) * inv * scale - (j == t ? scale : 0.0f);
    __syncthreads();
    if (j < V) d[j] = __float2bfloat16(g);
    __syncthreads();
  }
}

// ---- RoPE ----

// One thread per pair: per row, (NH + KVH) HS/2 rotation pairs in the query and key heads, and
// KVH HS/2 element pairs of v (copied). angle(t, i) = t * inv_freq[i] in double (t * freq reaches
// 1e6 at long context), the frequencies those of the CPU's table (engine/ops/rope.h).
template <typename Td, typename Ts>
__global__ void rope_kernel(Td* dst, const Ts* src, RopeParams p) {
  const int64_t half = p.HS / 2, rotated = (p.NH + p.KVH) * half;
  const int64_t per_row = (p.NH + 2 * p.KVH) * half, n = p.BT * per_row, W = 2 * per_row;
  for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < n;
       w += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = w / per_row, r = w % per_row, base = row * W;
    if (r >= rotated || p.freq.n == 0) {  // v, or no rotation: copy two elements
      const int64_t i0 = base + 2 * r;
      dst[i0] = from_f32<Td>(to_f32(src[i0]));
      dst[i0 + 1] = from_f32<Td>(to_f32(src[i0 + 1]));
      continue;
    }
    const int64_t h = r / half, i = r % half;  // h: a query head, then the key heads
    const int64_t i0 = base + h * p.HS + i, i1 = i0 + half;
    double sn_d, cs_d;
    sincos(static_cast<double>(row % p.T) * p.freq.inv_freq[i], &sn_d, &cs_d);
    const float cs = static_cast<float>(cs_d), sn = static_cast<float>(sn_d);
    const float a = to_f32(src[i0]), b = to_f32(src[i1]);
    if (!p.inverse) {
      dst[i0] = from_f32<Td>(a * cs - b * sn);
      dst[i1] = from_f32<Td>(a * sn + b * cs);
    } else {
      dst[i0] = from_f32<Td>(a * cs + b * sn);
      dst[i1] = from_f32<Td>(-a * sn + b * cs);
    }
  }
}

}  // namespace

// ---- launchers ----

void fill(void* p, int64_t n, float value, bool is_bf16, cudaStream_t s) {
  dispatch_act(is_bf16, [&](auto tag) {
    using T = decltype(tag);
    fill_kernel<T><<<grid_for(n), kThreads, 0, s>>>(static_cast<T*>(p), n, value);
  });
}

void fill_i32(int32_t* p, int64_t n, int32_t value, cudaStream_t s) {
  fill_i32_kernel<<<grid_for(n), kThreads, 0, s>>>(p, n, value);
}

void cast(void* dst, bool dst_bf16, const void* src, bool src_bf16, int64_t n, cudaStream_t s) {
  if (dst_bf16 == src_bf16) {  // same type: a device copy
    cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * (dst_bf16 ? 2 : 4), cudaMemcpyDeviceToDevice,
                    s);
    return;
  }
  if (dst_bf16)
    cast_kernel<bf16, float><<<grid_for(n), kThreads, 0, s>>>(static_cast<bf16*>(dst),
                                                              static_cast<const float*>(src), n);
  else
    cast_kernel<float, bf16><<<grid_for(n), kThreads, 0, s>>>(static_cast<float*>(dst),
                                                              static_cast<const bf16*>(src), n);
}

void add(void* out, const void* a, const void* b, int64_t n, bool is_bf16, cudaStream_t s) {
  dispatch_act(is_bf16, [&](auto tag) {
    using T = decltype(tag);
    add_kernel<T><<<grid_for(n), kThreads, 0, s>>>(static_cast<T*>(out), static_cast<const T*>(a),
                                                   static_cast<const T*>(b), n);
  });
}

void dropout(const DropoutParams& p, cudaStream_t s) {
  dispatch_act(p.bf16, [&](auto tag) {
    using T = decltype(tag);
    dropout_kernel<T><<<grid_for(p.n), kThreads, 0, s>>>(
        static_cast<T*>(p.out), static_cast<const T*>(p.inp), p.n, p.p, 1.0f / (1.0f - p.p), p.seed,
        p.stream, p.first_index);
  });
}

void activation_forward(const ActivationParams& p, cudaStream_t s) {
  dispatch_act(p.bf16, [&](auto tag) {
    using T = decltype(tag);
    activation_forward_kernel<T><<<grid_for(p.n), kThreads, 0, s>>>(
        static_cast<T*>(p.out), static_cast<const T*>(p.inp), p.n, p.gelu);
  });
}

void activation_backward(const ActivationParams& p, cudaStream_t s) {
  dispatch_act(p.bf16, [&](auto tag) {
    using T = decltype(tag);
    activation_backward_kernel<T>
        <<<grid_for(p.n), kThreads, 0, s>>>(static_cast<T*>(p.out), static_cast<const T*>(p.dout),
                                            static_cast<const T*>(p.inp), p.n, p.gelu);
  });
}

void bias_rows(void* out, const float* bias, int64_t rows, int64_t cols, bool overwrite,
               bool is_bf16, cudaStream_t s) {
  dispatch_act(is_bf16, [&](auto tag) {
    using T = decltype(tag);
    bias_rows_kernel<T><<<grid_for(rows * cols), kThreads, 0, s>>>(static_cast<T*>(out), bias, rows,
                                                                   cols, overwrite);
  });
}

int64_t column_chunks(int64_t rows, int64_t cols, int64_t n_sums, const ColumnReduce& r) {
  const int64_t slices = (cols + 31) / 32;
  int64_t chunks = (r.target_blocks + slices - 1) / slices;
  chunks = std::min(chunks, (rows + kMinChunkRows - 1) / kMinChunkRows);
  chunks = std::min(chunks, r.floats / std::max<int64_t>(1, n_sums * cols));
  return std::max<int64_t>(chunks, 1);
}

void add_chunk_partials(float* dst, const float* partials, int64_t chunks, int64_t cols,
                        cudaStream_t s) {
  add_chunk_partials_kernel<<<grid_for(cols), kThreads, 0, s>>>(dst, partials, chunks, cols);
}

void column_sum_add(float* dsum, const void* x, int64_t rows, int64_t cols, bool is_bf16,
                    const ColumnReduce& r, cudaStream_t s) {
  const int64_t chunks = column_chunks(rows, cols, 1, r);
  const dim3 block(32, 8),
      grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>(chunks));
  float* out = chunks == 1 ? dsum : r.scratch;
  dispatch_act(is_bf16, [&](auto tag) {
    using T = decltype(tag);
    column_sum_kernel<T>
        <<<grid, block, 0, s>>>(out, static_cast<const T*>(x), rows, cols, chunks == 1);
  });
  if (chunks > 1) add_chunk_partials(dsum, r.scratch, chunks, cols, s);
}

void embedding_forward(const EmbeddingForwardParams& p, cudaStream_t s) {
  const int64_t BT = p.B * p.T;
  dispatch_act(p.bf16, [&](auto tag) {
    using Tt = decltype(tag);
    embedding_forward_kernel<Tt><<<grid_for(BT * p.C), kThreads, 0, s>>>(
        static_cast<Tt*>(p.out), p.tokens, p.wte, p.wpe, BT, p.T, p.C, p.V);
  });
}

void embedding_backward(const EmbeddingBackwardParams& p, cudaStream_t s) {
  dispatch_act(p.bf16, [&](auto tag) {
    using Tt = decltype(tag);
    const Tt* dout = static_cast<const Tt*>(p.dout);
    if (p.n_buckets > 0) {
      const dim3 grid(static_cast<unsigned>(p.n_buckets),
                      static_cast<unsigned>((p.C + kThreads - 1) / kThreads));
      embedding_backward_wte_kernel<Tt>
          <<<grid, kThreads, 0, s>>>(p.dwte, dout, p.tokens, p.order, p.starts, p.C);
    }
    if (p.dwpe)
      embedding_backward_wpe_kernel<Tt>
          <<<grid_for(p.T * p.C), kThreads, 0, s>>>(p.dwpe, dout, p.B, p.T, p.C);
  });
}

void mse_loss(const MseLossParams& p, cudaStream_t s) {
  const unsigned grid = static_cast<unsigned>((p.N + 7) / 8);
  dispatch_act(p.bf16, [&](auto tag) {
    using T = decltype(tag);
    mse_loss_kernel<T><<<grid, kThreads, 0, s>>>(p.losses, static_cast<T*>(p.dinp),
                                                 static_cast<const T*>(p.inp), p.target, p.N, p.D,
                                                 p.scale);
  });
}

void softmax_xent(float* logits, const int32_t* targets, float* losses, int64_t rows, int64_t V,
                  float scale, bool write_bf16, cudaStream_t s) {
  softmax_xent_kernel<<<static_cast<unsigned>(rows), kXentThreads, 0, s>>>(logits, targets, losses,
                                                                           V, scale, write_bf16);
}

template <typename T>
__global__ void attention_delta_kernel(float* delta, const T* dout, const T* out, int64_t B,
                                       int64_t T_len, int64_t C, int64_t NH) {
  const int64_t HS = C / NH, n = B * NH * T_len;
  for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < n;
       w += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bh = w / T_len, t = w % T_len;  // delta's (b, h, t) order
    const int64_t base = (bh / NH) * T_len * C + t * C + (bh % NH) * HS;
    float acc = 0.0f;
    for (int64_t c = 0; c < HS; ++c) acc = fmaf(to_f32(dout[base + c]), to_f32(out[base + c]), acc);
    delta[w] = acc;
  }
}

void attention_delta(float* delta, const void* dout, const void* out, bool acts_bf16, int64_t B,
                     int64_t T, int64_t C, int64_t NH, cudaStream_t s) {
  const unsigned g = grid_for(B * NH * T);
  if (acts_bf16)
    attention_delta_kernel<bf16><<<g, kThreads, 0, s>>>(delta, static_cast<const bf16*>(dout),
                                                        static_cast<const bf16*>(out), B, T, C, NH);
  else
    attention_delta_kernel<float><<<g, kThreads, 0, s>>>(
        delta, static_cast<const float*>(dout), static_cast<const float*>(out), B, T, C, NH);
}

void rope_apply(const RopeParams& p, cudaStream_t s) {
  const unsigned g = grid_for(p.BT * (p.NH + 2 * p.KVH) * (p.HS / 2));
  if (p.dst_bf16 && p.src_bf16)
    rope_kernel<bf16, bf16>
        <<<g, kThreads, 0, s>>>(static_cast<bf16*>(p.dst), static_cast<const bf16*>(p.src), p);
  else if (p.dst_bf16)
    rope_kernel<bf16, float>
        <<<g, kThreads, 0, s>>>(static_cast<bf16*>(p.dst), static_cast<const float*>(p.src), p);
  else if (p.src_bf16)
    rope_kernel<float, bf16>
        <<<g, kThreads, 0, s>>>(static_cast<float*>(p.dst), static_cast<const bf16*>(p.src), p);
  else
    rope_kernel<float, float>
        <<<g, kThreads, 0, s>>>(static_cast<float*>(p.dst), static_cast<const float*>(p.src), p);
}

}  // namespace remat::cuda::kern
