// The backend interface: ~20 coarse, layer-level ops, each taking a struct of named arguments.
// Implementations: engine/cpu (fp32 reference, BLAS + OpenMP), engine/cuda (bf16/fp32),
// engine/count_backend (computes nothing: allocates from the pool and counts FLOPs and bytes;
// it is what `plan` runs on). An op's scratch memory is declared once per backend as a pure
// rule (engine/workspace.h) that the public op allocates before calling the implementation.
//
// Gradient contract, stated once for every op family:
//   * parameter gradients ACCUMULATE (+=), so micro-batches sum;
//   * activation gradients OVERWRITE (=),
//   * except where a field says "[+=] residual stream": the LayerNorm input gradient adds into
//     the residual-stream gradient that flows through the block.
// Shapes use the letters of layers/layer.h: B batch, T time, C channels, NH heads, HS head
// size, V vocabulary, N = B*T rows, OC output channels. Activations have backend.act_dtype();
// LayerNorm statistics, log-sum-exp, losses and all parameters are f32; tokens are i32.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "engine/memory_pool.h"
#include "engine/tensor.h"
#include "engine/workspace.h"

namespace remat {

/// What the executor is doing; FLOPs and bytes are counted per phase.
enum class Phase : uint8_t { Forward, Recompute, Backward, Loss, Optimizer, kCount };
constexpr int kNumPhases = static_cast<int>(Phase::kCount);
const char* phase_name(Phase p);

struct OpCost {
  double flops = 0;
  double bytes = 0;  // bytes read + written by the op's kernels (a lower bound on traffic)
};

struct LinearForwardArgs {
  Tensor out;     // (N, OC) act; with accumulate: out += inp W^T + b
  Tensor inp;     // (N, C) act
  Tensor weight;  // (OC, C) f32
  Tensor bias;    // (OC) f32, optional (empty)
  bool accumulate = false;
};

struct LinearBackwardArgs {
  Tensor dinp;     // (N, C) act [=], optional (empty: not needed)
  Tensor dweight;  // (OC, C) f32 [+=]
  Tensor dbias;    // (OC) f32 [+=], optional
  Tensor dout;     // (N, OC) act
  Tensor inp;      // (N, C) act
  Tensor weight;   // (OC, C) f32
};

struct LayerNormForwardArgs {
  Tensor out;     // (N, C) act
  Tensor stats;   // (N, 2) f32: mean, rstd per row
  Tensor inp;     // (N, C) act
  Tensor weight;  // (C) f32
  Tensor bias;    // (C) f32
};

struct LayerNormBackwardArgs {
  Tensor dinp;     // (N, C) act [+=] residual stream
  Tensor dweight;  // (C) f32 [+=]
  Tensor dbias;    // (C) f32 [+=]
  Tensor dout;     // (N, C) act
  Tensor inp;      // (N, C) act
  Tensor weight;   // (C) f32
  Tensor stats;    // (N, 2) f32
};

/// Causal multi-head self-attention with the flash contract: the forward saves only its output
/// and the per-row log-sum-exp, never a T x T matrix. With rope_theta > 0, rotary position
/// embedding is applied to q and k inside the op (qkv is saved unrotated).
struct AttentionForwardArgs {
  Tensor out;  // (B, T, C) act
  Tensor lse;  // (B, NH, T) f32: log-sum-exp of each row of scaled scores
  Tensor qkv;  // (B, T, 3C) act: q | k | v, heads contiguous inside each
  int n_head = 1;
  float rope_theta = 0;  // 0: no rotary embedding
};

struct AttentionBackwardArgs {
  Tensor dqkv;  // (B, T, 3C) act [=]
  Tensor dout;  // (B, T, C) act
  Tensor qkv;   // (B, T, 3C) act
  Tensor out;   // (B, T, C) act
  Tensor lse;   // (B, NH, T) f32
  int n_head = 1;
  float rope_theta = 0;
};

enum class Activation : uint8_t { Gelu, Relu };

struct ActivationForwardArgs {
  Tensor out;  // (N, D) act
  Tensor inp;  // (N, D) act
  Activation kind = Activation::Gelu;
};

struct ActivationBackwardArgs {
  Tensor dinp;  // (N, D) act [=]; may alias dout
  Tensor dout;  // (N, D) act
  Tensor inp;   // (N, D) act: the pre-activation
  Activation kind = Activation::Gelu;
};

struct EmbeddingForwardArgs {
  Tensor out;     // (B, T, C) act = wte[tokens] (+ wpe[t])
  Tensor tokens;  // (B, T) i32
  Tensor wte;     // (V, C) f32
  Tensor wpe;     // (maxT, C) f32, optional (rope models have none)
};

struct EmbeddingBackwardArgs {
  Tensor dwte;    // (V, C) f32 [+=]
  Tensor dwpe;    // (maxT, C) f32 [+=], optional
  Tensor dout;    // (B, T, C) act
  Tensor tokens;  // (B, T) i32
};

/// Fused, chunked LM head + softmax cross-entropy: for chunks of `chunk_rows` rows it forms the
/// logits inp W^T, the loss and the gradients, so no (N, V) tensor ever exists. Runs in the
/// forward pass; the gradients are scaled by loss_scale (1/N for a mean loss).
struct LmHeadLossArgs {
  Tensor losses;   // (N) f32 [=] per-row loss (unscaled)
  Tensor dinp;     // (N, C) act [=]
  Tensor dweight;  // (V, C) f32 [+=]
  Tensor inp;      // (N, C) act: the final hidden states
  Tensor weight;   // (V, C) f32: the (tied) output embedding
  Tensor targets;  // (N) i32
  float loss_scale = 1.0f;
  int64_t chunk_rows = 0;  // rows per chunk; <= 0 means all rows at once
};

/// Mean-squared error for the tutorial MLP: loss_row = sum_j (inp - target)^2 / D.
struct MseLossArgs {
  Tensor losses;  // (N) f32 [=]
  Tensor dinp;    // (N, D) act [=]
  Tensor inp;     // (N, D) act
  Tensor target;  // (N, D) f32
  float loss_scale = 1.0f;
};

/// Inverted dropout with a counter-based mask: keep element i iff
/// rng_uniform(seed, stream, i) >= p, scaled by 1/(1-p). The mask is a pure function of
/// (seed, stream, i), so a recompute or the backward pass (the same op on dout) reproduces it
/// with no saved state. See engine/rng.h.
struct DropoutArgs {
  Tensor out;  // (N, D) act; may alias inp
  Tensor inp;  // (N, D) act
  float p = 0;
  uint64_t seed = 0;
  uint64_t stream = 0;  // derived from (step, block, site)
};

struct AdamWArgs {
  Tensor param;  // (...) f32, updated in place
  Tensor grad;   // (...) f32
  Tensor m;      // (...) f32 first moment
  Tensor v;      // (...) f32 second moment
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0;
  float grad_scale = 1.0f;  // applied to grad first (gradient clipping)
  int64_t step = 1;         // 1-based, for bias correction
};

class Backend {
 public:
  virtual ~Backend() = default;

  /// "cpu", "cuda", "count".
  virtual std::string name() const = 0;
  /// One line for the banner: device, threads, BLAS kernel / GPU name.
  virtual std::string describe() const = 0;
  /// dtype of activations (f32 on the CPU, bf16 or f32 on CUDA).
  virtual DType act_dtype() const = 0;
  /// False for the count backend: its tensors have fake addresses and ops compute nothing.
  virtual bool computes() const { return true; }
  /// Whose op-workspace rules apply (engine/workspace.h): this backend's own; the count
  /// backend's are those of the backend it stands in for.
  virtual WorkspaceTarget workspace_target() const = 0;
  /// True when device memory is host memory (the CPU backend, and dry runs for it): host-side
  /// buffers such as checkpoint staging then count against the device budget, through the pool.
  virtual bool device_is_host() const { return false; }
  MemoryPool& pool() { return *pool_; }
  /// Waits until every queued op has finished (step timing). Synchronous backends: no-op.
  virtual void synchronize() {}

  // ---- data movement ----
  /// Sets every element to `value` (f32 or act tensors; i32 with an integral value).
  void fill(const Tensor& t, float value);
  void copy(const Tensor& dst, const Tensor& src);
  /// Host -> device, raw bytes (dst.bytes() of them).
  virtual void upload(const Tensor& dst, const void* host) = 0;
  /// Device -> host, raw bytes (src.bytes() of them). The count backend writes zeros.
  virtual void download(void* host, const Tensor& src) = 0;

  // ---- layer ops (see the Args structs for shapes and the += / = contract) ----
  void linear_forward(const LinearForwardArgs& a);
  void linear_backward(const LinearBackwardArgs& a);
  void layernorm_forward(const LayerNormForwardArgs& a);
  void layernorm_backward(const LayerNormBackwardArgs& a);
  void attention_forward(const AttentionForwardArgs& a);
  void attention_backward(const AttentionBackwardArgs& a);
  void activation_forward(const ActivationForwardArgs& a);
  void activation_backward(const ActivationBackwardArgs& a);
  /// out = a + b elementwise (N, C) act. out may alias a or b.
  void add(const Tensor& out, const Tensor& a, const Tensor& b);
  void embedding_forward(const EmbeddingForwardArgs& a);
  void embedding_backward(const EmbeddingBackwardArgs& a);
  void lm_head_loss(const LmHeadLossArgs& a);
  void mse_loss(const MseLossArgs& a);
  void dropout(const DropoutArgs& a);

  // ---- optimizer ----
  /// Sum of squares of every element of every tensor (f32), in double.
  double sum_squares(std::span<const Tensor> tensors);
  void adamw_update(const AdamWArgs& a);

  // ---- cost counters (every backend counts; the count backend only counts) ----
  void set_phase(Phase p) { phase_ = p; }
  Phase phase() const { return phase_; }
  const OpCost& cost(Phase p) const { return cost_[static_cast<size_t>(p)]; }
  void reset_cost() { cost_ = {}; }

 protected:
  explicit Backend(std::unique_ptr<MemoryPool> pool) : pool_(std::move(pool)) {}

  virtual void fill_impl(const Tensor& t, float value) = 0;
  virtual void copy_impl(const Tensor& dst, const Tensor& src) = 0;
  virtual void linear_forward_impl(const LinearForwardArgs& a, const OpWorkspace& ws) = 0;
  virtual void linear_backward_impl(const LinearBackwardArgs& a, const OpWorkspace& ws) = 0;
  virtual void layernorm_forward_impl(const LayerNormForwardArgs& a) = 0;
  virtual void layernorm_backward_impl(const LayerNormBackwardArgs& a) = 0;
  virtual void attention_forward_impl(const AttentionForwardArgs& a, const OpWorkspace& ws) = 0;
  virtual void attention_backward_impl(const AttentionBackwardArgs& a, const OpWorkspace& ws) = 0;
  virtual void activation_forward_impl(const ActivationForwardArgs& a) = 0;
  virtual void activation_backward_impl(const ActivationBackwardArgs& a) = 0;
  virtual void add_impl(const Tensor& out, const Tensor& a, const Tensor& b) = 0;
  virtual void embedding_forward_impl(const EmbeddingForwardArgs& a) = 0;
  virtual void embedding_backward_impl(const EmbeddingBackwardArgs& a, const OpWorkspace& ws) = 0;
  virtual void lm_head_loss_impl(const LmHeadLossArgs& a, const OpWorkspace& ws) = 0;
  virtual void mse_loss_impl(const MseLossArgs& a) = 0;
  virtual void dropout_impl(const DropoutArgs& a) = 0;
  virtual double sum_squares_impl(std::span<const Tensor> tensors) = 0;
  virtual void adamw_update_impl(const AdamWArgs& a) = 0;
  // The ops above that take an OpWorkspace receive the parts their backend's rule lists
  // (engine/cpu/workspace.h, engine/cuda/workspace.h), allocated by the public op.

 private:
  void count(double flops, double bytes);
  std::unique_ptr<MemoryPool> pool_;
  Phase phase_ = Phase::Forward;
  std::array<OpCost, kNumPhases> cost_{};
};

/// Rows per LM-head chunk when the config leaves it to the tool: enough rows to keep the GEMM
/// efficient, few enough that the (rows, V) f32 logits stay near 32 MiB.
int64_t default_loss_chunk_rows(int64_t n_rows, int64_t vocab);

}  // namespace remat
