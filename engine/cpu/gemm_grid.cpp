// The CPU GEMM's grids (see engine/cpu/gemm_grid.h).

#include "engine/cpu/gemm_grid.h"

#include <algorithm>

namespace remat::cpu {
namespace {

constexpr int64_t kMinCalls = 8, kMaxTileElems = 512 * 512, kAlign = 16;
// A slab is at least kMinSlabK rows of K: slabs of 512 made GPT-2 124M's 768 x 768 x 1024 weight
// gradient 4-6% slower than its tiles (AMD VM, 2026-12-03, a one-off timing of the product
// alone), so at 1024 tokens GPT-2 keeps its tiles.
constexpr int64_t kMinSlabK = 1024;
constexpr int64_t kMaxSlabs = kMinCalls;
// A partial sum costs its slab's call a zeroing pass and its writes, and the sum in slab order a
// read and a read-modify-write of C, while the partials are small enough to stay in cache; a
// packed float is read from memory in a training step. So a partial element counts as 2 packed
// floats: in the MLP's step more slabs and fewer tiles ran faster (below).
constexpr int64_t kPartialCost = 2;
// Beyond this many floats (16 MiB) of partial sums, the cache argument above no longer holds.
constexpr int64_t kMaxPartialFloats = int64_t{4} << 20;

int64_t round_up(int64_t v, int64_t a) {
  return (v + a - 1) / a * a;
}
int64_t cdiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
// Floats a grid of tm x tn tiles packs per element of K: each tile's call packs its rows of A
// and its columns of B into buffers of its own, so A is packed once per column of tiles and B
// once per row.
int64_t packing_per_k(int64_t M, int64_t N, int64_t tm, int64_t tn) {
  return M * cdiv(N, tn) + N * cdiv(M, tm);
}
// The side of `parts` tiles spanning `extent` (a multiple of kAlign), and whether `parts - 1`
// tiles already had that side: the same grid, so the candidate loops skip it.
int64_t tile_side(int64_t extent, int64_t parts) {
  return round_up(cdiv(extent, parts), kAlign);
}
bool repeats(int64_t extent, int64_t parts) {
  return parts > 1 && tile_side(extent, parts - 1) == tile_side(extent, parts);
}
// The widest tile side (a multiple of kAlign) that keeps a tile of `side` rows or columns within
// kMaxTileElems.
int64_t widest_other_side(int64_t side) {
  return std::max(kAlign, kMaxTileElems / side / kAlign * kAlign);
}

}  // namespace

// Each tile is one library call, which packs the tile's rows of A and columns of B into its own
// buffers: a grid of r x c tiles packs A c times and B r times, K (M c + N r) floats. The grid
// packing the least is the one to run, among those with at least kMinCalls tiles (so that up to 8
// threads share a product evenly) of at most kMaxTileElems elements (so that a fused epilogue
// finds its tile in a 1-2 MiB L2, as it did with the square 512 tiles before). Tile sides are
// multiples of 16 (a vector of AVX-512), so column tiles start on whole vectors. Measured on the
// Intel VM (2026-12-02): GPT-2 124M's step 4% faster than with square tiles (3 of 3 alternated
// pairs), the LM head's dY W (192 x 768 x 50257: 8 column tiles spanning all rows, not 12
// squares of 128) 8% faster. A function of (M, N) alone: never of the thread count.
TileGrid choose_tile_grid(int64_t M, int64_t N) {
  // One tile for an output too small to split (an empty one included: sides stay positive).
  TileGrid best{std::max(kAlign, round_up(M, kAlign)), std::max(kAlign, round_up(N, kAlign))};
  int64_t best_cost = -1, best_tiles = 0;
  for (int64_t r = 1; r <= cdiv(M, kAlign); ++r) {
    if (repeats(M, r)) continue;
    const int64_t tm = tile_side(M, r), rows = cdiv(M, tm);
    // The fewest column tiles that make kMinCalls in all and keep a tile within kMaxTileElems.
    int64_t c = std::max<int64_t>(1, cdiv(kMinCalls, rows));
    c = std::max(c, cdiv(N, widest_other_side(tm)));
    const int64_t tn = tile_side(N, std::min(c, cdiv(N, kAlign))), cols = cdiv(N, tn);
    const int64_t cost = packing_per_k(M, N, tm, tn), n_tiles = rows * cols;
    // A grid short of kMinCalls (its columns ran out) only wins while no grid reaches it.
    const bool enough = n_tiles >= kMinCalls, best_enough = best_tiles >= kMinCalls;
    if (best_cost < 0 || (enough && !best_enough) ||
        (enough == best_enough &&
         (cost < best_cost || (cost == best_cost && n_tiles < best_tiles)))) {
      best = {tm, tn};
      best_cost = cost;
      best_tiles = n_tiles;
    }
  }
  return best;
}

// A weight gradient dY^T X over T tokens has a small output (C x C') and a long K (T): tiles
// alone make 8 calls by cutting that small output, and each call packs its share of both long
// operands, K (M c + N r) floats. Cutting K into slabs instead keeps the tiles few and large, so
// the operands are packed about once, at the price of (slabs - 1) M N partial sums. Each
// candidate is the fewest tiles of each shape (within kMaxTileElems) and the fewest slabs that
// make kMinCalls calls; its cost is packing plus partial sums. The plain tile grid stays wherever
// it costs no more, so a product that is not split keeps its bits. Measured on the AMD VM
// (2026-12-03, OpenBLAS tiles, three runs of remat_bench_gemm_cpu, rows "split as trained"): the
// 64k-token example's 64 x 64 x 65536 at 2.6-2.8x the rate of its 8 tiles, the T = 4096 model's
// 768 x 256 x 4096 5-8% faster, the tutorial MLP's 512 x 512 x 4096 (2 tiles x 4 slabs) 1-17%.
// In the MLP's step (bench, 4 alternated pairs) the share of the floor rose by 1.4 points on
// average, 3 of 4 pairs. 8 slabs of 512 rows gave +4.4 in an earlier try on that noisy host, and
// +0.6 in 4 alternated pairs on a calmer one (2026-12-03, later), and such short slabs lose on
// GPT-2 (kMinSlabK). A function of (M, N, K) alone: never of the thread count.
SplitGrid choose_split_grid(int64_t M, int64_t N, int64_t K) {
  SplitGrid best{choose_tile_grid(M, N), 1};
  const int64_t max_slabs = std::min(kMaxSlabs, K / kMinSlabK);
  if (M == 0 || N == 0 || max_slabs < 2) return best;
  auto calls = [&](const SplitGrid& g) {
    return cdiv(M, g.tiles.rows) * cdiv(N, g.tiles.cols) * g.slabs;
  };
  auto cost = [&](const SplitGrid& g) {
    return K * packing_per_k(M, N, g.tiles.rows, g.tiles.cols) +
           kPartialCost * split_partial_floats(g, M, N);
  };
  int64_t best_cost = cost(best);
  bool best_enough = calls(best) >= kMinCalls;
  for (int64_t r = 1; r <= cdiv(M, kAlign); ++r) {
    if (repeats(M, r)) continue;
    const int64_t tm = tile_side(M, r), rows = cdiv(M, tm);
    for (int64_t c = cdiv(N, widest_other_side(tm)); c <= cdiv(N, kAlign); ++c) {
      if (repeats(N, c)) continue;
      const int64_t tn = tile_side(N, c), tiles = rows * cdiv(N, tn);
      if (tiles >= kMinCalls) break;  // enough tiles: slabs would only add partial sums
      const SplitGrid g{{tm, tn}, std::clamp(cdiv(kMinCalls, tiles), int64_t{2}, max_slabs)};
      if (split_partial_floats(g, M, N) > kMaxPartialFloats) continue;
      const bool enough = calls(g) >= kMinCalls;
      const int64_t g_cost = cost(g);
      if ((enough && !best_enough) || (enough == best_enough && g_cost < best_cost)) {
        best = g;
        best_cost = g_cost;
        best_enough = enough;
      }
    }
  }
  return best;
}

int64_t split_partial_floats(const SplitGrid& g, int64_t M, int64_t N) {
  return (g.slabs - 1) * M * N;
}

}  // namespace remat::cpu
