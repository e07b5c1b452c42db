// EvalWindows (see data/eval_windows.h).
#include "data/eval_windows.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "engine/core/error.h"

namespace remat {
namespace {

// How to read the files: data.source's format, or with synthetic data (a Hugging Face model's
// default config) what the files say: llm.c token shards (*.bin), or text as bytes for a
// byte-level model (vocabulary 256). Anything else is asked for, never guessed.
DataFormat format_of(const Config& cfg, const std::vector<std::string>& files) {
  if (cfg.data.source == "text") return DataFormat::Text;
  if (cfg.data.source == "tokens") return DataFormat::Tokens;
  const std::string fix =
      "pass --data FILES: llm.c token shards (*.bin), or text files for a byte-level model "
      "(model.vocab_size = 256)";
  if (files.empty())
    throw ConfigError(fmt::format("[eval] data.source = \"{}\" holds no text to score. Fix: {}",
                                  cfg.data.source, fix));
  const bool shards = std::all_of(files.begin(), files.end(),
                                  [](const std::string& f) { return f.ends_with(".bin"); });
  if (shards) return DataFormat::Tokens;
  if (cfg.model.vocab_size == 256) return DataFormat::Text;
  throw ConfigError(fmt::format(
      "[eval] --data {}: not token shards (*.bin), and a model of vocabulary {} does not read "
      "text as bytes. Fix: tokenize it with scripts/prepare_data.py, or --set data.source=tokens "
      "with --set data.path=FILE",
      files.front(), cfg.model.vocab_size));
}

}  // namespace

EvalWindows::EvalWindows(const Config& cfg, const std::vector<std::string>& files)
    : windows_(cfg.train.seq_len + 1),
      window_tokens_(cfg.train.seq_len + 1),
      vocab_(cfg.model.vocab_size) {
  const DataConfig& d = cfg.data;
  const DataFormat format = format_of(cfg, files);
  // Loss masks (X.mask.bin beside X.bin) hide targets from the score as validation hides them
  // from the loss: an SFT model is scored on its answers, not on the prompts.
  const bool masks = d.loss_mask == "auto";
  if (!files.empty()) {
    corpus_ = TokenCorpus::open(files, format, vocab_, "--data", masks);
    for (const Shard& s : corpus_.shards()) windows_.add(s, 0, s.size());
    from_ = "--data";
  } else if (!d.val_path.empty()) {
    corpus_ = TokenCorpus::open(d.val_path, format, vocab_, "data.val_path", masks);
    for (const Shard& s : corpus_.shards()) windows_.add(s, 0, s.size());
    from_ = "data.val_path";
  } else if (d.val_fraction > 0) {
    // The tail validation holds out of each training file (data/file_data.cpp's split).
    corpus_ = TokenCorpus::open(d.path, format, vocab_, "data.path", masks);
    for (const Shard& s : corpus_.shards()) {
      const auto held =
          static_cast<int64_t>(std::floor(d.val_fraction * static_cast<double>(s.size())));
      windows_.add(s, s.size() - held, s.size());
    }
    from_ = fmt::format("the data.val_fraction = {} tail of data.path", d.val_fraction);
  } else {
    throw ConfigError(
        "[eval] the config holds no data out (data.val_path and data.val_fraction are unset), and "
        "scoring the training data would measure memorization. Fix: pass --data FILES (held-out "
        "text or token shards)");
  }
  if (windows_.windows() == 0)
    throw DataError(fmt::format(
        "[data] {}: shorter than one window of seq_len + 1 = {} tokens: {}. Fix: give more "
        "held-out data, or a shorter --seq-len",
        from_, window_tokens_, windows_.list()));
}

std::string EvalWindows::describe(int64_t used) const {
  return fmt::format("{} window{} of {} tokens from {}: {}{}", used, used == 1 ? "" : "s",
                     window_tokens_, from_, windows_.list(),
                     masked() ? "; targets their loss masks hide are not scored" : "");
}

bool EvalWindows::masked() const {
  return corpus_.masked_shards() > 0;
}

void EvalWindows::read(int64_t k, int32_t* out, uint8_t* scored) const {
  const Window w = windows_.window(k);
  w.shard->read(w.start, window_tokens_, out, vocab_);
  if (scored) {  // target t is token t + 1 of the window: scored where its mask byte is 1
    const int64_t T = window_tokens_ - 1;
    if (const LossMask* m = w.shard->mask())
      m->read(w.start + 1, T, scored);
    else
      std::fill(scored, scored + T, uint8_t{1});
  }
  w.shard->check_unchanged();
}

}  // namespace remat
