// `train` with [lora] (see cmd/train_lora.h).
#include "cmd/train_lora.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "engine/config/lora.h"
#include "engine/core/error.h"
#include "engine/model_files/hf_weights.h"
#include "engine/model_files/peft.h"
#include "engine/training/lora_checkpoint.h"

namespace remat::cli {
namespace {

namespace fs = std::filesystem;

// The [lora] keys that shape the adapters (dropout may change on a resume, as the schedule may).
std::string lora_identity(const ModelConfig& m, const LoraConfig& l) {
  std::vector<std::string> sites, saved;
  for (const lora::Site& s : lora::select_sites(m, l.targets).sites) sites.push_back(s.module);
  for (const lora::SavedModule& s : lora::select_saved(m, l.modules_to_save).modules)
    saved.push_back(s.module);
  return fmt::format("rank {}, alpha {}, rslora {}, base {}, adapters on [{}], trained whole [{}]",
                     l.rank, l.alpha, l.rslora, l.base, fmt::join(sites, ", "),
                     fmt::join(saved, ", "));
}

bool same_folder(const std::string& a, const std::string& b) {
  std::error_code ec1, ec2;
  return fs::weakly_canonical(a, ec1) == fs::weakly_canonical(b, ec2);
}

}  // namespace

LoraStart check_lora_start(const Config& cfg, const TrainOptions& opt, const Checkpoint* resume) {
  const LoraConfig& l = cfg.lora;
  if (!opt.init_adapter.empty() && !l.enabled())
    throw ConfigError(fmt::format(
        "[lora] --init-adapter {}: this run trains no adapters (lora.rank = 0). Fix: set "
        "[lora] rank (and alpha, targets) as the adapter's adapter_config.json says",
        opt.init_adapter));
  if (resume) {
    const Config saved = parse_config(resume->state().config_toml, resume->path() + "/state.json");
    const std::string was = saved.lora.enabled() ? lora_identity(saved.model, saved.lora) : "off";
    const std::string is = l.enabled() ? lora_identity(cfg.model, l) : "off";
    if (was != is)
      throw_config_error(
          cfg, "lora.rank",
          fmt::format("LoRA is {} here but {} in the checkpoint {}", is, was, resume->path()),
          "resume with the checkpoint's [lora] (its state.json has it)");
    if (!l.enabled()) return {};
    check_lora_base(resume->state(), resume->path());
    const std::string dir = lora_base_dir(resume->state(), resume->path());
    if (dir.empty())
      throw CheckpointError(fmt::format(
          "[checkpoint] {}/state.json: a LoRA checkpoint without the record of its base "
          "(lora_base). Fix: resume from a checkpoint this version wrote",
          resume->path()));
    // --init hf:, --model hf: or model.from_hf naming another folder: another base.
    if (!cfg.model.from_hf.empty() && !same_folder(cfg.model.from_hf, dir))
      throw ConfigError(fmt::format(
          "[lora] the model is {}'s but the checkpoint {} was trained on the base {}. Fix: name "
          "that folder (--model hf:{}), or start a new run on the other base",
          cfg.model.from_hf, resume->path(), dir, dir));
    return {dir, resume->state().extra["lora_base"], ""};
  }
  if (!l.enabled()) return {};
  // Without a base the weights are train.seed's: fine to measure steps (fit --measure and sweep
  // run such trials), never to save adapters that only mean something on a real base.
  if (opt.init_path.empty() && cfg.checkpoint.dir.empty())
    return {"", nullptr,
            "LoRA base initialised from train.seed (no --init hf:DIR): a run to measure, it "
            "saves nothing"};
  if (opt.init_path.rfind("hf:", 0) != 0)
    throw_config_error(
        cfg, "lora.rank",
        opt.init_path.empty()
            ? "LoRA trains adapters on a pretrained base, and this run, which writes checkpoints, "
              "names none"
            : fmt::format("LoRA trains on a Hugging Face base, and --init {} is a checkpoint",
                          opt.init_path),
        "pass --init hf:DIR, the base's folder (a checkpoint becomes one with export --hf)");
  const std::string dir = opt.init_path.substr(3);
  return {dir, lora_base_record(dir), ""};
}

std::string load_lora_base(const LoraStart& start, const Config& cfg, Backend& be, Model& model) {
  if (start.base_dir.empty()) return "";
  return fmt::format("LoRA base from {}: {}", start.base_dir,
                     hf::load_weights(start.base_dir, cfg.model, be, model));
}

std::string load_init_adapter(const std::string& dir, const Config& cfg, Backend& be,
                              Model& model) {
  std::string base_note;
  const auto values = peft::read_adapter(dir, cfg.model, cfg.lora, &base_note);
  for (Param& p : model.params()) {
    const auto it = values.find(p.name);
    if (it == values.end()) continue;
    REMAT_ASSERT(static_cast<int64_t>(it->second.size()) == p.value.tensor().numel(),
                 "--init-adapter: {} has {} values", p.name, it->second.size());
    be.upload(p.value, it->second.data());
  }
  return fmt::format("adapters from {} ({} tensors{})", dir, values.size(),
                     base_note.empty() ? "" : fmt::format(", trained on {}", base_note));
}

std::string lora_summary(const Config& cfg, const Model& model) {
  if (!cfg.lora.enabled()) return "";
  return fmt::format(" + LoRA r {} (alpha {}{}) on {} linears, {:.3f}M trainable", cfg.lora.rank,
                     cfg.lora.alpha, cfg.lora.rslora ? ", rslora" : "",
                     lora::select_sites(cfg.model, cfg.lora.targets).sites.size(),
                     static_cast<double>(model.n_trainable_params()) / 1e6);
}

}  // namespace remat::cli
