// state.json of a checkpoint folder (users copy, edit and hand-merge these). Any CheckpointError
// is a fine answer; a crash, a sanitizer report or another exception is a bug. A state that
// parses must write back to text that parses to the same state, and the config it carries goes
// through the config parser as `--resume` would send it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/config/config.h"
#include "engine/core/error.h"
#include "engine/training/checkpoint_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  remat::CheckpointStateFile s;
  try {
    s = remat::parse_checkpoint_state(text, "state.json");
  } catch (const remat::CheckpointError&) {
    return 0;
  }
  const std::string written =
      remat::checkpoint_state_json(s.state, s.files.at(remat::kCheckpointModelFile),
                                   s.files.at(remat::kCheckpointOptimizerFile));
  const remat::CheckpointStateFile back = remat::parse_checkpoint_state(written, "rewritten");
  if (back.state.step != s.state.step || back.state.config_toml != s.state.config_toml ||
      back.state.data_cursor != s.state.data_cursor || back.state.extra != s.state.extra ||
      back.files.at(remat::kCheckpointModelFile).xxh3 !=
          s.files.at(remat::kCheckpointModelFile).xxh3)
    __builtin_trap();
  try {
    remat::parse_config(s.state.config_toml, "state.json (config)");
  } catch (const remat::ConfigError&) {
  }
  return 0;
}
