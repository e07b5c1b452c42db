// Rotary position embedding (RoPE) as Llama-family models define it: the frequencies of a head
// of HS dimensions, optionally rescaled for a longer context (Llama 3's "llama3" scaling). Shared
// by every backend's attention (which rotates q and k inside the op) and by the tests, so that
// all of them rotate by the same angles.
//
// Layout (Hugging Face's rotate_half): dimension i of a head pairs with dimension i + HS/2, both
// rotated by the angle t * inv_freq[i] at position t, for i < HS/2. Not the interleaved (2i, 2i+1)
// pairs of the original paper and of Meta's own checkpoints.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

namespace remat {

/// model.rope_scaling: how the frequencies are stretched past the context the model was trained
/// at. Llama3 is transformers' `_compute_llama3_parameters`: wavelengths longer than
/// original_context / low_freq_factor are divided by `factor`, those shorter than
/// original_context / high_freq_factor are kept, and those between are blended smoothly.
struct RopeScaling {
  enum Kind : uint8_t { None, Llama3 } kind = None;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_context = 8192;  // original_max_position_embeddings
  bool operator==(const RopeScaling&) const = default;
};

/// The HS / 2 inverse frequencies of a head, in double: theta^(-2i / HS), then scaled.
inline std::vector<double> rope_inv_freq(int64_t HS, double theta, const RopeScaling& s = {}) {
  const int64_t half = HS / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    f[static_cast<size_t>(i)] =
        std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(HS));
  if (s.kind == RopeScaling::Llama3) {
    const double old_ctx = static_cast<double>(s.original_context);
    const double low_freq_wavelen = old_ctx / s.low_freq_factor;
    const double high_freq_wavelen = old_ctx / s.high_freq_factor;
    for (double& inv : f) {
      const double wavelen = 2 * std::numbers::pi / inv;
      if (wavelen > low_freq_wavelen) {
        inv /= s.factor;
      } else if (wavelen >= high_freq_wavelen) {  // medium: blend the scaled and the original
        const double smooth =
            (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        inv = (1 - smooth) * inv / s.factor + smooth * inv;
      }
    }
  }
  return f;
}

}  // namespace remat
