// GPT block forward/backward against the backend interface (see layers/gpt_block.h).
#include "layers/gpt_block.h"

#include <algorithm>

#include "engine/core/rng.h"

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
      seed_(s.seed),
      tile_tokens_(s.tile_tokens),
      attention_chunk_(s.attention_chunk),
      ring_(s.ring),
      first_row_(s.first_row),
      dropout_salt_(s.dropout_salt),
      doc_start_(s.doc_start),
      mean_doc_tokens_(s.mean_doc_tokens),
      lora_(s.lora, index) {}

DropoutArgs GptBlock::dropout_args(const Tensor& out, const Tensor& inp, Site site,
                                   int64_t first_row) const {
  const uint64_t stream =
      mix64(mix64(static_cast<uint64_t>(step_)) ^ (static_cast<uint64_t>(index_) << 8) ^ site) ^
      dropout_salt_;
  return DropoutArgs{out,   inp,    active_dropout(),
                     seed_, stream, static_cast<uint64_t>((first_row_ + first_row) * C_)};
}

void GptBlock::branch_forward(Backend& be, const Tensor& out, const Tensor& base, const Tensor& inp,
                              const Param* w, const Param* b, std::span<const LoraAdapter> adapters,
                              Site site, int64_t first_row) {
  if (active_dropout() == 0) {  // accumulate straight into the residual: no temporary
    be.copy(out, base);
    be.linear_forward({.out = out,
                       .inp = inp,
                       .weight = w->value,
                       .bias = b->value,
                       .accumulate = true,
                       .lora = lora_.forward_terms(adapters, inp, first_row)});
    return;
  }
  Buffer proj = be.pool().allocate({out.rows(), C_}, be.act_dtype(), MemCategory::Transient,
                                   site == AttnOut ? "attn.proj" : "mlp.proj");
  be.linear_forward({.out = proj,
                     .inp = inp,
                     .weight = w->value,
                     .bias = b->value,
                     .lora = lora_.forward_terms(adapters, inp, first_row)});
  be.dropout(dropout_args(proj, proj, site, first_row));
  be.add(out, base, proj);
}

void GptBlock::fc_forward(Backend& be, const Tensor& fc, const Tensor& gelu, const Tensor& ln2,
                          int64_t first_row) const {
  // GELU fused into the fc GEMM's epilogue, after the bias and the adapters' terms.
  be.linear_forward({.out = fc,
                     .inp = ln2,
                     .weight = p_.mlp_fc_weight->value,
                     .bias = p_.mlp_fc_bias->value,
                     .act_out = gelu,
                     .act = Activation::Gelu,
                     .lora = lora_.forward_terms(p_.lora_fc, ln2, first_row)});
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

// A tiled block's slots are the first kNumTiledSlots of kSlots (the MLP's come last).
template <class T>
const std::vector<T>& tiled_prefix(const std::vector<T>& all) {
  static const std::vector<T> prefix(all.begin(), all.begin() + GptBlock::kNumTiledSlots);
  return prefix;
}

}  // namespace

const std::vector<std::string>& GptBlock::act_names() const {
  return tiled() ? tiled_prefix(slot_names<kSlots>()) : slot_names<kSlots>();
}
const std::vector<ActKind>& GptBlock::act_kinds() const {
  return tiled() ? tiled_prefix(slot_kinds<kSlots>()) : slot_kinds<kSlots>();
}

GptBlock::MlpChunk GptBlock::allocate_mlp_chunk(Backend& be) const {
  const int64_t rows = std::min(tile_tokens_, B_ * T_);
  const DType act = be.act_dtype();
  MemoryPool& pool = be.pool();
  return {pool.allocate({rows, C_}, act, MemCategory::Transient, "mlp.tile.ln2"),
          pool.allocate({rows, 2}, DType::F32, MemCategory::Transient, "mlp.tile.ln2.stats"),
          pool.allocate({rows, FF_}, act, MemCategory::Transient, "mlp.tile.fc"),
          pool.allocate({rows, FF_}, act, MemCategory::Transient, "mlp.tile.gelu")};
}

void GptBlock::mlp_chunk_forward(Backend& be, const MlpChunk& c, const Tensor& res, int64_t r0,
                                 int64_t n) const {
  const Tensor ln2 = c.ln2.tensor().row_range(0, n);
  be.layernorm_forward({ln2, c.ln2_stats.tensor().row_range(0, n), res.row_range(r0, n),
                        p_.ln2_weight->value, p_.ln2_bias->value});
  fc_forward(be, c.fc.tensor().row_range(0, n), c.gelu.tensor().row_range(0, n), ln2, r0);
}

void GptBlock::mlp_forward_tiled(Backend& be, const Tensor& res, const Tensor& y) {
  const int64_t N = B_ * T_;
  const MlpChunk c = allocate_mlp_chunk(be);
  be.for_each_row_tile(N, tile_tokens_, [&](int64_t r0, int64_t n) {
    mlp_chunk_forward(be, c, res, r0, n);
    branch_forward(be, y.row_range(r0, n), res.row_range(r0, n), c.gelu.tensor().row_range(0, n),
                   p_.mlp_proj_weight, p_.mlp_proj_bias, p_.lora_mlp_proj, MlpOut, r0);
  });
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
    const Tensor& qkv = make(Qkv, {B_, T_, 3 * C_}, act);
    be.linear_forward({.out = qkv,
                       .inp = a.get(Ln1),
                       .weight = p_.attn_qkv_weight->value,
                       .bias = p_.attn_qkv_bias->value,
                       .lora = lora_.forward_terms(p_.lora_qkv, a.get(Ln1))});
  }
  if (!a.has(Attn) || !a.has(AttnLse)) {
    const AttentionForwardArgs args{make(Attn, {B_, T_, C_}, act),
                                    make(AttnLse, {B_, NH_, T_}, DType::F32),
                                    a.get(Qkv),
                                    static_cast<int>(NH_),
                                    rope_theta_,
                                    0,
                                    {},
                                    attention_chunk_,
                                    documents(),
                                    mean_doc_tokens_};
    if (ring_)
      ring_->forward(be, args);
    else
      be.attention_forward(args);
  }
  if (!a.has(Res)) {
    branch_forward(be, make(Res, {B_, T_, C_}, act), a.get(X), a.get(Attn), p_.attn_proj_weight,
                   p_.attn_proj_bias, p_.lora_proj, AttnOut);
  }
  if (tiled()) {  // the MLP half has no slots: it runs, chunk by chunk, when y is wanted
    if (!y.empty()) mlp_forward_tiled(be, a.get(Res), y);
    return;
  }
  if (!a.has(Ln2) || !a.has(Ln2Stats)) {
    be.layernorm_forward({make(Ln2, {B_, T_, C_}, act), make(Ln2Stats, {N, 2}, DType::F32),
                          a.get(Res), p_.ln2_weight->value, p_.ln2_bias->value});
  }
  if (!a.has(Fc) && !a.has(Gelu)) {
    const Tensor& fc = make(Fc, {B_, T_, FF_}, act);
    fc_forward(be, fc, make(Gelu, {B_, T_, FF_}, act), a.get(Ln2), 0);
  } else if (!a.has(Fc)) {
    const Tensor& fc = make(Fc, {B_, T_, FF_}, act);
    be.linear_forward({.out = fc,
                       .inp = a.get(Ln2),
                       .weight = p_.mlp_fc_weight->value,
                       .bias = p_.mlp_fc_bias->value,
                       .lora = lora_.forward_terms(p_.lora_fc, a.get(Ln2))});
  } else if (!a.has(Gelu)) {
    be.activation_forward({make(Gelu, {B_, T_, FF_}, act), a.get(Fc), Activation::Gelu});
  }
  if (!y.empty())
    branch_forward(be, y, a.get(Res), a.get(Gelu), p_.mlp_proj_weight, p_.mlp_proj_bias,
                   p_.lora_mlp_proj, MlpOut);
}

Tensor GptBlock::branch_grad(Backend& be, const Tensor& dres, Site site, int64_t first_row,
                             Buffer& scratch) const {
  if (active_dropout() == 0) return dres;
  scratch =
      be.pool().allocate({dres.rows(), C_}, be.act_dtype(), MemCategory::Transient, "grad.dropout");
  be.dropout(dropout_args(scratch, dres, site, first_row));
  return scratch;
}

void GptBlock::mlp_backward_rows(Backend& be, const MlpActs& m, const Tensor& res,
                                 const Tensor& dresid, int64_t r0, int64_t n) {
  MemoryPool& pool = be.pool();
  const DType act = be.act_dtype();
  // y = res + dropout(gelu Wp^T + bp)
  const Tensor dres = dresid.row_range(r0, n);
  Buffer dmlp_scratch;
  const Tensor dmlp = branch_grad(be, dres, MlpOut, r0, dmlp_scratch);
  // d fc straight from the projection's backward: the GELU's backward is its dinp epilogue, after
  // the adapters' share of d gelu.
  Buffer dgelu = pool.allocate({n, FF_}, act, MemCategory::Transient, "grad.gelu");
  be.linear_backward({.dinp = dgelu,
                      .dweight = p_.mlp_proj_weight->grad,
                      .dbias = p_.mlp_proj_bias->grad,
                      .dout = dmlp,
                      .inp = m.gelu,
                      .weight = p_.mlp_proj_weight->value,
                      .inp_pre_act = m.fc,
                      .act = Activation::Gelu,
                      .lora = lora_.backward_terms(p_.lora_mlp_proj, m.gelu, r0)});
  dmlp_scratch.reset();
  Buffer dln2 = pool.allocate({n, C_}, act, MemCategory::Transient, "grad.ln2");
  be.linear_backward({.dinp = dln2,
                      .dweight = p_.mlp_fc_weight->grad,
                      .dbias = p_.mlp_fc_bias->grad,
                      .dout = dgelu,
                      .inp = m.ln2,
                      .weight = p_.mlp_fc_weight->value,
                      .lora = lora_.backward_terms(p_.lora_fc, m.ln2, r0)});
  dgelu.reset();
  be.layernorm_backward({dres, p_.ln2_weight->grad, p_.ln2_bias->grad, dln2, res.row_range(r0, n),
                         p_.ln2_weight->value, m.ln2_stats});
}

void GptBlock::mlp_backward_tiled(Backend& be, const Tensor& res, const Tensor& dresid) {
  const int64_t N = B_ * T_;
  const MlpChunk c = allocate_mlp_chunk(be);
  be.for_each_row_tile(N, tile_tokens_, [&](int64_t r0, int64_t n) {
    const Phase outer = be.phase();  // the chunk's forward counts as recompute
    be.set_phase(Phase::Recompute);
    mlp_chunk_forward(be, c, res, r0, n);
    be.set_phase(outer);
    mlp_backward_rows(be,
                      {c.ln2.tensor().row_range(0, n), c.ln2_stats.tensor().row_range(0, n),
                       c.fc.tensor().row_range(0, n), c.gelu.tensor().row_range(0, n)},
                      res, dresid, r0, n);
  });
}

void GptBlock::backward(Backend& be, ActStore& a, const Tensor& dresid) {
  MemoryPool& pool = be.pool();
  const DType act = be.act_dtype();
  if (tiled()) {
    mlp_backward_tiled(be, a.get(Res), dresid);
  } else {
    mlp_backward_rows(be, {a.get(Ln2), a.get(Ln2Stats), a.get(Fc), a.get(Gelu)}, a.get(Res), dresid,
                      0, B_ * T_);
    for (Slot s : {Ln2, Ln2Stats, Fc, Gelu}) a.release(s);
  }
  // Each activation is freed as soon as the backward has read it for the last time: the
  // attention half's peak then holds neither res nor the MLP's tensors.
  a.release(Res);
  // Attention branch: res = x + dropout(attn Wo^T + bo)
  Buffer dproj_scratch;
  const Tensor dproj = branch_grad(be, dresid, AttnOut, 0, dproj_scratch);
  Buffer dattn = pool.allocate({B_, T_, C_}, act, MemCategory::Transient, "grad.attn");
  be.linear_backward({.dinp = dattn,
                      .dweight = p_.attn_proj_weight->grad,
                      .dbias = p_.attn_proj_bias->grad,
                      .dout = dproj,
                      .inp = a.get(Attn),
                      .weight = p_.attn_proj_weight->value,
                      .lora = lora_.backward_terms(p_.lora_proj, a.get(Attn))});
  dproj_scratch.reset();
  // Attention's backward is the block's peak, so what it does not read is freed before it: ln1
  // (next read by the qkv GEMM's backward) is recomputed from x after it, with the same bits
  // (LayerNorm is deterministic; its statistics are rewritten unchanged). Like flash attention
  // recomputing its probabilities, that is part of the backward's FLOPs, not remat's recompute;
  // and where the backend's backward takes D = rowsum(dO * O) instead of O, D is formed now and O
  // freed.
  a.release(Ln1);  // until after attention's backward
  Buffer delta;
  if (!be.attention_backward_needs_out()) {
    delta = pool.allocate({B_, NH_, T_}, DType::F32, MemCategory::Transient, "attn.delta");
    be.attention_delta({delta, dattn, a.get(Attn), static_cast<int>(NH_)});
    a.release(Attn);
  }
  Buffer dqkv = pool.allocate({B_, T_, 3 * C_}, act, MemCategory::Transient, "grad.qkv");
  const AttentionBackwardArgs args{.dqkv = dqkv,
                                   .dout = dattn,
                                   .qkv = a.get(Qkv),
                                   .out = delta.empty() ? a.get(Attn) : Tensor{},
                                   .lse = a.get(AttnLse),
                                   .n_head = static_cast<int>(NH_),
                                   .rope_theta = rope_theta_,
                                   .delta = delta,
                                   .chunk_tokens = attention_chunk_,
                                   .doc_start = documents(),
                                   .mean_doc_tokens = mean_doc_tokens_};
  if (ring_)
    ring_->backward(be, args);
  else
    be.attention_backward(args);
  delta.reset();
  dattn.reset();
  for (Slot s : {Qkv, Attn, AttnLse}) a.release(s);
  a.peak_passed();  // what is left (x, ln1, dqkv, dln1) is well below the attention step
  be.layernorm_forward({a.make(be, Ln1, {B_, T_, C_}, act, act_names()), a.get(Ln1Stats), a.get(X),
                        p_.ln1_weight->value, p_.ln1_bias->value});
  Buffer dln1 = pool.allocate({B_, T_, C_}, act, MemCategory::Transient, "grad.ln1");
  be.linear_backward({.dinp = dln1,
                      .dweight = p_.attn_qkv_weight->grad,
                      .dbias = p_.attn_qkv_bias->grad,
                      .dout = dqkv,
                      .inp = a.get(Ln1),
                      .weight = p_.attn_qkv_weight->value,
                      .lora = lora_.backward_terms(p_.lora_qkv, a.get(Ln1))});
  dqkv.reset();
  a.release(Ln1);
  be.layernorm_backward({dresid, p_.ln1_weight->grad, p_.ln1_bias->grad, dln1, a.get(X),
                         p_.ln1_weight->value, a.get(Ln1Stats)});
}

}  // namespace remat
