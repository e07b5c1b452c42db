// model.rope_scaling as a list of keys: the one reader behind both of its spellings (the TOML
// table of [model], config.json's rope_scaling / rope_parameters dict), and the one list of keys
// each type writes back (state.json's config, the TOML an HF folder maps to, exported
// config.json). Key names and meanings are transformers 4.57's; engine/core/ops/rope.h computes
// with them. Which key each type takes:
//   linear   factor
//   dynamic  factor, original_max_position_embeddings (from config.json: its
//            max_position_embeddings, which transformers 4.57 reads for this type)
//   yarn     factor, original_max_position_embeddings, beta_fast, beta_slow, truncate,
//            attention_factor, mscale, mscale_all_dim
//   llama3   factor, low_freq_factor, high_freq_factor, original_max_position_embeddings
// A key a type does not take is refused (transformers only warns), as is an unknown type.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "engine/core/ops/rope.h"

namespace remat {

/// One key of a rope_scaling table as a file gives it. `value` holds what the key's type could
/// be read as: a number (an integer also as its double), a boolean, or nothing (another type;
/// `shown` then says what it was, for the message).
struct RopeKey {
  std::string name;
  std::variant<std::monostate, double, bool> value;
  bool is_integer = false;
  std::string shown;  // the value as written
};

/// What is wrong with one key (or the table when `key` is empty): the callers turn it into their
/// file's ConfigError (engine/config/config.cpp, engine/config/hf_config.cpp).
struct RopeScalingProblem : std::runtime_error {
  RopeScalingProblem(std::string key_, const std::string& problem, std::string fix_)
      : std::runtime_error(problem), key(std::move(key_)), fix(std::move(fix_)) {}
  std::string key;
  std::string fix;
};

/// Reads a rope_scaling table whose rope_type (or `type`) is `type` from its other `keys`.
/// "default" (and "none") is no scaling and takes no key. Throws RopeScalingProblem for an unknown
/// type (naming the supported ones), a key the type does not take, a value of the wrong kind or
/// out of range, or a required key missing (factor for every type; the original length for
/// dynamic, yarn and llama3; llama3's two frequency factors).
RopeScaling parse_rope_scaling(const std::string& type, const std::vector<RopeKey>& keys);

/// A value as rope_scaling_entries lists it.
using RopeValue = std::variant<double, int64_t, bool, std::string>;
/// rope_type, then every key of `s`'s type with its value, in transformers' names (optional yarn
/// keys only when set). Empty for no scaling. What parse_rope_scaling reads back to `s`.
std::vector<std::pair<std::string, RopeValue>> rope_scaling_entries(const RopeScaling& s);

}  // namespace remat
