// Hugging Face model folders, the tensor side (docs/hf.md): `train --init hf:DIR` reads
// model.safetensors, or the shards model.safetensors.index.json lists, into the model's f32
// weights; `export --hf OUT` writes them back under transformers' names and layouts. The name
// mapping is engine/model_files/hf_names's (hf::mappings), so both directions read the same table.
//
// Reading streams: each file is memory-mapped, each tensor converted (F32, BF16, F16 -> f32,
// exactly), reshaped into one of our parameters and uploaded, and its pages given back before the
// next; host memory holds one parameter at a time, never a file. Every name and shape is checked
// before the first upload, so a folder refused for them leaves the model as it was; the values
// are checked as they are converted (a NaN or an infinity is refused, naming the file and tensor,
// and the caller stops with the model partly loaded). A folder holding both model.safetensors and
// an index loads model.safetensors, as transformers does.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/core/backend.h"
#include "engine/model.h"
#include "engine/model_files/hf_names.h"

namespace remat::hf {

/// Loads the weights of the Hugging Face folder `dir` into `model` (built from `m`, which
/// read_model_keys made from the same folder, possibly with another vocab_size). Throws
/// CheckpointError naming the tensor and its file when one is missing, left over, mis-shaped, of
/// another dtype or holds a NaN or an infinity. Returns one line for the banner: files, dtypes, and
/// what was padded, stripped or skipped.
std::string load_weights(const std::string& dir, const ModelConfig& m, Backend& be, Model& model);

/// The f32 values of one of our parameters, by name (a checkpoint's tensor, a gradient, ...).
using ParamSource = std::function<std::vector<float>(const std::string& name)>;

/// Calls `sink` with every Hugging Face tensor of `m`'s parameters, in model order, as f32
/// (q/k/v split, GPT-2's Conv1D weights transposed back). The tests compare gradients this way.
void for_each_tensor(const ModelConfig& m, const ParamSource& source,
                     const std::function<void(const Piece&, const std::vector<float>&)>& sink);

struct WriteOptions {
  bool bf16 = true;  // else f32
  /// Above this many bytes of tensors the weights go into shards with an index, as
  /// save_pretrained does (its default max_shard_size is "5GB").
  uint64_t shard_bytes = 5'000'000'000;
};

/// Writes the weights of `m` into the existing folder `dir`: model.safetensors, or
/// model-0000i-of-0000n.safetensors and model.safetensors.index.json. Every file is fsync'd.
/// Returns the files written.
std::vector<std::string> write_weights(const std::string& dir, const ModelConfig& m,
                                       const ParamSource& source, const WriteOptions& opt);

}  // namespace remat::hf
