#include "engine/training/checkpoint_state.h"

#include <fmt/format.h>

#include <charconv>

#include "engine/core/error.h"
#include "engine/core/json_text.h"
#include "engine/model_files/safetensors.h"

namespace remat {

namespace {

using Json = nlohmann::json;

constexpr const char* kFormat = "remat-train checkpoint";
constexpr int64_t kFormatVersion = 1;

[[noreturn]] void fail(const std::string& path, const std::string& problem,
                       const std::string& fix = "resume from an earlier checkpoint") {
  throw CheckpointError(fmt::format("[checkpoint] {}: {}. Fix: {}", path, problem, fix));
}

const Json& need(const std::string& path, const Json& j, const char* key, bool ok_type,
                 const char* want) {
  if (!j.contains(key))
    fail(path, fmt::format("no \"{}\" key: the file is not a complete state", key));
  if (!ok_type) fail(path, fmt::format("\"{}\" is {}, expected {}", key, j[key].dump(), want));
  return j[key];
}

FileRecord parse_file_record(const std::string& path, const Json& files, const char* name) {
  if (!files.contains(name)) fail(path, fmt::format("\"files\" has no entry for {}", name));
  const Json& r = files[name];
  if (!r.is_object() || !r.contains("bytes") || !r["bytes"].is_number_unsigned() ||
      !r.contains("xxh3_64") || !r["xxh3_64"].is_string())
    fail(path, fmt::format("\"files\".\"{}\" is not {{\"bytes\": N, \"xxh3_64\": hex}}", name));
  const std::string hex = r["xxh3_64"].get<std::string>();
  FileRecord rec{r["bytes"].get<uint64_t>(), 0};
  auto [ptr, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), rec.xxh3, 16);
  if (hex.size() != 16 || ec != std::errc() || ptr != hex.data() + hex.size())
    fail(path, fmt::format("\"files\".\"{}\".xxh3_64 \"{}\" is not 16 hex digits", name, hex));
  return rec;
}

}  // namespace

std::string checkpoint_state_json(const CheckpointState& s, const FileRecord& model_file,
                                  const FileRecord& optimizer_file) {
  auto record = [](const FileRecord& r) {
    return Json{{"bytes", r.bytes}, {"xxh3_64", safetensors::hex64(r.xxh3)}};
  };
  const Json j = {
      {"format", kFormat},
      {"format_version", kFormatVersion},
      {"remat_train_version", REMAT_VERSION},
      {"step", s.step},
      {"config", s.config_toml},
      {"data_cursor", s.data_cursor},
      {"extra", s.extra},
      {"rng",
       {{"kind", "counter"},
        {"note",
         "all random streams are pure functions of (train.seed, step); the step is the RNG "
         "state"}}},
      {"files",
       {{kCheckpointModelFile, record(model_file)},
        {kCheckpointOptimizerFile, record(optimizer_file)}}}};
  return json_text(j, 2) + "\n";
}

CheckpointStateFile parse_checkpoint_state(const std::string& text, const std::string& path) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {  // parse_error, and out_of_range for a number too large
    fail(path, fmt::format("not valid JSON ({})", e.what()));
  }
  if (!j.is_object()) fail(path, "not a JSON object");
  need(path, j, "format", j.contains("format") && j["format"] == kFormat,
       "\"remat-train checkpoint\"");
  const Json& version =
      need(path, j, "format_version",
           j.contains("format_version") && j["format_version"].is_number_integer(), "an integer");
  if (version.get<int64_t>() != kFormatVersion)
    fail(path, fmt::format("format_version {} is not {}", version.dump(), kFormatVersion),
         "use the remat-train version that wrote it (see remat_train_version)");
  CheckpointStateFile s;
  // is_number_unsigned admits up to 2^64-1; a step past INT64_MAX would turn negative.
  const Json& step = need(path, j, "step",
                          j.contains("step") && j["step"].is_number_unsigned() &&
                              j["step"].get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX),
                          "a non-negative integer");
  s.state.step = step.get<int64_t>();
  s.state.config_toml =
      need(path, j, "config", j.contains("config") && j["config"].is_string(), "a string")
          .get<std::string>();
  if (j.contains("data_cursor")) s.state.data_cursor = j["data_cursor"];
  if (j.contains("extra")) s.state.extra = j["extra"];
  const Json& files =
      need(path, j, "files", j.contains("files") && j["files"].is_object(), "an object");
  for (const char* name : {kCheckpointModelFile, kCheckpointOptimizerFile})
    s.files[name] = parse_file_record(path, files, name);
  return s;
}

}  // namespace remat
