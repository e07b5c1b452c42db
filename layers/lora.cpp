// LoRA in a block (see layers/lora.h).
#include "layers/lora.h"

#include "engine/core/rng.h"

namespace remat {

// The stream mixes (step, block, adapter) as the GPT block's own dropout does
// (layers/gpt_block.cpp) with the adapter's site offset past the GPT's two sites, so no two masks
// of a step coincide.
LoraDropout BlockLora::dropout(const LoraAdapter& ad, int64_t first_row, int64_t width) const {
  if (!training_ || s_.dropout == 0) return {};
  constexpr uint64_t kFirstSite = 16;
  const uint64_t stream = mix64(mix64(static_cast<uint64_t>(step_)) ^
                                (static_cast<uint64_t>(block_) << 8) ^ (kFirstSite + ad.site)) ^
                          s_.salt;
  return {s_.dropout, s_.seed, stream, static_cast<uint64_t>((s_.first_row + first_row) * width)};
}

void BlockLora::forward(Backend& be, std::span<const LoraAdapter> adapters, const Tensor& out,
                        const Tensor& inp, int64_t first_row) const {
  for (const LoraAdapter& ad : adapters)
    be.lora_forward({.out = out,
                     .inp = inp,
                     .a = ad.a->value,
                     .b = ad.b->value,
                     .col0 = ad.col0,
                     .scale = s_.scale,
                     .dropout = dropout(ad, first_row, inp.dim(-1))});
}

void BlockLora::backward(Backend& be, std::span<const LoraAdapter> adapters, const Tensor& dinp,
                         const Tensor& dout, const Tensor& inp, int64_t first_row) const {
  for (const LoraAdapter& ad : adapters)
    be.lora_backward({.dinp = dinp,
                      .da = ad.a->grad,
                      .db = ad.b->grad,
                      .dout = dout,
                      .inp = inp,
                      .a = ad.a->value,
                      .b = ad.b->value,
                      .col0 = ad.col0,
                      .scale = s_.scale,
                      .dropout = dropout(ad, first_row, inp.dim(-1))});
}

}  // namespace remat
