// GPT block forward/backward against the backend interface (see layers/gpt_block.h).
#include "layers/gpt_block.h"

#include "engine/rng.h"

namespace remat {

GptBlock::GptBlock(GptBlockParams p, const GptBlockShape& s, int64_t index)
    : p_(p),
      B_(s.B),
      T_(s.T),
      C_(s.C),
      NH_(s.NH),
      FF_(s.FF),
      rope_theta_(s.rope_theta),
      index_(index),
      dropout_(s.dropout),
      seed_(s.seed) {}

DropoutArgs GptBlock::dropout_args(const Tensor& out, const Tensor& inp, Site site) const {
  const uint64_t stream =
      mix64(mix64(static_cast<uint64_t>(step_)) ^ (static_cast<uint64_t>(index_) << 8) ^ site);
  return DropoutArgs{out, inp, active_dropout(), seed_, stream};
}

void GptBlock::branch_forward(Backend& be, const Tensor& out, const Tensor& base, const Tensor& inp,
                              const Param* w, const Param* b, Site site) {
  if (active_dropout() == 0) {  // accumulate straight into the residual: no temporary
    be.copy(out, base);
    be.linear_forward({out, inp, w->value, b->value, true});
    return;
  }
  Buffer proj = be.pool().allocate({B_, T_, C_}, be.act_dtype(), MemCategory::Transient,
                                   site == AttnOut ? "attn.proj" : "mlp.proj");
  be.linear_forward({proj, inp, w->value, b->value});
  be.dropout(dropout_args(proj, proj, site));
  be.add(out, base, proj);
}

namespace {

// The saved activations of a GPT block `blocks.i`, in slot order: name, kind, shape, and what
// needs each one in the backward pass. res is the attention projection GEMM's output (plus the
// residual), so it counts as a dot.
using K = ActKind;
constexpr SlotInfo<GptBlock::Slot> kSlots[] = {
    {GptBlock::X, "x", K::Input},                   // (B,T,C)   block input        -> ln1 backward
    {GptBlock::Ln1, "ln1", K::Norm},                // (B,T,C)   LayerNorm 1 output -> qkv GEMM dW
    {GptBlock::Ln1Stats, "ln1.stats", K::Norm},     // (B,T,2)   f32 mean, rstd     -> ln1 backward
    {GptBlock::Qkv, "qkv", K::Dot},                 // (B,T,3C)  fused q|k|v        -> attention bwd
    {GptBlock::Attn, "attn", K::Attention},         // (B,T,C)   attention output   -> proj dW, attn
    {GptBlock::AttnLse, "attn.lse", K::Attention},  // (B,NH,T)  f32 log-sum-exp    -> attention bwd
    {GptBlock::Res, "res", K::Dot},                 // (B,T,C)   x + proj(attn)     -> ln2 backward
    {GptBlock::Ln2, "ln2", K::Norm},                // (B,T,C)   LayerNorm 2 output -> fc GEMM dW
    {GptBlock::Ln2Stats, "ln2.stats", K::Norm},     // (B,T,2)   f32                -> ln2 backward
    {GptBlock::Fc, "fc", K::Dot},                   // (B,T,FF)  fc GEMM output     -> gelu backward
    {GptBlock::Gelu, "gelu", K::Pointwise},         // (B,T,FF)  GELU output        -> mlp.proj dW
};
static_assert(std::size(kSlots) == GptBlock::kNumSlots && slots_in_order(kSlots),
              "kSlots lists every slot of GptBlock::Slot, in order");

}  // namespace

const std::vector<std::string>& GptBlock::act_names() const {
  return slot_names<kSlots>();
}
const std::vector<ActKind>& GptBlock::act_kinds() const {
  return slot_kinds<kSlots>();
}

void GptBlock::forward(Backend& be, ActStore& a, const Tensor& y) {
  const auto& names = act_names();
  const DType act = be.act_dtype();
  const int64_t N = B_ * T_;
  auto make = [&](Slot s, std::vector<int64_t> shape, DType dt) -> const Tensor& {
    return a.make(be, s, shape, dt, names);
  };
  // Each step runs only when one of its outputs is missing: a recompute reuses saved tensors.
  if (!a.has(Ln1) || !a.has(Ln1Stats)) {
    be.layernorm_forward({make(Ln1, {B_, T_, C_}, act), make(Ln1Stats, {N, 2}, DType::F32),
                          a.get(X), p_.ln1_weight->value, p_.ln1_bias->value});
  }
  if (!a.has(Qkv)) {
    be.linear_forward({make(Qkv, {B_, T_, 3 * C_}, act), a.get(Ln1), p_.attn_qkv_weight->value,
                       p_.attn_qkv_bias->value});
  }
  if (!a.has(Attn) || !a.has(AttnLse)) {
    be.attention_forward({make(Attn, {B_, T_, C_}, act), make(AttnLse, {B_, NH_, T_}, DType::F32),
                          a.get(Qkv), static_cast<int>(NH_), rope_theta_});
  }
  if (!a.has(Res)) {
    branch_forward(be, make(Res, {B_, T_, C_}, act), a.get(X), a.get(Attn), p_.attn_proj_weight,
                   p_.attn_proj_bias, AttnOut);
  }
  if (!a.has(Ln2) || !a.has(Ln2Stats)) {
    be.layernorm_forward({make(Ln2, {B_, T_, C_}, act), make(Ln2Stats, {N, 2}, DType::F32),
                          a.get(Res), p_.ln2_weight->value, p_.ln2_bias->value});
  }
  if (!a.has(Fc) && !a.has(Gelu)) {  // GELU fused into the fc GEMM's epilogue
    const Tensor& fc = make(Fc, {B_, T_, FF_}, act);
    be.linear_forward({.out = fc,
                       .inp = a.get(Ln2),
                       .weight = p_.mlp_fc_weight->value,
                       .bias = p_.mlp_fc_bias->value,
                       .act_out = make(Gelu, {B_, T_, FF_}, act),
                       .act = Activation::Gelu});
  } else if (!a.has(Fc)) {
    be.linear_forward(
        {make(Fc, {B_, T_, FF_}, act), a.get(Ln2), p_.mlp_fc_weight->value, p_.mlp_fc_bias->value});
  } else if (!a.has(Gelu)) {
    be.activation_forward({make(Gelu, {B_, T_, FF_}, act), a.get(Fc), Activation::Gelu});
  }
  if (!y.empty())
    branch_forward(be, y, a.get(Res), a.get(Gelu), p_.mlp_proj_weight, p_.mlp_proj_bias, MlpOut);
}

void GptBlock::backward(Backend& be, ActStore& a, const Tensor& dresid) {
  MemoryPool& pool = be.pool();
  const DType act = be.act_dtype();
  // The gradient reaching a branch's projection: dresid through the branch's dropout mask.
  auto branch_grad = [&](Site site, Buffer& scratch) -> Tensor {
    if (active_dropout() == 0) return dresid;
    scratch = pool.allocate({B_, T_, C_}, act, MemCategory::Transient, "grad.dropout");
    be.dropout(dropout_args(scratch, dresid, site));
    return scratch;
  };
  // MLP branch: y = res + dropout(gelu Wp^T + bp)
  Buffer dmlp_scratch;
  const Tensor dmlp = branch_grad(MlpOut, dmlp_scratch);
  // d fc straight from the projection's backward: the GELU's backward is its dinp epilogue.
  Buffer dgelu = pool.allocate({B_, T_, FF_}, act, MemCategory::Transient, "grad.gelu");
  be.linear_backward({.dinp = dgelu,
                      .dweight = p_.mlp_proj_weight->grad,
                      .dbias = p_.mlp_proj_bias->grad,
                      .dout = dmlp,
                      .inp = a.get(Gelu),
                      .weight = p_.mlp_proj_weight->value,
                      .inp_pre_act = a.get(Fc),
                      .act = Activation::Gelu});
  dmlp_scratch.reset();
  Buffer dln2 = pool.allocate({B_, T_, C_}, act, MemCategory::Transient, "grad.ln2");
  be.linear_backward({dln2, p_.mlp_fc_weight->grad, p_.mlp_fc_bias->grad, dgelu, a.get(Ln2),
                      p_.mlp_fc_weight->value});
  dgelu.reset();
  be.layernorm_backward({dresid, p_.ln2_weight->grad, p_.ln2_bias->grad, dln2, a.get(Res),
                         p_.ln2_weight->value, a.get(Ln2Stats)});
  dln2.reset();
  // Attention branch: res = x + dropout(attn Wo^T + bo)
  Buffer dproj_scratch;
  const Tensor dproj = branch_grad(AttnOut, dproj_scratch);
  Buffer dattn = pool.allocate({B_, T_, C_}, act, MemCategory::Transient, "grad.attn");
  be.linear_backward({dattn, p_.attn_proj_weight->grad, p_.attn_proj_bias->grad, dproj, a.get(Attn),
                      p_.attn_proj_weight->value});
  dproj_scratch.reset();
  Buffer dqkv = pool.allocate({B_, T_, 3 * C_}, act, MemCategory::Transient, "grad.qkv");
  be.attention_backward(
      {dqkv, dattn, a.get(Qkv), a.get(Attn), a.get(AttnLse), static_cast<int>(NH_), rope_theta_});
  dattn.reset();
  Buffer dln1 = pool.allocate({B_, T_, C_}, act, MemCategory::Transient, "grad.ln1");
  be.linear_backward({dln1, p_.attn_qkv_weight->grad, p_.attn_qkv_bias->grad, dqkv, a.get(Ln1),
                      p_.attn_qkv_weight->value});
  dqkv.reset();
  be.layernorm_backward({dresid, p_.ln1_weight->grad, p_.ln1_bias->grad, dln1, a.get(X),
                         p_.ln1_weight->value, a.get(Ln1Stats)});
}

}  // namespace remat
