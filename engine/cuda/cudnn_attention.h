// Causal flash attention through cuDNN's backend graph API (cuDNN's composite causal SDPA graph:
// matmul, scale, causal mask, softmax with stats, matmul; and its 22-op backward, 24 with
// grouped-query heads). Internal header of engine/cuda. Layout: q, k, v come from one bf16
// (B, T, W) buffer, W = (NH + 2 KVH) HS (NH query heads | KVH key heads | KVH value heads, each
// head contiguous), read in place through strides: cuDNN's grouped-query attention takes K and V
// with KVH heads and serves query head h from key/value head h / (NH / KVH), transformers'
// repeat_kv order. out / dout are (B, T, C) bf16, C = NH HS; lse (B, NH, T) f32 is cuDNN's
// "Stats" (max + ln sum exp of the scaled, masked scores: the same quantity as the CPU's lse).
// dqkv is written as (B, T, W) bf16. RoPE and f32<->bf16 staging happen in
// engine/cuda/attention.cpp. Plans are built once per shape (0.1-1 s each) and cached.
// Attention over chunks (engine/core/ops/attention.h) calls the same graphs on one (query chunk,
// key chunk) pair: T query rows against Tk key rows read from `kv` (the key chunk's rows of the
// same (B, T, W) layout), causal on the square diagonal pairs and unmasked on the others.
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace remat::cuda {

struct AttentionShape {
  int64_t B = 0, NH = 0, T = 0, HS = 0;  // T: query rows
  int64_t KVH = 0;                       // key/value heads; 0: NH
  int64_t Tk = 0;                        // key rows; 0: T
  bool causal = true;                    // top-left causal mask (row >= col), else none
  int64_t kv_heads() const { return KVH > 0 ? KVH : NH; }
  int64_t key_rows() const { return Tk > 0 ? Tk : T; }
  int64_t C() const { return NH * HS; }                     // out's width
  int64_t W() const { return (NH + 2 * kv_heads()) * HS; }  // qkv's
};

struct AttentionForwardPtrs {
  const void* qkv = nullptr;  // (B, T, W) bf16
  void* out = nullptr;        // (B, T, C) bf16
  float* lse = nullptr;       // (B, NH, T) f32
  const void* kv = nullptr;   // (B, Tk, W) bf16, whose k | v are read; null: qkv's
};

struct AttentionBackwardPtrs {
  const void* qkv = nullptr;     // (B, T, W) bf16 (the same, rotated, q and k as the forward)
  const void* out = nullptr;     // (B, T, C) bf16
  const void* dout = nullptr;    // (B, T, C) bf16
  const float* lse = nullptr;    // (B, NH, T) f32
  void* dqkv = nullptr;          // (B, T, W) bf16 [=]
  float* dq_accum = nullptr;     // (B, NH, T, HS) f32 scratch
  float* softmax_sum = nullptr;  // (B, NH, T) f32 scratch
  const void* kv = nullptr;      // (B, Tk, W) bf16, whose k | v are read; null: qkv's. dk | dv
                                 // are written into rows [0, Tk) of dqkv
};

/// One engine config cuDNN's heuristics offer for a graph (AttentionEngine::survey).
struct EngineOption {
  std::string label;             // "A #0", "FALLBACK #2"
  int64_t engine = -1;           // cuDNN's global engine index
  bool deterministic = false;    // no CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC among its notes
  bool finalizes = false;        // its execution plan finalizes on this device
  int64_t workspace_bytes = -1;  // the plan's workspace (finalizing plans only)
  std::string why_not;           // cuDNN's reason when it does not finalize
};

class AttentionEngine {
 public:
  /// Creates the cuDNN handle (needs a device) bound to `stream`.
  explicit AttentionEngine(cudaStream_t stream);
  ~AttentionEngine();
  AttentionEngine(const AttentionEngine&) = delete;
  AttentionEngine& operator=(const AttentionEngine&) = delete;

  /// Only plans whose workspace is at most this many bytes are used: the reserve the planner
  /// counts for the call's shape (cudnn_plan_reserve_bytes, engine/core/cuda_workspace.h).
  static int64_t workspace_limit(const AttentionShape& s, bool backward);
  /// Enqueue the forward / backward; `workspace` is device memory of workspace_limit bytes.
  /// The first call per shape builds the plan; when no engine config yields one, throws
  /// BackendError naming every config's reason.
  void forward(const AttentionShape& s, const AttentionForwardPtrs& p, void* workspace);
  void backward(const AttentionShape& s, const AttentionBackwardPtrs& p, void* workspace);
  /// Builds (or finds) the plan for this shape; returns the workspace it needs in bytes.
  int64_t plan_workspace_bytes(const AttentionShape& s, bool backward);
  /// Every engine config heuristics A and FALLBACK offer for this shape's graph, in their order,
  /// whether its plan finalizes, its workspace, and whether cuDNN calls it deterministic: what a
  /// deterministic backward could be built on, and at what workspace (the device check prints
  /// it). Builds plans only to measure them; uses none.
  std::vector<EngineOption> survey(const AttentionShape& s, bool backward);

  struct Graph;  // descriptors of one finalized graph and its plan (cudnn_attention.cpp)

 private:
  Graph& graph_for(const AttentionShape& s, bool backward);

  cudaStream_t stream_;
  cudnnHandle_t handle_ = nullptr;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>,
           std::unique_ptr<Graph>>
      graphs_;
};

}  // namespace remat::cuda
