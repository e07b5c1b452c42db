// The DataSource over token shards or text files (data.source = "tokens" | "text").
//
// A window is seq_len + 1 consecutive tokens of one shard: inputs are its first T tokens, targets
// the last T. Windows never cross a shard boundary (documents of different shards never join),
// nor the train/validation split inside a shard; a shard shorter than T + 1 contributes none.
//   order = "random"      row r = step * B + row starts at a start drawn uniformly from every valid
//                         start of the training split by the counter RNG keyed by (seed, r): a
//                         pure function of (seed, step, row), so a resumed run draws what an
//                         uninterrupted one would.
//   order = "sequential"  non-overlapping windows in file order at stride T (the last target of a
//                         window is the first input of the next, like llm.c's loader); row r takes
//                         window r mod n_windows, in epoch r / n_windows: every window once per
//                         epoch, in the same order each epoch.
// Validation data is data.val_path (other files of the same format) or data.val_fraction (the
// last fraction of each shard's tokens, rounded down). Validation batches are the split's
// sequential windows from its start, the same at every evaluation.
//
// The constructor touches no file, so a dry run (plan, fit) works on a machine without the data:
// next() on a backend that does not compute only allocates the batch. open() opens and checks
// every file; next() on a computing backend needs it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/token_corpus.h"
#include "engine/config/config.h"
#include "engine/training/trainer.h"

namespace remat {

/// Where a window lies: its shard and the token index of its first token in that shard.
struct Window {
  const Shard* shard = nullptr;
  int64_t start = 0;
};

/// The parts [begin, end) of shards that windows of `window_tokens` tokens may come from, with the
/// two ways of enumerating their windows.
class WindowSet {
 public:
  explicit WindowSet(int64_t window_tokens = 1) : window_(window_tokens) {}
  void add(const Shard& shard, int64_t begin, int64_t end);
  int64_t tokens() const { return tokens_; }
  /// Every start of a window (overlapping windows): what random order draws from.
  int64_t starts() const { return starts_; }
  Window start(int64_t k) const;  // k in [0, starts())
  /// Non-overlapping windows at stride window_tokens - 1: what sequential order walks.
  int64_t windows() const { return windows_; }
  Window window(int64_t k) const;  // k in [0, windows())
  /// The shards and their token counts in this set, for messages.
  std::string list(size_t max_names = 3) const;

 private:
  struct Region {
    const Shard* shard;
    int64_t begin, end;
    int64_t starts_before, windows_before;  // prefix sums over the regions before this one
  };
  int64_t window_;
  std::vector<Region> regions_;
  int64_t tokens_ = 0, starts_ = 0, windows_ = 0;
};

class FileData : public DataSource {
 public:
  explicit FileData(const Config& cfg);  // touches no file
  std::string describe() const override;
  void open() override;
  Batch next(Backend& be, int64_t step) override;
  int64_t validation_batches(int64_t eval_tokens) const override;
  Batch validation_batch(Backend& be, int64_t index) override;
  nlohmann::json cursor(int64_t steps) const override;

  bool is_open() const { return open_; }
  /// The window of row `row` (of all train.batch_size rows, whichever rank trains on it) of
  /// training step `step`, and of validation batch `index` (open only).
  Window train_window(int64_t step, int64_t row) const;
  Window val_window(int64_t index, int64_t row) const;
  const WindowSet& train_split() const { return train_; }
  const WindowSet& val_split() const { return val_; }

 private:
  Batch allocate_batch(Backend& be) const;
  template <class WindowOf>
  void fill_batch(Backend& be, const Batch& batch, WindowOf window_of);
  void build_splits();
  void check_splits() const;

  DataConfig data_;
  DataFormat format_;
  int64_t B_;         // rows per step, over every data-parallel rank
  BatchShare share_;  // this rank's rows of each step's B_, and its positions of each row
  int64_t T_;
  int64_t V_;
  uint64_t seed_;
  bool open_ = false;
  TokenCorpus corpus_, val_corpus_;
  WindowSet train_, val_;
  std::vector<int32_t> row_;           // one window of T + 1 tokens, reused
  std::vector<const Shard*> touched_;  // the shards one batch read, checked before it is used
};

}  // namespace remat
