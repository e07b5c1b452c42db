// `train` with [lora] (docs/lora.md): what a LoRA run starts from, checked before anything is
// built, and loaded once the model exists. A LoRA run trains adapters on a frozen Hugging Face
// base: a fresh run names it with --init hf:DIR (and may start its adapters from a PEFT folder,
// --init-adapter DIR); a resume reads the base again from the folder its checkpoint records,
// refusing when it has moved or changed, then the checkpoint's adapters and moments over it.
// Kept apart from cmd/train_command.cpp, which calls these at three points.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "cmd/commands.h"
#include "engine/config/config.h"
#include "engine/core/backend.h"
#include "engine/model.h"
#include "engine/training/checkpoint.h"

namespace remat::cli {

struct LoraStart {
  std::string base_dir;        // the frozen base's folder ("" without LoRA, or without a base)
  nlohmann::json base_record;  // what each checkpoint's state.json records of it (null without)
  std::string note;            // for the banner: a LoRA run without a base says so
};

/// Before anything is built. A LoRA run without a base (no --init) that saves nothing trains on
/// train.seed's weights (a measurement: fit --measure's and sweep's trials). Refuses, one line
/// each (ConfigError, or CheckpointError for the checkpoint's problems): --init-adapter without
/// [lora]; [lora] writing checkpoints without a Hugging Face base (--init hf:DIR), or with --init
/// of a checkpoint; a resume whose [lora] is not the checkpoint's,
/// whose checkpoint is (or is not) a LoRA one, whose base moved or changed, or with --init hf:DIR
/// naming another base.
LoraStart check_lora_start(const Config& cfg, const TrainOptions& opt, const Checkpoint* resume);

/// Throws when --init names a PEFT adapter folder (it goes to --init-adapter, beside a base).
void refuse_adapter_as_init(const std::string& init_path);

/// Whether a change of `key` between a checkpoint's config and a resumed run's selects the same
/// modules all the same: lora.targets and lora.modules_to_save are compared by what they select
/// (targets = [] and the seven Llama names are one choice), not by how they are written.
bool same_lora_selection(const std::string& key, const Config& saved, const Config& now);

/// A resume's frozen base, read again from its folder (the checkpoint's tensors go over it
/// after). Returns a line for the banner ("" without LoRA).
std::string load_lora_base(const LoraStart& start, const Config& cfg, Backend& be, Model& model);

/// --init-adapter DIR: the adapters (and the modules trained whole) from a PEFT folder, checked
/// against the run's [model] and [lora]. Returns a line for the banner.
std::string load_init_adapter(const std::string& dir, const Config& cfg, Backend& be, Model& model);

/// " + LoRA r 8 (alpha 16) on 14 linears of a frozen fp32 base, 0.050M trainable": for the model
/// line of train, eval, plan and fit ("" without LoRA). `n_trainable`: the parameters that train.
std::string lora_summary(const Config& cfg, int64_t n_trainable);
std::string lora_summary(const Config& cfg, const Model& model);
/// For eval's text output: a frozen base below fp32 is scored as trained, the adapters on its
/// decoded weights, while `export --hf` merges them into the original weights; one line saying so
/// ("" for an fp32 base or without LoRA).
std::string lora_scoring_note(const Config& cfg);
/// The same for --json output: rank, alpha, rslora, dropout, the target modules, the linears
/// they select, modules_to_save, base, double_quant and trainable_params; null without LoRA.
nlohmann::json lora_json(const Config& cfg, int64_t n_trainable);

}  // namespace remat::cli
