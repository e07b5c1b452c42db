// Token (+ learned position) embedding: arguments, shape checks, FLOPs and bytes. Kernels:
// engine/cpu/embedding.cpp, engine/cuda/embedding.cpp (+ elementwise.cu); workspace (CUDA
// backward): engine/core/cuda_workspace.h; tests: tests/ops/test_embedding.cpp.
#pragma once

#include "engine/core/error.h"
#include "engine/core/ops/op.h"
#include "engine/core/tensor.h"

namespace remat {

struct EmbeddingForwardArgs {
  Tensor out;     // (B, T, C) act = wte[tokens] (+ wpe[t - doc_start])
  Tensor tokens;  // (B, T) i32
  Tensor wte;     // (V, C) f32, or bf16 when frozen under lora.base = "bf16" or "nf4"
  Tensor wpe;     // (maxT, C) f32, optional (rope models have none)
  // Documents (engine/core/ops/attention.h): the learned position of token t is t - doc_start,
  // restarting at 0 in every document. Empty: t.
  Tensor doc_start{};  // (B, T) i32
};

struct EmbeddingBackwardArgs {
  Tensor dwte;         // (V, C) f32 [+=], optional (empty: a frozen embedding)
  Tensor dwpe;         // (maxT, C) f32 [+=], optional (rope models, or frozen); not both empty
  Tensor dout;         // (B, T, C) act
  Tensor tokens;       // (B, T) i32
  Tensor doc_start{};  // (B, T) i32, as in EmbeddingForwardArgs
};

inline void check(const EmbeddingForwardArgs& a) {
  REMAT_ASSERT(a.wte.dtype == DType::F32 || a.wte.dtype == DType::BF16,
               "embedding_forward: a {} token table (f32 or bf16)", dtype_name(a.wte.dtype));
  REMAT_ASSERT(a.tokens.dtype == DType::I32 && a.out.numel() == a.tokens.numel() * a.wte.dim(1),
               "embedding_forward: out {} tokens {} wte {}", a.out.shape_str(),
               a.tokens.shape_str(), a.wte.shape_str());
  REMAT_ASSERT(a.wpe.empty() || a.wpe.dim(0) >= a.tokens.dim(1),
               "embedding_forward: wpe {} shorter than T={}", a.wpe.shape_str(), a.tokens.dim(1));
  REMAT_ASSERT(a.doc_start.empty() || a.doc_start.numel() == a.tokens.numel(),
               "embedding_forward: doc_start {} tokens {}", a.doc_start.shape_str(),
               a.tokens.shape_str());
}
inline OpCost cost(const EmbeddingForwardArgs& a) {
  return {static_cast<double>(a.out.numel()), 3 * act_bytes(a.out)};
}

inline void check(const EmbeddingBackwardArgs& a) {
  REMAT_ASSERT(!a.dwte.empty() || !a.dwpe.empty(),
               "embedding_backward: neither dwte nor dwpe (a frozen stem calls no backward)");
  const Tensor& table = a.dwte.empty() ? a.dwpe : a.dwte;
  REMAT_ASSERT(a.dout.numel() == a.tokens.numel() * table.dim(1),
               "embedding_backward: dout {} tokens {}", a.dout.shape_str(), a.tokens.shape_str());
  REMAT_ASSERT(a.doc_start.empty() || a.doc_start.numel() == a.tokens.numel(),
               "embedding_backward: doc_start {} tokens {}", a.doc_start.shape_str(),
               a.tokens.shape_str());
}
// Two FLOPs per element with the token table (as counted since the first version, whether or
// not there are position rows), one for the position rows alone (a frozen token table).
inline OpCost cost(const EmbeddingBackwardArgs& a) {
  const double n = static_cast<double>(a.dout.numel());
  return {(a.dwte.empty() ? 1.0 : 2.0) * n, 3 * act_bytes(a.dout)};
}

}  // namespace remat
