// Launchers of the CUDA backend's own kernels (elementwise.cu, layernorm.cu, optimizer.cu).
// Internal header of engine/cuda, plain C++ so host files include it without CUDA device headers
// or fmt.
// Conventions: every launcher enqueues on `stream` and returns at once; the caller checks
// cudaGetLastError() after the op (CudaBackend::finish_op). `bf16` selects the storage type of
// activation pointers (void*): __nv_bfloat16 when true, float when false. Parameters, their
// gradients, statistics and losses are always float. Math is float; reductions run in a fixed
// order (no atomics), so results are deterministic run to run.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace remat::cuda::kern {

/// Scratch of the column reductions (bias and LayerNorm parameter gradients), owned by the
/// backend. A sum over rows split into row chunks fills enough blocks to use every SM (one block
/// per 32 columns alone gives 24 blocks for C = 768); a second pass adds the chunks' partials in
/// chunk order, so results are deterministic for a given shape and SM count.
struct ColumnReduce {
  float* scratch = nullptr;  // device, `floats` partial sums
  int64_t floats = 0;
  int target_blocks = 1;  // blocks to aim for in the first pass
};
/// Row chunks for a reduction of `n_sums` (rows, cols) column sums: 1 means a single pass
/// straight into the result (small inputs, or no room in the scratch).
int64_t column_chunks(int64_t rows, int64_t cols, int64_t n_sums, const ColumnReduce& r);

// ---- data movement ----
void fill(void* p, int64_t n, float value, bool bf16, cudaStream_t s);
void fill_i32(int32_t* p, int64_t n, int32_t value, cudaStream_t s);
/// dst[i] = src[i] converted; dst and src of either type (same type: a plain copy).
void cast(void* dst, bool dst_bf16, const void* src, bool src_bf16, int64_t n, cudaStream_t s);

/// NF4 (engine/core/nf4.h): the code tables, passed by value (1 KiB of kernel parameters), and the
/// byte offsets of a weight's parts, from nf4::layout on the host.
struct Nf4Tables {
  float code[16];
  float dynamic[256];
};
struct Nf4Layout {
  int64_t codes = 0, absmax = 0, offset = 0, absmax2 = 0;
  bool double_quant = false;
};
/// dst (n values, bf16 or f32) = the n NF4 values of `packed`, decoded as nf4::dequantize does.
void nf4_dequantize(void* dst, bool dst_bf16, const void* packed, int64_t n,
                    const Nf4Tables& tables, const Nf4Layout& layout, cudaStream_t s);

// ---- pointwise ----
/// out = a + b; out may alias a or b.
void add(void* out, const void* a, const void* b, int64_t n, bool bf16, cudaStream_t s);
/// Inverted dropout with the counter-based mask of engine/core/rng.h (same masks as the CPU
/// backend); out may alias inp. engine/core/ops/activation.h's DropoutArgs as raw pointers.
struct DropoutParams {
  void* out;
  const void* inp;
  int64_t n;
  float p;
  uint64_t seed, stream;
  uint64_t first_index;  // element i draws the counter first_index + i
  bool bf16;
};
void dropout(const DropoutParams& p, cudaStream_t s);
/// GELU (tanh approximation) or ReLU, as raw pointers: forward, out = act(inp) (dout unused);
/// backward, out = dout * act'(inp), where out (dinp) may alias dout.
struct ActivationParams {
  void* out;
  const void* dout;
  const void* inp;
  int64_t n;
  bool gelu;
  bool bf16;
};
void activation_forward(const ActivationParams& p, cudaStream_t s);
void activation_backward(const ActivationParams& p, cudaStream_t s);
/// out (rows, cols) {=, +=} bias (cols) broadcast over rows.
void bias_rows(void* out, const float* bias, int64_t rows, int64_t cols, bool overwrite, bool bf16,
               cudaStream_t s);
/// dsum (cols) += sum over rows of x (rows, cols).
void column_sum_add(float* dsum, const void* x, int64_t rows, int64_t cols, bool bf16,
                    const ColumnReduce& r, cudaStream_t s);

// ---- embedding ----
/// out (B*T, C) = wte[tokens] (+ wpe[t]); an out-of-vocabulary token yields a NaN row.
/// EmbeddingForwardArgs as raw pointers (wpe null: token embedding only).
struct EmbeddingForwardParams {
  void* out;
  const int32_t* tokens;
  const void* wte;  // f32, or bf16 (wte_bf16: a frozen LoRA base's table)
  const float* wpe;
  int64_t B, T, C, V;
  bool bf16;
  bool wte_bf16;
};
void embedding_forward(const EmbeddingForwardParams& p, cudaStream_t s);
/// EmbeddingBackwardArgs as raw pointers, with the rows bucketed by token on the host:
/// order (B*T) i32 lists row indices grouped by token, starts (n_buckets + 1) i32 bounds each
/// group. dwte[token of bucket] += sum of the bucket's dout rows; dwpe (T, C) += sum over b of
/// dout (B, T, C) unless dwpe is null.
struct EmbeddingBackwardParams {
  float* dwte;
  float* dwpe;
  const void* dout;
  const int32_t* tokens;
  const int32_t* order;
  const int32_t* starts;
  int64_t n_buckets;
  int64_t B, T, C;
  bool bf16;
};
void embedding_backward(const EmbeddingBackwardParams& p, cudaStream_t s);

// ---- losses ----
/// A target that is not trained: engine/core/ops/loss.h's kIgnoredTarget (loss.cpp checks that
/// both agree), here for the kernels, which include no engine/core header. Its row gets loss 0 and
/// a zero gradient from softmax_xent.
constexpr int32_t kIgnoredTarget = -1;
/// losses (N) = mean_j (inp - target)^2; dinp (N, D) = 2 scale (inp - target) / D.
/// MseLossArgs as raw pointers.
struct MseLossParams {
  float* losses;
  void* dinp;
  const void* inp;
  const float* target;
  int64_t N, D;
  float scale;
  bool bf16;
};
void mse_loss(const MseLossParams& p, cudaStream_t s);
/// Softmax cross-entropy over logits (rows, V) f32 in place: losses[r] = lse - logit[target];
/// the gradient (softmax - onehot) * scale overwrites the logits: as f32 (write_bf16 false), or
/// as bf16 stored at the start of each f32 row (bf16 element j of row r at byte 4 r V + 2 j,
/// i.e. a (rows, V) bf16 matrix with leading dimension 2V).
void softmax_xent(float* logits, const int32_t* targets, float* losses, int32_t* argmax,
                  int64_t rows, int64_t V, float scale, bool write_bf16, cudaStream_t s);

// ---- optimizer (optimizer.cu) ----
// The multi-tensor launchers take a host array of descriptors and launch once per group of them,
// the group passed by value in the kernel's parameters (at most 4 KB): a step's ~150 parameters
// in a handful of launches. Tensors per launch:
constexpr int kAdamWPerLaunch = 48;        // 72 bytes of pointers and hyperparameters each
constexpr int kSumSquaresPerLaunch = 128;  // 16 bytes each
constexpr int kZeroPerLaunch = 128;        // 16 bytes each
/// One AdamW update of n floats (engine/core/ops/adamw.h's AdamWArgs as raw pointers, with the bias
/// corrections 1 - beta^step computed by the caller).
struct AdamWParams {
  float* param;
  const float* grad;
  float* m;
  float* v;
  int64_t n;
  float lr, beta1, beta2, eps, weight_decay, grad_scale, bias_corr1, bias_corr2;
};
void adamw(const AdamWParams& p, cudaStream_t s);
/// adamw of each of the `count` updates, with the same bits per element as one call each. Their
/// tensors must not overlap (the order between updates is not defined).
void adamw_multi(const AdamWParams* updates, int64_t count, cudaStream_t s);
/// n floats of device memory.
struct DeviceFloats {
  float* data;
  int64_t n;
};
constexpr int kSumSquaresBlocks = 256;
constexpr int kSumSquaresThreads = 256;
/// partials[i kSumSquaresBlocks + b] (count x kSumSquaresBlocks doubles, may be mapped host
/// memory) = block b's share of sum x^2 over tensor i, in double: thread t of block b sums
/// x[j]^2 for j = b kSumSquaresThreads + t + k kSumSquaresBlocks kSumSquaresThreads in order of
/// k, then the block adds its threads' sums as a tree (halves: t += t + 128, then + 64, ...).
/// The tensors are only read.
void sum_squares_partials(const DeviceFloats* tensors, int64_t count, double* partials,
                          cudaStream_t s);
/// Sets every element of each of the `count` tensors to 0.
void zero_multi(const DeviceFloats* tensors, int64_t count, cudaStream_t s);

// ---- attention helpers ----
/// RoPE's inverse frequencies of one head (engine/core/ops/rope.h's rope_angles, scaling applied
/// on the host), by value in a kernel's parameters: n = HS / 2 pairs, 0 for no rotation; cos and
/// sin are multiplied by attention_factor (yarn's; 1 leaves the unscaled bits) before they are
/// rounded to float, as the CPU's table does.
constexpr int kMaxRopePairs = 128;  // head sizes up to 256, cuDNN's largest
struct RopeFrequencies {
  int n = 0;
  double attention_factor = 1.0;
  double inv_freq[kMaxRopePairs] = {};
};
/// dst (BT, (NH + 2 KVH) HS) = src (q | k | v, heads contiguous) with the NH query and KVH key
/// heads rotated by RoPE (NeoX half-split; angle t inv_freq[i], t = row % T); inverse = true
/// applies R^T (gradients back to the unrotated input). freq.n = 0: a plain copy. v is copied.
/// dst may alias src (each thread owns pair i of every head of one row).
struct RopeParams {
  void* dst;
  bool dst_bf16;
  const void* src;
  bool src_bf16;
  int64_t BT, T, NH, KVH, HS;
  bool inverse;
  RopeFrequencies freq;
};
void rope_apply(const RopeParams& p, cudaStream_t s);

// ---- attention over chunks (engine/cuda/attention_chunks.cu) ----
/// Folds one pair's output o_ij (n, NH HS) bf16 and lse_ij (NH, n) f32 into the running o
/// (n, NH HS) f32 and lse (head h's n rows at h * lse_stride): lse' = m + log(e^(lse - m) +
/// e^(lse_ij - m)) with m the larger, o' = e^(lse - lse') o + e^(lse_ij - lse') o_ij; `first`:
/// o = o_ij, lse = lse_ij (what the formula gives from lse = -inf).
void attention_merge(float* o, float* lse, int64_t lse_stride, const void* o_ij,
                     const float* lse_ij, int64_t n, int64_t NH, int64_t HS, bool first,
                     cudaStream_t s);
/// dst[r ld_dst + c] += src[r ld_src + c], r < rows, c < cols; dst f32, src bf16.
void add_rows(float* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows,
              int64_t cols, cudaStream_t s);
/// dst[r ld_dst + c] = src[r ld_src + c] converted, r < rows, c < cols; src f32, dst act.
void cast_rows(void* dst, bool dst_bf16, int64_t ld_dst, const float* src, int64_t ld_src,
               int64_t rows, int64_t cols, cudaStream_t s);

/// delta (B, NH, T) f32 = rowsum(dout * out) per row and head; dout, out (B, T, C) act.
void attention_delta(float* delta, const void* dout, const void* out, bool bf16, int64_t B,
                     int64_t T, int64_t C, int64_t NH, cudaStream_t s);

// ---- layernorm (layernorm.cu) ----
// engine/core/ops/layernorm.h's Args as raw pointers; act tensors are bf16 or f32 (`bf16`).
struct LayerNormForwardParams {
  void* out;
  float* stats;
  const void* inp;
  const float* weight;
  const float* bias;
  int64_t N, C;
  bool bf16;
};
void layernorm_forward(const LayerNormForwardParams& p, cudaStream_t s);
/// dinp += ...; dweight, dbias += ... (the backend's gradient contract).
struct LayerNormBackwardParams {
  void* dinp;
  float* dweight;
  float* dbias;
  const void* dout;
  const void* inp;
  const float* weight;
  const float* stats;
  int64_t N, C;
  bool bf16;
};
void layernorm_backward(const LayerNormBackwardParams& p, const ColumnReduce& r, cudaStream_t s);

}  // namespace remat::cuda::kern
