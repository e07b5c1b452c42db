// A LoRA adapter on a base linear's output (docs/lora.md): arguments, shape checks, FLOPs and
// bytes. The block runs the base linear (its weight frozen), then this op adds the adapter's term
// to some of its output columns:
//   out[:, col0 : col0 + n] += s (drop(inp) A^T) B^T        A (r, C), B (n, r), s = scale
// Columns, not the whole output, because one of our weights can be several Hugging Face modules
// side by side (Llama's fused q|k|v: q_proj is columns [0, Q) of its output, k_proj the next KV),
// each with an adapter of its own. The (N, r) product h = s drop(inp) A^T is never stored: the
// backward recomputes it (2 N C r FLOPs, small beside the base linear's 2 N C n) rather than the
// block saving an activation for each adapter.
// Backward, with g = dout[:, col0 : col0 + n]:
//   dB += g^T h        dh = s g B        dA += dh^T drop(inp)        dinp += drop'(dh A)
// dinp ADDS: it is the base linear's input gradient, which that linear's backward wrote (=) just
// before; the one exception to the activation gradients' [=] beside the residual stream.
// Dropout (peft's lora_dropout) is the dropout op's counter-based mask over the (N, C) input,
// redrawn identically in the backward and in any recompute.
// Kernels: engine/cpu/lora.cpp, engine/cuda/lora.cpp; workspaces: engine/core/cpu_workspace.h,
// engine/core/cuda_workspace.h; tests: tests/ops/test_lora.cpp.
#pragma once

#include "engine/core/error.h"
#include "engine/core/ops/op.h"
#include "engine/core/tensor.h"

namespace remat {

/// The adapter input's dropout: element i of the (N, C) input is kept iff
/// rng_uniform(seed, stream, first_index + i) >= p, as DropoutArgs (engine/core/ops/activation.h).
struct LoraDropout {
  float p = 0;
  uint64_t seed = 0;
  uint64_t stream = 0;
  uint64_t first_index = 0;
};

struct LoraForwardArgs {
  Tensor out;  // (N, OC) act [+=], columns [col0, col0 + n): the base linear's output
  Tensor inp;  // (N, C) act: the base linear's input
  Tensor a;    // (r, C) f32
  Tensor b;    // (n, r) f32
  int64_t col0 = 0;
  float scale = 1;
  LoraDropout dropout{};
};

struct LoraBackwardArgs {
  Tensor dinp;  // (N, C) act [+=], optional: the base linear's input gradient
  Tensor da;    // (r, C) f32 [+=]
  Tensor db;    // (n, r) f32 [+=]
  Tensor dout;  // (N, OC) act: the base output's gradient (columns [col0, col0 + n) are read)
  Tensor inp;   // (N, C) act
  Tensor a;     // (r, C) f32
  Tensor b;     // (n, r) f32
  int64_t col0 = 0;
  float scale = 1;
  LoraDropout dropout{};
};

inline void check_lora_shapes(const char* op, const Tensor& out, const Tensor& inp, const Tensor& a,
                              const Tensor& b, int64_t col0, float p) {
  const int64_t N = inp.rows(), C = inp.dim(-1), r = a.dim(0), n = b.dim(0);
  REMAT_ASSERT(a.ndim() == 2 && b.ndim() == 2 && a.dim(1) == C && b.dim(1) == r &&
                   a.dtype == DType::F32 && b.dtype == DType::F32,
               "{}: A {} and B {} for an input of width {}", op, a.shape_str(), b.shape_str(), C);
  REMAT_ASSERT(out.rows() == N && col0 >= 0 && col0 + n <= out.dim(-1),
               "{}: columns [{}, {}) of {} for {} rows", op, col0, col0 + n, out.shape_str(), N);
  REMAT_ASSERT(p >= 0 && p < 1, "{}: dropout p = {}", op, p);
}

inline void check(const LoraForwardArgs& a) {
  check_lora_shapes("lora_forward", a.out, a.inp, a.a, a.b, a.col0, a.dropout.p);
}
inline void check(const LoraBackwardArgs& a) {
  check_lora_shapes("lora_backward", a.dout, a.inp, a.a, a.b, a.col0, a.dropout.p);
  REMAT_ASSERT(a.da.numel() == a.a.numel() && a.db.numel() == a.b.numel(),
               "lora_backward: dA {} dB {} for A {} B {}", a.da.shape_str(), a.db.shape_str(),
               a.a.shape_str(), a.b.shape_str());
  REMAT_ASSERT(a.dinp.empty() || a.dinp.numel() == a.inp.numel(), "lora_backward: dinp {}",
               a.dinp.shape_str());
}

// h = drop(inp) A^T (2 N C r), out += h B^T (2 N r n), and the dropout (3 per input element).
inline OpCost cost(const LoraForwardArgs& a) {
  const double N = static_cast<double>(a.inp.rows()), C = static_cast<double>(a.inp.dim(-1)),
               r = static_cast<double>(a.a.dim(0)), n = static_cast<double>(a.b.dim(0));
  const double drop = a.dropout.p > 0 ? 3.0 * N * C : 0.0;
  const double act = static_cast<double>(dtype_size(a.inp.dtype));
  return {2.0 * N * C * r + 2.0 * N * r * n + drop,
          act * (N * C + 2.0 * N * n) + act_bytes(a.a) + act_bytes(a.b) + 8.0 * N * r};
}
// The recomputed h (2 N C r), dB (2 N n r), dh (2 N n r), dA (2 N r C), dinp (2 N r C), and with
// dropout its mask twice (the input's, and the input gradient's) and the gradient's add.
inline OpCost cost(const LoraBackwardArgs& a) {
  const double N = static_cast<double>(a.inp.rows()), C = static_cast<double>(a.inp.dim(-1)),
               r = static_cast<double>(a.a.dim(0)), n = static_cast<double>(a.b.dim(0));
  const bool has_dinp = !a.dinp.empty();
  const double drop =
      a.dropout.p > 0 ? 3.0 * N * C * (has_dinp ? 2.0 : 1.0) + (has_dinp ? N * C : 0.0) : 0.0;
  const double act = static_cast<double>(dtype_size(a.inp.dtype));
  return {2.0 * N * C * r * (has_dinp ? 3.0 : 2.0) + 4.0 * N * n * r + drop,
          act * (N * C + N * n + (has_dinp ? 2.0 * N * C : 0.0)) + 2 * act_bytes(a.a) +
              2 * act_bytes(a.b) + 16.0 * N * r};
}

}  // namespace remat
