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
#include <memory>
#include <nlohmann/json.hpp>
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

/// One of our parameters at a time from the Hugging Face folder `dir` of `m` (a LoRA run's frozen
/// base, for the merged export and `sample`): the same assembly as load_weights, without a model.
/// The constructor checks that every tensor `m` needs is there with its shape and a float dtype
/// (CheckpointError otherwise).
class FolderReader {
 public:
  FolderReader(const std::string& dir, const ModelConfig& m);
  ~FolderReader();
  FolderReader(const FolderReader&) = delete;
  FolderReader& operator=(const FolderReader&) = delete;
  /// Whether `ours` is one of the folder's parameters (a tied head is the embedding: no).
  bool has(const std::string& ours) const;
  /// Parameter `ours` as f32, in our layout.
  std::vector<float> read(const std::string& ours) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Calls `sink` with every Hugging Face tensor of `m`'s parameters, in model order, as f32
/// (q/k/v split, GPT-2's Conv1D weights transposed back). The tests compare gradients this way.
void for_each_tensor(const ModelConfig& m, const ParamSource& source,
                     const std::function<void(const Piece&, const std::vector<float>&)>& sink);

/// What a LoRA checkpoint records of its frozen base (engine/training/lora_checkpoint.h): for each
/// file of the folder `dir` that a load reads (config.json, the weights, their index), its
/// size and an XXH3-64 over its header and 16 slices of 64 KiB spread evenly over the rest: about
/// 1 MiB read per file, milliseconds for an 8B model's 16 GB, where hashing every byte would read
/// all 16 GB at each resume, export and sample (seconds from a fast disk, minutes from a network
/// one). It catches a file replaced, re-saved, re-quantized or fine-tuned anew (every weight
/// moves, so every slice does), renamed tensors or shapes (the header); not an edit confined to
/// bytes between the slices. {"files": {name: {"bytes": N, "xxh3": "hex"}}}.
nlohmann::json folder_fingerprint(const std::string& dir);
/// The first difference of `now` from `recorded` in words ("model.safetensors: 1234 bytes, 1200
/// recorded"), or "" when they agree.
std::string fingerprint_difference(const nlohmann::json& recorded, const nlohmann::json& now);

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
