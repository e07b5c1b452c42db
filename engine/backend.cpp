// The backend's public ops: shape checks at the op boundary (REMAT_ASSERT, on in release) and
// FLOP / byte counting, then the implementation's *_impl. The counts are the same formulas on
// every backend, so the planner's FLOPs equal a real run's.
#include "engine/backend.h"

#include <algorithm>

#include "engine/cpu/workspace.h"
#include "engine/cuda/workspace.h"

namespace remat {
namespace {

// The op's workspace on the backend whose rules apply (engine/workspace.h).
template <class Args>
WorkspaceList workspace_for(const WorkspaceTarget& t, const Args& a) {
  return t.device == DeviceKind::Cpu ? cpu::workspace(a, t) : cuda::workspace(a, t);
}

double act_bytes(const Tensor& t) {
  return t.empty() ? 0.0 : static_cast<double>(t.bytes());
}

void check_rows(const Tensor& a, const Tensor& b, const char* what) {
  REMAT_ASSERT(a.rows() == b.rows(), "{}: row mismatch {} vs {}", what, a.shape_str(),
               b.shape_str());
}

}  // namespace

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::Forward:
      return "forward";
    case Phase::Recompute:
      return "recompute";
    case Phase::Backward:
      return "backward";
    case Phase::Loss:
      return "loss";
    case Phase::Optimizer:
      return "optimizer";
    case Phase::kCount:
      break;
  }
  return "?";
}

void Backend::count(double flops, double bytes) {
  OpCost& c = cost_[static_cast<size_t>(phase_)];
  c.flops += flops;
  c.bytes += bytes;
}

void Backend::fill(const Tensor& t, float value) {
  count(0, act_bytes(t));
  fill_impl(t, value);
}

void Backend::copy(const Tensor& dst, const Tensor& src) {
  REMAT_ASSERT(dst.numel() == src.numel(), "copy: {} elements into {}", src.numel(), dst.numel());
  count(0, act_bytes(dst) + act_bytes(src));
  copy_impl(dst, src);
}

void Backend::linear_forward(const LinearForwardArgs& a) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), OC = a.weight.dim(0);
  REMAT_ASSERT(a.weight.dim(-1) == C, "linear_forward: weight {} vs input {}", a.weight.shape_str(),
               a.inp.shape_str());
  REMAT_ASSERT(a.out.rows() == N && a.out.dim(-1) == OC, "linear_forward: out {} expected ({}, {})",
               a.out.shape_str(), N, OC);
  REMAT_ASSERT(a.bias.empty() || a.bias.numel() == OC, "linear_forward: bias {}",
               a.bias.shape_str());
  count(2.0 * N * C * OC, act_bytes(a.inp) + act_bytes(a.weight) + act_bytes(a.out));
  const OpWorkspace ws(pool(), workspace_for(workspace_target(), a));
  linear_forward_impl(a, ws);
}

void Backend::linear_backward(const LinearBackwardArgs& a) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), OC = a.weight.dim(0);
  REMAT_ASSERT(a.dout.rows() == N && a.dout.dim(-1) == OC, "linear_backward: dout {}",
               a.dout.shape_str());
  REMAT_ASSERT(a.dweight.numel() == OC * C, "linear_backward: dweight {}", a.dweight.shape_str());
  REMAT_ASSERT(a.dinp.empty() || a.dinp.numel() == N * C, "linear_backward: dinp {}",
               a.dinp.shape_str());
  double flops = 2.0 * N * C * OC * (a.dinp.empty() ? 1 : 2);
  count(flops,
        act_bytes(a.dout) * 2 + act_bytes(a.inp) + act_bytes(a.weight) * 3 + act_bytes(a.dinp));
  const OpWorkspace ws(pool(), workspace_for(workspace_target(), a));
  linear_backward_impl(a, ws);
}

void Backend::layernorm_forward(const LayerNormForwardArgs& a) {
  check_rows(a.out, a.inp, "layernorm_forward");
  REMAT_ASSERT(a.stats.numel() == a.inp.rows() * 2, "layernorm_forward: stats {}",
               a.stats.shape_str());
  count(8.0 * a.inp.numel(), act_bytes(a.inp) + act_bytes(a.out) + act_bytes(a.stats));
  layernorm_forward_impl(a);
}

void Backend::layernorm_backward(const LayerNormBackwardArgs& a) {
  check_rows(a.dinp, a.inp, "layernorm_backward");
  check_rows(a.dout, a.inp, "layernorm_backward");
  count(14.0 * a.inp.numel(), act_bytes(a.inp) + act_bytes(a.dout) + 2 * act_bytes(a.dinp));
  layernorm_backward_impl(a);
}

// Causal attention does 2*HS FLOPs per (query, key) pair for each of its GEMM-like products:
// S = QK^T and O = PV forward (2 products); S again, dV, dP, dQ, dK backward (5 products).
static double causal_pairs(const Tensor& qkv, int n_head) {
  const double B = static_cast<double>(qkv.dim(0)), T = static_cast<double>(qkv.dim(1));
  return B * n_head * T * (T + 1) / 2;
}

void Backend::attention_forward(const AttentionForwardArgs& a) {
  REMAT_ASSERT(a.qkv.ndim == 3 && a.out.ndim == 3, "attention_forward: qkv {} out {}",
               a.qkv.shape_str(), a.out.shape_str());
  const int64_t B = a.qkv.dim(0), T = a.qkv.dim(1), C = a.out.dim(2);
  REMAT_ASSERT(a.qkv.dim(2) == 3 * C && a.out.dim(0) == B && a.out.dim(1) == T,
               "attention_forward: qkv {} vs out {}", a.qkv.shape_str(), a.out.shape_str());
  REMAT_ASSERT(a.n_head > 0 && C % a.n_head == 0, "attention_forward: {} heads, C={}", a.n_head, C);
  REMAT_ASSERT(a.lse.numel() == B * a.n_head * T, "attention_forward: lse {}", a.lse.shape_str());
  const double HS = static_cast<double>(C / a.n_head);
  count(2 * 2 * HS * causal_pairs(a.qkv, a.n_head),
        act_bytes(a.qkv) + act_bytes(a.out) + act_bytes(a.lse));
  const OpWorkspace ws(pool(), workspace_for(workspace_target(), a));
  attention_forward_impl(a, ws);
}

void Backend::attention_backward(const AttentionBackwardArgs& a) {
  REMAT_ASSERT(a.dqkv.numel() == a.qkv.numel() && a.dout.numel() == a.out.numel(),
               "attention_backward: dqkv {} qkv {} dout {} out {}", a.dqkv.shape_str(),
               a.qkv.shape_str(), a.dout.shape_str(), a.out.shape_str());
  const double HS = static_cast<double>(a.out.dim(2) / a.n_head);
  count(5 * 2 * HS * causal_pairs(a.qkv, a.n_head),
        2 * act_bytes(a.qkv) + 2 * act_bytes(a.out) + act_bytes(a.dqkv) + act_bytes(a.lse));
  const OpWorkspace ws(pool(), workspace_for(workspace_target(), a));
  attention_backward_impl(a, ws);
}

void Backend::activation_forward(const ActivationForwardArgs& a) {
  REMAT_ASSERT(a.out.numel() == a.inp.numel(), "activation_forward: {} vs {}", a.out.shape_str(),
               a.inp.shape_str());
  count((a.kind == Activation::Gelu ? 10.0 : 1.0) * a.inp.numel(),
        act_bytes(a.inp) + act_bytes(a.out));
  activation_forward_impl(a);
}

void Backend::activation_backward(const ActivationBackwardArgs& a) {
  REMAT_ASSERT(a.dinp.numel() == a.inp.numel() && a.dout.numel() == a.inp.numel(),
               "activation_backward: shapes {} {} {}", a.dinp.shape_str(), a.dout.shape_str(),
               a.inp.shape_str());
  count((a.kind == Activation::Gelu ? 16.0 : 1.0) * a.inp.numel(),
        act_bytes(a.inp) + act_bytes(a.dout) + act_bytes(a.dinp));
  activation_backward_impl(a);
}

void Backend::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  REMAT_ASSERT(out.numel() == a.numel() && a.numel() == b.numel(), "add: {} {} {}", out.shape_str(),
               a.shape_str(), b.shape_str());
  count(static_cast<double>(out.numel()), act_bytes(out) + act_bytes(a) + act_bytes(b));
  add_impl(out, a, b);
}

void Backend::embedding_forward(const EmbeddingForwardArgs& a) {
  REMAT_ASSERT(a.tokens.dtype == DType::I32 && a.out.numel() == a.tokens.numel() * a.wte.dim(1),
               "embedding_forward: out {} tokens {} wte {}", a.out.shape_str(),
               a.tokens.shape_str(), a.wte.shape_str());
  REMAT_ASSERT(a.wpe.empty() || a.wpe.dim(0) >= a.tokens.dim(1),
               "embedding_forward: wpe {} shorter than T={}", a.wpe.shape_str(), a.tokens.dim(1));
  count(static_cast<double>(a.out.numel()), 3 * act_bytes(a.out));
  embedding_forward_impl(a);
}

void Backend::embedding_backward(const EmbeddingBackwardArgs& a) {
  REMAT_ASSERT(a.dout.numel() == a.tokens.numel() * a.dwte.dim(1),
               "embedding_backward: dout {} tokens {}", a.dout.shape_str(), a.tokens.shape_str());
  count(2.0 * a.dout.numel(), 3 * act_bytes(a.dout));
  const OpWorkspace ws(pool(), workspace_for(workspace_target(), a));
  embedding_backward_impl(a, ws);
}

void Backend::lm_head_loss(const LmHeadLossArgs& a) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), V = a.weight.dim(0);
  REMAT_ASSERT(a.weight.dim(1) == C && a.dweight.numel() == V * C,
               "lm_head_loss: weight {} dweight {} inp {}", a.weight.shape_str(),
               a.dweight.shape_str(), a.inp.shape_str());
  REMAT_ASSERT(a.targets.numel() == N && a.losses.numel() == N && a.dinp.numel() == N * C,
               "lm_head_loss: targets {} losses {} dinp {} for N={}", a.targets.shape_str(),
               a.losses.shape_str(), a.dinp.shape_str(), N);
  // logits (2NCV), d inp (2NCV), d weight (2NCV), softmax (~5NV)
  count(6.0 * N * C * V + 5.0 * N * V,
        act_bytes(a.inp) * 2 + act_bytes(a.weight) * 3 + 8.0 * N * V);
  const OpWorkspace ws(pool(), workspace_for(workspace_target(), a));
  lm_head_loss_impl(a, ws);
}

void Backend::mse_loss(const MseLossArgs& a) {
  REMAT_ASSERT(a.inp.numel() == a.target.numel() && a.dinp.numel() == a.inp.numel() &&
                   a.losses.numel() == a.inp.rows(),
               "mse_loss: inp {} target {} dinp {} losses {}", a.inp.shape_str(),
               a.target.shape_str(), a.dinp.shape_str(), a.losses.shape_str());
  count(4.0 * a.inp.numel(), 3 * act_bytes(a.inp));
  mse_loss_impl(a);
}

void Backend::dropout(const DropoutArgs& a) {
  REMAT_ASSERT(a.out.numel() == a.inp.numel(), "dropout: {} vs {}", a.out.shape_str(),
               a.inp.shape_str());
  REMAT_ASSERT(a.p >= 0 && a.p < 1, "dropout: p = {}", a.p);
  count(3.0 * a.inp.numel(), act_bytes(a.inp) + act_bytes(a.out));
  dropout_impl(a);
}

double Backend::sum_squares(std::span<const Tensor> tensors) {
  double n = 0;
  for (const Tensor& t : tensors) n += static_cast<double>(t.numel());
  count(2 * n, 4 * n);
  return sum_squares_impl(tensors);
}

void Backend::adamw_update(const AdamWArgs& a) {
  REMAT_ASSERT(a.param.numel() == a.grad.numel() && a.m.numel() == a.param.numel() &&
                   a.v.numel() == a.param.numel(),
               "adamw_update: shapes {} {} {} {}", a.param.shape_str(), a.grad.shape_str(),
               a.m.shape_str(), a.v.shape_str());
  count(12.0 * a.param.numel(), 7.0 * a.param.bytes());
  adamw_update_impl(a);
}

int64_t default_loss_chunk_rows(int64_t n_rows, int64_t vocab) {
  const int64_t target_bytes = 32ll << 20;
  int64_t rows = std::max<int64_t>(64, target_bytes / (4 * std::max<int64_t>(vocab, 1)));
  rows = (rows + 63) / 64 * 64;
  return std::min(rows, n_rows);
}

}  // namespace remat
