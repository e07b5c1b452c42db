// cuDNN causal flash attention, forward and backward, through the raw backend API (no
// cudnn-frontend). See engine/cuda/cudnn_attention.h for the layout contract. The graphs follow the
// op order of cuDNN's composite causal SDPA (the one cudnn-frontend builds): forward Q K^T -> scale
// -> causal mask -> softmax with stats -> P V; backward the matching 22-op graph.
//
// Backend API in brief (what the code below relies on): every object is a descriptor created by
// cudnnBackendCreateDescriptor, filled with cudnnBackendSetAttribute(desc, name, type, count,
// values) and frozen by cudnnBackendFinalize. Tensors carry a unique id (UID); the variant pack
// binds device pointers (or host pointers, for by-value scalars) to UIDs at execution. A graph
// is a list of finalized ops; heuristics rank engine configs for it, and the first config whose
// execution plan finalizes and whose workspace fits the planner's reserve for the shape
// (cudnn_plan_reserve_bytes) is used. Every descriptor
// stays alive as long as the plan. cuDNN's sdpa backward is non-deterministic (dQ accumulates
// atomically): results repeat only to within bf16 rounding, which the gpu tests' tolerances allow
// for.
#include "engine/cuda/cudnn_attention.h"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "engine/core/cuda_workspace.h"
#include "engine/cuda/check.h"
#include "engine/cuda/cudnn_graphs.h"

namespace remat::cuda {
namespace {

using Dims = std::array<int64_t, 4>;

// Owning handle of one backend descriptor.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    REMAT_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_));
  }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(Desc&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  Desc& operator=(Desc&&) = delete;
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
           const void* values) {
    REMAT_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, values));
  }
  void set_desc(cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t v) {
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
  }
  void set_i64(cudnnBackendAttributeName_t name, int64_t v) { set(name, CUDNN_TYPE_INT64, 1, &v); }
  void set_dtype(cudnnBackendAttributeName_t name, cudnnDataType_t v) {
    set(name, CUDNN_TYPE_DATA_TYPE, 1, &v);
  }
  void finalize() { REMAT_CUDNN_CHECK(cudnnBackendFinalize(d_)); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// UIDs of the graph's real (non-virtual) tensors: the variant pack binds pointers to these.
enum Uid : int64_t {
  kQ = 1,
  kKt,
  kV,
  kO,
  kStats,
  kScale,
  kNegInf,  // forward (kV is V^T in the backward)
  kdO,
  kdQ,
  kdK,
  kdV,
  kOne,
  kSoftmaxSum,
  kdQAccum,  // backward
  kFirstVirtual = 100,
};

constexpr cudnnDataType_t kF32 = CUDNN_DATA_FLOAT;
constexpr cudnnDataType_t kBF16 = CUDNN_DATA_BFLOAT16;

// Builds one operation graph; owns every descriptor it creates.
class GraphBuilder {
 public:
  cudnnBackendDescriptor_t tensor(int64_t uid, Dims dims, Dims strides, cudnnDataType_t dt,
                                  bool is_virtual = false, bool by_value = false) {
    Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    t.set_dtype(CUDNN_ATTR_TENSOR_DATA_TYPE, dt);
    t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    t.set_i64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid);
    t.set_i64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16);
    if (is_virtual) t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    t.finalize();
    return keep(std::move(t));
  }
  cudnnBackendDescriptor_t virt(Dims dims, Dims strides, cudnnDataType_t dt = kF32) {
    return tensor(next_virtual_++, dims, strides, dt, true);
  }
  /// A by-value f32 scalar, dims {1,1,1,1}: its variant-pack pointer is a host float.
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return tensor(uid, {1, 1, 1, 1}, {1, 1, 1, 1}, kF32, false, true);
  }

  /// y = mode(x, b) (b and the select mask t optional); `prec` is the math precision.
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t t = nullptr,
                 cudnnDataType_t prec = kF32, int64_t axis = -1) {
    Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    pw.set_dtype(CUDNN_ATTR_POINTWISE_MATH_PREC, prec);
    if (axis >= 0) pw.set_i64(CUDNN_ATTR_POINTWISE_AXIS, axis);
    pw.finalize();
    Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw.get());
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    const float one = 1.0f;  // the frontend sets both alphas to 1 explicitly; so do we
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    if (b) op.set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    op.finalize();
    keep(std::move(pw));
    add_op(std::move(op));
  }
  /// c = a b over the last two dims, fp32 compute.
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    Desc mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    mm.set_dtype(CUDNN_ATTR_MATMUL_COMP_TYPE, kF32);
    mm.finalize();
    Desc op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm.get());
    op.finalize();
    keep(std::move(mm));
    add_op(std::move(op));
  }
  /// y = reduce(x) over the axes where y has extent 1, or, where y has k of x's n > k, over each
  /// group of n / k adjacent indices (the grouped-query heads of one key/value head).
  void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t y) {
    Desc red(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    red.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    red.set_dtype(CUDNN_ATTR_REDUCTION_COMP_TYPE, kF32);
    red.finalize();
    Desc op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, red.get());
    op.finalize();
    keep(std::move(red));
    add_op(std::move(op));
  }
  /// y = x re-strided (a transpose without data movement) and/or re-typed.
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Desc op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    op.finalize();
    add_op(std::move(op));
  }

  size_t n_ops() const { return ops_.size(); }
  std::vector<Desc> take_descriptors() { return std::move(keep_); }
  const std::vector<cudnnBackendDescriptor_t>& ops() const { return ops_; }

 private:
  cudnnBackendDescriptor_t keep(Desc d) {
    keep_.push_back(std::move(d));
    return keep_.back().get();
  }
  void add_op(Desc d) { ops_.push_back(keep(std::move(d))); }

  std::vector<Desc> keep_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = kFirstVirtual;
};

// Strides of the views into the (B, T, W) qkv (and dqkv) buffer, dims in B, H, S, D order:
// a head's rows are W apart, heads HS apart, batches W T apart (queries; keys and values W Tk).
// `full_head` is the layout of a key/value gradient per query head (B, NH, Tk, HS), before its
// sum over the group. Scores are (B, NH, T, Tk).
struct Strides {
  Dims qkv, kv, kv_t, out, row, scores, scores_t, full_head;
  explicit Strides(const AttentionShape& s) {
    const int64_t C = s.C(), W = s.W(), T = s.T, Tk = s.key_rows(), H = s.NH, D = s.HS;
    qkv = {W * T, D, W, 1};
    kv = {W * Tk, D, W, 1};
    kv_t = {W * Tk, D, 1, W};  // [B, H, D, S]: K^T and V^T as the graph consumes them
    out = {C * T, D, C, 1};
    row = {H * T, T, 1, 1};
    scores = {H * T * Tk, T * Tk, Tk, 1};
    scores_t = {H * T * Tk, T * Tk, 1, Tk};
    full_head = {H * Tk * D, Tk * D, D, 1};
  }
};

// ops 3-6 of the forward table: keep scores where row >= col, -inf elsewhere.
cudnnBackendDescriptor_t causal_mask(GraphBuilder& g, const AttentionShape& s, const Strides& st,
                                     cudnnBackendDescriptor_t scores,
                                     cudnnBackendDescriptor_t neg_inf) {
  if (!s.causal) return scores;  // an off-diagonal pair: every key precedes every query
  const Dims sd = {s.B, s.NH, s.T, s.key_rows()};
  auto row = g.virt(sd, st.scores, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, row, nullptr, CUDNN_DATA_INT32, 2);
  auto col = g.virt(sd, st.scores, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, col, nullptr, CUDNN_DATA_INT32, 3);
  auto keep = g.virt(sd, st.scores, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, keep, nullptr, CUDNN_DATA_BOOLEAN);
  auto masked = g.virt(sd, st.scores);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scores, neg_inf, masked, keep);
  return masked;
}

// Forward, 14 ops: S = Q K^T scaled, causal mask, row max, exp, row sum, P V, and the LSE. K and
// V have KVH heads: the matmuls broadcast each over its NH / KVH query heads.
void build_forward(GraphBuilder& g, const AttentionShape& s) {
  const Strides st(s);
  const Dims hd = {s.B, s.NH, s.T, s.HS};
  const Dims kv = {s.B, s.kv_heads(), s.key_rows(), s.HS};
  const Dims kv_t = {s.B, s.kv_heads(), s.HS, s.key_rows()};
  const Dims sd = {s.B, s.NH, s.T, s.key_rows()}, rd = {s.B, s.NH, s.T, 1};
  auto q = g.tensor(kQ, hd, st.qkv, kBF16);
  auto kt = g.tensor(kKt, kv_t, st.kv_t, kBF16);
  auto v = g.tensor(kV, kv, st.kv, kBF16);
  auto o = g.tensor(kO, hd, st.out, kBF16);
  auto stats = g.tensor(kStats, rd, st.row, kF32);
  auto scale = g.scalar(kScale);
  auto neg_inf = g.scalar(kNegInf);

  auto s0 = g.virt(sd, st.scores);
  g.matmul(q, kt, s0);
  auto s1 = g.virt(sd, st.scores);
  g.pointwise(CUDNN_POINTWISE_MUL, s0, scale, s1);
  auto s2 = causal_mask(g, s, st, s1, neg_inf);
  auto m = g.virt(rd, st.row);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s2, m);
  auto s3 = g.virt(sd, st.scores);
  g.pointwise(CUDNN_POINTWISE_SUB, s2, m, s3);
  auto e = g.virt(sd, st.scores);
  g.pointwise(CUDNN_POINTWISE_EXP, s3, nullptr, e);
  auto z = g.virt(rd, st.row);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  auto lz = g.virt(rd, st.row);
  g.pointwise(CUDNN_POINTWISE_LOG, z, nullptr, lz);
  g.pointwise(CUDNN_POINTWISE_ADD, m, lz, stats);
  auto p = g.virt(sd, st.scores, kBF16);  // the second matmul's A must have the I/O type
  g.pointwise(CUDNN_POINTWISE_DIV, e, z, p);
  g.matmul(p, v, o);
}

// dK or dV (B, KVH, T, HS) = a (B, NH, T, T) x b (B, NH, T, HS): with grouped-query heads the
// product is formed per query head (a virtual bf16 tensor) and summed over each group by a
// reduction, the graph cuDNN's frontend builds for its fused kernel to recognize.
void grouped_matmul(GraphBuilder& g, const AttentionShape& s, const Strides& st,
                    cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                    cudnnBackendDescriptor_t out) {
  if (s.kv_heads() == s.NH) {
    g.matmul(a, b, out);
    return;
  }
  auto per_query_head = g.virt({s.B, s.NH, s.key_rows(), s.HS}, st.full_head, kBF16);
  g.matmul(a, b, per_query_head);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, per_query_head, out);
}

// Backward, 22 ops (24 with grouped-query heads: dK and dV each summed over the group), the
// non-deterministic dQ-accumulator variant: cuDNN's deterministic one needs a workspace quadratic
// in T on Hopper, useless at long context.
void build_backward(GraphBuilder& g, const AttentionShape& s) {
  const Strides st(s);
  const Dims hd = {s.B, s.NH, s.T, s.HS};
  const Dims kv = {s.B, s.kv_heads(), s.key_rows(), s.HS};
  const Dims kv_t = {s.B, s.kv_heads(), s.HS, s.key_rows()};
  const Dims sd = {s.B, s.NH, s.T, s.key_rows()}, rd = {s.B, s.NH, s.T, 1};
  const Dims sd_t = {s.B, s.NH, s.key_rows(), s.T};  // P^T and dS^T
  auto q = g.tensor(kQ, hd, st.qkv, kBF16);
  auto kt = g.tensor(kKt, kv_t, st.kv_t, kBF16);
  auto vt = g.tensor(kV, kv_t, st.kv_t, kBF16);
  auto o = g.tensor(kO, hd, st.out, kBF16);
  auto dO = g.tensor(kdO, hd, st.out, kBF16);  // dO strides == O strides (cuDNN 9.5.0 assumed so)
  auto stats = g.tensor(kStats, rd, st.row, kF32);
  auto dq = g.tensor(kdQ, hd, st.qkv, kBF16);
  auto dk = g.tensor(kdK, kv, st.kv, kBF16);
  auto dv = g.tensor(kdV, kv, st.kv, kBF16);
  auto scale = g.scalar(kScale);
  auto neg_inf = g.scalar(kNegInf);
  auto one = g.scalar(kOne);
  auto softmax_sum = g.tensor(kSoftmaxSum, rd, st.row, kF32);
  auto dq_accum = g.tensor(kdQAccum, hd, {s.NH * s.T * s.HS, s.T * s.HS, s.HS, 1}, kF32);

  // D_i = rowsum(dO * O)
  auto t0 = g.virt(hd, {s.NH * s.T * s.HS, s.HS, s.NH * s.HS, 1});
  g.pointwise(CUDNN_POINTWISE_MUL, dO, o, t0);
  auto t1 = g.virt(rd, st.row);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, t0, t1);
  g.pointwise(CUDNN_POINTWISE_MUL, t1, one, softmax_sum);
  // P = exp(scale QK^T - lse), masked
  auto s0 = g.virt(sd, st.scores);
  g.matmul(q, kt, s0);
  auto s1 = g.virt(sd, st.scores);
  g.pointwise(CUDNN_POINTWISE_MUL, s0, scale, s1);
  auto s2 = g.virt(sd, st.scores);
  g.pointwise(CUDNN_POINTWISE_SUB, s1, stats, s2);
  auto s3 = causal_mask(g, s, st, s2, neg_inf);
  auto p = g.virt(sd, st.scores);
  g.pointwise(CUDNN_POINTWISE_EXP, s3, nullptr, p);
  // dV = P^T dO
  auto pt = g.virt(sd_t, st.scores_t, kBF16);
  g.reshape(p, pt);
  grouped_matmul(g, s, st, pt, dO, dv);
  // dS = P (dO V^T - D) scale
  auto dp = g.virt(sd, st.scores);
  g.matmul(dO, vt, dp);
  auto d1 = g.virt(sd, st.scores);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, softmax_sum, d1);
  auto d2 = g.virt(sd, st.scores);
  g.pointwise(CUDNN_POINTWISE_MUL, d1, p, d2);
  auto ds = g.virt(sd, st.scores);
  g.pointwise(CUDNN_POINTWISE_MUL, d2, scale, ds);
  // dK = dS^T Q
  auto dst_ = g.virt(sd_t, st.scores_t, kBF16);
  g.reshape(ds, dst_);
  grouped_matmul(g, s, st, dst_, q, dk);
  // dQ = dS K, accumulated in f32 then converted
  auto k = g.virt(kv, st.kv);
  g.reshape(kt, k);
  g.matmul(ds, k, dq_accum);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, nullptr, dq);
}

}  // namespace

// One finalized graph, its plan, and everything they reference.
struct AttentionEngine::Graph {
  std::vector<Desc> parts;  // tensors, ops, sub-descriptors
  std::unique_ptr<Desc> op_graph, engine_cfg, plan;
  size_t n_ops = 0;
  int64_t workspace_bytes = 0;
};

namespace {

std::unique_ptr<AttentionEngine::Graph> make_graph(const AttentionShape& s, bool backward,
                                                   cudnnHandle_t handle) {
  GraphBuilder g;
  if (backward)
    build_backward(g, s);
  else
    build_forward(g, s);
  auto graph = std::make_unique<AttentionEngine::Graph>();
  graph->n_ops = g.n_ops();
  graph->op_graph = std::make_unique<Desc>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph->op_graph->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                       static_cast<int64_t>(g.ops().size()), g.ops().data());
  // The graph handle is optional from cuDNN 9.8 on (and the attribute deprecated); older 9.x
  // need it, so it is set whenever there is one (the host-only check has none).
  if (handle) graph->op_graph->set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  graph->op_graph->finalize();
  graph->parts = g.take_descriptors();
  return graph;
}

// The engine's global index, to name a config in messages (-1 if cuDNN does not say).
int64_t engine_index(cudnnBackendDescriptor_t cfg) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw = engine.get();
  int64_t n = 0, index = -1;
  if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                               &n, &raw) != CUDNN_STATUS_SUCCESS ||
      cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                               &index) != CUDNN_STATUS_SUCCESS)
    return -1;
  return index;
}

// Whether cuDNN's numerical notes for the config's engine leave out NONDETERMINISTIC.
bool engine_is_deterministic(cudnnBackendDescriptor_t cfg) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw = engine.get();
  int64_t n = 0;
  if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                               &n, &raw) != CUDNN_STATUS_SUCCESS)
    return false;
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  int64_t count = 0;
  if (cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               static_cast<int64_t>(notes.size()), &count,
                               notes.data()) != CUDNN_STATUS_SUCCESS)
    return false;
  for (int64_t i = 0; i < count; ++i)
    if (notes[static_cast<size_t>(i)] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return false;
  return true;
}

// The ranked engine configs of one heuristics mode; none (and a reason) if the query fails.
std::vector<std::unique_ptr<Desc>> heuristic_configs(const AttentionEngine::Graph& graph,
                                                     cudnnBackendHeurMode_t mode,
                                                     std::vector<std::string>& reasons) {
  const char* name = mode == CUDNN_HEUR_MODE_A ? "heuristics A" : "heuristics FALLBACK";
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph.op_graph->get());
  heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  int64_t n = 0;
  cudnnStatus_t st = cudnnBackendFinalize(heur.get());
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, nullptr);
  std::vector<std::unique_ptr<Desc>> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; st == CUDNN_STATUS_SUCCESS && i < n; ++i) {
    cfgs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(cfgs.back()->get());
  }
  int64_t got = 0;
  if (st == CUDNN_STATUS_SUCCESS && n > 0)
    st = cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, raw.data());
  if (st != CUDNN_STATUS_SUCCESS) {
    reasons.push_back(
        fmt::format("{}: {} {}", name, cudnnGetErrorString(st), detail::cudnn_last_error()));
    return {};
  }
  if (got == 0) reasons.push_back(fmt::format("{}: no engine configs", name));
  cfgs.resize(static_cast<size_t>(got));
  return cfgs;
}

// Tries one config: true (and the plan stored in `graph`) when its plan finalizes and its
// workspace fits the limit; otherwise appends why not.
bool try_config(AttentionEngine::Graph& graph, std::unique_ptr<Desc>& cfg, cudnnHandle_t handle,
                int64_t ws_limit, const std::string& label, std::vector<std::string>& reasons) {
  auto plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  plan->set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg->get());
  plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  const std::string who = fmt::format("{} (engine {})", label, engine_index(cfg->get()));
  const cudnnStatus_t st = cudnnBackendFinalize(plan->get());
  if (st != CUDNN_STATUS_SUCCESS) {  // NOT_SUPPORTED is normal: the next config is tried
    reasons.push_back(
        fmt::format("{}: {} {}", who, cudnnGetErrorString(st), detail::cudnn_last_error()));
    return false;
  }
  int64_t ws = 0, cnt = 0;
  REMAT_CUDNN_CHECK(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                             CUDNN_TYPE_INT64, 1, &cnt, &ws));
  if (ws > ws_limit) {
    reasons.push_back(
        fmt::format("{}: needs {} bytes of workspace, over the {} reserved", who, ws, ws_limit));
    return false;
  }
  graph.workspace_bytes = ws;
  graph.plan = std::move(plan);
  graph.engine_cfg = std::move(cfg);
  return true;
}

// Heuristics mode A, then FALLBACK; the first engine config whose plan finalizes within the
// workspace limit wins. Failing that, the error lists every config tried and why it was not used.
void build_plan(AttentionEngine::Graph& graph, cudnnHandle_t handle, const AttentionShape& s,
                bool backward, int64_t ws_limit) {
  std::vector<std::string> reasons;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    auto cfgs = heuristic_configs(graph, mode, reasons);
    for (size_t i = 0; i < cfgs.size(); ++i) {
      const std::string label =
          fmt::format("{} #{}", mode == CUDNN_HEUR_MODE_A ? "A" : "FALLBACK", i);
      if (try_config(graph, cfgs[i], handle, ws_limit, label, reasons)) return;
    }
  }
  std::string all;
  for (const auto& r : reasons) all += "\n  " + r;
  throw BackendError(fmt::format(
      "[attention] no cuDNN engine supports causal flash attention {} for B={} heads={} "
      "key/value heads={} T={} head size={} (bf16). Fix: cuDNN needs an sm_80+ GPU and a head "
      "size that is a multiple of 8 and at most 128 (256 on Hopper). Engine configs tried "
      "({}):{}",
      backward ? "backward" : "forward", s.B, s.NH, s.kv_heads(), s.T, s.HS, reasons.size(), all));
}

void execute(cudnnHandle_t handle, const AttentionEngine::Graph& g,
             const std::vector<int64_t>& uids, const std::vector<void*>& ptrs, void* workspace) {
  // Null when the plan needs none (a pointer for 0 bytes has made cuDNN fail elsewhere).
  void* ws_ptr = g.workspace_bytes > 0 ? workspace : nullptr;
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()),
           uids.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
           static_cast<int64_t>(ptrs.size()), ptrs.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws_ptr);
  pack.finalize();
  REMAT_CUDNN_CHECK(cudnnBackendExecute(handle, g.plan->get(), pack.get()));
}

}  // namespace

AttentionEngine::AttentionEngine(cudaStream_t stream) : stream_(stream) {
  REMAT_CUDNN_CHECK(cudnnCreate(&handle_));
  REMAT_CUDNN_CHECK(cudnnSetStream(handle_, stream_));
}

AttentionEngine::~AttentionEngine() {
  graphs_.clear();  // plans before the handle
  if (handle_) cudnnDestroy(handle_);
}

AttentionEngine::Graph& AttentionEngine::graph_for(const AttentionShape& s, bool backward) {
  auto key = std::make_tuple(s.B, s.NH, s.T, s.HS, s.kv_heads(), s.key_rows(), s.causal, backward);
  auto it = graphs_.find(key);
  if (it != graphs_.end()) return *it->second;
  auto g = make_graph(s, backward, handle_);
  build_plan(*g, handle_, s, backward, workspace_limit(s, backward));
  return *graphs_.emplace(key, std::move(g)).first->second;
}

int64_t AttentionEngine::workspace_limit(const AttentionShape& s, bool backward) {
  return static_cast<int64_t>(
      cudnn_plan_reserve_bytes(s.B, s.NH, s.kv_heads(), s.key_rows(), s.HS, backward));
}

int64_t AttentionEngine::plan_workspace_bytes(const AttentionShape& s, bool backward) {
  return graph_for(s, backward).workspace_bytes;
}

std::vector<EngineOption> AttentionEngine::survey(const AttentionShape& s, bool backward) {
  auto graph = make_graph(s, backward, handle_);
  std::vector<EngineOption> options;
  std::vector<std::string> reasons;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    auto cfgs = heuristic_configs(*graph, mode, reasons);
    for (size_t i = 0; i < cfgs.size(); ++i) {
      EngineOption o;
      o.label = fmt::format("{} #{}", mode == CUDNN_HEUR_MODE_A ? "A" : "FALLBACK", i);
      o.engine = engine_index(cfgs[i]->get());
      o.deterministic = engine_is_deterministic(cfgs[i]->get());
      std::vector<std::string> why;
      // No workspace limit: the survey wants every plan's size, the limit is the caller's call.
      o.finalizes =
          try_config(*graph, cfgs[i], handle_, std::numeric_limits<int64_t>::max(), o.label, why);
      if (o.finalizes)
        o.workspace_bytes = graph->workspace_bytes;
      else if (!why.empty())
        o.why_not = why.back();
      options.push_back(std::move(o));
    }
  }
  return options;
}

// Scalars bound by value: the variant pack holds host pointers to these, read at execution.
static const float kOneValue = 1.0f;
static const float kNegInfValue = -std::numeric_limits<float>::infinity();

// The mask's -inf only where the graph has the mask (causal_mask): an off-diagonal pair of
// chunked attention has none, and a variant pack should bind only tensors its graph uses.
static void bind_mask_scalar(const AttentionShape& s, std::vector<int64_t>& uids,
                             std::vector<void*>& ptrs) {
  if (!s.causal) return;
  uids.push_back(kNegInf);
  ptrs.push_back(const_cast<float*>(&kNegInfValue));
}

void AttentionEngine::forward(const AttentionShape& s, const AttentionForwardPtrs& p,
                              void* workspace) {
  Graph& g = graph_for(s, false);
  const int64_t k_at = s.C() * 2, v_at = k_at + s.kv_heads() * s.HS * 2;  // bytes into a row
  float scale = 1.0f / std::sqrt(static_cast<float>(s.HS));
  auto* qkv = static_cast<char*>(const_cast<void*>(p.qkv));
  auto* kv = p.kv ? static_cast<char*>(const_cast<void*>(p.kv)) : qkv;
  std::vector<int64_t> uids = {kQ, kKt, kV, kO, kStats, kScale};
  std::vector<void*> ptrs = {qkv, kv + k_at, kv + v_at, p.out, p.lse, &scale};
  bind_mask_scalar(s, uids, ptrs);
  execute(handle_, g, uids, ptrs, workspace);
}

void AttentionEngine::backward(const AttentionShape& s, const AttentionBackwardPtrs& p,
                               void* workspace) {
  Graph& g = graph_for(s, true);
  const int64_t C = s.C(), k_at = C * 2, v_at = k_at + s.kv_heads() * s.HS * 2;
  float scale = 1.0f / std::sqrt(static_cast<float>(s.HS));
  // cuDNN >= 9.6 initialises the dQ accumulator itself; older 9.x expect zeros (the frontend
  // zero-fills it only for those), so do the same.
  if (cudnnGetVersion() < 90600)
    REMAT_CUDA_CHECK(
        cudaMemsetAsync(p.dq_accum, 0, static_cast<size_t>(s.B * s.T * C) * 4, stream_));
  auto* qkv = static_cast<char*>(const_cast<void*>(p.qkv));
  auto* kv = p.kv ? static_cast<char*>(const_cast<void*>(p.kv)) : qkv;
  auto* dqkv = static_cast<char*>(p.dqkv);
  std::vector<int64_t> uids = {kQ,  kKt, kV,     kO,   kdO,         kStats,  kdQ,
                               kdK, kdV, kScale, kOne, kSoftmaxSum, kdQAccum};
  std::vector<void*> ptrs = {qkv,
                             kv + k_at,
                             kv + v_at,
                             const_cast<void*>(p.out),
                             const_cast<void*>(p.dout),
                             const_cast<float*>(p.lse),
                             dqkv,
                             dqkv + k_at,
                             dqkv + v_at,
                             &scale,
                             const_cast<float*>(&kOneValue),
                             p.softmax_sum,
                             p.dq_accum};
  bind_mask_scalar(s, uids, ptrs);
  execute(handle_, g, uids, ptrs, workspace);
}

std::string cudnn_version_refusal(int64_t version) {
  // cuDNN 9 numbers releases as major * 10000 + minor * 100 + patch, cuDNN 8 * 1000.
  const int64_t major_unit = version < 90000 ? 1000 : 10000;
  const std::string v =
      fmt::format("{}.{}.{}", version / major_unit, version % major_unit / 100, version % 100);
  constexpr const char* kFix =
      "Fix: install cuDNN 9.15.1 or newer (pip install 'nvidia-cudnn-cu13>=9.15.1', or -cu12 for "
      "CUDA 12) and point LD_LIBRARY_PATH at its nvidia/cudnn/lib";
  if (version < 90000)
    return fmt::format("[cuda] cuDNN {} is too old: remat-train needs cuDNN 9. {}", v, kFix);
  if (version == 91000 || version == 91001)
    return fmt::format(
        "[cuda] cuDNN {} has known bugs in bf16 fused attention (cudnn-frontend blocks 9.10.0 and "
        "9.10.1). {}",
        v, kFix);
  if (version <= 91500)
    return fmt::format(
        "[cuda] cuDNN {}: its flash attention backward gives NaN when the key length is not a "
        "multiple of 128 without a padding mask (cudnn-frontend adds one on cuDNN up to 9.15.0; "
        "remat-train's graphs have none). {}",
        v, kFix);
  return "";
}

std::string check_attention_graphs_finalize(int64_t B, int64_t NH, int64_t T, int64_t HS,
                                            int64_t KVH, int64_t Tk, bool causal) {
  const AttentionShape s{B, NH, T, HS, KVH, Tk, causal};
  auto fwd = make_graph(s, false, nullptr);
  auto bwd = make_graph(s, true, nullptr);
  return fmt::format("fwd {} ops, bwd {} ops", fwd->n_ops, bwd->n_ops);
}

}  // namespace remat::cuda
