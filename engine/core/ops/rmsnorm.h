// RMSNorm over the last dimension (Llama family): out = weight * (x / sqrt(mean(x^2) + eps)),
// the statistics in f32 whatever the activation dtype, the normalized row cast to the activation
// dtype before the weight multiplies it, as transformers' LlamaRMSNorm does. Also the per-head
// RMSNorm of q and k (Qwen3's qk_norm) over a fused qkv row. Arguments, shape checks, FLOPs and
// bytes. Kernels: engine/cpu/rmsnorm.cpp, engine/cuda/rmsnorm.cpp (+ rmsnorm.cu); tests:
// tests/ops/test_rmsnorm.cpp.
#pragma once

#include "engine/core/error.h"
#include "engine/core/ops/op.h"
#include "engine/core/tensor.h"

namespace remat {

struct RmsNormForwardArgs {
  Tensor out;     // (N, C) act
  Tensor rstd;    // (N) f32: 1 / sqrt(mean(x^2) + eps) per row
  Tensor inp;     // (N, C) act
  Tensor weight;  // (C) f32
  float eps = 1e-5f;
};

struct RmsNormBackwardArgs {
  Tensor dinp;     // (N, C) act [+=] residual stream
  Tensor dweight;  // (C) f32 [+=]; empty: a frozen weight, no weight gradient
  Tensor dout;     // (N, C) act
  Tensor inp;      // (N, C) act
  Tensor weight;   // (C) f32
  Tensor rstd;     // (N) f32
};

/// Per-head RMSNorm of the q and k heads of a fused qkv row (B*T, (NH + 2 KVH) * HS): each of the
/// NH query heads is normalized over its HS dimensions and multiplied by q_weight, each of the
/// KVH key heads by k_weight; the KVH value heads are copied unchanged.
struct QkNormForwardArgs {
  Tensor out;       // (N, (NH + 2 KVH) HS) act
  Tensor rstd;      // (N, NH + KVH) f32
  Tensor inp;       // (N, (NH + 2 KVH) HS) act
  Tensor q_weight;  // (HS) f32
  Tensor k_weight;  // (HS) f32
  int n_head = 1;
  int n_kv_head = 1;
  float eps = 1e-6f;
};

struct QkNormBackwardArgs {
  Tensor dinp;       // (N, (NH + 2 KVH) HS) act [=]
  Tensor dq_weight;  // (HS) f32 [+=]; empty: frozen
  Tensor dk_weight;  // (HS) f32 [+=]; empty: frozen
  Tensor dout;       // (N, (NH + 2 KVH) HS) act
  Tensor inp;        // (N, (NH + 2 KVH) HS) act
  Tensor q_weight;   // (HS) f32
  Tensor k_weight;   // (HS) f32
  Tensor rstd;       // (N, NH + KVH) f32
  int n_head = 1;
  int n_kv_head = 1;
};

inline void check(const RmsNormForwardArgs& a) {
  check_rows(a.out, a.inp, "rmsnorm_forward");
  REMAT_ASSERT(a.out.numel() == a.inp.numel() && a.weight.numel() == a.inp.dim(-1) &&
                   a.rstd.dtype == DType::F32 && a.rstd.numel() == a.inp.rows() && a.eps > 0,
               "rmsnorm_forward: out {} inp {} weight {} rstd {} eps {}", a.out.shape_str(),
               a.inp.shape_str(), a.weight.shape_str(), a.rstd.shape_str(), a.eps);
}
inline OpCost cost(const RmsNormForwardArgs& a) {
  return {4.0 * static_cast<double>(a.inp.numel()),
          act_bytes(a.inp) + act_bytes(a.out) + act_bytes(a.rstd)};
}

inline void check(const RmsNormBackwardArgs& a) {
  check_rows(a.dinp, a.inp, "rmsnorm_backward");
  check_rows(a.dout, a.inp, "rmsnorm_backward");
  REMAT_ASSERT(a.dinp.numel() == a.inp.numel() && a.dout.numel() == a.inp.numel() &&
                   a.weight.numel() == a.inp.dim(-1) &&
                   (a.dweight.empty() || a.dweight.numel() == a.weight.numel()) &&
                   a.rstd.numel() == a.inp.rows(),
               "rmsnorm_backward: dinp {} dout {} inp {} weight {} rstd {}", a.dinp.shape_str(),
               a.dout.shape_str(), a.inp.shape_str(), a.weight.shape_str(), a.rstd.shape_str());
}
// 8 FLOPs per element, 3 of them the weight gradient (dout x rstd, summed over the rows).
inline OpCost cost(const RmsNormBackwardArgs& a) {
  OpCost c{8.0 * static_cast<double>(a.inp.numel()),
           act_bytes(a.inp) + act_bytes(a.dout) + 2 * act_bytes(a.dinp) + act_bytes(a.rstd)};
  if (a.dweight.empty()) {
    c.flops -= 3.0 * static_cast<double>(a.inp.numel());
    c.skipped_flops = 3.0 * static_cast<double>(a.inp.numel());
  }
  return c;
}

/// Head size of a fused qkv row of `width` columns with NH query and KVH key/value heads.
inline int64_t qkv_head_size(int64_t width, int n_head, int n_kv_head) {
  return width / (n_head + 2 * n_kv_head);
}

inline void check(const QkNormForwardArgs& a) {
  const int64_t W = a.inp.dim(-1), HS = qkv_head_size(W, a.n_head, a.n_kv_head);
  REMAT_ASSERT(a.n_head > 0 && a.n_kv_head > 0 && a.n_head % a.n_kv_head == 0 &&
                   HS * (a.n_head + 2 * a.n_kv_head) == W && a.out.numel() == a.inp.numel() &&
                   a.q_weight.numel() == HS && a.k_weight.numel() == HS &&
                   a.rstd.numel() == a.inp.rows() * (a.n_head + a.n_kv_head) && a.eps > 0,
               "qk_norm_forward: out {} inp {} heads {}/{} q_weight {} rstd {}", a.out.shape_str(),
               a.inp.shape_str(), a.n_head, a.n_kv_head, a.q_weight.shape_str(),
               a.rstd.shape_str());
}
inline OpCost cost(const QkNormForwardArgs& a) {
  return {4.0 * static_cast<double>(a.inp.numel()),
          act_bytes(a.inp) + act_bytes(a.out) + act_bytes(a.rstd)};
}

inline void check(const QkNormBackwardArgs& a) {
  const int64_t W = a.inp.dim(-1), HS = qkv_head_size(W, a.n_head, a.n_kv_head);
  REMAT_ASSERT(a.n_head > 0 && a.n_kv_head > 0 && HS * (a.n_head + 2 * a.n_kv_head) == W &&
                   a.dinp.numel() == a.inp.numel() && a.dout.numel() == a.inp.numel() &&
                   (a.dq_weight.empty() || a.dq_weight.numel() == HS) &&
                   (a.dk_weight.empty() || a.dk_weight.numel() == HS) &&
                   a.rstd.numel() == a.inp.rows() * (a.n_head + a.n_kv_head),
               "qk_norm_backward: dinp {} dout {} inp {} heads {}/{} rstd {}", a.dinp.shape_str(),
               a.dout.shape_str(), a.inp.shape_str(), a.n_head, a.n_kv_head, a.rstd.shape_str());
}
// As RMSNorm's, over the q and k heads' share of each row for each weight gradient left out.
inline OpCost cost(const QkNormBackwardArgs& a) {
  OpCost c{8.0 * static_cast<double>(a.inp.numel()),
           act_bytes(a.inp) + act_bytes(a.dout) + act_bytes(a.dinp) + act_bytes(a.rstd)};
  const double per_head = static_cast<double>(a.inp.numel()) / (a.n_head + 2 * a.n_kv_head);
  const double frozen =
      (a.dq_weight.empty() ? a.n_head : 0) + (a.dk_weight.empty() ? a.n_kv_head : 0);
  c.flops -= 3.0 * per_head * frozen;
  c.skipped_flops = 3.0 * per_head * frozen;
  return c;
}

}  // namespace remat
