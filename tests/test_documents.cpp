// Documents, loss masks and packed rows (issue 61): the marking of a row (data/documents.h), the
// first-fit packing (data/packing.h), packed rows and masks read from hand-written shards, the
// end-of-text id from shards.json, every bad mask or missing id as a DataError naming the files;
// then whole models: a batch of documents gives each document's own losses and gradients (GPT with
// learned positions and with RoPE, the Llama family, tiled, attention in chunks), targets a mask
// hides change no bit of the gradient, packed rows resume where they stopped, and validation
// averages over the trained targets.
#include <fmt/format.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <set>

#include "data/documents.h"
#include "data/eval_windows.h"
#include "data/file_data.h"
#include "data/packing.h"
#include "data/synthetic.h"
#include "engine/config/config.h"
#include "engine/core/error.h"
#include "engine/core/ops/loss.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/remat/executor.h"
#include "engine/training/trainer.h"
#include "layers/models.h"
#include "temp_dir.h"
#include "tests/cli_util.h"
#include "tests/shard_files.h"
#include "tests/test_util.h"

using namespace remat;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using test::TempDir;

namespace {

constexpr int32_t kIgnored = kIgnoredTarget;

using test::data_error;
using test::download;

// A token-file config over `paths` (a TOML list), T tokens a row, B rows, [data] extras.
Config files_config(const std::string& paths, int64_t T, int64_t B, const std::string& extra) {
  return parse_config(fmt::format(R"(
[model]
vocab_size = 64
n_ctx = 64
[train]
seq_len = {}
batch_size = {}
seed = 5
[data]
source = "tokens"
path = {}
{}
)",
                                  T, B, paths, extra),
                      "test-documents");
}

}  // namespace

TEST_CASE("a row's documents start after each end-of-text, whose target is never trained",
          "[documents][data]") {
  // Tokens 5 6 EOT 7 EOT 8 9 | 10 with EOT = 1: inputs are the first 7, targets the last 7.
  const std::vector<int32_t> tokens = {5, 6, 1, 7, 1, 8, 9, 10};
  std::vector<int32_t> targets(7), starts(7, -5);
  CHECK(mark_row(tokens.data(), nullptr, 7, 1, targets.data(), starts.data()) == 5);
  CHECK(targets == std::vector<int32_t>{6, 1, kIgnored, 1, kIgnored, 9, 10});
  CHECK(starts == std::vector<int32_t>{0, 0, 0, 3, 3, 5, 5});
  // A mask byte per token: token i's byte says whether it is trained as a target.
  const std::vector<uint8_t> mask = {1, 0, 1, 1, 0, 1, 1, 0};
  CHECK(mark_row(tokens.data(), mask.data(), 7, 1, targets.data(), starts.data()) == 2);
  CHECK(targets == std::vector<int32_t>{kIgnored, 1, kIgnored, kIgnored, kIgnored, 9, kIgnored});
  // No documents (eot < 0): the mask alone, and the starts untouched.
  std::vector<int32_t> untouched(7, -5);
  CHECK(mark_row(tokens.data(), mask.data(), 7, -1, targets.data(), untouched.data()) == 4);
  CHECK(targets == std::vector<int32_t>{kIgnored, 1, 7, kIgnored, 8, 9, kIgnored});
  CHECK(untouched == std::vector<int32_t>(7, -5));
}

TEST_CASE("packing places every document whole, first-fit, long ones in row-long pieces",
          "[documents][data]") {
  // Documents of 1 .. 30 tokens and one of 47 (cut into 16, 16, 15) in rows of 16.
  std::vector<PackDocument> docs;
  int64_t at = 0, total = 0;
  for (int64_t n = 1; n <= 30; ++n) {
    docs.push_back({static_cast<uint32_t>(n % 3), at, at + n});
    at += n;
  }
  docs.push_back({7, 1000, 1047});
  for (const PackDocument& d : docs) total += d.end - d.start;
  const Packing p = Packing::pack(docs, 16, 11);
  CHECK(p.documents() == 31);
  CHECK(p.tokens() == total);
  // (shard, start, length, continues) of every piece, as the documents cut into rows give them:
  // a piece goes on into the next when its document does.
  std::multiset<std::tuple<uint32_t, int64_t, int64_t, bool>> seen, want;
  for (const PackDocument& d : docs)
    for (int64_t s = d.start; s < d.end; s += 16)
      want.insert({d.shard, s, std::min<int64_t>(16, d.end - s), s + 16 < d.end});
  int64_t used = 0;
  for (int64_t r = 0; r < p.rows(); ++r) {
    int64_t in_row = 0;
    for (const PackPiece& piece : p.row(r)) {
      in_row += piece.length;
      seen.insert({piece.shard, piece.start, piece.length, piece.continues});
    }
    CHECK(in_row <= 16);
    used += in_row;
  }
  CHECK(used == total);
  CHECK(seen == want);
  // First-fit: no two rows are both at most half full, so the padding stays below one row's half
  // per row on average; and rows never exceed 2 tokens / T + 1.
  int64_t half_empty = 0;
  for (int64_t r = 0; r < p.rows(); ++r) {
    int64_t in_row = 0;
    for (const PackPiece& piece : p.row(r)) in_row += piece.length;
    half_empty += in_row <= 8;
  }
  CHECK(half_empty <= 1);
  CHECK(p.padding() == Approx(1.0 - static_cast<double>(total) / (16.0 * p.rows())));
  // The seed decides the order; the same seed the same rows.
  const Packing again = Packing::pack(docs, 16, 11), other = Packing::pack(docs, 16, 12);
  auto layout = [](const Packing& q) {
    std::vector<int64_t> v;
    for (int64_t r = 0; r < q.rows(); ++r)
      for (const PackPiece& piece : q.row(r)) v.push_back(piece.start);
    return v;
  };
  CHECK(layout(again) == layout(p));
  CHECK(layout(other) != layout(p));
  // Each epoch's order is a permutation of its own.
  const std::vector<int64_t> e0 = epoch_order(p.rows(), 11, 0), e1 = epoch_order(p.rows(), 11, 1);
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> all(static_cast<size_t>(p.rows()));
  std::iota(all.begin(), all.end(), int64_t{0});
  CHECK(sorted == all);
  CHECK(e0 != e1);
  CHECK(e0 == epoch_order(p.rows(), 11, 0));
}

namespace {

// One shard of documents with EOT = 1: lengths 3, 5, 2, 9 (the last without an end-of-text: the
// shard's end ends it); token values follow their index (2 + index mod 30), EOTs excepted.
std::vector<uint16_t> document_tokens(const std::vector<int>& lengths, bool last_has_eot) {
  std::vector<uint16_t> t;
  for (size_t d = 0; d < lengths.size(); ++d)
    for (int i = 0; i < lengths[d]; ++i) {
      const bool eot = i + 1 == lengths[d] && (d + 1 < lengths.size() || last_has_eot);
      t.push_back(eot ? 1 : static_cast<uint16_t>(2 + t.size() % 30));
    }
  return t;
}

}  // namespace

TEST_CASE("an end-of-text id that never occurs is a warning naming the id and its source",
          "[documents][data]") {
  TempDir dir("never");
  const std::vector<uint16_t> tokens = document_tokens({3, 5, 2, 9}, false);
  test::write_bytes(dir / "a.bin", test::shard_bytes(tokens));
  auto warnings = [&](int eot) {
    FileData data(files_config(fmt::format("[\"{}\"]", dir / "a.bin"), 8, 3,
                               fmt::format("attention = \"document\"\neot_token = {}", eot)));
    data.open();
    return data.warnings();
  };
  CHECK(warnings(1).empty());
  const std::vector<std::string> w = warnings(7);  // 2 + i mod 30 skips 7 at no index: it occurs
  CHECK(w.empty());
  const std::vector<std::string> absent = warnings(40);
  REQUIRE(absent.size() == 1);
  CHECK_THAT(absent[0], StartsWith("warning: [data] the end-of-text id 40 (data.eot_token) never "
                                   "occurs in ") &&
                            Contains("a.bin") && Contains("Fix: set data.eot_token"));
}

TEST_CASE("packed rows hold whole documents, then untrained padding that attends to itself",
          "[documents][data]") {
  TempDir dir("packed");
  const std::vector<uint16_t> tokens = document_tokens({3, 5, 2, 9}, false);
  test::write_bytes(dir / "a.bin", test::shard_bytes(tokens));
  const Config cfg = files_config(fmt::format("[\"{}\"]", dir / "a.bin"), 8, 3,
                                  "order = \"packed\"\nattention = \"document\"\neot_token = 1");
  FileData data(cfg);
  data.open();
  CHECK_THAT(data.describe(), Contains("packed rows of 8"));
  CHECK_THAT(data.documents_summary(),
             Contains("4 documents (end-of-text 1), mean 4.8 tokens, packed into") &&
                 Contains("rows of 8"));
  cpu::CpuBackend be(1ull << 28, 1);
  // Every row, in order: inputs are pieces then EOT padding; targets are the next token inside a
  // document, ignored after an EOT, after a document's last token and on padding; each token's
  // document start is its piece's first index, padding's its own.
  const Packing& p = data.train_packing();
  REQUIRE(p.rows() >= 3);
  Batch b = data.next(be, 0);
  const std::vector<int32_t> in = download(be, b.inputs), tg = download(be, b.targets),
                             ds = download(be, b.doc_start);
  int64_t trained = 0;
  for (int64_t row = 0; row < 3; ++row) {
    const auto pieces = p.row(epoch_order(p.rows(), 5, 0)[static_cast<size_t>(row)]);
    int64_t t = 0;
    for (const PackPiece& piece : pieces) {
      for (int64_t i = 0; i < piece.length; ++i) {
        const size_t at = static_cast<size_t>(row * 8 + t + i);
        const int64_t token = piece.start + i;
        CHECK(in[at] == tokens[static_cast<size_t>(token)]);
        CHECK(ds[at] == t);
        const bool last = i + 1 == piece.length;
        const int32_t want = last && !piece.continues
                                 ? kIgnored
                                 : static_cast<int32_t>(tokens[static_cast<size_t>(token + 1)]);
        CHECK(tg[at] == want);
        trained += want != kIgnored;
      }
      t += piece.length;
    }
    for (; t < 8; ++t) {
      const size_t at = static_cast<size_t>(row * 8 + t);
      CHECK(in[at] == 1);
      CHECK(tg[at] == kIgnored);
      CHECK(ds[at] == t);
    }
  }
  CHECK(b.trained_targets == trained);
  // The 9-token document is cut into 8 + 1: its first piece's last target is the next token.
  int64_t continuing = 0;
  for (int64_t r = 0; r < p.rows(); ++r)
    for (const PackPiece& piece : p.row(r)) continuing += piece.continues;
  CHECK(continuing == 1);
}

TEST_CASE("packed order is a pure function of (seed, step): a resumed source draws the same rows",
          "[documents][data]") {
  TempDir dir("packed-resume");
  std::vector<int> lengths;
  for (int i = 0; i < 40; ++i) lengths.push_back(1 + (i * 7) % 13);
  test::write_bytes(dir / "a.bin", test::shard_bytes(document_tokens(lengths, true)));
  const Config cfg = files_config(fmt::format("[\"{}\"]", dir / "a.bin"), 16, 3,
                                  "order = \"packed\"\neot_token = 1");
  cpu::CpuBackend be(1ull << 28, 1);
  FileData run(cfg);
  run.open();
  const int64_t rows = run.train_packing().rows();
  std::vector<std::vector<int32_t>> drawn;  // every step of two epochs and more, in one run
  for (int64_t s = 0; s < rows; ++s) drawn.push_back(download(be, run.next(be, s).inputs));
  for (int64_t s : {int64_t{0}, rows / 3, rows - 1}) {
    FileData resumed(cfg);  // a fresh source, as a resumed run opens one
    resumed.open();
    CHECK(download(be, resumed.next(be, s).inputs) == drawn[static_cast<size_t>(s)]);
  }
  // Each epoch shows every row once, and the next epoch another order of them.
  CHECK(run.cursor(rows) == nlohmann::json{{"order", "packed"},
                                           {"rows_drawn", 3 * rows},
                                           {"epoch", 3},
                                           {"row", 0},
                                           {"rows_per_epoch", rows},
                                           {"documents", 40}});
  std::vector<std::vector<std::vector<int32_t>>> epochs(3);  // each epoch's rows, in order
  for (int64_t r = 0; r < 3 * rows; ++r) {
    const std::vector<int32_t>& step = drawn[static_cast<size_t>(r / 3)];
    epochs[static_cast<size_t>(r / rows)].emplace_back(step.begin() + (r % 3) * 16,
                                                       step.begin() + (r % 3 + 1) * 16);
  }
  auto sorted = [](std::vector<std::vector<int32_t>> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  CHECK(sorted(epochs[1]) == sorted(epochs[0]));
  CHECK(sorted(epochs[2]) == sorted(epochs[0]));
  CHECK(epochs[1] != epochs[0]);
}

TEST_CASE("a loss mask beside its shard hides targets, and bad masks name both files",
          "[documents][data]") {
  TempDir dir("masks");
  const std::vector<uint16_t> tokens = {10, 11, 12, 13, 14, 15, 16, 17, 18};
  const std::vector<uint8_t> mask = {1, 1, 0, 0, 1, 1, 1, 0, 1};
  test::write_bytes(dir / "d/a.bin", test::shard_bytes(tokens));
  test::write_bytes(dir / "d/a.mask.bin", test::mask_bytes(mask));
  cpu::CpuBackend be(1ull << 28, 1);
  SECTION("read in sequential windows; a folder's mask is no shard") {
    const Config cfg =
        files_config(fmt::format("\"{}\"", dir / "d"), 8, 1, "order = \"sequential\"");
    FileData data(cfg);
    data.open();
    REQUIRE(data.train_split().windows() == 1);  // a.mask.bin was not taken for a shard
    CHECK_THAT(data.documents_summary(), Contains("loss masks beside 1 of 1 shards (66.7%"));
    Batch b = data.next(be, 0);
    CHECK(download(be, b.targets) ==
          std::vector<int32_t>{11, kIgnored, kIgnored, 14, 15, 16, kIgnored, 18});
    CHECK(b.trained_targets == 5);
    CHECK(b.doc_start.empty());  // causal attention: no documents travel
    // data.loss_mask = "off": every target, and no count (as before masks existed).
    const Config off = files_config(fmt::format("\"{}\"", dir / "d"), 8, 1,
                                    "order = \"sequential\"\nloss_mask = \"off\"");
    FileData plain(off);
    plain.open();
    Batch c = plain.next(be, 0);
    CHECK(download(be, c.targets) == std::vector<int32_t>{11, 12, 13, 14, 15, 16, 17, 18});
    CHECK(c.trained_targets == -1);
  }
  SECTION("a mask that does not match its shard") {
    const std::string shard = dir / "d/a.bin", m = dir / "d/a.mask.bin";
    auto open_with = [&](const std::string& bytes) {
      test::write_bytes(m, bytes);
      FileData data(files_config(fmt::format("[\"{}\"]", shard), 4, 1, ""));
      return data_error([&] { data.open(); });
    };
    for (const auto& [bytes, says] : std::vector<std::pair<std::string, std::string>>{
             {test::mask_bytes({1, 1, 0}), "the header counts 3 tokens, the shard has 9"},
             {test::mask_bytes(mask, kShardMagic), "header magic 20240520 version 1"},
             {test::mask_bytes(mask, kMaskMagic, 2), "version 2, a loss mask has magic 20240522"},
             {test::mask_bytes(mask) + "x", "1034 bytes, 1033 expected"},
             {test::mask_bytes(mask).substr(0, 1030), "1030 bytes, 1033 expected"},
             {test::mask_bytes({1, 1, 0, 0, 2, 1, 1, 0, 1}), "byte 2 for token 4"},
             {std::string(100, '\0'), "100 bytes, shorter than the 1024-byte header"}}) {
      const std::string msg = open_with(bytes);
      INFO(msg);
      CHECK_THAT(msg, Contains(m) && Contains("the loss mask of " + shard) && Contains(says) &&
                          Contains("Fix:"));
    }
  }
  SECTION("eval scores the targets the mask trains, as validation does") {
    // --data a.bin: window 0 is tokens 0..8, its targets tokens 1..8, scored where the mask is 1.
    const Config cfg = files_config(fmt::format("\"{}\"", dir / "d"), 8, 1, "");
    const EvalWindows windows(cfg, {dir / "d/a.bin"});
    CHECK(windows.masked());
    CHECK_THAT(windows.describe(1), Contains("targets their loss masks hide are not scored"));
    std::vector<int32_t> tokens_read(9);
    std::vector<uint8_t> scored(8);
    windows.read(0, tokens_read.data(), scored.data());
    CHECK(scored == std::vector<uint8_t>(mask.begin() + 1, mask.end()));
    // loss_mask = "off": every target, as training reads it then.
    const Config off = files_config(fmt::format("\"{}\"", dir / "d"), 8, 1, "loss_mask = \"off\"");
    const EvalWindows plain(off, {dir / "d/a.bin"});
    CHECK_FALSE(plain.masked());
    plain.read(0, tokens_read.data(), scored.data());
    CHECK(scored == std::vector<uint8_t>(8, 1));
  }
  SECTION("a mask that trains nothing, or that cannot be read, stops the run") {
    // All zeros: a loss of 0 that learns nothing. A dangling link: not "no mask" (every target).
    const std::string shard = dir / "d/a.bin", m = dir / "d/a.mask.bin";
    test::write_bytes(m, test::mask_bytes(std::vector<uint8_t>(tokens.size(), 0)));
    FileData none(files_config(fmt::format("[\"{}\"]", shard), 4, 1, ""));
    CHECK_THAT(data_error([&] { none.open(); }),
               Contains("[data] data.path: the loss masks beside its 1 shard train no target") &&
                   Contains(m) && Contains("data.loss_mask = \"off\""));
    std::filesystem::remove(m);
    std::filesystem::create_symlink(dir / "d/nowhere.mask.bin", m);
    FileData dangling(files_config(fmt::format("[\"{}\"]", shard), 4, 1, ""));
    CHECK_THAT(data_error([&] { dangling.open(); }), Contains(m));
  }
  SECTION("a mask named as data") {
    FileData data(files_config(fmt::format("[\"{}\"]", dir / "d/a.mask.bin"), 4, 1, ""));
    CHECK_THAT(data_error([&] { data.open(); }),
               Contains("is a loss mask, read beside its shard") && Contains("a.bin"));
  }
}

TEST_CASE("the end-of-text id comes from data.eot_token, else from shards.json beside the shards",
          "[documents][data]") {
  TempDir dir("eot");
  test::write_bytes(dir / "a/x.bin", test::shard_bytes(document_tokens({4, 4, 4}, true)));
  test::write_bytes(dir / "b/y.bin", test::shard_bytes(document_tokens({4, 4, 4}, true)));
  const std::string both = fmt::format("[\"{}\", \"{}\"]", dir / "a/x.bin", dir / "b/y.bin");
  auto open = [&](const std::string& extra) {
    auto d = std::make_unique<FileData>(files_config(both, 8, 1, extra));
    d->open();
    return d;
  };
  CHECK_THAT(data_error([&] { open("attention = \"document\""); }),
             Contains("data.attention = \"document\" needs the end-of-text id") &&
                 Contains("no shards.json lies beside the shards") &&
                 Contains("Fix: set data.eot_token"));
  test::write_bytes(dir / "a/shards.json", R"({"eot_token": 1, "vocab_size": 64})");
  CHECK(open("attention = \"document\"")->eot_token() == 1);
  CHECK(open("order = \"packed\"\neot_token = 3")->eot_token() == 3);  // the key wins
  test::write_bytes(dir / "b/shards.json", R"({"eot_token": 2})");
  CHECK_THAT(data_error([&] { open("order = \"packed\""); }), Contains("records end-of-text 1") &&
                                                                  Contains("records 2") &&
                                                                  Contains("different tokenizers"));
  test::write_bytes(dir / "b/shards.json", R"({"eot_token": 640})");
  CHECK_THAT(data_error([&] { open("order = \"packed\""); }),
             Contains("b/shards.json: no end-of-text id in [0, 64)"));
  // A FIFO in its place is named, not read (which would block) nor taken for no file.
  std::filesystem::remove(dir / "b/shards.json");
  REQUIRE(mkfifo((dir / "b/shards.json").c_str(), 0600) == 0);
  CHECK_THAT(data_error([&] { open("order = \"packed\""); }),
             Contains("b/shards.json") && Contains("(not a regular file)"));
  CHECK(open("")->eot_token() == -1);  // causal windows need none
}

namespace {

// A small model's config: GPT (learned positions or RoPE) or the Llama family with every option.
std::string model_toml(const std::string& kind, int64_t T, int64_t B) {
  const std::string model =
      kind == "llama"
          ? "kind = \"llama\"\nn_layer = 2\nn_head = 4\nn_kv_head = 2\nhead_dim = 12\n"
            "n_embd = 32\nd_ff = 40\nvocab_size = 37\nattention_bias = true\nqk_norm = true\n"
            "tie_embeddings = false\n"
          : fmt::format(
                "n_layer = 2\nn_head = 2\nn_embd = 16\nvocab_size = 37\nn_ctx = 160\n"
                "position = \"{}\"\n",
                kind == "gpt-rope" ? "rope" : "learned");
  return fmt::format(
      "[model]\n{}[train]\nseq_len = {}\nbatch_size = {}\nloss_chunk = 16\n[device]\n"
      "threads = 2\n",
      model, T, B);
}

struct Pass {
  std::vector<float> row_losses;
  std::vector<std::vector<float>> grads;
  double mean = 0;
};

// One forward and backward of `batch` on a fresh model of `cfg` (weights from the seed alone, so
// every shape gets the same values).
Pass run_once(const Config& cfg, Backend& be, const Batch& batch) {
  std::unique_ptr<Model> model = make_model(cfg, be);
  for (Param& p : model->params()) be.fill(p.grad, 0.0f);
  const StepLoss loss = forward_backward(be, *model, resolve_remat_plan(cfg, *model), batch);
  Pass out{loss.row_losses, {}, loss.mean};
  for (Param& p : model->params()) out.grads.push_back(test::to_host(p.grad));
  return out;
}

// Rows of random tokens cut into documents of the given lengths (each row's sum to T) by EOT = 1,
// plus one more token a row for the last target.
struct DocumentBatch {
  int64_t B, T;
  std::vector<std::vector<int64_t>> lengths;
  std::vector<int32_t> inputs, targets, starts;
  int64_t trained = 0;
};
DocumentBatch document_batch(const std::vector<std::vector<int64_t>>& lengths, int64_t T) {
  DocumentBatch d{static_cast<int64_t>(lengths.size()), T, lengths, {}, {}, {}, 0};
  for (int64_t b = 0; b < d.B; ++b) {
    std::vector<int32_t> row;
    for (int64_t n : lengths[static_cast<size_t>(b)])
      for (int64_t i = 0; i < n; ++i)
        row.push_back(i + 1 == n ? 1 : 2 + static_cast<int32_t>(rng_bits(77, b, row.size()) % 35));
    row.push_back(2 + static_cast<int32_t>(rng_bits(78, b, 0) % 35));  // the last target
    std::vector<int32_t> targets(static_cast<size_t>(T)), starts(targets.size());
    d.trained += mark_row(row.data(), nullptr, T, 1, targets.data(), starts.data());
    d.inputs.insert(d.inputs.end(), row.begin(), row.end() - 1);
    d.targets.insert(d.targets.end(), targets.begin(), targets.end());
    d.starts.insert(d.starts.end(), starts.begin(), starts.end());
  }
  return d;
}

Batch upload(Backend& be, const std::vector<int32_t>& inputs, const std::vector<int32_t>& targets,
             const std::vector<int32_t>& starts, int64_t B, int64_t T, int64_t trained,
             int64_t divisor) {
  Batch b;
  b.inputs = test::make_i32(be, {B, T}, inputs);
  b.targets = test::make_i32(be, {B, T}, targets);
  if (!starts.empty()) b.doc_start = test::make_i32(be, {B, T}, starts);
  b.n_tokens = B * T;
  b.trained_targets = trained;
  b.step_targets = divisor;
  return b;
}

// The whole batch with documents, against each document alone in a batch of one (causal, its
// positions from 0) scaled by the same divisor: the same per-token losses, and gradients that sum
// to the batch's.
void check_documents_alone(const std::string& kind, const std::vector<std::string>& sets,
                           const std::vector<std::vector<int64_t>>& lengths, int64_t T) {
  CAPTURE(kind, T);
  cpu::CpuBackend be(1ull << 30, 2);
  const DocumentBatch d = document_batch(lengths, T);
  const Config cfg = parse_config(model_toml(kind, T, d.B), "documents", sets);
  const Pass whole =
      run_once(cfg, be, upload(be, d.inputs, d.targets, d.starts, d.B, T, d.trained, d.trained));
  std::vector<std::vector<double>> summed;
  for (const auto& g : whole.grads) summed.emplace_back(g.size(), 0.0);
  double loss_sum = 0;
  for (int64_t b = 0; b < d.B; ++b) {
    int64_t s = 0;
    for (int64_t n : d.lengths[static_cast<size_t>(b)]) {
      CAPTURE(b, s, n);
      const auto at = [&](const std::vector<int32_t>& v) {
        return std::vector<int32_t>(v.begin() + b * T + s, v.begin() + b * T + s + n);
      };
      const std::vector<int32_t> targets = at(d.targets);
      const int64_t trained =
          std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t >= 0; });
      const Config one = parse_config(model_toml(kind, n, 1), "documents", sets);
      const Pass alone =
          run_once(one, be, upload(be, at(d.inputs), targets, {}, 1, n, trained, d.trained));
      const std::vector<float> mine(whole.row_losses.begin() + b * T + s,
                                    whole.row_losses.begin() + b * T + s + n);
      CHECK(test::allclose(mine, alone.row_losses, test::kTolAttention, "row losses"));
      for (size_t p = 0; p < summed.size(); ++p)
        for (size_t i = 0; i < summed[p].size(); ++i) summed[p][i] += alone.grads[p][i];
      for (float l : alone.row_losses) loss_sum += l;
      s += n;
    }
  }
  CHECK(whole.mean == Approx(loss_sum / static_cast<double>(d.trained)).epsilon(1e-6));
  for (size_t p = 0; p < summed.size(); ++p) {
    CAPTURE(p);
    CHECK(test::allclose(whole.grads[p], summed[p], test::kTolAttention, "gradient"));
  }
}

// Two rows: documents across 64-token tiles, of one token, and a row that is one document.
const std::vector<std::vector<int64_t>> kRows = {{1, 17, 70, 3, 29}, {120}};

}  // namespace

TEST_CASE("a batch of documents gives each document's own losses and gradients, GPT and Llama",
          "[documents]") {
  const std::string kind = GENERATE("gpt-learned", "gpt-rope", "llama");
  SECTION("whole rows") {
    check_documents_alone(kind, {}, kRows, 120);
  }
  SECTION("the MLP tiled") {
    check_documents_alone(kind, {"remat.tile_tokens=7"}, kRows, 120);
  }
  SECTION("attention over 64-token chunks, full remat") {
    check_documents_alone(kind, {"remat.attention_chunk=64", "remat.policy=full"}, kRows, 120);
  }
}

TEST_CASE("targets a loss mask hides change no bit of the gradient", "[documents][data]") {
  // Sequential windows of 8 over 17 tokens: the first window's last target, token 8, is no input
  // of it. Masked, its value changes nothing; trained, it changes the gradient (the control).
  TempDir dir("masked-grad");
  std::vector<uint16_t> tokens(17);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(3 + (i * 5) % 31);
  std::vector<uint8_t> mask(17, 1);
  mask[3] = 0;
  mask[8] = 0;
  auto gradient = [&](uint16_t token8, bool masked) {
    std::vector<uint16_t> t = tokens;
    t[8] = token8;
    test::write_bytes(dir / "a.bin", test::shard_bytes(t));
    std::vector<uint8_t> m = mask;
    m[8] = masked ? 0 : 1;
    test::write_bytes(dir / "a.mask.bin", test::mask_bytes(m));
    Config cfg = parse_config(model_toml("gpt-rope", 8, 1), "masked",
                              {"data.source=\"tokens\"", "data.order=\"sequential\"",
                               fmt::format("data.path=\"{}\"", dir / "a.bin")});
    cpu::CpuBackend be(1ull << 28, 2);
    FileData data(cfg);
    data.open();
    Batch b = data.next(be, 0);
    b.step_targets = b.trained_targets;
    return run_once(cfg, be, b).grads;
  };
  CHECK(test::bitwise_equal(gradient(20, true), gradient(33, true)));
  CHECK_FALSE(test::bitwise_equal(gradient(20, false), gradient(33, false)));
}

TEST_CASE("validation averages over the trained targets of all its batches", "[documents]") {
  // Two packed validation rows of different trained counts: the mean is over targets, not rows
  // or batches.
  TempDir dir("val-docs");
  test::write_bytes(dir / "t.bin", test::shard_bytes(document_tokens({5, 9, 3, 12, 2, 6}, true)));
  test::write_bytes(dir / "v.bin", test::shard_bytes(document_tokens({12, 2, 4, 11}, true)));
  Config cfg = parse_config(
      model_toml("gpt-rope", 12, 1), "val",
      {"data.source=\"tokens\"", "data.order=\"packed\"", "data.attention=\"document\"",
       "data.eot_token=1", fmt::format("data.path=\"{}\"", dir / "t.bin"),
       fmt::format("data.val_path=\"{}\"", dir / "v.bin")});
  cpu::CpuBackend be(1ull << 28, 2);
  std::unique_ptr<Model> model = make_model(cfg, be);
  FileData data(cfg);
  data.open();
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, data);
  const int64_t n = data.validation_batches(1 << 20);
  REQUIRE(n >= 2);
  double sum = 0;
  int64_t counted = 0;
  std::set<int64_t> counts;
  for (int64_t i = 0; i < n; ++i) {
    Batch b = data.validation_batch(be, i);
    const StepLoss l = forward_loss(be, *model, b);
    for (float v : l.row_losses) sum += v;
    counted += b.trained_targets;
    counts.insert(b.trained_targets);
  }
  CHECK(counts.size() > 1);  // batches that count differently, or the test proves nothing
  CHECK(trainer.evaluate(1 << 20) == Approx(sum / static_cast<double>(counted)).epsilon(1e-12));
}

TEST_CASE("bad documents, masks and end-of-text ids stop the binary with one line, exit 2",
          "[smoke][documents]") {
  TempDir dir("docs-cli");
  test::write_bytes(dir / "a.bin", test::shard_bytes({1, 2, 3, 4, 5, 6, 7, 8}));
  const std::string base = fmt::format(
      "--config configs/text.toml --set device.memory=1GiB --set remat.policy=full --set "
      "data.source=tokens --set data.path={} --set train.seq_len=4",
      dir / "a.bin");
  auto one_line = [](const test::CliResult& r) {
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
    CHECK_THAT(r.out, Contains("Fix:"));
  };
  test::write_bytes(dir / "a.mask.bin", test::mask_bytes({1, 1, 1}));
  const test::CliResult mask = test::run_binary(base, true);
  one_line(mask);
  CHECK_THAT(mask.out,
             Contains(dir / "a.mask.bin") && Contains("the loss mask of " + dir / "a.bin"));
  const test::CliResult eot =
      test::run_binary(base + " --set data.loss_mask=off --set data.order=packed", true);
  one_line(eot);
  CHECK_THAT(eot.out, Contains("data.order = \"packed\" needs the end-of-text id"));
  const test::CliResult synthetic =
      test::run_binary("--config configs/copy.toml --set data.attention=document --steps 1", true);
  one_line(synthetic);
  CHECK_THAT(synthetic.out, Contains("data.attention") && Contains("data.eot_token"));
  const test::CliResult vocab = test::run_binary(
      "--config configs/copy.toml --set data.attention=document --set data.eot_token=64", true);
  one_line(vocab);
  CHECK_THAT(vocab.out, Contains("end-of-text id 64 is outside the vocabulary"));
}
