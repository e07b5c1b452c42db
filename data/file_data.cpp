// Windows over token shards and text files (see data/file_data.h).
#include "data/file_data.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iterator>
#include <set>

#include "data/documents.h"
#include "engine/config/shards_json.h"
#include "engine/core/error.h"
#include "engine/core/ops/loss.h"
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
  const std::string order = packed() ? fmt::format("packed rows of {}", T_)
                                     : fmt::format("{} windows of {}", data_.order, T_ + 1);
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

std::string FileData::documents_summary() const {
  if (!open_) return "";
  std::vector<std::string> parts;
  if (packed()) {
    const Packing& p = train_pack_;
    parts.push_back(fmt::format(
        "{} documents (end-of-text {}), mean {:.1f} tokens, packed into {} rows of {}: {:.1f}% "
        "padding",
        p.documents(), eot_,
        static_cast<double>(p.tokens()) / static_cast<double>(std::max<int64_t>(1, p.documents())),
        p.rows(), T_, 100.0 * p.padding()));
  } else if (data_.documents()) {
    parts.push_back(fmt::format("documents end with end-of-text {}", eot_));
  }
  if (data_.documents())
    parts.push_back("each token attends within its document, positions from 0");
  const int64_t masked = corpus_.masked_shards() + val_corpus_.masked_shards();
  if (masked > 0) {
    int64_t trained = 0, tokens = 0;
    for (const TokenCorpus* c : {&corpus_, &val_corpus_})
      for (const Shard& sh : c->shards())
        if (sh.mask()) {
          trained += sh.mask()->trained();
          tokens += sh.size();
        }
    parts.push_back(fmt::format(
        "loss masks beside {} of {} shards ({:.1f}% of their tokens trained)", masked,
        corpus_.shards().size() + val_corpus_.shards().size(),
        100.0 * static_cast<double>(trained) / static_cast<double>(std::max<int64_t>(1, tokens))));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

std::vector<std::string> FileData::warnings() const {
  if (!open_ || eot_ < 0) return {};
  for (const TokenCorpus* c : {&corpus_, &val_corpus_})
    for (const Shard& s : c->shards())
      if (s.contains(eot_)) return {};
  // Legal (a corpus may be one long document), but far more often a wrong id: documents that
  // never end train as one, with positions and attention running across what the user meant as
  // boundaries.
  return {fmt::format(
      "warning: [data] the end-of-text id {} ({}) never occurs in {}: each file is one document. "
      "Fix: set data.eot_token to the id your tokenizer ends documents with, or write the shards "
      "with scripts/prepare_data.py --documents, which ends each one",
      eot_, data_.eot_token >= 0 ? "data.eot_token" : "from shards.json", corpus_.list_files(1))};
}

void FileData::open() {
  open_ = false;
  val_corpus_ = TokenCorpus();
  const bool masks = data_.loss_mask == "auto";
  corpus_ = TokenCorpus::open(data_.path, format_, V_, "data.path", masks);
  if (!data_.val_path.empty())
    val_corpus_ = TokenCorpus::open(data_.val_path, format_, V_, "data.val_path", masks);
  eot_ = data_.documents() || packed() ? resolve_eot() : -1;
  build_splits();
  if (packed()) build_packing();
  check_splits();
  marks_ =
      data_.documents() || packed() || corpus_.masked_shards() + val_corpus_.masked_shards() > 0;
  order_epoch_ = -1;
  // Random order reads scattered windows (read-ahead would fetch pages no window needs);
  // sequential order walks each shard front to back.
  const auto access =
      data_.order == "random" ? DataFile::Access::Random : DataFile::Access::Sequential;
  for (const Shard& s : corpus_.shards()) s.advise(access);
  row_.assign(static_cast<size_t>(T_ + 1), 0);
  targets_.assign(static_cast<size_t>(T_), 0);
  docs_.assign(static_cast<size_t>(T_), 0);
  mask_.assign(static_cast<size_t>(T_ + 1), 1);
  open_ = true;
}

int64_t FileData::resolve_eot() const {
  if (data_.eot_token >= 0) return data_.eot_token;
  // What scripts/prepare_data.py recorded beside the shards: one shards.json per folder of them.
  namespace fs = std::filesystem;
  std::set<std::string> folders;
  for (const TokenCorpus* c : {&corpus_, &val_corpus_})
    for (const Shard& s : c->shards()) folders.insert(fs::path(s.path()).parent_path().string());
  int64_t eot = -1;
  std::string from;
  for (const std::string& folder : folders) {
    const std::optional<ShardsJson> j = read_shards_json(folder.empty() ? "." : folder);
    if (!j) continue;
    if (!j->problem.empty() || j->eot_token < 0 || j->eot_token >= V_)
      throw DataError(
          fmt::format("[data] {}: no end-of-text id in [0, {}) under \"eot_token\"{}. Fix: set "
                      "data.eot_token, or write the shards again with scripts/prepare_data.py",
                      j->path, V_, j->problem.empty() ? "" : " (" + j->problem + ")"));
    if (eot >= 0 && j->eot_token != eot)
      throw DataError(fmt::format(
          "[data] {} records end-of-text {}, {} records {}: the shards come from different "
          "tokenizers. Fix: train on one tokenizer's shards, or set data.eot_token",
          from, eot, j->path, j->eot_token));
    eot = j->eot_token;
    from = j->path;
  }
  if (eot < 0)
    throw DataError(fmt::format(
        "[data] data.{} = \"{}\" needs the end-of-text id that ends each document, and none is "
        "known: data.eot_token is not set and no shards.json lies beside the shards ({}). Fix: "
        "set data.eot_token, or prepare the data with scripts/prepare_data.py (--documents or "
        "--chat), which records it",
        data_.documents() ? "attention" : "order", data_.documents() ? "document" : "packed",
        corpus_.list_files(1)));
  return eot;
}

const Shard& FileData::pack_shard(uint32_t index) const {
  const size_t n = corpus_.shards().size();
  return index < n ? corpus_.shards()[index] : val_corpus_.shards()[index - n];
}

// The splits' documents: the runs of each split's part of a shard up to and including each
// end-of-text token (and the run to the part's end after the last one), as build_splits cuts them.
void FileData::build_packing() {
  std::vector<PackDocument> train, val;
  auto add = [&](std::vector<PackDocument>& out, const Shard& s, uint32_t index, int64_t begin,
                 int64_t end) {
    int64_t start = begin;
    for (int64_t e : s.document_ends(begin, end, eot_)) {
      out.push_back({index, start, e});
      start = e;
    }
  };
  const auto& shards = corpus_.shards();
  for (size_t i = 0; i < shards.size(); ++i) {
    const Shard& s = shards[i];
    const auto held =
        static_cast<int64_t>(std::floor(data_.val_fraction * static_cast<double>(s.size())));
    add(train, s, static_cast<uint32_t>(i), 0, s.size() - held);
    if (data_.val_path.empty() && held > 0)
      add(val, s, static_cast<uint32_t>(i), s.size() - held, s.size());
  }
  for (size_t i = 0; i < val_corpus_.shards().size(); ++i)
    add(val, val_corpus_.shards()[i], static_cast<uint32_t>(shards.size() + i), 0,
        val_corpus_.shards()[i].size());
  train_pack_ = Packing::pack(train, T_, seed_);
  val_pack_ = Packing::pack(val, T_, seed_);
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
  if (packed()) {  // rows of documents, however short: only an empty split has none
    if (train_pack_.rows() == 0)
      throw DataError(fmt::format("[data] data.path: no token to train on: {}. Fix: add data{}",
                                  train_.list(),
                                  data_.val_fraction > 0 ? " (or lower data.val_fraction)" : ""));
    if ((!data_.val_path.empty() || data_.val_fraction > 0) && val_pack_.rows() == 0)
      throw DataError(
          fmt::format("[data] {}: the validation split holds no token: {}. Fix: {}",
                      data_.val_path.empty() ? "data.val_fraction" : "data.val_path", val_.list(),
                      data_.val_path.empty() ? "raise data.val_fraction" : "add validation data"));
    return;
  }
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

int64_t FileData::packed_train_row(int64_t step, int64_t row) const {
  REMAT_ASSERT(open_ && packed(), "FileData: packed rows of an opened packed source");
  const int64_t r = step * B_ + row, rows = train_pack_.rows();
  const int64_t epoch = r / rows;
  if (epoch != order_epoch_) {  // a step's rows are in at most two epochs: one is cached
    order_ = epoch_order(rows, seed_, epoch);
    order_epoch_ = epoch;
  }
  return order_[static_cast<size_t>(r % rows)];
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
  if (data_.documents())
    batch.doc_start =
        pool.allocate({share_.rows, Tl}, DType::I32, MemCategory::Transient, "batch.doc_start");
  batch.n_tokens = share_.rows * Tl;
  return batch;
}

// T + 1 tokens from the window's start: inputs row_[0 .. T), targets row_[1 .. T] unless marked.
void FileData::window_row(const Window& w) {
  w.shard->read(w.start, T_ + 1, row_.data(), V_);
  touched_.push_back(w.shard);
  if (!marks_) return;
  const LossMask* mask = w.shard->mask();
  if (mask) mask->read(w.start, T_ + 1, mask_.data());
  mark_row(row_.data(), mask ? mask_.data() : nullptr, T_, data_.documents() ? eot_ : -1,
           targets_.data(), docs_.data());
}

// A packed row: its pieces one after the other, each a document of its own (its first token
// starts one), then padding: end-of-text tokens, each a document of one token, never trained.
// A piece's targets are its next tokens; its last one is trained only when its document goes on
// (a long document's piece), and then reads the token after the piece.
void FileData::packed_row(const Packing& packing, int64_t r) {
  int64_t t = 0;
  for (const PackPiece& piece : packing.row(r)) {
    const Shard& shard = pack_shard(piece.shard);
    const int64_t n = piece.length, with_next = n + (piece.continues ? 1 : 0);
    int32_t* tokens = row_.data() + t;  // n inputs; the next token lands on row_[t + n] for now
    shard.read(piece.start, with_next, tokens, V_);
    const int32_t next = piece.continues ? tokens[n] : kIgnoredTarget;
    const LossMask* mask = shard.mask();
    if (mask) mask->read(piece.start, with_next, mask_.data());
    for (int64_t i = 0; i < n; ++i) {
      const bool last = i + 1 == n;
      const int32_t target = last ? next : tokens[i + 1];
      const bool trained = target != kIgnoredTarget && (!mask || mask_[static_cast<size_t>(i + 1)]);
      targets_[static_cast<size_t>(t + i)] = trained ? target : kIgnoredTarget;
      docs_[static_cast<size_t>(t + i)] = static_cast<int32_t>(t);
    }
    touched_.push_back(&shard);
    t += n;
  }
  for (; t < T_; ++t) {
    row_[static_cast<size_t>(t)] = static_cast<int32_t>(eot_);
    targets_[static_cast<size_t>(t)] = kIgnoredTarget;
    docs_[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  }
}

template <class RowOf>
FileData::HostBatch FileData::read_batch(RowOf row_of) {
  const int64_t Tl = share_.positions.tokens();
  const size_t n = static_cast<size_t>(share_.rows * Tl);
  HostBatch h{std::vector<int32_t>(n), std::vector<int32_t>(n),
              std::vector<int32_t>(data_.documents() ? n : 0), 0};
  touched_.clear();
  for (int64_t b = 0; b < share_.rows; ++b) {
    row_of(share_.first_row + b);
    // This rank's positions (all of them on one rank).
    share_.positions.for_each([&](int64_t j, int64_t t) {
      const auto at = static_cast<size_t>(b * Tl + j), ti = static_cast<size_t>(t);
      h.inputs[at] = row_[ti];
      h.targets[at] = marks_ ? targets_[ti] : row_[ti + 1];
      h.trained += h.targets[at] != kIgnoredTarget;
      if (!h.docs.empty()) h.docs[at] = docs_[ti];
    });
  }
  // After the reads, before the batch is used: a file that changed since open (even while these
  // windows were read) stops the run here, and this batch is never trained on.
  std::sort(touched_.begin(), touched_.end());
  touched_.erase(std::unique(touched_.begin(), touched_.end()), touched_.end());
  for (const Shard* s : touched_) s->check_unchanged();
  return h;
}

template <class RowOf>
void FileData::fill_batch(Backend& be, Batch& batch, RowOf row_of) {
  upload_batch(be, batch, read_batch(row_of));
}

void FileData::upload_batch(Backend& be, Batch& batch, const HostBatch& h) const {
  be.upload(batch.inputs, h.inputs.data());
  be.upload(batch.targets, h.targets.data());
  if (!h.docs.empty()) be.upload(batch.doc_start, h.docs.data());
  if (marks_) batch.trained_targets = h.trained;
}

std::function<void(int64_t)> FileData::train_row_of(int64_t step) {
  if (packed())
    return [this, step](int64_t row) { packed_row(train_pack_, packed_train_row(step, row)); };
  return [this, step](int64_t row) { window_row(train_window(step, row)); };
}

Batch FileData::next(Backend& be, int64_t step) {
  Batch batch = allocate_batch(be);
  if (!be.computes()) return batch;  // a dry run needs the shapes, not the tokens
  REMAT_ASSERT(open_, "FileData::next on a computing backend before open()");
  // Counted steps before this one were never drawn (a step that failed): forgotten.
  counted_.erase(counted_.begin(), counted_.lower_bound(step));
  const auto counted = counted_.find(step);
  if (counted == counted_.end()) {
    fill_batch(be, batch, train_row_of(step));
  } else {
    upload_batch(be, batch, counted->second);  // read (and checked unchanged) when counted
    counted_.erase(counted);
  }
  return batch;
}

// The rows next(step) trains on, read once: kept until next(step) uploads them.
int64_t FileData::trained_targets(int64_t step) {
  if (!marks_) return -1;
  REMAT_ASSERT(open_, "FileData::trained_targets before open()");
  HostBatch h = read_batch(train_row_of(step));
  const int64_t trained = h.trained;
  counted_[step] = std::move(h);
  return trained;
}

int64_t FileData::validation_batches(int64_t eval_tokens) const {
  // Dry runs never open: they plan no evaluation.
  const int64_t rows = packed() ? val_pack_.rows() : val_.windows();
  if (!open_ || rows == 0) return 0;
  const int64_t per_batch = B_ * T_;
  const int64_t tokens = eval_tokens > 0 ? eval_tokens : 8 * per_batch;
  const int64_t wanted = std::max<int64_t>(1, (tokens + per_batch - 1) / per_batch);
  const int64_t distinct = std::max<int64_t>(1, rows / B_);  // batches of distinct rows
  return std::min(wanted, distinct);
}

Batch FileData::validation_batch(Backend& be, int64_t index) {
  if (be.computes() && validation_batches(1) == 0) return DataSource::validation_batch(be, index);
  Batch batch = allocate_batch(be);
  if (!be.computes()) return batch;
  if (packed())  // the packed rows in their packing's order, wrapping around as windows do
    fill_batch(be, batch,
               [&](int64_t row) { packed_row(val_pack_, (index * B_ + row) % val_pack_.rows()); });
  else
    fill_batch(be, batch, [&](int64_t row) { window_row(val_window(index, row)); });
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
  if (packed() && open_) {
    j["epoch"] = rows / train_pack_.rows();
    j["row"] = rows % train_pack_.rows();  // the next of the epoch's rows to draw
    j["rows_per_epoch"] = train_pack_.rows();
    j["documents"] = train_pack_.documents();
  }
  return j;
}

}  // namespace remat
