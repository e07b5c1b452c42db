// state.json, the one text file of a checkpoint folder (engine/training/checkpoint.h has the
// layout): the step, the run's resolved config, the data cursor, versions, and the size and XXH3-64
// of each tensor file. Writing and parsing live here, apart from the tensor I/O, so that the parser
// of these user-editable bytes is fuzzed on its own (tests/fuzz/fuzz_checkpoint_state.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

namespace remat {

inline constexpr const char* kCheckpointModelFile = "model.safetensors";
inline constexpr const char* kCheckpointOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kCheckpointStateFile = "state.json";

/// What state.json records besides the tensors.
struct CheckpointState {
  int64_t step = 0;         // steps done
  std::string config_toml;  // the run's resolved config (config_to_toml)
  nlohmann::json data_cursor = nlohmann::json::object();  // DataSource::cursor(step)
  nlohmann::json extra = nlohmann::json::object();        // e.g. last validation loss
};

/// Size and checksum of one tensor file, as state.json records them.
struct FileRecord {
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
};

/// A parsed state.json: the state and a record for each of the two tensor files.
struct CheckpointStateFile {
  CheckpointState state;
  std::map<std::string, FileRecord> files;  // keyed by kCheckpointModelFile, ...OptimizerFile
};

/// The text of state.json (pretty-printed, newline-terminated).
std::string checkpoint_state_json(const CheckpointState& s, const FileRecord& model_file,
                                  const FileRecord& optimizer_file);

/// Parses and validates the text of state.json; `path` names it in errors. Throws
/// CheckpointError ("[checkpoint] PATH: problem. Fix: ...") for anything that is not a state
/// this version wrote: invalid JSON, wrong format or version, missing or mistyped keys.
CheckpointStateFile parse_checkpoint_state(const std::string& text, const std::string& path);

}  // namespace remat
