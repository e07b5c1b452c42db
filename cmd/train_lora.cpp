// `train` with [lora] (see cmd/train_lora.h).
#include "cmd/train_lora.h"

#include <fmt/format.h>

#include <filesystem>
#include <string>

#include "engine/config/lora.h"
#include "engine/core/error.h"
#include "engine/model_files/hf_weights.h"
#include "engine/model_files/peft.h"
#include "engine/training/lora_checkpoint.h"

namespace remat::cli {
namespace {

namespace fs = std::filesystem;

bool same_folder(const std::string& a, const std::string& b) {
  std::error_code ec1, ec2;
  return fs::weakly_canonical(a, ec1) == fs::weakly_canonical(b, ec2);
}

// The folder a resume names with --model hf:DIR (or --set model.from_hf=DIR), if any. A resume
// takes its model from the checkpoint, so this name can only agree or be refused.
std::string base_named_beside_resume(const TrainOptions& opt) {
  if (opt.config_path.rfind("hf:", 0) == 0) return opt.config_path.substr(3);
  const std::string key = "model.from_hf=";
  std::string named;
  for (const std::string& o : opt.overrides)
    if (o.rfind(key, 0) == 0) named = o.substr(key.size());
  if (named.size() >= 2 && named.front() == '"' && named.back() == '"') {
    std::string plain;
    for (size_t i = 1; i + 1 < named.size(); ++i) {
      if (named[i] == '\\' && i + 2 < named.size()) ++i;
      plain += named[i];
    }
    named = plain;
  }
  return named;
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
    // cfg is the checkpoint's (resumed_run refused any change of [lora]); its base must still be
    // the folder the adapters were trained on.
    if (!l.enabled()) return {};
    const std::string dir = required_lora_base(resume->state(), resume->path(), "resume from");
    // --init hf:, --model hf: or model.from_hf naming another folder: another base.
    const std::string named = base_named_beside_resume(opt);
    if (!named.empty() && !same_folder(named, dir))
      throw ConfigError(fmt::format(
          "[lora] --model hf:{} names another base, but the checkpoint {} was trained on the base "
          "{}. Fix: resume without --model (the checkpoint knows its base), or start a new run on "
          "the other base with --init hf:{}",
          named, resume->path(), dir, named));
    return {dir, resume->state().extra["lora_base"], ""};
  }
  if (!l.enabled()) return {};
  // An adapter means something only on the base it was trained on: never on train.seed's weights.
  if (!opt.init_adapter.empty() && opt.init_path.rfind("hf:", 0) != 0)
    throw ConfigError(fmt::format(
        "[lora] --init-adapter {}: an adapter starts from the base it was trained on, and this run "
        "{}. Fix: pass --init hf:DIR, the adapter's base (adapter_config.json names it as "
        "base_model_name_or_path)",
        opt.init_adapter,
        opt.init_path.empty()
            ? "loads none (--model hf:DIR reads only config.json)"
            : fmt::format("starts from --init {}, not a Hugging Face folder", opt.init_path)));
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

void refuse_adapter_as_init(const std::string& init_path) {
  std::error_code ec;
  if (init_path.empty() || init_path.rfind("hf:", 0) == 0 ||
      !std::filesystem::exists(std::filesystem::path(init_path) / peft::kConfigFile, ec))
    return;
  throw ConfigError(fmt::format(
      "--init {}: a PEFT adapter folder, not a checkpoint or a model. Fix: pass it as "
      "--init-adapter {} beside --init hf:BASE, with [lora] rank as its adapter_config.json says",
      init_path, init_path));
}

bool same_lora_selection(const std::string& key, const Config& saved, const Config& now) {
  if (key == "lora.targets") {
    const lora::SiteChoice a = lora::select_sites(saved.model, saved.lora.targets);
    const lora::SiteChoice b = lora::select_sites(now.model, now.lora.targets);
    return a.problem.empty() && b.problem.empty() &&
           lora::module_names(a.sites) == lora::module_names(b.sites);
  }
  if (key == "lora.modules_to_save") {
    const lora::SavedChoice a = lora::select_saved(saved.model, saved.lora.modules_to_save);
    const lora::SavedChoice b = lora::select_saved(now.model, now.lora.modules_to_save);
    return a.problem.empty() && b.problem.empty() &&
           lora::module_names(a.modules) == lora::module_names(b.modules);
  }
  return false;
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
  return lora_summary(cfg, model.n_trainable_params());
}

std::string lora_summary(const Config& cfg, int64_t n_trainable) {
  if (!cfg.lora.enabled()) return "";
  // The frozen base's storage too: the load line before it names the folder's dtype, not this.
  const std::string base =
      cfg.lora.base == "nf4"
          ? fmt::format("NF4{}", cfg.lora.double_quant ? " with nested absmax" : "")
          : cfg.lora.base;
  return fmt::format(
      " + LoRA r {} (alpha {}{}) on {} linears of a frozen {} base, {:.3f}M trainable",
      cfg.lora.rank, cfg.lora.alpha, cfg.lora.rslora ? ", rslora" : "",
      lora::select_sites(cfg.model, cfg.lora.targets).sites.size(), base,
      static_cast<double>(n_trainable) / 1e6);
}

std::string lora_scoring_note(const Config& cfg) {
  if (!cfg.lora.enabled() || cfg.lora.base == "fp32") return "";
  return fmt::format(
      "note   scored as trained: the adapters on the {}-decoded base; `export --hf` merges them "
      "into the base folder's original weights, which score a little differently\n",
      cfg.lora.base == "nf4" ? "NF4" : "bf16");
}

nlohmann::json lora_json(const Config& cfg, int64_t n_trainable) {
  if (!cfg.lora.enabled()) return nullptr;
  const LoraConfig& l = cfg.lora;
  return {{"rank", l.rank},
          {"alpha", l.alpha},
          {"rslora", l.rslora},
          {"dropout", l.dropout},
          {"target_modules", lora::target_names(cfg.model, l.targets)},
          {"linears", lora::select_sites(cfg.model, l.targets).sites.size()},
          {"modules_to_save", l.modules_to_save},
          {"base", l.base},
          {"double_quant", l.base == "nf4" && l.double_quant},
          {"trainable_params", n_trainable}};
}

}  // namespace remat::cli
