// Linear layer y = x W^T + b (W is (out, in), as PyTorch's nn.Linear): arguments, shape checks,
// FLOPs and bytes. Optional fused epilogues: the forward can also write act(y), and the backward
// can take dinp on through the activation that produced inp; each equals the separate
// activation op bit for bit on the CPU (same per-element code, applied while a GEMM tile is
// still in cache). A frozen weight can carry LoRA adapters (`lora`, engine/core/ops/lora.h): their
// terms join y before act, and their share of dinp joins it before act'. Kernels:
// engine/cpu/linear.cpp, engine/cuda/linear.cpp (cuBLASLt); workspaces:
// engine/{cpu,cuda}/workspace.h; tests: tests/ops/test_linear.cpp.
#pragma once

#include "engine/core/error.h"
#include "engine/core/ops/activation.h"
#include "engine/core/ops/lora.h"
#include "engine/core/ops/op.h"
#include "engine/core/tensor.h"

namespace remat {

struct LinearForwardArgs {
  Tensor out;     // (N, OC) act; with accumulate: out += inp W^T + b
  Tensor inp;     // (N, C) act
  Tensor weight;  // (OC, C) f32
  Tensor bias{};  // (OC) f32, optional (empty)
  bool accumulate = false;
  Tensor act_out{};  // (N, OC) act, optional: act_out = act(out), out as written above
  Activation act = Activation::Gelu;
  LinearLora lora{};  // optional: adapters on a frozen weight, added before act (ops/lora.h)
};

struct LinearBackwardArgs {
  // dinp shares no memory with dout, inp or inp_pre_act: the CPU backend keeps a weight
  // gradient's partial sums in it before writing it (engine/cpu/linear.cpp).
  Tensor dinp;     // (N, C) act [=], optional (empty: not needed)
  Tensor dweight;  // (OC, C) f32 [+=], optional (empty: a frozen weight, no weight-gradient GEMM)
  Tensor dbias{};  // (OC) f32 [+=], optional
  Tensor dout;     // (N, OC) act
  Tensor inp;      // (N, C) act
  Tensor weight;   // (OC, C) f32
  // Optional (N, C) act: the pre-activation with inp = act(inp_pre_act). Then dinp is the
  // gradient with respect to inp_pre_act: (dout W) * act'(inp_pre_act).
  Tensor inp_pre_act{};
  Activation act = Activation::Gelu;
  LinearLora lora{};  // optional: the forward's adapters, with their gradients (ops/lora.h)
};

inline void check(const LinearForwardArgs& a) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), OC = a.weight.dim(0);
  REMAT_ASSERT(a.weight.dim(-1) == C, "linear_forward: weight {} vs input {}", a.weight.shape_str(),
               a.inp.shape_str());
  REMAT_ASSERT(a.out.rows() == N && a.out.dim(-1) == OC, "linear_forward: out {} expected ({}, {})",
               a.out.shape_str(), N, OC);
  REMAT_ASSERT(a.bias.empty() || a.bias.numel() == OC, "linear_forward: bias {}",
               a.bias.shape_str());
  REMAT_ASSERT(a.act_out.empty() || a.act_out.numel() == N * OC, "linear_forward: act_out {}",
               a.act_out.shape_str());
  check_lora("linear_forward", a.lora, a.inp, a.out, false);
}
inline OpCost cost(const LinearForwardArgs& a) {
  const double N = static_cast<double>(a.inp.rows()), C = static_cast<double>(a.inp.dim(-1)),
               OC = static_cast<double>(a.weight.dim(0));
  OpCost c{2.0 * N * C * OC, act_bytes(a.inp) + act_bytes(a.weight) + act_bytes(a.out)};
  if (!a.act_out.empty()) {
    c.flops += cost(ActivationForwardArgs{a.act_out, a.out, a.act}).flops;
    c.bytes += act_bytes(a.act_out);
  }
  const OpCost adapters = lora_forward_cost(a.lora, a.inp);
  c.flops += adapters.flops;
  c.bytes += adapters.bytes;
  return c;
}

inline void check(const LinearBackwardArgs& a) {
  const int64_t N = a.inp.rows(), C = a.inp.dim(-1), OC = a.weight.dim(0);
  REMAT_ASSERT(a.dout.rows() == N && a.dout.dim(-1) == OC, "linear_backward: dout {}",
               a.dout.shape_str());
  REMAT_ASSERT(a.dweight.empty() || a.dweight.numel() == OC * C, "linear_backward: dweight {}",
               a.dweight.shape_str());
  REMAT_ASSERT(a.dinp.empty() || a.dinp.numel() == N * C, "linear_backward: dinp {}",
               a.dinp.shape_str());
  REMAT_ASSERT(a.inp_pre_act.empty() || (!a.dinp.empty() && a.inp_pre_act.numel() == N * C),
               "linear_backward: inp_pre_act {} needs a dinp of ({}, {})",
               a.inp_pre_act.shape_str(), N, C);
  REMAT_ASSERT(a.dweight.empty() || a.weight.dtype == DType::F32,
               "linear_backward: a {} weight is frozen and has no gradient",
               dtype_name(a.weight.dtype));
  // The adapters' products read dout with the input's dtype (the activations share one).
  REMAT_ASSERT(a.lora.empty() || a.dout.dtype == a.inp.dtype,
               "linear_backward: LoRA's dout is {}, its input {}", dtype_name(a.dout.dtype),
               dtype_name(a.inp.dtype));
  check_lora("linear_backward", a.lora, a.inp, a.dout, true);
}
inline OpCost cost(const LinearBackwardArgs& a) {
  const double N = static_cast<double>(a.inp.rows()), C = static_cast<double>(a.inp.dim(-1)),
               OC = static_cast<double>(a.weight.dim(0));
  const double gemm = 2.0 * N * C * OC;
  OpCost c{gemm * (a.dinp.empty() ? 1 : 2),
           act_bytes(a.dout) * 2 + act_bytes(a.inp) + act_bytes(a.weight) * 3 + act_bytes(a.dinp)};
  if (a.dweight.empty()) {  // frozen: no dW GEMM, which read dout and inp and read+wrote dW
    c.flops -= gemm;
    c.skipped_flops = gemm;
    c.bytes -= act_bytes(a.dout) + act_bytes(a.inp) + act_bytes(a.weight) * 2;
  }
  if (!a.inp_pre_act.empty()) {
    const ActivationBackwardArgs act{a.dinp, a.dinp, a.inp_pre_act, a.act};
    c.flops += cost(act).flops;
    c.bytes += act_bytes(a.inp_pre_act);
  }
  const OpCost adapters = lora_backward_cost(a.lora, a.inp, !a.dinp.empty());
  c.flops += adapters.flops;
  c.bytes += adapters.bytes;
  return c;
}

}  // namespace remat
