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
//   order = "packed"      rows of whole documents (data/packing.h: shuffled by the seed, first-fit,
//                         long ones cut into rows), packed once at open; row r takes row
//                         epoch_order(e)[r mod rows] of epoch e = r / rows. A row's unused tail is
//                         padding (end-of-text tokens that attend only to themselves), never
//                         trained. A document is a run of a split up to and including its
//                         end-of-text token (data.eot_token), or up to the split's end.
// Documents and masks (data/documents.h): with data.attention = "document" a batch carries each
// token's document start; with loss masks (data.loss_mask = "auto", X.mask.bin beside X.bin), with
// documents or packed, the targets that are not trained are kIgnoredTarget and the batch counts
// the trained ones. Without any of them, batches are exactly what they always were. The
// end-of-text id is data.eot_token, or the one shards.json beside the shards records (written by
// scripts/prepare_data.py); documents without either are a DataError at open.
// Validation data is data.val_path (other files of the same format) or data.val_fraction (the
// last fraction of each shard's tokens, rounded down). Validation batches are the split's
// sequential windows from its start, the same at every evaluation.
//
// The constructor touches no file, so a dry run (plan, fit) works on a machine without the data:
// next() on a backend that does not compute only allocates the batch. open() opens and checks
// every file; next() on a computing backend needs it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "data/packing.h"
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
  std::string documents_summary() const override;
  std::vector<std::string> warnings() const override;
  void open() override;
  Batch next(Backend& be, int64_t step) override;
  int64_t trained_targets(int64_t step) override;
  int64_t validation_batches(int64_t eval_tokens) const override;
  Batch validation_batch(Backend& be, int64_t index) override;
  nlohmann::json cursor(int64_t steps) const override;

  bool is_open() const { return open_; }
  /// The end-of-text id documents end with (-1: none, neither documents nor packed rows).
  int64_t eot_token() const { return eot_; }
  const Packing& train_packing() const { return train_pack_; }
  /// The window of row `row` (of all train.batch_size rows, whichever rank trains on it) of
  /// training step `step`, and of validation batch `index` (open only).
  Window train_window(int64_t step, int64_t row) const;
  Window val_window(int64_t index, int64_t row) const;
  const WindowSet& train_split() const { return train_; }
  const WindowSet& val_split() const { return val_; }

 private:
  Batch allocate_batch(Backend& be) const;
  /// This rank's part of a batch, on the host.
  struct HostBatch {
    std::vector<int32_t> inputs, targets, docs;  // docs: empty without documents
    int64_t trained = 0;                         // targets that are not kIgnoredTarget
  };
  /// Reads the batch's rows: row_of(global row) fills one whole row into row_ (inputs),
  /// targets_ and docs_ (data/documents.h's marking), and each rank keeps its positions.
  template <class RowOf>
  HostBatch read_batch(RowOf row_of);
  /// read_batch, then uploads it into `batch`.
  template <class RowOf>
  void fill_batch(Backend& be, Batch& batch, RowOf row_of);
  void upload_batch(Backend& be, Batch& batch, const HostBatch& h) const;
  /// The training batches trained_targets read to count, kept for next() (by step), so that
  /// counting a step's targets before its first backward does not read its rows a second time.
  std::map<int64_t, HostBatch> counted_;
  /// The row_of of training step `step`'s rows (packed or windows).
  std::function<void(int64_t)> train_row_of(int64_t step);
  /// One row from a window, or from a packed row's pieces.
  void window_row(const Window& w);
  void packed_row(const Packing& packing, int64_t r);
  const Shard& pack_shard(uint32_t index) const;
  void build_splits();
  void build_packing();
  void check_splits() const;
  /// data.eot_token, else what shards.json beside the shards records (documents need one).
  int64_t resolve_eot() const;
  /// The packed row of training row `row` of step `step` (open, packed order only).
  int64_t packed_train_row(int64_t step, int64_t row) const;
  bool packed() const { return data_.order == "packed"; }

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
  Packing train_pack_, val_pack_;       // packed order: the splits' documents in rows
  mutable std::vector<int64_t> order_;  // epoch_order of epoch order_epoch_ (packed), cached
  mutable int64_t order_epoch_ = -1;
  int64_t eot_ = -1;
  // Whether batches mark targets (documents, packed rows, or a loss mask on some shard): then
  // untrained targets are kIgnoredTarget and Batch::trained_targets counts the others.
  bool marks_ = false;
  std::vector<int32_t> row_;             // one row: T + 1 tokens of a window, or T packed inputs
  std::vector<int32_t> targets_, docs_;  // that row's targets and document starts (T each)
  std::vector<uint8_t> mask_;            // that window's loss mask bytes (T + 1)
  std::vector<const Shard*> touched_;    // the shards one batch read, checked before it is used
};

}  // namespace remat
