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

LinearLora BlockLora::forward_terms(std::span<const LoraAdapter> adapters, const Tensor& inp,
                                    int64_t first_row) const {
  LinearLora l;
  l.scale = s_.scale;
  for (const LoraAdapter& ad : adapters)
    l.add({.a = ad.a->value,
           .b = ad.b->value,
           .col0 = ad.col0,
           .dropout = dropout(ad, first_row, inp.dim(-1))});
  return l;
}

LinearLora BlockLora::backward_terms(std::span<const LoraAdapter> adapters, const Tensor& inp,
                                     int64_t first_row) const {
  LinearLora l = forward_terms(adapters, inp, first_row);
  for (int i = 0; i < l.count; ++i) {
    l.adapters[static_cast<size_t>(i)].da = adapters[static_cast<size_t>(i)].a->grad;
    l.adapters[static_cast<size_t>(i)].db = adapters[static_cast<size_t>(i)].b->grad;
  }
  return l;
}

}  // namespace remat
