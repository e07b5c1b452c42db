// First-fit packing of documents into rows (see data/packing.h).
#include "data/packing.h"

#include <algorithm>
#include <numeric>

#include "engine/core/error.h"
#include "engine/core/rng.h"

namespace remat {
namespace {

constexpr uint64_t kPackStream = 0x7061636b6564ull;  // "packed"
constexpr uint64_t kEpochStream = 0x65706f6368ull;   // "epoch"

/// Fisher-Yates over [0, n) with draw i from the counter RNG keyed by (seed, stream, i).
template <class T>
void shuffle(std::vector<T>& v, uint64_t seed, uint64_t stream) {
  for (size_t i = v.size(); i > 1; --i) {
    const uint64_t j = rng_bits(seed, stream, i) % i;  // bias below i / 2^64: immaterial here
    std::swap(v[i - 1], v[j]);
  }
}

/// The free space of rows 0 .. n-1 (a row not yet opened has all of it), and the first row with at
/// least a given amount: a max-tree over the rows, so each query and update is O(log n).
class FreeSpace {
 public:
  FreeSpace(int64_t n, int64_t row_tokens) {
    while (size_ < n) size_ *= 2;
    tree_.assign(static_cast<size_t>(2 * size_), 0);
    for (int64_t i = 0; i < n; ++i) tree_[static_cast<size_t>(size_ + i)] = row_tokens;
    for (int64_t i = size_ - 1; i >= 1; --i)
      tree_[at(i)] = std::max(tree_[at(2 * i)], tree_[at(2 * i + 1)]);
  }
  /// The first row with at least `need` free tokens.
  int64_t first_fit(int64_t need) const {
    REMAT_ASSERT(tree_[1] >= need, "packing: no row has {} free tokens", need);
    int64_t i = 1;
    while (i < size_) i = tree_[at(2 * i)] >= need ? 2 * i : 2 * i + 1;
    return i - size_;
  }
  void take(int64_t row, int64_t tokens) {
    int64_t i = size_ + row;
    tree_[at(i)] -= tokens;
    for (i /= 2; i >= 1; i /= 2) tree_[at(i)] = std::max(tree_[at(2 * i)], tree_[at(2 * i + 1)]);
  }

 private:
  static size_t at(int64_t i) { return static_cast<size_t>(i); }
  int64_t size_ = 1;
  std::vector<int64_t> tree_;
};

}  // namespace

Packing Packing::pack(const std::vector<PackDocument>& documents, int64_t row_tokens,
                      uint64_t seed) {
  REMAT_ASSERT(row_tokens > 0 && row_tokens < (int64_t{1} << 31), "packing rows of {} tokens",
               row_tokens);
  Packing p;
  p.row_tokens_ = row_tokens;
  // Long documents become row-long pieces first; then the pieces are shuffled and placed.
  std::vector<PackPiece> items;
  for (const PackDocument& d : documents) {
    if (d.end <= d.start) continue;
    ++p.documents_;
    p.tokens_ += d.end - d.start;
    for (int64_t at = d.start; at < d.end; at += row_tokens) {
      PackPiece piece;
      piece.start = at;
      piece.shard = d.shard;
      piece.length = static_cast<uint32_t>(std::min(row_tokens, d.end - at));
      piece.continues = at + row_tokens < d.end;
      items.push_back(piece);
    }
  }
  shuffle(items, seed, kPackStream);
  // First-fit leaves at most one row half empty or emptier (two such rows' pieces would have fit
  // in one), so it never opens more than 2 tokens / row_tokens + 1 rows.
  const int64_t max_rows = std::min<int64_t>(static_cast<int64_t>(items.size()),
                                             2 * ((p.tokens_ + row_tokens - 1) / row_tokens) + 1);
  FreeSpace free(max_rows, row_tokens);
  std::vector<int64_t> row_of(items.size());
  std::vector<int64_t> count;  // pieces per row
  for (size_t i = 0; i < items.size(); ++i) {
    const int64_t r = free.first_fit(items[i].length);
    free.take(r, items[i].length);
    row_of[i] = r;
    if (r >= static_cast<int64_t>(count.size())) count.resize(static_cast<size_t>(r + 1), 0);
    ++count[static_cast<size_t>(r)];
  }
  p.row_begin_.assign(count.size() + 1, 0);
  std::partial_sum(count.begin(), count.end(), p.row_begin_.begin() + 1);
  // Each row's pieces in the order they were placed: a stable scatter by row.
  p.pieces_.resize(items.size());
  std::vector<int64_t> next(p.row_begin_.begin(), p.row_begin_.end() - 1);
  for (size_t i = 0; i < items.size(); ++i)
    p.pieces_[static_cast<size_t>(next[static_cast<size_t>(row_of[i])]++)] = items[i];
  return p;
}

std::span<const PackPiece> Packing::row(int64_t r) const {
  REMAT_ASSERT(r >= 0 && r < rows(), "packed row {} of {}", r, rows());
  const auto begin = static_cast<size_t>(row_begin_[static_cast<size_t>(r)]);
  const auto end = static_cast<size_t>(row_begin_[static_cast<size_t>(r + 1)]);
  return {pieces_.data() + begin, end - begin};
}

double Packing::padding() const {
  const double capacity = static_cast<double>(rows()) * static_cast<double>(row_tokens_);
  return capacity > 0 ? 1.0 - static_cast<double>(tokens_) / capacity : 0.0;
}

std::vector<int64_t> epoch_order(int64_t rows, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(rows));
  std::iota(order.begin(), order.end(), int64_t{0});
  shuffle(order, seed ^ mix64(static_cast<uint64_t>(epoch) + 1), kEpochStream);
  return order;
}

}  // namespace remat
