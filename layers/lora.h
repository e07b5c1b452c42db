// LoRA in a block (docs/lora.md): a block's adapted linears each carry a list of adapters (one per
// Hugging Face module the linear is: Llama's fused q|k|v has up to three), which the block hands
// to the linear op itself (engine/core/ops/lora.h):
//   forward:  out = x W^T (+ b), each adapter adding s (drop(x) A^T) B^T to its columns;
//   backward: dx = dout W + each adapter's share (the frozen W gets no gradient), dA and dB
//             accumulated.
// The adapter's input x is the base linear's input, a tensor the block holds anyway (saved or
// recomputed under the remat plan), so adapters add no slot. Dropout masks come from the
// counter-based RNG keyed by (seed, step, block, adapter) and the rows' place in the whole batch,
// so a recompute, a tile of rows or another rank's share draws exactly the mask one whole pass
// would.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/core/backend.h"
#include "engine/model.h"

namespace remat {

/// One adapter: its A (r, in) and B (cols, r) parameters and the output columns it adds to.
struct LoraAdapter {
  Param* a = nullptr;
  Param* b = nullptr;
  int64_t col0 = 0;
  uint64_t site = 0;  // distinct per adapter of a block: its dropout stream
};

/// What the adapters of every block share: the scale and the dropout, with where this rank's rows
/// and masks sit in the job (as the GPT block's own dropout: engine/parallel).
struct LoraShared {
  float scale = 1;
  float dropout = 0;
  uint64_t seed = 0;      // train.seed
  int64_t first_row = 0;  // data parallel: this rank's first row of the batch
  uint64_t salt = 0;      // context parallel: this rank's own mask stream
};

/// The adapters' side of one block: the linear op's adapter arguments, with the step's dropout
/// streams.
class BlockLora {
 public:
  BlockLora() = default;
  BlockLora(const LoraShared& shared, int64_t block) : s_(shared), block_(block) {}
  void begin_step(int64_t step) { step_ = step; }
  void set_training(bool training) { training_ = training; }
  /// The adapters of a linear whose input `inp` (rows, C) is rows [first_row, first_row + rows)
  /// of the block's (a tile of the MLP's, or all): for its forward (A, B), or for its backward
  /// (also their gradients dA, dB). None for a linear without adapters.
  LinearLora forward_terms(std::span<const LoraAdapter> adapters, const Tensor& inp,
                           int64_t first_row = 0) const;
  LinearLora backward_terms(std::span<const LoraAdapter> adapters, const Tensor& inp,
                            int64_t first_row = 0) const;

 private:
  LoraDropout dropout(const LoraAdapter& ad, int64_t first_row, int64_t width) const;
  LoraShared s_;
  int64_t block_ = 0;
  int64_t step_ = 0;
  bool training_ = true;
};

}  // namespace remat
