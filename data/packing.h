// Packing documents into rows (data.order = "packed"): whole documents, in an order shuffled by
// the seed, each placed in the first row with room for it (first-fit, found in O(log rows) by a
// tree of the rows' free space); a document longer than a row is first cut into row-long pieces
// (the last one shorter), each packed as a document of its own. What is left at a row's end is
// padding, which the data source neither trains nor lets any token attend to.
//
// The packing is computed once per run (a pure function of the documents, the row length and
// the seed); each epoch presents its rows in an order of its own (epoch_order), so that a resumed
// run, which recomputes both, draws exactly the rows an uninterrupted one would.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace remat {

/// One document: tokens [start, end) of shard `shard` (an index into the caller's list).
struct PackDocument {
  uint32_t shard = 0;
  int64_t start = 0, end = 0;
};

/// A piece of a packed row: `length` tokens of shard `shard` from `start`. `continues`: the token
/// after the piece belongs to the same document (a long document's piece), so the piece's last
/// target is a trained one.
struct PackPiece {
  int64_t start = 0;
  uint32_t shard = 0;
  uint32_t length : 31 = 0;
  uint32_t continues : 1 = 0;
};

class Packing {
 public:
  Packing() = default;
  /// Packs `documents` into rows of `row_tokens` tokens, first-fit in the order the counter RNG
  /// keyed by `seed` shuffles them to.
  static Packing pack(const std::vector<PackDocument>& documents, int64_t row_tokens,
                      uint64_t seed);

  int64_t rows() const { return static_cast<int64_t>(row_begin_.size()) - 1; }
  /// Row r's pieces, in the order they were placed.
  std::span<const PackPiece> row(int64_t r) const;
  int64_t documents() const { return documents_; }
  int64_t tokens() const { return tokens_; }  // in documents (padding excluded)
  /// The share of the rows' tokens that is padding.
  double padding() const;

 private:
  std::vector<PackPiece> pieces_;      // row by row
  std::vector<int64_t> row_begin_{0};  // row r's pieces: [row_begin_[r], row_begin_[r + 1])
  int64_t row_tokens_ = 0, documents_ = 0, tokens_ = 0;
};

/// The order epoch `epoch` presents `rows` rows in: a permutation drawn by the counter RNG keyed by
/// (seed, epoch).
std::vector<int64_t> epoch_order(int64_t rows, uint64_t seed, int64_t epoch);

}  // namespace remat
