// Ring attention's CUDA kernels (see ring_kernels.cuh). The arithmetic is the CPU kernels'
// (engine/cpu/ring_attention.cpp): S = scale Q K^T masked where a key's global position is after
// the query's, the online softmax in (m, l, acc); in the backward P = exp(S - lse),
// dS = P (dO V^T - D), dV += P^T dO, dQ += scale dS K, dK += scale dS^T Q.
//
// Tiles: a block of 4 warps holds 32 queries and 32 keys in shared memory (rows padded to HS + 1
// floats, so that lane j reading key row j hits its own bank). In the score step each warp owns
// 8 query rows and each lane one key. The backward runs as two kernels so that every output
// has one owner: one per key tile of a key/value head (dK, dV over all query tiles of each of its
// query heads), one per query tile of a query head (dQ over all key tiles), each recomputing P
// and dS; accumulators live in shared memory, each element owned by one thread, summed in head
// and tile order, then added to the [+=] output once. RoPE's frequencies come from the host
// (engine/core/ops/rope.h's, with their scaling), by value in the kernels' parameters.
#include <climits>
#include <mutex>

#include "engine/cuda/device_common.cuh"
#include "engine/cuda/ring_kernels.cuh"

namespace remat::cuda::kern {

namespace {

constexpr int kTile = 32;  // queries per block, keys per tile
constexpr int kWarps = 4;
constexpr int kBlockThreads = kWarps * 32;
constexpr int kRowsPerWarp = kTile / kWarps;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ int64_t position_of(const RingPositions& p, int64_t t) {
  for (int r = 0; r < p.n; ++r) {
    if (t < p.length[r]) return p.start[r] + t;
    t -= p.length[r];
  }
  return LLONG_MAX;  // past the last token: never reached for t < tokens
}

__device__ __forceinline__ long long warp_min_i64(long long v) {
  for (int o = 16; o > 0; o >>= 1) {
    const long long u = __shfl_xor_sync(kFull, v, o);
    v = u < v ? u : v;
  }
  return v;
}
__device__ __forceinline__ long long warp_max_i64(long long v) {
  for (int o = 16; o > 0; o >>= 1) {
    const long long u = __shfl_xor_sync(kFull, v, o);
    v = u > v ? u : v;
  }
  return v;
}

// ---- split / merge: one thread per element of q, k or v ----

// Element c of one head-split row after RoPE's half-split rotation at position `pos` (R, or R^T
// when `inverse`), as the CPU's rotate() computes it; `row` points at the row's first head.
template <typename T>
__device__ float rotated(const T* row, int64_t c, int64_t HS, int64_t pos,
                         const RopeFrequencies& freq, bool inverse) {
  const int64_t h = c / HS, i = c % HS, half = HS / 2;
  const int64_t k = i < half ? i : i - half;
  const float a = to_f32(row[h * HS + k]), b = to_f32(row[h * HS + k + half]);
  double sn_d, cs_d;
  sincos(static_cast<double>(pos) * freq.inv_freq[k], &sn_d, &cs_d);
  const float cs = static_cast<float>(cs_d * freq.attention_factor);
  const float sn = static_cast<float>(sn_d * freq.attention_factor);
  if (!inverse) return i < half ? a * cs - b * sn : a * sn + b * cs;
  return i < half ? a * cs + b * sn : b * cs - a * sn;
}

// Where element c of a qkv row (C + 2K wide) lives: in q (c < C), the keys (c < C + K, rotated
// too) or the values; `offset` is c's column in its part, with the keys and values as kv's row.
struct QkvColumn {
  int part;  // 0: q, 1: k, 2: v
  int64_t offset;
};
__device__ __forceinline__ QkvColumn qkv_column(int64_t c, int64_t C, int64_t K) {
  if (c < C) return {0, c};
  return {c < C + K ? 1 : 2, c - C};
}

template <typename T>
__global__ void ring_split_kernel(RingSplitParams p) {
  const T* qkv = static_cast<const T*>(p.qkv);
  const int64_t C = p.C, HS = C / p.NH, K = p.KVH * HS, W = C + 2 * K, n = p.B * p.T * W;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = e / W;
    const QkvColumn col = qkv_column(e % W, C, K);
    const T* src = qkv + row * W + (col.part == 0 ? 0 : C);  // q's heads, or k's (then v's)
    float v;
    if (col.part == 2 || p.freq.n == 0)
      v = to_f32(src[col.offset]);
    else
      v = rotated(src, col.offset, HS, position_of(p.pos, row % p.T), p.freq, false);
    if (col.part == 0)
      p.q[row * C + col.offset] = v;
    else
      p.kv[row * 2 * K + col.offset] = v;
  }
}

template <typename T>
__global__ void ring_merge_grad_kernel(RingMergeGradParams p) {
  T* dqkv = static_cast<T*>(p.dqkv);
  const int64_t C = p.C, HS = C / p.NH, K = p.KVH * HS, W = C + 2 * K, n = p.B * p.T * W;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = e / W;
    const QkvColumn col = qkv_column(e % W, C, K);
    const float* src = col.part == 0 ? p.dq + row * C : p.dkv + row * 2 * K;
    float v;
    if (col.part == 2 || p.freq.n == 0)
      v = src[col.offset];
    else
      v = rotated(src, col.offset, HS, position_of(p.pos, row % p.T), p.freq, true);
    dqkv[e] = from_f32<T>(v);
  }
}

// ---- tiles in shared memory ----

// Rows [r0, r0 + n) of a (rows, ld_src) tensor's columns [col, col + HS) into a 32-row tile of
// row length `ld` (rows n..31 zero), read as type T.
template <typename T>
__device__ void load_tile(float* tile, int ld, const T* src, int64_t ld_src, int64_t r0, int64_t n,
                          int64_t col, int64_t HS) {
  for (int64_t e = threadIdx.x; e < kTile * HS; e += blockDim.x) {
    const int64_t r = e / HS, c = e % HS;
    tile[r * ld + c] = r < n ? to_f32(src[(r0 + r) * ld_src + col + c]) : 0.0f;
  }
}

__device__ __forceinline__ float dot_rows(const float* a, const float* b, int64_t HS) {
  float s = 0.0f;
  for (int64_t c = 0; c < HS; ++c) s = fmaf(a[c], b[c], s);
  return s;
}

// The positions of one tile's tokens, one per lane (lane i: token t0 + i; lanes past n get
// `none`), and their extreme over the warp.
struct LanePositions {
  long long mine, lo, hi;
};
__device__ LanePositions lane_positions(const RingPositions& p, int64_t t0, int64_t n) {
  const int lane = threadIdx.x & 31;
  const bool in = lane < n;
  const long long pos = in ? position_of(p, t0 + lane) : 0;
  return {pos, warp_min_i64(in ? pos : LLONG_MAX), warp_max_i64(in ? pos : LLONG_MIN)};
}

// ---- forward ----

// Shared memory of the forward: the tiles of Q, K, V, the 32 query rows' running state (acc,
// m, l) and one row of probabilities per warp.
struct ForwardSmem {
  float *Q, *K, *V;  // [kTile][ld]
  float* acc;        // [kTile][HS]
  float *m, *l;      // [kTile]
  float* P;          // [kWarps][kTile]
};
__device__ ForwardSmem forward_smem(float* base, int ld, int64_t HS) {
  ForwardSmem s;
  s.Q = base;
  s.K = s.Q + kTile * ld;
  s.V = s.K + kTile * ld;
  s.acc = s.V + kTile * ld;
  s.m = s.acc + kTile * HS;
  s.l = s.m + kTile;
  s.P = s.l + kTile;
  return s;
}
constexpr int64_t forward_smem_floats(int64_t HS) {
  return 3 * kTile * (HS + 1) + kTile * HS + 2 * kTile + kWarps * kTile;
}

// Grid (query tiles, NH, B). The block's 32 query rows keep (acc, m, l) in shared memory for the
// whole pass over the key tiles; warp w owns rows 8w..8w+7 (no other warp touches them), lane j
// scores key j, and lane l accumulates columns l, l + 32, ...
__global__ void __launch_bounds__(kBlockThreads) ring_forward_kernel(RingForwardParams p) {
  extern __shared__ float smem[];
  const int64_t C = p.C, HS = C / p.NH, h = blockIdx.y, b = blockIdx.z;
  const int64_t K = p.KVH * HS, kv_col = h / (p.NH / p.KVH) * HS;  // this head's keys in kv
  const int ld = static_cast<int>(HS) + 1;
  const ForwardSmem s = forward_smem(smem, ld, HS);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t i0 = int64_t{blockIdx.x} * kTile;
  const int64_t qn = p.Tq - i0 < kTile ? p.Tq - i0 : kTile;
  const int64_t stats = (b * p.NH + h) * p.Tq + i0;   // row i0's (m, l)
  const int64_t rows = (b * p.Tq + i0) * C + h * HS;  // row i0's head in q and acc
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  const LanePositions qp = lane_positions(p.q_pos, i0, qn);
  load_tile(s.Q, ld, p.q, C, b * p.Tq + i0, qn, h * HS, HS);
  for (int64_t e = threadIdx.x; e < qn * HS; e += blockDim.x)
    s.acc[e] = p.acc[rows + (e / HS) * C + e % HS];
  if (threadIdx.x < qn) {
    s.m[threadIdx.x] = p.row_max[stats + threadIdx.x];
    s.l[threadIdx.x] = p.row_sum[stats + threadIdx.x];
  }
  float* P = s.P + warp * kTile;

  for (int64_t j0 = 0; j0 < p.Tk; j0 += kTile) {
    const int64_t kn = p.Tk - j0 < kTile ? p.Tk - j0 : kTile;
    const LanePositions kp = lane_positions(p.k_pos, j0, kn);
    if (kp.lo > qp.hi) continue;  // every key after every query (the same for every warp)
    __syncthreads();              // the previous tile's K, V are read
    load_tile(s.K, ld, p.kv, 2 * K, b * p.Tk + j0, kn, kv_col, HS);
    load_tile(s.V, ld, p.kv, 2 * K, b * p.Tk + j0, kn, K + kv_col, HS);
    __syncthreads();
#pragma unroll 1
    for (int k = 0; k < kRowsPerWarp; ++k) {
      const int r = warp * kRowsPerWarp + k;
      const long long row_pos = __shfl_sync(kFull, qp.mine, r);
      if (r >= qn) break;  // the same for the whole warp
      const bool visible = lane < kn && kp.mine <= row_pos;
      const float score =
          visible ? scale * dot_rows(s.Q + r * ld, s.K + lane * ld, HS) : -CUDART_INF_F;
      const float tile_max = warp_max(score);
      if (tile_max == -CUDART_INF_F) continue;  // no key of this tile is visible to this row
      const float m_old = s.m[r], m_new = fmaxf(m_old, tile_max);
      const float corr = expf(m_old - m_new);  // 0 while m was -inf
      const float pr = visible ? expf(score - m_new) : 0.0f;
      const float sum = warp_sum(pr);
      P[lane] = pr;
      __syncwarp();  // every lane has read m[r] and written its P
      if (lane == 0) {
        s.m[r] = m_new;
        s.l[r] = s.l[r] * corr + sum;
      }
      float* acc = s.acc + r * HS;
      for (int64_t c = lane; c < HS; c += 32) {
        float a = acc[c] * corr;
        for (int64_t jj = 0; jj < kn; ++jj) a = fmaf(P[jj], s.V[jj * ld + c], a);
        acc[c] = a;
      }
      __syncwarp();  // P is read before the next row writes it
    }
  }

  __syncthreads();
  for (int64_t e = threadIdx.x; e < qn * HS; e += blockDim.x)
    p.acc[rows + (e / HS) * C + e % HS] = s.acc[e];
  if (threadIdx.x < qn) {
    p.row_max[stats + threadIdx.x] = s.m[threadIdx.x];
    p.row_sum[stats + threadIdx.x] = s.l[threadIdx.x];
  }
}

template <typename T>
__global__ void ring_finish_kernel(RingFinishParams p) {
  T* out = static_cast<T*>(p.out);
  const int64_t HS = p.C / p.NH, n = p.B * p.T * p.C, n_stats = p.B * p.NH * p.T;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (int64_t e = first; e < n; e += step) {
    const int64_t row = e / p.C, c = e % p.C, b = row / p.T, t = row % p.T;
    const float inv = 1.0f / p.row_sum[(b * p.NH + c / HS) * p.T + t];
    out[e] = from_f32<T>(p.acc[e] * inv);
  }
  // lse may be row_max itself: each element is read and written by one thread.
  for (int64_t e = first; e < n_stats; e += step) p.lse[e] = p.row_max[e] + logf(p.row_sum[e]);
}

// ---- backward ----

// Shared memory of both backward kernels: the four operand tiles, the tile's P and dS, the
// query rows' lse and D, and one accumulator tile [kTile][HS] (dQ, or dK then dV in the key
// kernel, which has two).
struct BackwardSmem {
  float *Q, *dO, *K, *V;  // [kTile][ld]
  float *P, *dS;          // [kTile][kTile + 1]: query row, key column
  float *lse, *D;         // [kTile]
  float *acc0, *acc1;     // [kTile][HS]
};
__device__ BackwardSmem backward_smem(float* base, int ld, int64_t HS) {
  BackwardSmem s;
  s.Q = base;
  s.dO = s.Q + kTile * ld;
  s.K = s.dO + kTile * ld;
  s.V = s.K + kTile * ld;
  s.P = s.V + kTile * ld;
  s.dS = s.P + kTile * (kTile + 1);
  s.lse = s.dS + kTile * (kTile + 1);
  s.D = s.lse + kTile;
  s.acc0 = s.D + kTile;
  s.acc1 = s.acc0 + kTile * HS;
  return s;
}
constexpr int64_t backward_smem_floats(int64_t HS) {
  return 4 * kTile * (HS + 1) + 2 * kTile * (kTile + 1) + 2 * kTile + 2 * kTile * HS;
}

// The query tile's Q, dO (an activation: bf16 or f32), lse and D (rows i0..i0+qn) into shared
// memory.
__device__ void load_query_side(const BackwardSmem& s, int ld, const RingBackwardParams& p,
                                int64_t b, int64_t h, int64_t i0, int64_t qn) {
  const int64_t C = p.C, HS = C / p.NH;
  load_tile(s.Q, ld, p.q, C, b * p.Tq + i0, qn, h * HS, HS);
  if (p.bf16)
    load_tile(s.dO, ld, static_cast<const bf16*>(p.dout), C, b * p.Tq + i0, qn, h * HS, HS);
  else
    load_tile(s.dO, ld, static_cast<const float*>(p.dout), C, b * p.Tq + i0, qn, h * HS, HS);
  if (threadIdx.x < kTile) {
    const int64_t r = threadIdx.x, stat = (b * p.NH + h) * p.Tq + i0 + r;
    s.lse[r] = r < qn ? p.lse[stat] : 0.0f;
    s.D[r] = r < qn ? p.delta[stat] : 0.0f;
  }
}

// P and dS of the (query tile, key tile) pair in shared memory: warp w computes rows
// 8w..8w+7, lane j key j. Invisible pairs (and rows or keys past the tiles' ends) get 0.
__device__ void probabilities(const BackwardSmem& s, int ld, int64_t HS, float scale, int64_t qn,
                              int64_t kn, const LanePositions& qp, const LanePositions& kp) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll 1
  for (int k = 0; k < kRowsPerWarp; ++k) {
    const int r = warp * kRowsPerWarp + k;
    const long long row_pos = __shfl_sync(kFull, qp.mine, r);
    const bool visible = r < qn && lane < kn && kp.mine <= row_pos;
    float pr = 0.0f, ds = 0.0f;
    if (visible) {
      pr = expf(scale * dot_rows(s.Q + r * ld, s.K + lane * ld, HS) - s.lse[r]);
      ds = pr * (dot_rows(s.dO + r * ld, s.V + lane * ld, HS) - s.D[r]);
    }
    s.P[r * (kTile + 1) + lane] = pr;
    s.dS[r * (kTile + 1) + lane] = ds;
  }
}

// Grid (key tiles, KVH, B): dK and dV of 32 keys of one key/value head over every query tile
// that sees them, of each of its query heads in turn.
__global__ void __launch_bounds__(kBlockThreads) ring_backward_kv_kernel(RingBackwardParams p) {
  extern __shared__ float smem[];
  const int64_t C = p.C, HS = C / p.NH, kvh = blockIdx.y, b = blockIdx.z;
  const int64_t K = p.KVH * HS, G = p.NH / p.KVH;
  const int ld = static_cast<int>(HS) + 1;
  const BackwardSmem s = backward_smem(smem, ld, HS);
  const int64_t j0 = int64_t{blockIdx.x} * kTile;
  const int64_t kn = p.Tk - j0 < kTile ? p.Tk - j0 : kTile;
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  const LanePositions kp = lane_positions(p.k_pos, j0, kn);
  load_tile(s.K, ld, p.kv, 2 * K, b * p.Tk + j0, kn, kvh * HS, HS);
  load_tile(s.V, ld, p.kv, 2 * K, b * p.Tk + j0, kn, K + kvh * HS, HS);
  float *dK = s.acc0, *dV = s.acc1;
  for (int64_t e = threadIdx.x; e < kTile * HS; e += blockDim.x) dK[e] = dV[e] = 0.0f;

  for (int64_t h = kvh * G; h < (kvh + 1) * G; ++h)
    for (int64_t i0 = 0; i0 < p.Tq; i0 += kTile) {
      const int64_t qn = p.Tq - i0 < kTile ? p.Tq - i0 : kTile;
      const LanePositions qp = lane_positions(p.q_pos, i0, qn);
      if (kp.lo > qp.hi) continue;  // no query of this tile sees a key of ours
      __syncthreads();              // the previous query tile is used up
      load_query_side(s, ld, p, b, h, i0, qn);
      __syncthreads();
      probabilities(s, ld, HS, scale, qn, kn, qp, kp);
      __syncthreads();
      // dV[j] += sum_r P[r][j] dO[r]; dK[j] += scale sum_r dS[r][j] Q[r]: one thread per element.
      for (int64_t e = threadIdx.x; e < kn * HS; e += blockDim.x) {
        const int64_t j = e / HS, c = e % HS;
        float sv = 0.0f, sk = 0.0f;
        for (int64_t r = 0; r < qn; ++r) {
          sv = fmaf(s.P[r * (kTile + 1) + j], s.dO[r * ld + c], sv);
          sk = fmaf(s.dS[r * (kTile + 1) + j], s.Q[r * ld + c], sk);
        }
        dV[e] += sv;
        dK[e] += scale * sk;
      }
    }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < kn * HS; e += blockDim.x) {
    const int64_t j = e / HS, c = e % HS;
    float* row = p.dkv + (b * p.Tk + j0 + j) * 2 * K + kvh * HS + c;
    row[0] += dK[e];
    row[K] += dV[e];
  }
}

// Grid (query tiles, NH, B): dQ of 32 queries over every key tile they see.
__global__ void __launch_bounds__(kBlockThreads) ring_backward_q_kernel(RingBackwardParams p) {
  extern __shared__ float smem[];
  const int64_t C = p.C, HS = C / p.NH, h = blockIdx.y, b = blockIdx.z;
  const int64_t K = p.KVH * HS, kv_col = h / (p.NH / p.KVH) * HS;  // this head's keys in kv
  const int ld = static_cast<int>(HS) + 1;
  const BackwardSmem s = backward_smem(smem, ld, HS);
  const int64_t i0 = int64_t{blockIdx.x} * kTile;
  const int64_t qn = p.Tq - i0 < kTile ? p.Tq - i0 : kTile;
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  const LanePositions qp = lane_positions(p.q_pos, i0, qn);
  load_query_side(s, ld, p, b, h, i0, qn);
  float* dQ = s.acc0;
  for (int64_t e = threadIdx.x; e < kTile * HS; e += blockDim.x) dQ[e] = 0.0f;

  for (int64_t j0 = 0; j0 < p.Tk; j0 += kTile) {
    const int64_t kn = p.Tk - j0 < kTile ? p.Tk - j0 : kTile;
    const LanePositions kp = lane_positions(p.k_pos, j0, kn);
    if (kp.lo > qp.hi) continue;
    __syncthreads();
    load_tile(s.K, ld, p.kv, 2 * K, b * p.Tk + j0, kn, kv_col, HS);
    load_tile(s.V, ld, p.kv, 2 * K, b * p.Tk + j0, kn, K + kv_col, HS);
    __syncthreads();
    probabilities(s, ld, HS, scale, qn, kn, qp, kp);
    __syncthreads();
    // dQ[r] += scale sum_j dS[r][j] K[j]: one thread per element.
    for (int64_t e = threadIdx.x; e < qn * HS; e += blockDim.x) {
      const int64_t r = e / HS, c = e % HS;
      float sq = 0.0f;
      for (int64_t j = 0; j < kn; ++j) sq = fmaf(s.dS[r * (kTile + 1) + j], s.K[j * ld + c], sq);
      dQ[e] += scale * sq;
    }
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < qn * HS; e += blockDim.x) {
    const int64_t r = e / HS, c = e % HS;
    p.dq[(b * p.Tq + i0 + r) * C + h * HS + c] += dQ[e];
  }
}

unsigned tiles(int64_t n) {
  return static_cast<unsigned>((n + kTile - 1) / kTile);
}

// Kernels whose shared memory passes 48 KiB must opt in. The attribute belongs to the kernel,
// process-wide: raised when a launch needs more than any before, under a lock, since several
// backends may launch from several threads and none may launch before the attribute is set.
struct SmemAllowance {
  std::mutex mu;
  int64_t bytes = 0;
};
template <typename K>
void allow_smem(K kernel, SmemAllowance& allowed, int64_t bytes) {
  std::lock_guard<std::mutex> lock(allowed.mu);
  if (bytes <= allowed.bytes) return;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(bytes));
  allowed.bytes = bytes;
}
SmemAllowance forward_allowed, backward_kv_allowed, backward_q_allowed;

}  // namespace

int64_t ring_forward_smem_bytes(int64_t HS) {
  return forward_smem_floats(HS) * static_cast<int64_t>(sizeof(float));
}
int64_t ring_backward_smem_bytes(int64_t HS) {
  return backward_smem_floats(HS) * static_cast<int64_t>(sizeof(float));
}

void ring_split(const RingSplitParams& p, cudaStream_t s) {
  const int64_t n = p.B * p.T * (p.C + 2 * p.KVH * (p.C / p.NH));
  dispatch_act(p.bf16, [&](auto tag) {
    using T = decltype(tag);
    ring_split_kernel<T><<<grid_for(n), kThreads, 0, s>>>(p);
  });
}

void ring_merge_grad(const RingMergeGradParams& p, cudaStream_t s) {
  const int64_t n = p.B * p.T * (p.C + 2 * p.KVH * (p.C / p.NH));
  dispatch_act(p.bf16, [&](auto tag) {
    using T = decltype(tag);
    ring_merge_grad_kernel<T><<<grid_for(n), kThreads, 0, s>>>(p);
  });
}

void ring_block_forward(const RingForwardParams& p, cudaStream_t s) {
  if (p.Tq == 0 || p.Tk == 0) return;
  const int64_t bytes = ring_forward_smem_bytes(p.C / p.NH);
  allow_smem(ring_forward_kernel, forward_allowed, bytes);
  const dim3 grid(tiles(p.Tq), static_cast<unsigned>(p.NH), static_cast<unsigned>(p.B));
  ring_forward_kernel<<<grid, kBlockThreads, static_cast<size_t>(bytes), s>>>(p);
}

void ring_finish(const RingFinishParams& p, cudaStream_t s) {
  const int64_t n = p.B * p.T * p.C;
  dispatch_act(p.bf16, [&](auto tag) {
    using T = decltype(tag);
    ring_finish_kernel<T><<<grid_for(n), kThreads, 0, s>>>(p);
  });
}

void ring_block_backward(const RingBackwardParams& p, cudaStream_t s) {
  if (p.Tq == 0 || p.Tk == 0) return;
  const int64_t bytes = ring_backward_smem_bytes(p.C / p.NH);
  allow_smem(ring_backward_kv_kernel, backward_kv_allowed, bytes);
  allow_smem(ring_backward_q_kernel, backward_q_allowed, bytes);
  const unsigned nh = static_cast<unsigned>(p.NH), nkv = static_cast<unsigned>(p.KVH);
  const unsigned nb = static_cast<unsigned>(p.B);
  ring_backward_kv_kernel<<<dim3(tiles(p.Tk), nkv, nb), kBlockThreads, static_cast<size_t>(bytes),
                            s>>>(p);
  ring_backward_q_kernel<<<dim3(tiles(p.Tq), nh, nb), kBlockThreads, static_cast<size_t>(bytes),
                           s>>>(p);
}

}  // namespace remat::cuda::kern
