// PEFT LoRA adapter folders (see engine/model_files/peft.h).
#include "engine/model_files/peft.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/core/error.h"
#include "engine/core/json_text.h"
#include "engine/core/regular_file.h"
#include "engine/model_files/hf_names.h"
#include "engine/model_files/safetensors.h"

namespace remat::peft {
namespace {

namespace fs = std::filesystem;
namespace st = safetensors;
using Json = nlohmann::json;

const std::string kPrefix = "base_model.model.";

[[noreturn]] void refuse(const std::string& where, const std::string& problem,
                         const std::string& fix) {
  throw CheckpointError(fmt::format("[peft] {}: {}. Fix: {}", where, problem, fix));
}

// The safetensors reader's refusals speak of checkpoints (its files are mostly ours): an
// adapter's file is the adapter's, and its page is docs/lora.md.
st::Reader open_adapter_weights(const std::string& path) {
  try {
    return st::Reader(path);
  } catch (const CheckpointError& e) {
    std::string what = e.what();
    constexpr std::string_view kTag = "[checkpoint]";
    if (what.starts_with(kTag)) what.replace(0, kTag.size(), "[peft]");
    const std::string folder_fix = "give a checkpoint folder or a .safetensors file";
    if (const size_t at = what.find(folder_fix); at != std::string::npos)
      what.replace(at, folder_fix.size(),
                   "give the adapter folder a regular adapter_model.safetensors");
    throw CheckpointError(what);
  }
}

std::string toml_list(const std::vector<std::string>& names) {
  std::vector<std::string> quoted;
  for (const auto& n : names) quoted.push_back(fmt::format("\"{}\"", n));
  return fmt::format("[{}]", fmt::join(quoted, ", "));
}

// A list of names in adapter_config.json: null (none) or an array of strings; a string is a
// regular expression, which this build does not match.
std::vector<std::string> name_list(const Json& j, const std::string& key, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return {};
  const Json& v = j[key];
  if (v.is_string())
    refuse(path,
           fmt::format("{} is the regular expression \"{}\", which this build does not match", key,
                       v.get<std::string>()),
           fmt::format("list the module names in {} (e.g. {})", key,
                       key == "modules_to_save" ? "[\"input_layernorm\", \"lm_head\"]"
                                                : "[\"q_proj\", \"v_proj\"]"));
  if (!v.is_array()) refuse(path, fmt::format("{} is not a list", key), "save the adapter again");
  std::vector<std::string> out;
  for (const Json& e : v) {
    if (!e.is_string())
      refuse(path, fmt::format("{} holds {}, not a name", key, e.dump()), "save the adapter again");
    out.push_back(e.get<std::string>());
  }
  return out;
}

// PEFT features that change what the adapter computes and that this build does not train: a
// folder using one is refused by its key, never loaded as something else.
void refuse_unsupported(const Json& j, const std::string& path) {
  auto set = [&](const char* key) {
    if (!j.contains(key)) return false;
    const Json& v = j[key];
    return !(v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
             ((v.is_object() || v.is_array()) && v.empty()) || (v.is_string() && v.empty()));
  };
  const std::pair<const char*, const char*> features[] = {
      {"use_dora", "DoRA (weight-decomposed LoRA)"},
      {"lora_bias", "a bias on lora_B"},
      {"rank_pattern", "a rank per module"},
      {"alpha_pattern", "an alpha per module"},
      {"layers_to_transform", "adapters on some layers only"},
      {"layers_pattern", "adapters on some layers only"},
      {"exclude_modules", "modules excluded from the targets"},
      {"trainable_token_indices", "trainable token rows"},
      {"target_parameters", "adapters on parameters rather than modules"},
      {"use_qalora", "QALoRA"},
      {"layer_replication", "replicated layers"},
      {"megatron_config", "Megatron's parallel layers"}};
  for (const auto& [key, what] : features)
    if (set(key))
      refuse(path,
             fmt::format("{} = {} ({}) is not trained by this build", key, j[key].dump(), what),
             "use a plain LoRA adapter (docs/lora.md lists what is read)");
  if (j.contains("bias") && !(j["bias"].is_string() && j["bias"].get<std::string>() == "none"))
    refuse(path,
           fmt::format("bias = {} trains the base's biases, which this build does not",
                       j["bias"].dump()),
           "use an adapter saved with bias = \"none\"");
  if (j.contains("task_type") && !j["task_type"].is_null() &&
      !(j["task_type"].is_string() && j["task_type"].get<std::string>() == "CAUSAL_LM"))
    refuse(path,
           fmt::format("task_type = {}: this build trains causal language models",
                       j["task_type"].dump()),
           "use a CAUSAL_LM adapter");
}

// adapter_config.json against the run's [model] and [lora].
void check_config(const Json& j, const std::string& path, const ModelConfig& m,
                  const LoraConfig& l) {
  if (!j.is_object()) refuse(path, "not a JSON object", "save the adapter again");
  if (!j.contains("peft_type") || j["peft_type"] != "LORA")
    refuse(path,
           fmt::format("peft_type is {}: only LoRA adapters are read",
                       j.contains("peft_type") ? j["peft_type"].dump() : "missing"),
           "give a LoRA adapter folder");
  refuse_unsupported(j, path);
  if (!j.contains("r") || !j["r"].is_number_integer())
    refuse(path, "r is missing or not an integer", "save the adapter again");
  const int64_t r = j["r"].get<int64_t>();
  if (r < 1 || r > LoraConfig::kMaxRank)
    refuse(path,
           fmt::format("r = {} is not a rank this build trains (1 to {})", r, LoraConfig::kMaxRank),
           "give an adapter saved by peft with its rank r");
  if (r != l.rank)
    refuse(path, fmt::format("r = {} but lora.rank = {}", r, l.rank),
           fmt::format("set lora.rank = {} (the adapter's rank)", r));
  if (!j.contains("lora_alpha") || !j["lora_alpha"].is_number())
    refuse(path, "lora_alpha is missing or not a number", "save the adapter again");
  const double alpha = j["lora_alpha"].get<double>();
  if (!(alpha >= LoraConfig::kMinAlpha && alpha <= LoraConfig::kMaxAlpha))
    refuse(path,
           fmt::format("lora_alpha = {} is outside what lora.alpha takes ({:g} to {:g})", alpha,
                       LoraConfig::kMinAlpha, LoraConfig::kMaxAlpha),
           "give an adapter with a positive lora_alpha");
  if (alpha != l.alpha)
    refuse(path, fmt::format("lora_alpha = {} but lora.alpha = {}", alpha, l.alpha),
           fmt::format("set lora.alpha = {} (the adapter's scale is alpha / rank)", alpha));
  // peft reads these by truthiness (1 or "yes" would switch rslora on there): only a boolean or
  // null is read here, anything else refused rather than taken as false.
  for (const char* key : {"use_rslora", "fan_in_fan_out", "inference_mode"})
    if (j.contains(key) && !j[key].is_boolean() && !j[key].is_null())
      refuse(path, fmt::format("{} = {} is not true or false", key, j[key].dump()),
             "save the adapter again (peft writes a boolean)");
  const bool rslora =
      j.contains("use_rslora") && j["use_rslora"].is_boolean() && j["use_rslora"].get<bool>();
  if (rslora != l.rslora)
    refuse(path, fmt::format("use_rslora = {} but lora.rslora = {}", rslora, l.rslora),
           fmt::format("set lora.rslora = {}", rslora));
  const std::vector<std::string> targets = name_list(j, "target_modules", path);
  if (targets.empty())
    refuse(path, "target_modules is empty", "save the adapter with its target_modules");
  const lora::SiteChoice theirs = lora::select_sites(m, targets);
  if (!theirs.problem.empty())
    refuse(path, "target_modules: " + theirs.problem, "give an adapter of this model");
  if (lora::module_names(theirs.sites) !=
      lora::module_names(lora::select_sites(m, l.targets).sites))
    refuse(path,
           fmt::format("target_modules = {} adapt {} modules, lora.targets = {} adapt {}",
                       toml_list(targets), theirs.sites.size(), toml_list(l.targets),
                       lora::select_sites(m, l.targets).sites.size()),
           fmt::format("set lora.targets = {}", toml_list(targets)));
  const std::vector<std::string> saved = name_list(j, "modules_to_save", path);
  const lora::SavedChoice their_saved = lora::select_saved(m, saved);
  if (!their_saved.problem.empty())
    refuse(path, "modules_to_save: " + their_saved.problem, "give an adapter of this model");
  if (lora::module_names(their_saved.modules) !=
      lora::module_names(lora::select_saved(m, l.modules_to_save).modules))
    refuse(path,
           fmt::format("modules_to_save = {} but lora.modules_to_save = {}", toml_list(saved),
                       toml_list(l.modules_to_save)),
           fmt::format("set lora.modules_to_save = {}", toml_list(saved)));
}

// A folder, FIFO or device named adapter_config.json is refused before a byte is read (a FIFO
// would block forever).
Json read_json(const fs::path& p) {
  RegularFile f = RegularFile::open_read(p.string());
  if (!f.ok())
    refuse(p.string(),
           f.problem() == RegularFile::Problem::Missing ? "missing: not a PEFT adapter folder"
                                                        : f.problem_text(),
           "give the folder save_pretrained wrote (adapter_config.json and "
           "adapter_model.safetensors)");
  constexpr uint64_t kMaxConfigBytes = uint64_t{16} << 20;  // peft's are a few KB
  std::string text;
  if (const int err = f.read_all(text, kMaxConfigBytes))
    refuse(p.string(), err == EFBIG ? "over 16 MB: not an adapter_config.json" : std::strerror(err),
           "save the adapter again");
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    refuse(p.string(), fmt::format("not valid JSON ({})", e.what()), "save the adapter again");
  }
}

}  // namespace

std::vector<AdapterTensor> adapter_tensors(const ModelConfig& m, const LoraConfig& l) {
  std::vector<AdapterTensor> out;
  for (const lora::Site& s : lora::select_sites(m, l.targets).sites) {
    out.push_back({s.a_name, kPrefix + s.module + ".lora_A.weight", {l.rank, s.in}});
    out.push_back({s.b_name, kPrefix + s.module + ".lora_B.weight", {s.rows, l.rank}});
  }
  // The modules trained whole, by their parameters' transformers names (no Conv1D among them).
  const std::vector<hf::Mapping> maps =
      hf::mappings(m, m.kind == ModelKind::Gpt ? "transformer." : "model.");
  for (const lora::SavedModule& mod : lora::select_saved(m, l.modules_to_save).modules)
    for (size_t i = 0; i < mod.params.size(); ++i)
      for (const hf::Mapping& mp : maps)
        if (mp.ours == mod.params[i])
          out.push_back({mp.ours, kPrefix + mod.hf_params[i], mp.shape});
  return out;
}

std::map<std::string, std::vector<float>> read_adapter(const std::string& dir, const ModelConfig& m,
                                                       const LoraConfig& l,
                                                       std::string* base_note) {
  const fs::path config = fs::path(dir) / kConfigFile;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    refuse(dir, fs::exists(fs::symlink_status(dir, ec)) ? "not a folder" : "no such folder",
           "give the folder of a PEFT LoRA adapter (save_pretrained's)");
  const Json j = read_json(config);
  check_config(j, config.string(), m, l);
  if (base_note)
    *base_note = j.contains("base_model_name_or_path") && j["base_model_name_or_path"].is_string()
                     ? j["base_model_name_or_path"].get<std::string>()
                     : "";
  const fs::path weights = fs::path(dir) / kWeightsFile;
  if (!fs::exists(weights, ec))
    refuse(weights.string(),
           fs::exists(fs::path(dir) / "adapter_model.bin", ec)
               ? "missing; adapter_model.bin (a pickle) is not read"
               : "missing",
           "save the adapter with safe_serialization=True (peft's default)");
  const st::Reader file = open_adapter_weights(weights.string());
  const std::vector<AdapterTensor> want = adapter_tensors(m, l);
  std::set<std::string> names;
  for (const AdapterTensor& t : want) {  // every tensor first: a refused folder loads nothing
    names.insert(t.theirs);
    const st::TensorInfo* info = file.find(t.theirs);
    if (!info)
      refuse(weights.string(), fmt::format("no tensor '{}' (for {})", t.theirs, t.ours),
             "give an adapter of this model and [lora]");
    if (info->shape != t.shape)
      refuse(weights.string(),
             fmt::format("tensor '{}' has shape {} but {} is {}", t.theirs,
                         st::shape_string(info->shape), t.ours, st::shape_string(t.shape)),
             "give an adapter of this model and [lora]");
    if (st::dtype_bytes(info->dtype) == 0 ||
        !(info->dtype == "F32" || info->dtype == "BF16" || info->dtype == "F16"))
      refuse(weights.string(), fmt::format("tensor '{}' is {}", t.theirs, info->dtype),
             "save the adapter in F32, BF16 or F16");
  }
  for (const st::TensorInfo& info : file.tensors())
    if (!names.count(info.name))
      refuse(weights.string(),
             fmt::format("tensor '{}' is not part of a LoRA adapter of this model and [lora]{}",
                         info.name,
                         info.name.find("lora_magnitude") != std::string::npos ? " (DoRA)" : ""),
             "give a plain LoRA adapter of this model");
  std::map<std::string, std::vector<float>> out;
  for (const AdapterTensor& t : want) {
    const st::TensorInfo& info = *file.find(t.theirs);
    std::vector<float> v(static_cast<size_t>(info.bytes() / st::dtype_bytes(info.dtype)));
    st::to_f32(info.dtype, file.data(info), v.size(), v.data());
    // A NaN or an infinity would only show as a diverged loss at step 1, blamed on the schedule.
    const auto bad = std::find_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); });
    if (bad != v.end())
      refuse(weights.string(),
             fmt::format("tensor '{}' holds {} at element {}", t.theirs, *bad, bad - v.begin()),
             "give an adapter whose weights are finite (save it again from a healthy run)");
    out[t.ours] = std::move(v);
  }
  return out;
}

void write_adapter(const std::string& dir, const ModelConfig& m, const LoraConfig& l,
                   const std::string& base, const hf::ParamSource& source) {
  // Every key peft 0.17.1 writes, so that its reader takes the defaults of none.
  const Json config = {
      {"alpha_pattern", Json::object()},
      {"auto_mapping", nullptr},
      {"base_model_name_or_path", base},
      {"bias", "none"},
      {"corda_config", nullptr},
      {"eva_config", nullptr},
      {"exclude_modules", nullptr},
      {"fan_in_fan_out", m.kind == ModelKind::Gpt},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"layer_replication", nullptr},
      {"layers_pattern", nullptr},
      {"layers_to_transform", nullptr},
      {"loftq_config", Json::object()},
      {"lora_alpha", l.alpha},
      {"lora_bias", false},
      {"lora_dropout", l.dropout},
      {"megatron_config", nullptr},
      {"megatron_core", "megatron.core"},
      {"modules_to_save", l.modules_to_save.empty() ? Json(nullptr) : Json(l.modules_to_save)},
      {"peft_type", "LORA"},
      {"qalora_group_size", 16},
      {"r", l.rank},
      {"rank_pattern", Json::object()},
      {"revision", nullptr},
      {"target_modules", lora::target_names(m, l.targets)},
      {"target_parameters", nullptr},
      {"task_type", "CAUSAL_LM"},
      {"trainable_token_indices", nullptr},
      {"use_dora", false},
      {"use_qalora", false},
      {"use_rslora", l.rslora}};
  const std::vector<AdapterTensor> tensors = adapter_tensors(m, l);
  std::vector<st::TensorInfo> infos;
  for (const AdapterTensor& t : tensors) infos.push_back({t.theirs, "F32", t.shape});
  st::Writer w((fs::path(dir) / kWeightsFile).string(), infos, {{"format", "pt"}});
  for (const AdapterTensor& t : tensors) {
    const std::vector<float> v = source(t.ours);
    w.write(v.data(), v.size() * sizeof(float));
  }
  w.finish();
  st::write_file_durably((fs::path(dir) / kConfigFile).string(), json_text(config, 2) + "\n");
}

void merge(std::vector<float>& w, const lora::Site& site, const std::vector<float>& a,
           const std::vector<float>& b, int64_t rank, double scale) {
  const int64_t in = site.in;
  REMAT_ASSERT(static_cast<int64_t>(a.size()) == rank * in &&
                   static_cast<int64_t>(b.size()) == site.rows * rank &&
                   static_cast<int64_t>(w.size()) >= (site.row0 + site.rows) * in,
               "peft merge: {} with A {} B {} into {}", site.module, a.size(), b.size(), w.size());
  for (int64_t i = 0; i < site.rows; ++i)
    for (int64_t c = 0; c < in; ++c) {
      double acc = 0;
      for (int64_t k = 0; k < rank; ++k)
        acc += static_cast<double>(b[static_cast<size_t>(i * rank + k)]) *
               a[static_cast<size_t>(k * in + c)];
      float& x = w[static_cast<size_t>((site.row0 + i) * in + c)];
      x = static_cast<float>(x + scale * acc);
    }
}

}  // namespace remat::peft
