// The two models remat-train trains, built from a config for one (batch, sequence) shape:
//   GptModel: token (+ learned position) embedding, L pre-LN blocks, final LayerNorm, LM head
//             tied to the token embedding, mean next-token cross-entropy (fused and chunked).
//   MlpModel: the checkpointing tutorial's L relu layers on synthetic regression, MSE loss.
#pragma once

#include <memory>

#include "engine/config.h"
#include "engine/model.h"

namespace remat {

std::unique_ptr<Model> make_model(const Config& cfg, Backend& be);

}  // namespace remat
