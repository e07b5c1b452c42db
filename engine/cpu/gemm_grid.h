// How the CPU GEMM (gemm.h) cuts a product into single-threaded library calls: a function of the
// product's shape alone, never of the thread count, so every thread count computes every element
// by the same calls, bit for bit. Pure arithmetic, no BLAS (linear.cpp sizes the partial sums of
// a split weight gradient from it).
#pragma once

#include <cstdint>

namespace remat::cpu {

/// The output tiles of one product: rows x cols elements each (the last row and column of tiles
/// may be smaller).
struct TileGrid {
  int64_t rows, cols;
};
/// The grid that packs the least among those with at least 8 tiles of at most 512 x 512 elements
/// (gemm_grid.cpp says why).
TileGrid choose_tile_grid(int64_t M, int64_t N);

/// A product cut along K as well: each tile of `tiles` is `slabs` library calls over equal parts
/// of K, the first into C (with the product's beta), the others into partial sums that are then
/// added to C in slab order. slabs == 1 is the plain tile grid.
struct SplitGrid {
  TileGrid tiles;
  int64_t slabs = 1;
};
/// For a product whose output is small next to its K (a weight gradient over many tokens), where
/// tiles alone pack the long operands once per tile row and column: the split that moves the
/// least memory, packing and partial sums together, among those with at least 8 calls; the plain
/// tile grid wherever it moves less (gemm_grid.cpp).
SplitGrid choose_split_grid(int64_t M, int64_t N, int64_t K);
/// Floats of partial sums a product split by `g` needs: (slabs - 1) M N.
int64_t split_partial_floats(const SplitGrid& g, int64_t M, int64_t N);

}  // namespace remat::cpu
