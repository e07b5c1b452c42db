// What scripts/prepare_data.py records beside the shards it writes, FOLDER/shards.json: the
// end-of-text id the documents end with (data.eot_token's default), and the documents' mean
// length (the planner's estimate of document attention's FLOPs). A small JSON object; only the
// fields read here matter, others are ignored.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace remat {

struct ShardsJson {
  std::string path;                 // FOLDER/shards.json
  int64_t eot_token = -1;           // -1: missing or not a non-negative integer
  double mean_document_tokens = 0;  // 0: not recorded
  std::string problem;              // not empty: there but not a regular file or JSON object
};

/// FOLDER/shards.json when the file exists.
std::optional<ShardsJson> read_shards_json(const std::string& folder);

/// The folders data.path-style `entries` name shards in, without expanding them (a dry run may
/// plan for data that is elsewhere): a directory itself, a file's or a glob's parent folder.
std::vector<std::string> data_folders(const std::vector<std::string>& entries);

}  // namespace remat
