// The windows `remat-train eval` scores for its loss by position: consecutive, non-overlapping
// windows of seq_len + 1 tokens from the start of the held-out data, read as validation reads
// them (data/file_data.h): data.val_path's files, else the data.val_fraction tail of every
// data.path file, or instead the files `eval --data` names, whole. Opened and checked at
// construction; every problem is a one-line DataError or ConfigError naming the file or key and
// the fix. Does not draw random windows, nor any of the training split.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/file_data.h"
#include "data/token_corpus.h"
#include "engine/config/config.h"

namespace remat {

class EvalWindows {
 public:
  /// `cfg`'s held-out data (or `files`, when not empty, in data.source's format; with synthetic
  /// data, token shards by their .bin name, or text for a byte-level model) at
  /// cfg.train.seq_len. Throws ConfigError when there is none (synthetic data, no validation
  /// split) or the format is not known, and DataError when it is shorter than one window.
  EvalWindows(const Config& cfg, const std::vector<std::string>& files);
  int64_t count() const { return windows_.windows(); }
  /// "12 windows of 513 tokens from data.val_path: val.bin (8,000 tokens)".
  std::string describe(int64_t used) const;
  /// The seq_len + 1 tokens of window k (k < count()), checked against the vocabulary; with
  /// `scored`, also whether each of its seq_len targets counts (its loss mask's byte, else 1).
  void read(int64_t k, int32_t* out, uint8_t* scored = nullptr) const;
  /// Whether a loss mask lies beside any of the files (data.loss_mask = "auto").
  bool masked() const;

 private:
  TokenCorpus corpus_;
  WindowSet windows_;
  std::string from_;  // which files: "data.val_path", "--data", ...
  int64_t window_tokens_ = 0, vocab_ = 0;
};

}  // namespace remat
