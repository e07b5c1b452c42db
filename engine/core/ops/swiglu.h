// SwiGLU's gate (Llama-family MLPs): out = silu(gate) * up, silu(g) = g / (1 + exp(-g)), applied
// between the gate/up GEMMs and the down GEMM. Arguments, shape checks, FLOPs and bytes. Kernels:
// engine/cpu/swiglu.cpp, engine/cuda/swiglu.cpp (+ swiglu.cu); tests: tests/ops/test_swiglu.cpp.
#pragma once

#include "engine/core/error.h"
#include "engine/core/ops/op.h"
#include "engine/core/tensor.h"

namespace remat {

struct SwiGluForwardArgs {
  Tensor out;   // (N, FF) act
  Tensor gate;  // (N, FF) act
  Tensor up;    // (N, FF) act
};

struct SwiGluBackwardArgs {
  Tensor dgate;  // (N, FF) act [=]; may alias dout (each element is read before it is written)
  Tensor dup;    // (N, FF) act [=]
  Tensor dout;   // (N, FF) act
  Tensor gate;   // (N, FF) act
  Tensor up;     // (N, FF) act
};

inline void check(const SwiGluForwardArgs& a) {
  REMAT_ASSERT(a.out.numel() == a.gate.numel() && a.up.numel() == a.gate.numel(),
               "swiglu_forward: out {} gate {} up {}", a.out.shape_str(), a.gate.shape_str(),
               a.up.shape_str());
}
inline OpCost cost(const SwiGluForwardArgs& a) {
  return {6.0 * static_cast<double>(a.gate.numel()),
          act_bytes(a.gate) + act_bytes(a.up) + act_bytes(a.out)};
}

inline void check(const SwiGluBackwardArgs& a) {
  REMAT_ASSERT(a.dgate.numel() == a.gate.numel() && a.dup.numel() == a.gate.numel() &&
                   a.dout.numel() == a.gate.numel() && a.up.numel() == a.gate.numel(),
               "swiglu_backward: dgate {} dup {} dout {} gate {} up {}", a.dgate.shape_str(),
               a.dup.shape_str(), a.dout.shape_str(), a.gate.shape_str(), a.up.shape_str());
}
inline OpCost cost(const SwiGluBackwardArgs& a) {
  return {12.0 * static_cast<double>(a.gate.numel()), act_bytes(a.gate) + act_bytes(a.up) +
                                                          act_bytes(a.dout) + act_bytes(a.dgate) +
                                                          act_bytes(a.dup)};
}

}  // namespace remat
