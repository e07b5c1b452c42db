// What kind of computation produced a saved activation: the vocabulary remat policies are written
// in (engine/config/policy.h) and blocks label their slots with (engine/model.h), so that a block
// says what it saved without knowing which policy keeps it.
#pragma once

#include <cstdint>

namespace remat {

/// save_dots keeps Dot and Attention outputs, save_attn keeps Attention outputs.
enum class ActKind : uint8_t { Input, Norm, Dot, Attention, Pointwise };

}  // namespace remat
