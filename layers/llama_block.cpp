// Llama-family block forward/backward against the backend interface (see layers/llama_block.h).
#include "layers/llama_block.h"

#include <algorithm>
#include <utility>

namespace remat {
namespace {

// The saved activations of a Llama block `blocks.i`, in slot order: name, kind, and what needs
// each one in the backward pass. Dots are GEMM outputs (qkv, res, gate, up); the attention's
// output and log-sum-exp are Attention; the norms' outputs and statistics are Norm; the SwiGLU
// product is Pointwise. res is the o_proj GEMM's output plus the residual, so it counts as a dot.
using K = ActKind;
constexpr SlotInfo<LlamaBlock::Slot> kSlots[] = {
    {LlamaBlock::X, "x", K::Input},                   // (B,T,C)  block input     -> norm1 bwd
    {LlamaBlock::Norm1, "norm1", K::Norm},            // (B,T,C)  RMSNorm 1       -> qkv dW
    {LlamaBlock::Norm1Rstd, "norm1.rstd", K::Norm},   // (B*T)    f32 1/rms       -> norm1 bwd
    {LlamaBlock::Qkv, "qkv", K::Dot},                 // (B,T,W)  q|k|v           -> attention
    {LlamaBlock::QkvNormed, "qkv.normed", K::Norm},   // (B,T,W)  q, k normed     -> attention
    {LlamaBlock::QkvRstd, "qkv.rstd", K::Norm},       // (B*T,NH+KVH) f32         -> qk_norm bwd
    {LlamaBlock::Attn, "attn", K::Attention},         // (B,T,NH*HS) output       -> o_proj dW
    {LlamaBlock::AttnLse, "attn.lse", K::Attention},  // (B,NH,T) f32 log-sum-exp -> attention
    {LlamaBlock::Res, "res", K::Dot},                 // (B,T,C)  x + o_proj(attn) -> norm2 bwd
    {LlamaBlock::Norm2, "norm2", K::Norm},            // (B,T,C)  RMSNorm 2       -> gate/up dW
    {LlamaBlock::Norm2Rstd, "norm2.rstd", K::Norm},   // (B*T)    f32             -> norm2 bwd
    {LlamaBlock::Gate, "gate", K::Dot},               // (B,T,FF) gate GEMM       -> swiglu bwd
    {LlamaBlock::Up, "up", K::Dot},                   // (B,T,FF) up GEMM         -> swiglu bwd
    {LlamaBlock::Act, "act", K::Pointwise},           // (B,T,FF) silu(gate) * up -> down dW
};
static_assert(std::size(kSlots) == LlamaBlock::kNumSlots && slots_in_order(kSlots),
              "kSlots lists every slot of LlamaBlock::Slot, in order");

}  // namespace

LlamaBlock::LlamaBlock(LlamaBlockParams p, const LlamaBlockShape& s, int64_t index)
    : p_(std::move(p)), s_(s), index_(index), lora_(s.lora, index) {
  REMAT_ASSERT((p_.q_norm_weight == nullptr) == (p_.k_norm_weight == nullptr),
               "llama block {}: q_norm and k_norm come together", index);
  for (const auto& info : kSlots) {
    if (!qk_norm() && (info.slot == QkvNormed || info.slot == QkvRstd)) continue;
    if (tiled() && info.slot >= Norm2) break;
    names_.emplace_back(info.name);
    kinds_.push_back(info.kind);
  }
}

AttentionForwardArgs LlamaBlock::attention_args(const Tensor& out, const Tensor& lse,
                                                const Tensor& qkv) const {
  return {.out = out,
          .lse = lse,
          .qkv = qkv,
          .n_head = static_cast<int>(s_.NH),
          .rope_theta = s_.rope_theta,
          .n_kv_head = static_cast<int>(s_.KVH),
          .rope_scaling = s_.rope_scaling,
          .chunk_tokens = s_.attention_chunk,
          .doc_start = s_.doc_start ? *s_.doc_start : Tensor{},
          .mean_doc_tokens = s_.mean_doc_tokens};
}

LlamaBlock::MlpActs LlamaBlock::MlpChunk::rows(int64_t n) const {
  return {norm2.tensor().row_range(0, n), norm2_rstd.tensor().row_range(0, n),
          gate.tensor().row_range(0, n), up.tensor().row_range(0, n), act.tensor().row_range(0, n)};
}

LlamaBlock::MlpChunk LlamaBlock::allocate_mlp_chunk(Backend& be) const {
  const int64_t rows = std::min(s_.tile_tokens, s_.B * s_.T);
  const DType act = be.act_dtype();
  MemoryPool& pool = be.pool();
  return {pool.allocate({rows, s_.C}, act, MemCategory::Transient, "mlp.tile.norm2"),
          pool.allocate({rows, 1}, DType::F32, MemCategory::Transient, "mlp.tile.norm2.rstd"),
          pool.allocate({rows, s_.FF}, act, MemCategory::Transient, "mlp.tile.gate"),
          pool.allocate({rows, s_.FF}, act, MemCategory::Transient, "mlp.tile.up"),
          pool.allocate({rows, s_.FF}, act, MemCategory::Transient, "mlp.tile.act")};
}

void LlamaBlock::mlp_acts_forward(Backend& be, const MlpActs& m, const Tensor& res,
                                  int64_t r0) const {
  be.rmsnorm_forward({m.norm2, m.norm2_rstd, res.row_range(r0, m.norm2.rows()),
                      p_.norm2_weight->value, s_.norm_eps});
  be.linear_forward({.out = m.gate,
                     .inp = m.norm2,
                     .weight = p_.gate_weight->value,
                     .lora = lora_.forward_terms(p_.lora_gate, m.norm2, r0)});
  be.linear_forward({.out = m.up,
                     .inp = m.norm2,
                     .weight = p_.up_weight->value,
                     .lora = lora_.forward_terms(p_.lora_up, m.norm2, r0)});
  be.swiglu_forward({m.act, m.gate, m.up});
}

void LlamaBlock::mlp_out_forward(Backend& be, const Tensor& y, const Tensor& res, const Tensor& act,
                                 int64_t r0) const {
  be.copy(y, res);  // accumulate straight into the residual: no temporary
  be.linear_forward({.out = y,
                     .inp = act,
                     .weight = p_.down_weight->value,
                     .accumulate = true,
                     .lora = lora_.forward_terms(p_.lora_down, act, r0)});
}

void LlamaBlock::mlp_forward_tiled(Backend& be, const Tensor& res, const Tensor& y) const {
  const MlpChunk c = allocate_mlp_chunk(be);
  be.for_each_row_tile(s_.B * s_.T, s_.tile_tokens, [&](int64_t r0, int64_t n) {
    const MlpActs m = c.rows(n);
    mlp_acts_forward(be, m, res, r0);
    mlp_out_forward(be, y.row_range(r0, n), res.row_range(r0, n), m.act, r0);
  });
}

void LlamaBlock::forward(Backend& be, ActStore& a, const Tensor& y) {
  const DType act = be.act_dtype();
  const int64_t B = s_.B, T = s_.T, N = B * T;
  auto has = [&](Slot s) { return a.has(slot(s)); };
  auto get = [&](Slot s) -> const Tensor& { return a.get(slot(s)); };
  auto make = [&](Slot s, std::vector<int64_t> shape, DType dt) -> const Tensor& {
    return a.make(be, slot(s), shape, dt, names_);
  };
  // Each step runs only when one of its outputs is missing: a recompute reuses saved tensors.
  if (!has(Norm1) || !has(Norm1Rstd))
    be.rmsnorm_forward({make(Norm1, {B, T, s_.C}, act), make(Norm1Rstd, {N}, DType::F32), get(X),
                        p_.norm1_weight->value, s_.norm_eps});
  if (!has(Qkv)) {
    const Tensor& qkv = make(Qkv, {B, T, qkv_width()}, act);
    be.linear_forward({.out = qkv,
                       .inp = get(Norm1),
                       .weight = p_.qkv_weight->value,
                       .bias = p_.qkv_bias ? p_.qkv_bias->value.tensor() : Tensor(),
                       .lora = lora_.forward_terms(p_.lora_qkv, get(Norm1))});
  }
  if (qk_norm() && (!has(QkvNormed) || !has(QkvRstd)))
    be.qk_norm_forward({make(QkvNormed, {B, T, qkv_width()}, act),
                        make(QkvRstd, {N, s_.NH + s_.KVH}, DType::F32), get(Qkv),
                        p_.q_norm_weight->value, p_.k_norm_weight->value, static_cast<int>(s_.NH),
                        static_cast<int>(s_.KVH), s_.norm_eps});
  if (!has(Attn) || !has(AttnLse)) {
    const AttentionForwardArgs args =
        attention_args(make(Attn, {B, T, s_.NH * s_.HS}, act),
                       make(AttnLse, {B, s_.NH, T}, DType::F32), get(qk_norm() ? QkvNormed : Qkv));
    if (s_.ring)
      s_.ring->forward(be, args);
    else
      be.attention_forward(args);
  }
  if (!has(Res)) {
    const Tensor& res = make(Res, {B, T, s_.C}, act);
    be.copy(res, get(X));
    be.linear_forward({.out = res,
                       .inp = get(Attn),
                       .weight = p_.proj_weight->value,
                       .accumulate = true,
                       .lora = lora_.forward_terms(p_.lora_proj, get(Attn))});
  }
  if (tiled()) {  // the MLP half has no slots: it runs, chunk by chunk, when y is wanted
    if (!y.empty()) mlp_forward_tiled(be, get(Res), y);
    return;
  }
  if (!has(Norm2) || !has(Norm2Rstd))
    be.rmsnorm_forward({make(Norm2, {B, T, s_.C}, act), make(Norm2Rstd, {N}, DType::F32), get(Res),
                        p_.norm2_weight->value, s_.norm_eps});
  if (!has(Gate)) {
    const Tensor& gate = make(Gate, {B, T, s_.FF}, act);
    be.linear_forward({.out = gate,
                       .inp = get(Norm2),
                       .weight = p_.gate_weight->value,
                       .lora = lora_.forward_terms(p_.lora_gate, get(Norm2))});
  }
  if (!has(Up)) {
    const Tensor& up = make(Up, {B, T, s_.FF}, act);
    be.linear_forward({.out = up,
                       .inp = get(Norm2),
                       .weight = p_.up_weight->value,
                       .lora = lora_.forward_terms(p_.lora_up, get(Norm2))});
  }
  if (!has(Act)) be.swiglu_forward({make(Act, {B, T, s_.FF}, act), get(Gate), get(Up)});
  if (!y.empty()) mlp_out_forward(be, y, get(Res), get(Act), 0);
}

void LlamaBlock::mlp_backward_rows(Backend& be, const MlpActs& m, const Tensor& res,
                                   const Tensor& dresid, int64_t r0, ActStore* store) const {
  MemoryPool& pool = be.pool();
  const DType act = be.act_dtype();
  const int64_t n = m.norm2.rows();
  const Tensor dres = dresid.row_range(r0, n);
  // y = res + act Wd^T. Three (n, FF) tensors at most are live beside the saved ones: d act,
  // which becomes d gate in place (SwiGLU's backward allows it), and d up; act, then gate and up,
  // go as soon as they have been read for the last time.
  Buffer dgate = pool.allocate({n, s_.FF}, act, MemCategory::Transient, "grad.gate");
  be.linear_backward({.dinp = dgate,
                      .dweight = p_.down_weight->grad,
                      .dout = dres,
                      .inp = m.act,
                      .weight = p_.down_weight->value,
                      .lora = lora_.backward_terms(p_.lora_down, m.act, r0)});
  if (store) store->release(slot(Act));
  Buffer dup = pool.allocate({n, s_.FF}, act, MemCategory::Transient, "grad.up");
  be.swiglu_backward({dgate, dup, dgate, m.gate, m.up});
  if (store)
    for (Slot s : {Gate, Up}) store->release(slot(s));
  // d norm2 = dgate Wg + dup Wu: two GEMMs into two buffers, then one add.
  Buffer dnorm2 = pool.allocate({n, s_.C}, act, MemCategory::Transient, "grad.norm2");
  be.linear_backward({.dinp = dnorm2,
                      .dweight = p_.gate_weight->grad,
                      .dout = dgate,
                      .inp = m.norm2,
                      .weight = p_.gate_weight->value,
                      .lora = lora_.backward_terms(p_.lora_gate, m.norm2, r0)});
  dgate.reset();
  Buffer dnorm2_up = pool.allocate({n, s_.C}, act, MemCategory::Transient, "grad.norm2.up");
  be.linear_backward({.dinp = dnorm2_up,
                      .dweight = p_.up_weight->grad,
                      .dout = dup,
                      .inp = m.norm2,
                      .weight = p_.up_weight->value,
                      .lora = lora_.backward_terms(p_.lora_up, m.norm2, r0)});
  dup.reset();
  be.add(dnorm2, dnorm2, dnorm2_up);
  dnorm2_up.reset();
  be.rmsnorm_backward({dres, p_.norm2_weight->grad, dnorm2, res.row_range(r0, n),
                       p_.norm2_weight->value, m.norm2_rstd});
}

void LlamaBlock::mlp_backward_tiled(Backend& be, const Tensor& res, const Tensor& dresid) const {
  const MlpChunk c = allocate_mlp_chunk(be);
  be.for_each_row_tile(s_.B * s_.T, s_.tile_tokens, [&](int64_t r0, int64_t n) {
    const MlpActs m = c.rows(n);
    const Phase outer = be.phase();  // the chunk's forward counts as recompute
    be.set_phase(Phase::Recompute);
    mlp_acts_forward(be, m, res, r0);
    be.set_phase(outer);
    mlp_backward_rows(be, m, res, dresid, r0);
  });
}

// Attention half: res = x + attn Wo^T, attn = attention(qk_norm(x Wqkv^T + b)). As in the GPT
// block, everything attention's backward does not read is freed before it (its the block's
// peak): norm1 is recomputed from x afterwards with the same bits, and where the backend takes
// D = rowsum(dO * O) instead of O, D is formed first and O freed.
void LlamaBlock::attention_backward(Backend& be, ActStore& a, const Tensor& dresid) const {
  MemoryPool& pool = be.pool();
  const DType act = be.act_dtype();
  const int64_t B = s_.B, T = s_.T;
  const int NH = static_cast<int>(s_.NH);
  Buffer dattn = pool.allocate({B, T, s_.NH * s_.HS}, act, MemCategory::Transient, "grad.attn");
  be.linear_backward({.dinp = dattn,
                      .dweight = p_.proj_weight->grad,
                      .dout = dresid,
                      .inp = a.get(slot(Attn)),
                      .weight = p_.proj_weight->value,
                      .lora = lora_.backward_terms(p_.lora_proj, a.get(slot(Attn)))});
  a.release(slot(Norm1));  // until after attention's backward
  Buffer delta;
  if (!be.attention_backward_needs_out()) {
    delta = pool.allocate({B, s_.NH, T}, DType::F32, MemCategory::Transient, "attn.delta");
    be.attention_delta({delta, dattn, a.get(slot(Attn)), NH});
    a.release(slot(Attn));
  }
  // With qk_norm, attention reads (and clobbers) the normed copy and hands its gradient to the
  // q/k norm's backward, which reads the unnormed qkv.
  const Slot attn_in = qk_norm() ? QkvNormed : Qkv;
  Buffer dqkv_attn = pool.allocate({B, T, qkv_width()}, act, MemCategory::Transient,
                                   qk_norm() ? "grad.qkv.normed" : "grad.qkv");
  const AttentionBackwardArgs args{.dqkv = dqkv_attn,
                                   .dout = dattn,
                                   .qkv = a.get(slot(attn_in)),
                                   .out = delta.empty() ? a.get(slot(Attn)) : Tensor{},
                                   .lse = a.get(slot(AttnLse)),
                                   .n_head = NH,
                                   .rope_theta = s_.rope_theta,
                                   .delta = delta,
                                   .n_kv_head = static_cast<int>(s_.KVH),
                                   .rope_scaling = s_.rope_scaling,
                                   .chunk_tokens = s_.attention_chunk,
                                   .doc_start = s_.doc_start ? *s_.doc_start : Tensor{},
                                   .mean_doc_tokens = s_.mean_doc_tokens};
  if (s_.ring)
    s_.ring->backward(be, args);
  else
    be.attention_backward(args);
  delta.reset();
  dattn.reset();
  for (Slot s : {attn_in, Attn, AttnLse}) a.release(slot(s));
  Buffer dqkv;
  if (qk_norm()) {
    dqkv = pool.allocate({B, T, qkv_width()}, act, MemCategory::Transient, "grad.qkv");
    be.qk_norm_backward({dqkv, p_.q_norm_weight->grad, p_.k_norm_weight->grad, dqkv_attn,
                         a.get(slot(Qkv)), p_.q_norm_weight->value, p_.k_norm_weight->value,
                         a.get(slot(QkvRstd)), NH, static_cast<int>(s_.KVH)});
    dqkv_attn.reset();
    a.release(slot(Qkv));
    a.release(slot(QkvRstd));
  } else {
    dqkv = std::move(dqkv_attn);
  }
  a.peak_passed();  // what is left (x, norm1, dqkv, dnorm1) is well below the attention step
  be.rmsnorm_forward({a.make(be, slot(Norm1), {B, T, s_.C}, act, names_), a.get(slot(Norm1Rstd)),
                      a.get(slot(X)), p_.norm1_weight->value, s_.norm_eps});
  Buffer dnorm1 = pool.allocate({B, T, s_.C}, act, MemCategory::Transient, "grad.norm1");
  be.linear_backward({.dinp = dnorm1,
                      .dweight = p_.qkv_weight->grad,
                      .dbias = p_.qkv_bias ? p_.qkv_bias->grad.tensor() : Tensor(),
                      .dout = dqkv,
                      .inp = a.get(slot(Norm1)),
                      .weight = p_.qkv_weight->value,
                      .lora = lora_.backward_terms(p_.lora_qkv, a.get(slot(Norm1)))});
  dqkv.reset();
  a.release(slot(Norm1));
  be.rmsnorm_backward({dresid, p_.norm1_weight->grad, dnorm1, a.get(slot(X)),
                       p_.norm1_weight->value, a.get(slot(Norm1Rstd))});
}

void LlamaBlock::backward(Backend& be, ActStore& a, const Tensor& dresid) {
  if (tiled()) {
    mlp_backward_tiled(be, a.get(slot(Res)), dresid);
  } else {
    mlp_backward_rows(be,
                      {a.get(slot(Norm2)), a.get(slot(Norm2Rstd)), a.get(slot(Gate)),
                       a.get(slot(Up)), a.get(slot(Act))},
                      a.get(slot(Res)), dresid, 0, &a);
    for (Slot s : {Norm2, Norm2Rstd, Gate, Up, Act}) a.release(slot(s));
  }
  a.release(slot(Res));
  attention_backward(be, a, dresid);
}

}  // namespace remat
