// LoRA checkpoints (docs/lora.md). A LoRA run's checkpoint holds what trains: the adapters, the
// modules trained whole and their AdamW moments (engine/training/checkpoint.h writes trainable
// parameters only: kilobytes to megabytes, where the base is gigabytes). Its state.json records
// the frozen base it was trained on, as extra["lora_base"] = {"path": the folder, absolute,
// "files": hf::folder_fingerprint of it}, so that a resume, an export or `sample` reads the same
// base again, and refuses, naming both, when the folder has moved or its files have changed.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/training/checkpoint.h"

namespace remat {

/// state.json's record of the base folder `dir`: its absolute path and fingerprint.
nlohmann::json lora_base_record(const std::string& dir);

/// The base folder a checkpoint records ("" when it is not a LoRA checkpoint). Throws
/// CheckpointError when the record is there but malformed.
std::string lora_base_dir(const CheckpointState& s, const std::string& checkpoint_path);

/// Throws CheckpointError ("[checkpoint] PATH/state.json: ...") when the base a LoRA checkpoint
/// records is gone (moved or removed) or its files differ from what was recorded.
void check_lora_base(const CheckpointState& s, const std::string& checkpoint_path);

/// The base folder of a LoRA checkpoint, checked unchanged (check_lora_base). Throws
/// CheckpointError when it records none (a state.json edited by hand, or from before bases were
/// recorded), its fix saying to `use` ("resume from", "evaluate") a checkpoint this version wrote.
std::string required_lora_base(const CheckpointState& s, const std::string& checkpoint_path,
                               const std::string& use);

/// A checkpoint's weights as the whole model they stand for, by our parameter names (what `sample`
/// decodes and `export --hf` writes): the checkpoint's own tensors; for a LoRA checkpoint the base
/// read from its recorded folder (checked unchanged), each adapted weight with its adapters
/// merged (W + s B A, peft's merge), and the modules trained whole from the checkpoint.
class CheckpointWeights {
 public:
  CheckpointWeights(const Checkpoint& ckpt, const Config& cfg);
  ~CheckpointWeights();
  CheckpointWeights(const CheckpointWeights&) = delete;
  CheckpointWeights& operator=(const CheckpointWeights&) = delete;
  /// One weight as host f32, its shape into `shape` when given. CheckpointError if absent.
  std::vector<float> weight(const std::string& name, std::vector<int64_t>* shape = nullptr) const;
  /// The LoRA base folder ("" for a checkpoint of every weight).
  const std::string& base_dir() const { return base_dir_; }

 private:
  struct Base;
  const Checkpoint& ckpt_;
  Config cfg_;
  std::string base_dir_;
  std::unique_ptr<Base> base_;
};

}  // namespace remat
