// LoRA checkpoints: the base's record and the merged weights (see
// engine/training/lora_checkpoint.h).
#include "engine/training/lora_checkpoint.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>

#include "engine/config/lora.h"
#include "engine/core/error.h"
#include "engine/model_files/hf_names.h"
#include "engine/model_files/hf_weights.h"
#include "engine/model_files/peft.h"

namespace remat {
namespace {

namespace fs = std::filesystem;
constexpr const char* kKey = "lora_base";

[[noreturn]] void fail(const std::string& checkpoint_path, const std::string& problem,
                       const std::string& fix) {
  throw CheckpointError(
      fmt::format("[checkpoint] {}/state.json: {}. Fix: {}", checkpoint_path, problem, fix));
}

}  // namespace

nlohmann::json lora_base_record(const std::string& dir) {
  nlohmann::json r = hf::folder_fingerprint(dir);
  r["path"] = fs::absolute(dir).lexically_normal().string();
  return r;
}

std::string lora_base_dir(const CheckpointState& s, const std::string& checkpoint_path) {
  if (!s.extra.contains(kKey)) return "";
  const nlohmann::json& r = s.extra[kKey];
  if (!r.is_object() || !r.contains("path") || !r["path"].is_string() || !r.contains("files") ||
      !r["files"].is_object())
    fail(checkpoint_path, "lora_base is not a record of a base folder (path and files)",
         "resume from an earlier checkpoint");
  for (const auto& [name, f] : r["files"].items())
    if (!f.is_object() || !f.contains("bytes") || !f["bytes"].is_number_unsigned() ||
        !f.contains("xxh3") || !f["xxh3"].is_string())
      fail(checkpoint_path, fmt::format("lora_base's record of {} is malformed", name),
           "resume from an earlier checkpoint");
  return r["path"].get<std::string>();
}

void check_lora_base(const CheckpointState& s, const std::string& checkpoint_path) {
  const std::string dir = lora_base_dir(s, checkpoint_path);
  if (dir.empty()) return;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail(
        checkpoint_path,
        fmt::format("the LoRA base {} this checkpoint was trained on is gone (moved or removed)",
                    dir),
        fmt::format("put the base model back at {} (the adapters are only meaningful on it)", dir));
  const std::string diff = hf::fingerprint_difference(s.extra[kKey], hf::folder_fingerprint(dir));
  if (!diff.empty())
    fail(checkpoint_path,
         fmt::format("the LoRA base {} changed since this checkpoint was written: {}", dir, diff),
         fmt::format("restore the base model this run was trained on at {}, or start a new run "
                     "on the new base (--init hf:DIR)",
                     dir));
}

struct CheckpointWeights::Base {
  hf::FolderReader reader;
  std::map<std::string, std::vector<int64_t>> shapes;      // our base parameters
  std::map<std::string, std::vector<lora::Site>> adapted;  // base weight -> its adapters
  Base(const std::string& dir, const ModelConfig& m, const LoraConfig& l) : reader(dir, m) {
    for (const hf::Mapping& mp : hf::mappings(m, "")) shapes[mp.ours] = mp.shape;
    for (const lora::Site& s : lora::select_sites(m, l.targets).sites) adapted[s.base].push_back(s);
  }
};

std::string required_lora_base(const CheckpointState& s, const std::string& checkpoint_path,
                               const std::string& use) {
  check_lora_base(s, checkpoint_path);
  const std::string dir = lora_base_dir(s, checkpoint_path);
  if (dir.empty())
    throw CheckpointError(
        fmt::format("[checkpoint] {}/state.json: a LoRA checkpoint without the record of its base "
                    "(lora_base). Fix: {} a checkpoint this version wrote",
                    checkpoint_path, use));
  return dir;
}

CheckpointWeights::CheckpointWeights(const Checkpoint& ckpt, const Config& cfg)
    : ckpt_(ckpt), cfg_(cfg) {
  if (!cfg_.lora.enabled()) return;
  base_dir_ = required_lora_base(ckpt.state(), ckpt.path(), "use");
  base_ = std::make_unique<Base>(base_dir_, cfg_.model, cfg_.lora);
}

CheckpointWeights::~CheckpointWeights() = default;

std::vector<float> CheckpointWeights::weight(const std::string& name,
                                             std::vector<int64_t>* shape) const {
  if (!base_) return ckpt_.weight(name, shape);
  // Trained whole (modules_to_save): the checkpoint's; else the base's, with adapters merged.
  for (const std::string& n : ckpt_.weight_names())
    if (n == name) return ckpt_.weight(name, shape);
  const auto it = base_->shapes.find(name);
  if (it == base_->shapes.end() || !base_->reader.has(name))
    throw CheckpointError(fmt::format(
        "[checkpoint] {}: no weight '{}' in the checkpoint nor in its LoRA base {}. Fix: use the "
        "names of the model's parameters",
        ckpt_.path(), name, base_dir_));
  std::vector<float> w = base_->reader.read(name);
  if (shape) *shape = it->second;
  const double scale = lora::scaling(cfg_.lora);
  if (const auto a = base_->adapted.find(name); a != base_->adapted.end())
    for (const lora::Site& s : a->second)
      peft::merge(w, s, ckpt_.weight(s.a_name), ckpt_.weight(s.b_name), cfg_.lora.rank, scale);
  return w;
}

}  // namespace remat
