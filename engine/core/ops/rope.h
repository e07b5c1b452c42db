// Rotary position embedding (RoPE) as Llama-family models define it: the frequencies of a head
// of HS dimensions, optionally rescaled for a longer context (model.rope_scaling: transformers'
// "linear", "dynamic", "yarn" and "llama3" types), and the factor yarn multiplies cos and sin by.
// Shared by every backend's attention (which rotates q and k inside the op), the ring's ops, the
// KV-cached decoders and the tests, so that all of them rotate by the same angles.
//
// Layout (Hugging Face's rotate_half): dimension i of a head pairs with dimension i + HS/2, both
// rotated by the angle t * inv_freq[i] at position t, for i < HS/2. Not the interleaved (2i, 2i+1)
// pairs of the original paper and of Meta's own checkpoints.
//
// Every formula is transformers 4.57's (modeling_rope_utils.py, _compute_*_parameters), computed
// in double where transformers computes in float32 (engine/core/rope.cpp);
// docs/context-extension.md says what each type does. Partial rotary embeddings are not
// supported (model import refuses them).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace remat {

/// model.rope_scaling: how the frequencies are stretched past the context the model was trained
/// at. Each field says which types read it; the others ignore it.
struct RopeScaling {
  enum Kind : uint8_t { None, Linear, Dynamic, Yarn, Llama3 } kind = None;
  double factor = 1.0;  // every type: how many times longer the context gets
  // llama3: wavelengths longer than original_context / low_freq_factor are divided by `factor`,
  // those shorter than original_context / high_freq_factor are kept, those between are blended.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // llama3 and yarn: original_max_position_embeddings, the context the model was trained at.
  // dynamic: config.json's max_position_embeddings (what transformers 4.57 reads for it), the
  // length past which the base grows.
  int64_t original_context = 8192;
  // yarn: the ramp between extrapolated and interpolated frequencies runs over the dimensions
  // that turn between beta_slow and beta_fast times over original_context (transformers' `or`
  // defaults: 32 and 1); `truncate` rounds its ends outwards to whole dimensions.
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
  // yarn: the factor cos and sin are multiplied by. Unset: 0.1 ln(factor) + 1, or with both
  // mscale and mscale_all_dim set (non-zero, DeepSeek's form) the ratio of that formula with
  // each of them as the log's multiplier.
  std::optional<double> attention_factor{};
  double mscale = 0.0;  // 0: unset
  double mscale_all_dim = 0.0;
  // dynamic: the sequence length the base is scaled for, the run's seq_len (set by the model and
  // the decoder, never by a config; 0 counts as no longer than original_context).
  int64_t seq_len = 0;
  bool operator==(const RopeScaling&) const = default;
};

/// The rope_type spelling of each kind (transformers' names; None is "default").
inline constexpr std::array<std::pair<std::string_view, RopeScaling::Kind>, 5> kRopeTypes = {{
    {"default", RopeScaling::None},
    {"linear", RopeScaling::Linear},
    {"dynamic", RopeScaling::Dynamic},
    {"yarn", RopeScaling::Yarn},
    {"llama3", RopeScaling::Llama3},
}};
inline std::string_view rope_type_name(RopeScaling::Kind k) {
  for (const auto& [name, kind] : kRopeTypes)
    if (kind == k) return name;
  return "?";
}
/// "linear, dynamic, yarn, llama3": the scaled types, for messages.
inline constexpr std::string_view kScaledRopeTypes = "linear, dynamic, yarn, llama3";

/// The base dynamic NTK scaling rotates with at its seq_len: theta unchanged up to
/// original_context, then theta ((factor L / original) - (factor - 1))^(HS / (HS - 2)).
double rope_dynamic_theta(int64_t HS, double theta, const RopeScaling& s);

/// The HS / 2 inverse frequencies of a head, in double: theta^(-2i / HS), then scaled.
std::vector<double> rope_inv_freq(int64_t HS, double theta, const RopeScaling& s = {});

/// What cos and sin are multiplied by: yarn's attention factor (which scales the rotated q and k,
/// so the attention logits by its square), 1 for every other type.
double rope_attention_factor(const RopeScaling& s);

/// What a table of RoPE's cos and sin is made of, for a head of HS with base theta.
struct RopeAngles {
  std::vector<double> inv_freq;   // HS / 2
  double attention_factor = 1.0;  // rope_attention_factor
  /// cos and sin of pair i at position `pos`, as every CPU table stores them: the angle
  /// pos * inv_freq[i] in double (it reaches 1e6 at long context), times the attention factor,
  /// rounded to float. A factor of 1 leaves the unscaled values' bits.
  void cos_sin(int64_t pos, float* cs, float* sn) const;
};
RopeAngles rope_angles(int64_t HS, double theta, const RopeScaling& s = {});

}  // namespace remat
