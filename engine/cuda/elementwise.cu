// The CUDA backend's small kernels: fill/cast, residual add, GELU/ReLU, bias broadcast and bias
// gradient, embedding gather and deterministic scatter-add, MSE, the LM head's softmax
// cross-entropy and RoPE (AdamW, the gradient norm and the batched zero fill: optimizer.cu).
// Each is memory-bound: grid-stride loops (the pointwise ones over 16-byte vectors when the
// pointers are aligned, device_common.cuh), float math on bf16 or float storage, fixed-order
// reductions (no atomics), so a recomputed activation is bitwise equal to the original and
// gradients repeat run to run. Semantics follow the CPU reference (engine/cpu/*.cpp) op by op.
#include <algorithm>

#include "engine/core/rng.h"
#include "engine/cuda/device_common.cuh"
#include "engine/cuda/kernels.cuh"

namespace remat::cuda::kern {
namespace {

// ---- data movement and pointwise: 16-byte vectors where aligned (device_common.cuh) ----

// Any 2- or 4-byte type: `v` is already converted, so fill and fill_i32 share it.
template <typename T>
__global__ void fill_kernel(T* p, int64_t n, T v, bool vectors) {
  constexpr int N = kVecElems<T>;
  Pack<T, N> pack;
#pragma unroll
  for (int k = 0; k < N; ++k) pack.v[k] = v;
  for_each_vector<N>(
      n, vectors, [&](int64_t i) { *reinterpret_cast<Pack<T, N>*>(p + i) = pack; },
      [&](int64_t i) { p[i] = v; });
}

// Groups of 8: 16 bytes of the bf16 side, two 16-byte accesses of the f32 side.
template <typename Td, typename Ts>
__global__ void cast_kernel(Td* dst, const Ts* src, int64_t n, bool vectors) {
  map_elements<8>(
      dst, n, vectors, [](int64_t, float x) { return x; }, src);
}

template <typename T>
__global__ void add_kernel(T* out, const T* a, const T* b, int64_t n, bool vectors) {
  map_elements<kVecElems<T>>(
      out, n, vectors, [](int64_t, float x, float y) { return x + y; }, a, b);
}

template <typename T>
__global__ void dropout_kernel(T* out, const T* inp, int64_t n, float p, float scale, uint64_t seed,
                               uint64_t stream, uint64_t first_index, bool vectors) {
  auto keep = [=](int64_t i, float x) {
    return rng_uniform(seed, stream, first_index + static_cast<uint64_t>(i)) >= p ? x * scale
                                                                                  : 0.0f;
  };
  map_elements<kVecElems<T>>(out, n, vectors, keep, inp);
}

// GELU, tanh approximation (GPT-2), as engine/cpu/cpu_backend.cpp.
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

template <typename T>
__global__ void activation_forward_kernel(T* out, const T* inp, int64_t n, bool gelu,
                                          bool vectors) {
  auto act = [gelu](int64_t, float x) {
    if (gelu) {
      const float u = kGeluScale * (x + 0.044715f * x * x * x);
      return 0.5f * x * (1.0f + tanhf(u));
    }
    return x > 0 ? x : 0.0f;
  };
  map_elements<kVecElems<T>>(out, n, vectors, act, inp);
}

template <typename T>
__global__ void activation_backward_kernel(T* dinp, const T* dout, const T* inp, int64_t n,
                                           bool gelu, bool vectors) {
  auto grad = [gelu](int64_t, float x, float dy) {
    if (gelu) {
      const float u = kGeluScale * (x + 0.044715f * x * x * x);
      const float th = tanhf(u);
      const float sech2 = 1.0f - th * th;
      const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
      return dy * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du);
    }
    return x > 0 ? dy : 0.0f;
  };
  map_elements<kVecElems<T>>(dinp, n, vectors, grad, inp, dout);
}

// A group may cross a row end (cols need not be a multiple of N): one division per group, then
// the column wraps.
template <typename T>
__global__ void bias_rows_kernel(T* out, const float* bias, int64_t rows, int64_t cols,
                                 bool overwrite, bool vectors) {
  constexpr int N = kVecElems<T>;
  auto group = [&](int64_t i) {
    Pack<T, N> y;
    if (!overwrite) y = load_pack<N>(out + i);
    int64_t c = i % cols;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float b = bias[c];
      y.v[k] = from_f32<T>(overwrite ? b : to_f32(y.v[k]) + b);
      c = c + 1 == cols ? 0 : c + 1;
    }
    *reinterpret_cast<Pack<T, N>*>(out + i) = y;
  };
  for_each_vector<N>(rows * cols, vectors, group, [&](int64_t i) {
    const float b = bias[i % cols];
    out[i] = from_f32<T>(overwrite ? b : to_f32(out[i]) + b);
  });
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

// Groups only when C is a multiple of N, so that a group lies in one row and reads whole
// pieces of wte and wpe. The table W is f32, or bf16 when frozen (lora.base = "bf16", "nf4").
template <typename T, typename W>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const W* wte,
                                         const float* wpe, int64_t BT, int64_t T_len, int64_t C,
                                         int64_t V, bool vectors) {
  constexpr int N = kVecElems<T>;
  // The CPU backend asserts; a device assert would kill the context, so a bad token poisons
  // its row with NaN instead, which the loss then reports.
  auto group = [&](int64_t i) {
    const int64_t bt = i / C, c = i % C;
    const int32_t id = tokens[bt];
    Pack<float, N> v;
    if (id >= 0 && id < V) {
      const Pack<W, N> e = load_pack<N>(wte + id * C + c);
#pragma unroll
      for (int k = 0; k < N; ++k) v.v[k] = to_f32(e.v[k]);
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) v.v[k] = CUDART_NAN_F;
    }
    Pack<float, N> w;
    if (wpe) w = load_pack<N>(wpe + (bt % T_len) * C + c);
    Pack<T, N> y;
#pragma unroll
    for (int k = 0; k < N; ++k) y.v[k] = from_f32<T>(wpe ? v.v[k] + w.v[k] : v.v[k]);
    *reinterpret_cast<Pack<T, N>*>(out + i) = y;
  };
  for_each_vector<N>(BT * C, vectors, group, [&](int64_t i) {
    const int64_t bt = i / C, c = i % C;
    const int32_t id = tokens[bt];
    float v = (id >= 0 && id < V) ? to_f32(wte[id * C + c]) : CUDART_NAN_F;
    if (wpe) v += wpe[(bt % T_len) * C + c];
    out[i] = from_f32<T>(v);
  });
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

// With `argmax`, the row's first largest logit's index too: after the max, each thread's smallest
// index holding it, reduced as the largest of their negations (exact in float: V <= 2^24).
__global__ void softmax_xent_kernel(float* logits, const int32_t* targets, float* losses,
                                    int32_t* argmax, int64_t V, float scale, bool write_bf16) {
  __shared__ float target_logit;
  float* l = logits + blockIdx.x * V;
  const int32_t t = targets[blockIdx.x];
  if (t == kIgnoredTarget) {  // not trained (engine/core/ops/loss.h): loss 0, zero gradient
    if (threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      if (write_bf16)
        reinterpret_cast<bf16*>(l)[j] = __float2bfloat16(0.0f);
      else
        l[j] = 0.0f;
    }
    return;
  }
  const bool valid = t >= 0 && t < V;
  if (threadIdx.x == 0) target_logit = valid ? l[t] : CUDART_NAN_F;
  float mx = -CUDART_INF_F;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, l[j]);
  mx = block_reduce<true>(mx);
  if (argmax) {
    float first = -CUDART_INF_F;  // -(smallest index of mx this thread saw)
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
      if (l[j] == mx) {
        first = -static_cast<float>(j);
        break;
      }
    first = block_reduce<true>(first);
    if (threadIdx.x == 0) argmax[blockIdx.x] = static_cast<int32_t>(-first);
  }
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

// Heads whose loads one thread issues before its first store: a single head's load-store round
// trip per step would leave each thread with one access in flight.
constexpr int kRopeHeadsPerStep = 4;

// Pair i of `heads` consecutive heads of one row: src and dst point at element i of the first
// head, its partner is `half` further on. kRotate false: a copy (v, or no RoPE). Each element is
// read before it is written, and only by this thread, so dst may alias src.
// The rotation rounds each product and each sum by itself (__fmul_rn, __fadd_rn, __fsub_rn, which
// nvcc never contracts): written as a * cs - b * sn, the compiler may fuse either product into an
// FMA, and two kernels (this one and tests/gpu/rope_reference.cu's, which spells the rotation the
// same way) could then round differently. Spelled out, the bits are fixed by the source alone.
template <bool kRotate, typename Td, typename Ts>
__device__ __forceinline__ void rope_heads(Td* dst, const Ts* src, int64_t heads, int64_t HS,
                                           int64_t half, float cs, float sn, bool inverse) {
  auto put = [&](int64_t at, float a, float b) {
    if (!kRotate) {
      dst[at] = from_f32<Td>(a);
      dst[at + half] = from_f32<Td>(b);
    } else if (!inverse) {  // R: (a cs - b sn, a sn + b cs)
      dst[at] = from_f32<Td>(__fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn)));
      dst[at + half] = from_f32<Td>(__fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs)));
    } else {  // R^T: (a cs + b sn, b cs - a sn)
      dst[at] = from_f32<Td>(__fadd_rn(__fmul_rn(a, cs), __fmul_rn(b, sn)));
      dst[at + half] = from_f32<Td>(__fsub_rn(__fmul_rn(b, cs), __fmul_rn(a, sn)));
    }
  };
  int64_t h = 0;
  for (; h + kRopeHeadsPerStep <= heads; h += kRopeHeadsPerStep) {
    float a[kRopeHeadsPerStep], b[kRopeHeadsPerStep];
#pragma unroll
    for (int k = 0; k < kRopeHeadsPerStep; ++k) {
      a[k] = to_f32(src[(h + k) * HS]);
      b[k] = to_f32(src[(h + k) * HS + half]);
    }
#pragma unroll
    for (int k = 0; k < kRopeHeadsPerStep; ++k) put((h + k) * HS, a[k], b[k]);
  }
  for (; h < heads; ++h) put(h * HS, to_f32(src[h * HS]), to_f32(src[h * HS + half]));
}

// One thread per (row, pair i): the angle t * inv_freq[i] (in double: t * freq reaches 1e6 at
// long context) is the same for every head of the row, so its sincos is computed once and
// applied to the NH query and KVH key heads; the thread then copies elements i and i + HS/2 of
// each v head. Adjacent threads take adjacent i, so each head's accesses stay coalesced. The
// frequencies and the attention factor are those of the CPU's table (engine/core/ops/rope.h).
template <typename Td, typename Ts>
__global__ void rope_kernel(Td* dst, const Ts* src, RopeParams p) {
  const int64_t half = p.HS / 2, n = p.BT * half, W = (p.NH + 2 * p.KVH) * p.HS;
  const int64_t rotated = p.freq.n == 0 ? 0 : p.NH + p.KVH;
  for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < n;
       w += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = w / half, i = w % half, at = row * W + i;
    if (rotated > 0) {
      double sn_d, cs_d;
      sincos(static_cast<double>(row % p.T) * p.freq.inv_freq[i], &sn_d, &cs_d);
      const float cs = static_cast<float>(cs_d * p.freq.attention_factor);
      const float sn = static_cast<float>(sn_d * p.freq.attention_factor);
      rope_heads<true>(dst + at, src + at, rotated, p.HS, half, cs, sn, p.inverse);
    }
    const int64_t rest = rotated * p.HS;
    rope_heads<false>(dst + at + rest, src + at + rest, p.NH + 2 * p.KVH - rotated, p.HS, half,
                      0.0f, 0.0f, p.inverse);
  }
}

}  // namespace

// ---- launchers ----

void fill(void* p, int64_t n, float value, bool is_bf16, cudaStream_t s) {
  if (is_bf16)
    fill_kernel<bf16><<<grid_for_vectors(n, kVecElems<bf16>), kThreads, 0, s>>>(
        static_cast<bf16*>(p), n, __float2bfloat16(value), aligned16(p));
  else
    fill_kernel<float><<<grid_for_vectors(n, kVecElems<float>), kThreads, 0, s>>>(
        static_cast<float*>(p), n, value, aligned16(p));
}

void fill_i32(int32_t* p, int64_t n, int32_t value, cudaStream_t s) {
  fill_kernel<int32_t>
      <<<grid_for_vectors(n, kVecElems<int32_t>), kThreads, 0, s>>>(p, n, value, aligned16(p));
}

void cast(void* dst, bool dst_bf16, const void* src, bool src_bf16, int64_t n, cudaStream_t s) {
  if (dst_bf16 == src_bf16) {  // same type: a device copy
    cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * (dst_bf16 ? 2 : 4), cudaMemcpyDeviceToDevice,
                    s);
    return;
  }
  const unsigned g = grid_for_vectors(n, 8);
  const bool vectors = aligned16(dst, src);
  if (dst_bf16)
    cast_kernel<bf16, float><<<g, kThreads, 0, s>>>(static_cast<bf16*>(dst),
                                                    static_cast<const float*>(src), n, vectors);
  else
    cast_kernel<float, bf16><<<g, kThreads, 0, s>>>(static_cast<float*>(dst),
                                                    static_cast<const bf16*>(src), n, vectors);
}

void add(void* out, const void* a, const void* b, int64_t n, bool is_bf16, cudaStream_t s) {
  dispatch_act(is_bf16, [&](auto tag) {
    using T = decltype(tag);
    add_kernel<T><<<grid_for_vectors(n, kVecElems<T>), kThreads, 0, s>>>(
        static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n,
        aligned16(out, a, b));
  });
}

void dropout(const DropoutParams& p, cudaStream_t s) {
  dispatch_act(p.bf16, [&](auto tag) {
    using T = decltype(tag);
    dropout_kernel<T><<<grid_for_vectors(p.n, kVecElems<T>), kThreads, 0, s>>>(
        static_cast<T*>(p.out), static_cast<const T*>(p.inp), p.n, p.p, 1.0f / (1.0f - p.p), p.seed,
        p.stream, p.first_index, aligned16(p.out, p.inp));
  });
}

void activation_forward(const ActivationParams& p, cudaStream_t s) {
  dispatch_act(p.bf16, [&](auto tag) {
    using T = decltype(tag);
    activation_forward_kernel<T><<<grid_for_vectors(p.n, kVecElems<T>), kThreads, 0, s>>>(
        static_cast<T*>(p.out), static_cast<const T*>(p.inp), p.n, p.gelu, aligned16(p.out, p.inp));
  });
}

void activation_backward(const ActivationParams& p, cudaStream_t s) {
  dispatch_act(p.bf16, [&](auto tag) {
    using T = decltype(tag);
    activation_backward_kernel<T><<<grid_for_vectors(p.n, kVecElems<T>), kThreads, 0, s>>>(
        static_cast<T*>(p.out), static_cast<const T*>(p.dout), static_cast<const T*>(p.inp), p.n,
        p.gelu, aligned16(p.out, p.dout, p.inp));
  });
}

void bias_rows(void* out, const float* bias, int64_t rows, int64_t cols, bool overwrite,
               bool is_bf16, cudaStream_t s) {
  dispatch_act(is_bf16, [&](auto tag) {
    using T = decltype(tag);
    bias_rows_kernel<T><<<grid_for_vectors(rows * cols, kVecElems<T>), kThreads, 0, s>>>(
        static_cast<T*>(out), bias, rows, cols, overwrite, aligned16(out));
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
    constexpr int N = kVecElems<Tt>;
    const bool vectors = p.C % N == 0 && aligned16(p.out, p.wte, p.wpe);
    dispatch_act(p.wte_bf16, [&](auto table_tag) {
      using Tw = decltype(table_tag);
      embedding_forward_kernel<Tt, Tw><<<grid_for_vectors(BT * p.C, N), kThreads, 0, s>>>(
          static_cast<Tt*>(p.out), p.tokens, static_cast<const Tw*>(p.wte), p.wpe, BT, p.T, p.C,
          p.V, vectors);
    });
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

void softmax_xent(float* logits, const int32_t* targets, float* losses, int32_t* argmax,
                  int64_t rows, int64_t V, float scale, bool write_bf16, cudaStream_t s) {
  softmax_xent_kernel<<<static_cast<unsigned>(rows), kXentThreads, 0, s>>>(
      logits, targets, losses, argmax, V, scale, write_bf16);
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
  const unsigned g = grid_for(p.BT * (p.HS / 2));
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
