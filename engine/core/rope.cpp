// RoPE's frequencies and attention factor for each scaling type (see engine/core/ops/rope.h):
// transformers 4.57's _compute_{default,linear_scaling,dynamic_ntk,yarn,llama3}_parameters, in
// double.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "engine/core/ops/rope.h"

namespace remat {
namespace {

// yarn's get_mscale: 0.1 m ln(scale) + 1 past scale 1.
double yarn_mscale(double scale, double m) {
  return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

// yarn's find_correction_dim: the dimension (of HS) whose wavelength fits `rotations` times
// into the original context.
double yarn_correction_dim(double rotations, double HS, double theta, double context) {
  return HS * std::log(context / (rotations * 2 * std::numbers::pi)) / (2 * std::log(theta));
}

void scale_llama3(std::vector<double>& f, const RopeScaling& s) {
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

// Pair i keeps its own frequency (extrapolation) below the ramp, takes inv / factor
// (interpolation) above it, and a linear blend across it.
void scale_yarn(std::vector<double>& f, int64_t HS, double theta, const RopeScaling& s) {
  const double dim = static_cast<double>(HS), ctx = static_cast<double>(s.original_context);
  double low = yarn_correction_dim(s.beta_fast, dim, theta, ctx);
  double high = yarn_correction_dim(s.beta_slow, dim, theta, ctx);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
  for (size_t i = 0; i < f.size(); ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    f[i] = f[i] / s.factor * ramp + f[i] * (1 - ramp);
  }
}

}  // namespace

double rope_dynamic_theta(int64_t HS, double theta, const RopeScaling& s) {
  const double max_pos = static_cast<double>(s.original_context);
  const double len = std::max(static_cast<double>(s.seq_len), max_pos);
  const double dim = static_cast<double>(HS);
  return theta * std::pow(s.factor * len / max_pos - (s.factor - 1), dim / (dim - 2));
}

std::vector<double> rope_inv_freq(int64_t HS, double theta, const RopeScaling& s) {
  const int64_t half = HS / 2;
  const double base = s.kind == RopeScaling::Dynamic ? rope_dynamic_theta(HS, theta, s) : theta;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    f[static_cast<size_t>(i)] =
        std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(HS));
  switch (s.kind) {
    case RopeScaling::Linear:  // position interpolation: t / factor, folded into the frequency
      for (double& inv : f) inv /= s.factor;
      break;
    case RopeScaling::Yarn:
      scale_yarn(f, HS, theta, s);
      break;
    case RopeScaling::Llama3:
      scale_llama3(f, s);
      break;
    case RopeScaling::None:
    case RopeScaling::Dynamic:  // its base did it
      break;
  }
  return f;
}

double rope_attention_factor(const RopeScaling& s) {
  if (s.kind != RopeScaling::Yarn) return 1.0;
  if (s.attention_factor) return *s.attention_factor;
  if (s.mscale != 0 && s.mscale_all_dim != 0)
    return yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim);
  return yarn_mscale(s.factor, 1.0);
}

void RopeAngles::cos_sin(int64_t pos, float* cs, float* sn) const {
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double ang = static_cast<double>(pos) * inv_freq[i];
    cs[i] = static_cast<float>(std::cos(ang) * attention_factor);
    sn[i] = static_cast<float>(std::sin(ang) * attention_factor);
  }
}

RopeAngles rope_angles(int64_t HS, double theta, const RopeScaling& s) {
  return {rope_inv_freq(HS, theta, s), rope_attention_factor(s)};
}

}  // namespace remat
