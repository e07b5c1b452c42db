// shards.json beside token shards (see engine/config/shards_json.h).
#include "engine/config/shards_json.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

namespace remat {

namespace fs = std::filesystem;

std::optional<ShardsJson> read_shards_json(const std::string& folder) {
  const fs::path file = fs::path(folder) / "shards.json";
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(file, ec);
  if (!fs::exists(st)) return std::nullopt;
  ShardsJson s;
  s.path = file.string();
  // A FIFO or a folder in its place is named, never read (reading a FIFO would block) nor taken
  // for an absent file (which would silently change where the end-of-text id comes from).
  if (!fs::is_regular_file(file, ec)) {
    s.problem = "not a regular file";
    return s;
  }
  std::ifstream in(file);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    s.problem = "not a JSON object";
    return s;
  }
  if (j.contains("eot_token") && j["eot_token"].is_number_integer() &&
      j["eot_token"].get<int64_t>() >= 0)
    s.eot_token = j["eot_token"].get<int64_t>();
  if (j.contains("mean_document_tokens") && j["mean_document_tokens"].is_number() &&
      j["mean_document_tokens"].get<double>() > 0)
    s.mean_document_tokens = j["mean_document_tokens"].get<double>();
  return s;
}

std::vector<std::string> data_folders(const std::vector<std::string>& entries) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const std::string& e : entries) {
    std::error_code ec;
    const fs::path p(e);
    const fs::path folder = fs::is_directory(p, ec) ? p : p.parent_path();
    const std::string f = folder.empty() ? "." : folder.string();
    if (f.find_first_of("*?[") == std::string::npos && seen.insert(f).second) out.push_back(f);
  }
  return out;
}

}  // namespace remat
