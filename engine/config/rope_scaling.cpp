// The rope_scaling key list (see engine/config/rope_scaling.h).
#include "engine/config/rope_scaling.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <optional>

namespace remat {
namespace {

// Every key a type may take, in the order rope_scaling_entries writes them.
const std::vector<std::string>& keys_of(RopeScaling::Kind kind) {
  static const std::vector<std::string> none,
      linear = {"factor"}, dynamic = {"factor", "original_max_position_embeddings"},
      yarn = {"factor",    "original_max_position_embeddings",
              "beta_fast", "beta_slow",
              "truncate",  "attention_factor",
              "mscale",    "mscale_all_dim"},
      llama3 = {"factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings"};
  switch (kind) {
    case RopeScaling::Linear:
      return linear;
    case RopeScaling::Dynamic:
      return dynamic;
    case RopeScaling::Yarn:
      return yarn;
    case RopeScaling::Llama3:
      return llama3;
    case RopeScaling::None:
      break;
  }
  return none;
}

std::string example(RopeScaling::Kind kind) {
  switch (kind) {
    case RopeScaling::Linear:
      return "{ rope_type = \"linear\", factor = 4.0 }";
    case RopeScaling::Dynamic:
      return "{ rope_type = \"dynamic\", factor = 4.0, original_max_position_embeddings = 4096 }";
    case RopeScaling::Yarn:
      return "{ rope_type = \"yarn\", factor = 4.0, original_max_position_embeddings = 32768 }";
    case RopeScaling::Llama3:
      return "{ rope_type = \"llama3\", factor = 8.0, low_freq_factor = 1.0, high_freq_factor = "
             "4.0, original_max_position_embeddings = 8192 }";
    case RopeScaling::None:
      break;
  }
  return "\"none\"";
}

// Reads one key's value into `s`; range checks as transformers' validation asks (its warnings
// become refusals here).
void read_key(RopeScaling& s, const RopeKey& k) {
  const double* num = std::get_if<double>(&k.value);
  auto number = [&](double lo, double hi, const char* range) {
    if (!num)
      throw RopeScalingProblem(k.name, fmt::format("expected a number, got {}", k.shown),
                               "write a number");
    if (!(*num >= lo && *num <= hi))
      throw RopeScalingProblem(k.name, fmt::format("{} is out of range ({})", *num, range),
                               "use the value of the model's config.json");
    return *num;
  };
  constexpr double kHuge = 1e6;
  if (k.name == "factor") {
    s.factor = number(1.0, kHuge, "1 to 1e6");
  } else if (k.name == "original_max_position_embeddings") {
    if (!num || !k.is_integer || *num < 1)
      throw RopeScalingProblem(k.name,
                               fmt::format("expected a positive integer, got {}",
                                           num && k.is_integer ? fmt::format("{}", *num) : k.shown),
                               "write the context length the model was trained at, e.g. 8192");
    s.original_context = static_cast<int64_t>(*num);
  } else if (k.name == "low_freq_factor") {
    s.low_freq_factor = number(1e-6, kHuge, "1e-6 to 1e6");
  } else if (k.name == "high_freq_factor") {
    s.high_freq_factor = number(1e-6, kHuge, "1e-6 to 1e6");
  } else if (k.name == "beta_fast") {
    s.beta_fast = number(1e-6, kHuge, "1e-6 to 1e6");
  } else if (k.name == "beta_slow") {
    s.beta_slow = number(1e-6, kHuge, "1e-6 to 1e6");
  } else if (k.name == "attention_factor") {
    s.attention_factor = number(1e-6, kHuge, "1e-6 to 1e6");
  } else if (k.name == "mscale") {
    s.mscale = number(0.0, kHuge, "0 to 1e6; 0 is unset");
  } else if (k.name == "mscale_all_dim") {
    s.mscale_all_dim = number(0.0, kHuge, "0 to 1e6; 0 is unset");
  } else if (k.name == "truncate") {
    const bool* b = std::get_if<bool>(&k.value);
    if (!b)
      throw RopeScalingProblem(k.name, fmt::format("expected true or false, got {}", k.shown),
                               "write true (transformers' default) or false");
    s.truncate = *b;
  }
}

}  // namespace

RopeScaling parse_rope_scaling(const std::string& type, const std::vector<RopeKey>& keys) {
  std::optional<RopeScaling::Kind> kind;
  for (const auto& [name, k] : kRopeTypes)
    if (type == name) kind = k;
  if (type == "none") kind = RopeScaling::None;
  if (!kind)
    throw RopeScalingProblem(
        "rope_type", fmt::format("RoPE scaling \"{}\" is not supported", type),
        fmt::format("use one of {} (or \"default\" for none)", kScaledRopeTypes));
  RopeScaling s;
  s.kind = *kind;
  const std::vector<std::string>& takes = keys_of(s.kind);
  const std::string takes_list =
      takes.empty() ? std::string("no other key") : fmt::format("{}", fmt::join(takes, ", "));
  for (const RopeKey& k : keys) {
    if (std::find(takes.begin(), takes.end(), k.name) == takes.end()) {
      bool known = k.name == "factor";
      for (const auto& [name, other] : kRopeTypes) {
        const std::vector<std::string>& of = keys_of(other);
        known = known || std::find(of.begin(), of.end(), k.name) != of.end();
      }
      throw RopeScalingProblem(
          k.name,
          known ? fmt::format("does not apply to rope_type \"{}\"", type)
                : fmt::format("unknown key '{}' in rope_scaling", k.name),
          fmt::format("rope_type \"{}\" takes {}; e.g. {}", type, takes_list, example(s.kind)));
    }
    read_key(s, k);
  }
  auto given = [&](const char* name) {
    return std::any_of(keys.begin(), keys.end(), [&](const RopeKey& k) { return k.name == name; });
  };
  if (s.kind == RopeScaling::None) return {};
  std::vector<std::string> required = {"factor"};
  if (s.kind != RopeScaling::Linear) required.emplace_back("original_max_position_embeddings");
  if (s.kind == RopeScaling::Llama3) {
    required.emplace_back("low_freq_factor");
    required.emplace_back("high_freq_factor");
  }
  std::vector<std::string> missing;
  for (const std::string& name : required)
    if (!given(name.c_str())) missing.push_back(name);
  if (!missing.empty())
    throw RopeScalingProblem(
        "", fmt::format("rope_type \"{}\" needs {}", type, fmt::join(missing, ", ")),
        fmt::format("write e.g. {}", example(s.kind)));
  if (s.kind == RopeScaling::Llama3 && !(s.high_freq_factor > s.low_freq_factor))
    throw RopeScalingProblem("high_freq_factor",
                             fmt::format("high_freq_factor = {} must exceed low_freq_factor = {}",
                                         s.high_freq_factor, s.low_freq_factor),
                             "use the values of the model's config.json (Llama 3.1: 1.0 and 4.0)");
  if (s.kind == RopeScaling::Yarn && !(s.beta_fast > s.beta_slow))
    throw RopeScalingProblem(
        "beta_fast",
        fmt::format("beta_fast = {} must exceed beta_slow = {}", s.beta_fast, s.beta_slow),
        "leave both out for transformers' 32 and 1");
  return s;
}

std::vector<std::pair<std::string, RopeValue>> rope_scaling_entries(const RopeScaling& s) {
  std::vector<std::pair<std::string, RopeValue>> out;
  if (s.kind == RopeScaling::None) return out;
  out.emplace_back("rope_type", std::string(rope_type_name(s.kind)));
  for (const std::string& key : keys_of(s.kind)) {
    if (key == "factor") out.emplace_back(key, s.factor);
    if (key == "original_max_position_embeddings") out.emplace_back(key, s.original_context);
    if (key == "low_freq_factor") out.emplace_back(key, s.low_freq_factor);
    if (key == "high_freq_factor") out.emplace_back(key, s.high_freq_factor);
    if (key == "beta_fast") out.emplace_back(key, s.beta_fast);
    if (key == "beta_slow") out.emplace_back(key, s.beta_slow);
    if (key == "truncate") out.emplace_back(key, s.truncate);
    if (key == "attention_factor" && s.attention_factor) out.emplace_back(key, *s.attention_factor);
    if (key == "mscale" && s.mscale != 0) out.emplace_back(key, s.mscale);
    if (key == "mscale_all_dim" && s.mscale_all_dim != 0) out.emplace_back(key, s.mscale_all_dim);
  }
  return out;
}

}  // namespace remat
