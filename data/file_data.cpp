// Windows over token shards and text files (see data/file_data.h).
#include "data/file_data.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <set>

#include "engine/core/error.h"
#include "engine/core/rng.h"
#include "engine/core/units.h"

namespace remat {
namespace {

constexpr uint64_t kWindowStream = 0x77696e646f77ull;  // "window"

__extension__ typedef unsigned __int128 uint128;  // __extension__: no -Wpedantic warning

/// A 64-bit draw mapped onto [0, n) by the high half of bits * n: no modulo bias beyond n / 2^64.
int64_t scale_draw(uint64_t bits, int64_t n) {
  return static_cast<int64_t>((static_cast<uint128>(bits) * static_cast<uint64_t>(n)) >> 64);
}

/// "812", "61.4k", "1.23M", "4.10G" (decimal, three significant digits).
std::string human_count(int64_t n) {
  double v = static_cast<double>(n);
  const char* units[] = {"", "k", "M", "G", "T"};
  int u = 0;
  while (v >= 999.5 && u < 4) {
    v /= 1000.0;
    ++u;
  }
  if (u == 0) return fmt::format("{}", n);
  return fmt::format("{:.{}f}{}", v, v < 9.995 ? 2 : v < 99.95 ? 1 : 0, units[u]);
}

}  // namespace

// ---- WindowSet ----

void WindowSet::add(const Shard& shard, int64_t begin, int64_t end) {
  const int64_t len = std::max<int64_t>(0, end - begin);
  const int64_t stride = window_ - 1;
  REMAT_ASSERT(stride >= 1, "windows of {} tokens", window_);
  regions_.push_back({&shard, begin, end, starts_, windows_});
  tokens_ += len;
  if (len < window_) return;  // too short for one window
  starts_ += len - window_ + 1;
  windows_ += (len - 1) / stride;  // window k needs k * stride + window_ <= len
}

namespace {

// The region holding item k of a prefix-summed enumeration: the last region whose count before it
// is <= k (regions without items share their successor's prefix, so they are never picked).
template <class Regions, class Before>
auto find_region(const Regions& regions, int64_t k, Before before) {
  auto it = std::upper_bound(regions.begin(), regions.end(), k,
                             [&](int64_t v, const auto& r) { return v < before(r); });
  return std::prev(it);
}

}  // namespace

Window WindowSet::start(int64_t k) const {
  REMAT_ASSERT(k >= 0 && k < starts_, "window start {} of {}", k, starts_);
  const auto r = find_region(regions_, k, [](const Region& x) { return x.starts_before; });
  return {r->shard, r->begin + (k - r->starts_before)};
}

Window WindowSet::window(int64_t k) const {
  REMAT_ASSERT(k >= 0 && k < windows_, "window {} of {}", k, windows_);
  const auto r = find_region(regions_, k, [](const Region& x) { return x.windows_before; });
  return {r->shard, r->begin + (k - r->windows_before) * (window_ - 1)};
}

std::string WindowSet::list(size_t max_names) const {
  std::string out;
  for (size_t i = 0; i < regions_.size() && i < max_names; ++i)
    out += fmt::format("{}{} ({} tokens)", i ? ", " : "", regions_[i].shard->path(),
                       regions_[i].end - regions_[i].begin);
  if (regions_.size() > max_names) out += fmt::format(" and {} more", regions_.size() - max_names);
  return out;
}

// ---- FileData ----

FileData::FileData(const Config& cfg)
    : data_(cfg.data),
      format_(cfg.data.source == "text" ? DataFormat::Text : DataFormat::Tokens),
      B_(cfg.train.batch_size),
      share_(batch_share(cfg)),
      T_(cfg.train.seq_len),
      V_(cfg.model.vocab_size),
      seed_(cfg.train.seed),
      train_(T_ + 1),
      val_(T_ + 1) {}

std::string FileData::describe() const {
  const std::string order = fmt::format("{} windows of {}", data_.order, T_ + 1);
  if (!open_)
    return fmt::format("{}: {} (not opened), {}", data_.source, fmt::join(data_.path, ", "), order);
  const int64_t files = static_cast<int64_t>(corpus_.shards().size() + val_corpus_.shards().size());
  const int64_t total = train_.tokens() + val_.tokens();
  std::string what = format_ == DataFormat::Text
                         ? fmt::format("text: {} file{}, {} as bytes", files, files == 1 ? "" : "s",
                                       format_bytes(static_cast<uint64_t>(total)))
                         : fmt::format("tokens: {} shard{}, {} tokens", files,
                                       files == 1 ? "" : "s", human_count(total));
  if (val_.tokens() > 0)
    what += fmt::format(" (train {}, val {})", human_count(train_.tokens()),
                        human_count(val_.tokens()));
  return fmt::format("{}, {}", what, order);
}

void FileData::open() {
  open_ = false;
  val_corpus_ = TokenCorpus();
  corpus_ = TokenCorpus::open(data_.path, format_, V_, "data.path");
  if (!data_.val_path.empty())
    val_corpus_ = TokenCorpus::open(data_.val_path, format_, V_, "data.val_path");
  build_splits();
  check_splits();
  // Random order reads scattered windows (read-ahead would fetch pages no window needs);
  // sequential order walks each shard front to back.
  const auto access =
      data_.order == "random" ? DataFile::Access::Random : DataFile::Access::Sequential;
  for (const Shard& s : corpus_.shards()) s.advise(access);
  row_.assign(static_cast<size_t>(T_ + 1), 0);
  open_ = true;
}

void FileData::build_splits() {
  train_ = WindowSet(T_ + 1);
  val_ = WindowSet(T_ + 1);
  for (const Shard& s : corpus_.shards()) {
    // The held-out tail, rounded down to whole tokens; windows never cross the split.
    const auto held =
        static_cast<int64_t>(std::floor(data_.val_fraction * static_cast<double>(s.size())));
    train_.add(s, 0, s.size() - held);
    if (data_.val_path.empty() && data_.val_fraction > 0) val_.add(s, s.size() - held, s.size());
  }
  for (const Shard& s : val_corpus_.shards()) val_.add(s, 0, s.size());
}

void FileData::check_splits() const {
  namespace fs = std::filesystem;
  std::set<fs::path> train_files;
  for (const Shard& s : corpus_.shards()) train_files.insert(fs::weakly_canonical(s.path()));
  for (const Shard& s : val_corpus_.shards())
    if (train_files.count(fs::weakly_canonical(s.path())))
      throw DataError(
          fmt::format("[data] data.val_path: {} is also in data.path, so validation would measure "
                      "memorized data. Fix: keep each file in one of the two lists",
                      s.path()));
  if (train_.starts() == 0)
    throw DataError(fmt::format(
        "[data] data.path: dataset shorter than one window (seq_len + 1 = {} tokens){}: {}. Fix: "
        "lower "
        "train.seq_len, or add data{}",
        T_ + 1, data_.val_fraction > 0 ? " once data.val_fraction holds out each file's tail" : "",
        train_.list(), data_.val_fraction > 0 ? " (or lower data.val_fraction)" : ""));
  const bool has_val = !data_.val_path.empty() || data_.val_fraction > 0;
  if (has_val && val_.windows() == 0)
    throw DataError(fmt::format(
        "[data] {}: validation split shorter than one window (seq_len + 1 = {} tokens): {}. Fix: "
        "{}",
        data_.val_path.empty() ? "data.val_fraction" : "data.val_path", T_ + 1, val_.list(),
        data_.val_path.empty()
            ? "raise data.val_fraction (it holds out each file's tail), or lower train.seq_len"
            : "add validation data, or lower train.seq_len"));
}

Window FileData::train_window(int64_t step, int64_t row) const {
  REMAT_ASSERT(open_, "FileData: open() before drawing windows");
  const auto r = static_cast<uint64_t>(step * B_ + row);
  if (data_.order == "sequential")
    return train_.window(static_cast<int64_t>(r % static_cast<uint64_t>(train_.windows())));
  return train_.start(scale_draw(rng_bits(seed_, kWindowStream, r), train_.starts()));
}

Window FileData::val_window(int64_t index, int64_t row) const {
  REMAT_ASSERT(open_ && val_.windows() > 0, "FileData: no validation windows");
  // Fewer than B windows: rows wrap around within the split (repeats are harmless for a mean).
  return val_.window((index * B_ + row) % val_.windows());
}

Batch FileData::allocate_batch(Backend& be) const {
  // Exactly what the synthetic token tasks allocate, so dry runs predict the same bytes.
  Batch batch;
  MemoryPool& pool = be.pool();
  const int64_t Tl = share_.positions.tokens();
  batch.inputs =
      pool.allocate({share_.rows, Tl}, DType::I32, MemCategory::Transient, "batch.inputs");
  batch.targets =
      pool.allocate({share_.rows, Tl}, DType::I32, MemCategory::Transient, "batch.targets");
  batch.n_tokens = share_.rows * Tl;
  return batch;
}

template <class WindowOf>
void FileData::fill_batch(Backend& be, const Batch& batch, WindowOf window_of) {
  const int64_t Tl = share_.positions.tokens();
  std::vector<int32_t> inputs(static_cast<size_t>(share_.rows * Tl)), targets(inputs.size());
  touched_.clear();
  for (int64_t b = 0; b < share_.rows; ++b) {
    const Window w = window_of(share_.first_row + b);
    w.shard->read(w.start, T_ + 1, row_.data(), V_);
    if (std::find(touched_.begin(), touched_.end(), w.shard) == touched_.end())
      touched_.push_back(w.shard);
    // This rank's positions (all of them on one rank).
    share_.positions.for_each([&](int64_t j, int64_t t) {
      inputs[static_cast<size_t>(b * Tl + j)] = row_[static_cast<size_t>(t)];
      targets[static_cast<size_t>(b * Tl + j)] = row_[static_cast<size_t>(t + 1)];
    });
  }
  // After the reads, before the batch is used: a file that changed since open (even while these
  // windows were read) stops the run here, and this batch is never trained on.
  for (const Shard* s : touched_) s->check_unchanged();
  be.upload(batch.inputs, inputs.data());
  be.upload(batch.targets, targets.data());
}

Batch FileData::next(Backend& be, int64_t step) {
  Batch batch = allocate_batch(be);
  if (!be.computes()) return batch;  // a dry run needs the shapes, not the tokens
  REMAT_ASSERT(open_, "FileData::next on a computing backend before open()");
  fill_batch(be, batch, [&](int64_t row) { return train_window(step, row); });
  return batch;
}

int64_t FileData::validation_batches(int64_t eval_tokens) const {
  if (!open_ || val_.windows() == 0) return 0;  // dry runs never open: they plan no evaluation
  const int64_t per_batch = B_ * T_;
  const int64_t tokens = eval_tokens > 0 ? eval_tokens : 8 * per_batch;
  const int64_t wanted = std::max<int64_t>(1, (tokens + per_batch - 1) / per_batch);
  const int64_t distinct =
      std::max<int64_t>(1, val_.windows() / B_);  // batches of distinct windows
  return std::min(wanted, distinct);
}

Batch FileData::validation_batch(Backend& be, int64_t index) {
  if (be.computes() && (!open_ || val_.windows() == 0))
    return DataSource::validation_batch(be, index);
  Batch batch = allocate_batch(be);
  if (!be.computes()) return batch;
  fill_batch(be, batch, [&](int64_t row) { return val_window(index, row); });
  return batch;
}

nlohmann::json FileData::cursor(int64_t steps) const {
  const int64_t rows = steps * B_;
  nlohmann::json j = {{"order", data_.order}, {"rows_drawn", rows}};
  if (data_.order == "sequential" && open_) {
    j["epoch"] = rows / train_.windows();
    j["window"] = rows % train_.windows();  // the next window to draw
    j["windows_per_epoch"] = train_.windows();
  }
  return j;
}

}  // namespace remat
