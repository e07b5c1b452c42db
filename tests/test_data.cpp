// File-backed data: the llm.c token-shard reader and text files against hand-built files, every
// bad input as a DataError that names the file, path expansion (directories, globs), and the
// windows: a pure function of (seed, step, row), never crossing a shard or the validation split,
// sequential order covering each window once per epoch, and dry runs that touch no file.
#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "data/dataset.h"
#include "data/file_data.h"
#include "data/gaussian.h"
#include "data/synthetic.h"
#include "data/token_corpus.h"
#include "engine/config/config.h"
#include "engine/core/count_backend.h"
#include "engine/core/error.h"
#include "engine/cpu/cpu_backend.h"
#include "temp_dir.h"
#include "tests/shard_files.h"

using namespace remat;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

using test::TempDir;

using test::shard32_bytes;
using test::shard_bytes;
using test::write_bytes;

/// Tokens that say where they are: shard `id`, position i -> id * 1000 + i (unique below 65536).
std::vector<uint16_t> tagged_tokens(int id, int n) {
  std::vector<uint16_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<uint16_t>(id * 1000 + i);
  return t;
}

std::string toml_list(const std::vector<std::string>& paths) {
  std::string out = "[";
  for (size_t i = 0; i < paths.size(); ++i) out += fmt::format("{}\"{}\"", i ? ", " : "", paths[i]);
  return out + "]";
}

Config data_config(const std::string& source, const std::vector<std::string>& paths, int64_t T,
                   int64_t B, const std::string& data_extra = "", int64_t vocab = 60000) {
  return parse_config(fmt::format(R"(
[model]
vocab_size = {}
n_ctx = 1024
[train]
seq_len = {}
batch_size = {}
seed = 7
[data]
source = "{}"
path = {}
{}
)",
                                  vocab, T, B, source, toml_list(paths), data_extra),
                      "test-data");
}

std::unique_ptr<FileData> open_data(const Config& cfg) {
  auto d = std::make_unique<FileData>(cfg);
  d->open();
  return d;
}

using test::data_error;
using test::download;

}  // namespace

TEST_CASE("token shards are read as the llm.c format lays them out", "[data]") {
  TempDir dir;
  const std::vector<uint16_t> tokens = {0, 1, 255, 256, 513, 65535, 42};
  write_bytes(dir / "a.bin", shard_bytes(tokens));
  Shard s(dir / "a.bin", DataFormat::Tokens);
  REQUIRE(s.size() == 7);
  CHECK(s.bytes() == 1024 + 14);
  for (size_t i = 0; i < tokens.size(); ++i) CHECK(s.token(static_cast<int64_t>(i)) == tokens[i]);
  std::vector<int32_t> out(4);
  s.read(2, 4, out.data(), 65536);
  CHECK(out == std::vector<int32_t>{255, 256, 513, 65535});

  write_bytes(dir / "empty.bin", shard_bytes({}));  // a valid shard without tokens
  const TokenCorpus c = TokenCorpus::open({dir / "*.bin"}, DataFormat::Tokens, 65536, "data.path");
  REQUIRE(c.shards().size() == 2);
  CHECK(c.shards()[0].path() == dir / "a.bin");
  CHECK(c.total_tokens() == 7);
}

TEST_CASE("text files are read as bytes", "[data]") {
  TempDir dir;
  write_bytes(dir / "t.txt", std::string("hi\xff\x00!", 5));
  Shard s(dir / "t.txt", DataFormat::Text);
  REQUIRE(s.size() == 5);
  CHECK(s.token(0) == 'h');
  CHECK(s.token(2) == 255);
  CHECK(s.token(3) == 0);
}

TEST_CASE("bad token shards are DataErrors naming the file and the problem", "[data]") {
  TempDir dir;
  const std::string f = dir / "bad.bin";
  const std::vector<uint16_t> ok = tagged_tokens(0, 10);
  auto open = [&] { return TokenCorpus::open({f}, DataFormat::Tokens, 60000, "data.path"); };
  std::string msg;
  SECTION("empty") {
    write_bytes(f, "");
    msg = data_error(open);
    CHECK_THAT(msg, Contains("empty"));
  }
  SECTION("shorter than the header") {
    write_bytes(f, std::string(1000, 'x'));
    msg = data_error(open);
    CHECK_THAT(msg, Contains("1024-byte header"));
  }
  SECTION("bad magic") {
    write_bytes(f, shard_bytes(ok, 12345));
    msg = data_error(open);
    CHECK_THAT(msg, Contains("bad magic number 12345"));
  }
  SECTION("wrong version") {
    write_bytes(f, shard_bytes(ok, kShardMagic, 2));
    msg = data_error(open);
    CHECK_THAT(msg, Contains("unsupported version 2"));
  }
  SECTION("truncated") {
    write_bytes(f, shard_bytes(ok, kShardMagic, kShardVersion, 12));
    msg = data_error(open);
    CHECK_THAT(msg, Contains("truncated") && Contains("4 missing"));
  }
  SECTION("trailing bytes") {
    write_bytes(f, shard_bytes(ok) + "xyz");
    msg = data_error(open);
    CHECK_THAT(msg, Contains("3 trailing bytes"));
  }
  SECTION("token outside the vocabulary, found by the scan at open") {
    std::vector<uint16_t> t = ok;
    t[5] = 60000;
    write_bytes(f, shard_bytes(t));
    msg = data_error(open);
    CHECK_THAT(msg,
               Contains("token index 5 ") && Contains("is 60000") && Contains("model.vocab_size"));
  }
  CHECK_THAT(msg, Contains(f) && Contains("Fix:"));
  CHECK(msg.find('\n') == std::string::npos);
}

TEST_CASE("each window read is checked against the vocabulary too", "[data]") {
  TempDir dir;
  write_bytes(dir / "a.bin", shard_bytes(tagged_tokens(0, 20)));
  Shard s(dir / "a.bin", DataFormat::Tokens);
  std::vector<int32_t> out(8);
  const std::string msg = data_error([&] { s.read(4, 8, out.data(), 10); });  // tokens 4..11
  CHECK_THAT(msg, Contains(dir / "a.bin") && Contains("token index 10 ") && Contains("is 10") &&
                      Contains("byte offset 1044") && Contains("raise model.vocab_size"));
}

// Llama 3's vocabulary (128256) and Qwen's (151936) need ids past 65535: llm.c's "llama-3" shards.
TEST_CASE("uint32 token shards hold ids past 65535 and share every reader path", "[data]") {
  TempDir dir;
  const std::vector<uint32_t> tokens = {0, 65535, 65536, 128255, 151935, 7};
  write_bytes(dir / "a.bin", shard32_bytes(tokens));
  Shard s(dir / "a.bin", DataFormat::Tokens);
  REQUIRE(s.size() == 6);
  CHECK(s.bytes_per_token() == 4);
  CHECK(s.bytes() == 1024 + 24);
  for (size_t i = 0; i < tokens.size(); ++i) CHECK(s.token(static_cast<int64_t>(i)) == tokens[i]);
  std::vector<int32_t> out(4);
  s.read(1, 4, out.data(), 151936);
  CHECK(out == std::vector<int32_t>{65535, 65536, 128255, 151935});

  SECTION("a corpus mixes uint16 and uint32 shards") {
    write_bytes(dir / "b.bin", shard_bytes({1, 2, 3}));
    const TokenCorpus c =
        TokenCorpus::open({dir / "*.bin"}, DataFormat::Tokens, 151936, "data.path");
    REQUIRE(c.shards().size() == 2);
    CHECK(c.shards()[0].bytes_per_token() == 4);
    CHECK(c.shards()[1].bytes_per_token() == 2);
    CHECK(c.total_tokens() == 9);
  }
  SECTION("windows and the held-out tail read the uint32 values") {
    std::vector<uint32_t> big(100);
    for (size_t i = 0; i < big.size(); ++i) big[i] = 100000 + static_cast<uint32_t>(i);
    write_bytes(dir / "big.bin", shard32_bytes(big));  // 25 held out: [75, 100)
    auto data = open_data(data_config("tokens", {dir / "big.bin"}, 8, 2,
                                      "order = \"sequential\"\nval_fraction = 0.25", 110000));
    cpu::CpuBackend be(1ull << 30, 1);
    Batch b = data->next(be, 0);  // windows 0 and 1: tokens [0, 9) and [8, 17)
    const std::vector<int32_t> in = download(be, b.inputs), tg = download(be, b.targets);
    for (int64_t t = 0; t < 8; ++t) {
      CHECK(in[static_cast<size_t>(t)] == 100000 + t);
      CHECK(tg[static_cast<size_t>(t)] == 100001 + t);
      CHECK(in[static_cast<size_t>(8 + t)] == 100008 + t);
    }
    REQUIRE(data->val_split().windows() == 3);  // (25 - 1) / 8
    Batch v = data->validation_batch(be, 0);
    CHECK(download(be, v.inputs)[0] == 100075);
    CHECK_THAT(data->describe(), Contains("tokens: 1 shard, 100 tokens (train 75, val 25)"));
  }
  SECTION("a file truncated under the reader is DataChanged, as for uint16") {
    fs::resize_file(dir / "a.bin", 1024 + 10);
    CHECK_THROWS_AS(s.read(0, 6, out.data(), 151936), DataChanged);
  }
}

TEST_CASE("bad uint32 shards are one-line DataErrors naming the file, index and fix", "[data]") {
  TempDir dir;
  const std::string f = dir / "bad.bin";
  const std::vector<uint32_t> ok = {1, 70000, 128255, 3, 4, 5};
  auto open = [&] { return TokenCorpus::open({f}, DataFormat::Tokens, 128256, "data.path"); };
  std::string msg;
  SECTION("a token at the vocabulary size") {
    std::vector<uint32_t> t = ok;
    t[3] = 128256;
    write_bytes(f, shard32_bytes(t));
    msg = data_error(open);
    CHECK_THAT(msg, Contains("token index 3 (byte offset 1036) is 128256") &&
                        Contains("model.vocab_size = 128256") &&
                        Contains("raise model.vocab_size to at least 128257"));
  }
  SECTION("a token past INT32_MAX is refused, not read as negative") {
    std::vector<uint32_t> t = ok;
    t[4] = 0xffffffffu;
    write_bytes(f, shard32_bytes(t));
    msg = data_error(open);
    CHECK_THAT(msg, Contains("token index 4 ") && Contains("is 4294967295") &&
                        Contains("Fix: regenerate the shard"));
  }
  SECTION("the Llama 3 magic with GPT-2's version, and the reverse") {
    write_bytes(f, shard32_bytes(ok, kShard32Magic, kShardVersion));
    msg = data_error(open);
    CHECK_THAT(msg, Contains("unsupported version 1 for magic 20240801") && Contains("uint32"));
    write_bytes(f, shard_bytes({1, 2}, kShardMagic, kShard32Version));
    CHECK_THAT(data_error(open), Contains("unsupported version 7 for magic 20240520"));
  }
  SECTION("truncated and trailing bytes count 4 bytes a token") {
    write_bytes(f, shard32_bytes(ok, kShard32Magic, kShard32Version, 8));
    msg = data_error(open);
    CHECK_THAT(msg, Contains("8 uint32 tokens") && Contains("8 missing"));
    write_bytes(f, shard32_bytes(ok) + "xy");
    CHECK_THAT(data_error(open), Contains("2 trailing bytes after the 6 uint32 tokens"));
  }
  SECTION("an unknown magic names both formats") {
    write_bytes(f, shard32_bytes(ok, 20240802));
    msg = data_error(open);
    CHECK_THAT(
        msg, Contains("bad magic number 20240802") && Contains("20240520") && Contains("20240801"));
  }
  CHECK_THAT(msg, StartsWith("[data] " + f + ": ") && Contains("Fix:"));
  CHECK(msg.find('\n') == std::string::npos);
}

TEST_CASE("path errors name the entry and the fix", "[data]") {
  TempDir dir;
  std::string msg;
  SECTION("missing file") {
    msg =
        data_error([&] { expand_data_paths({dir / "nope.bin"}, DataFormat::Tokens, "data.path"); });
    CHECK_THAT(msg, Contains("does not exist") && Contains(dir / "nope.bin"));
  }
  SECTION("glob without a match") {
    msg =
        data_error([&] { expand_data_paths({dir / "x/*.bin"}, DataFormat::Tokens, "data.path"); });
    CHECK_THAT(msg, Contains("no file matches '" + (dir / "x/*.bin") + "'"));
  }
  SECTION("directory without shards") {
    write_bytes(dir / "d/readme.txt", "hello");
    msg = data_error([&] { expand_data_paths({dir / "d"}, DataFormat::Tokens, "data.path"); });
    CHECK_THAT(msg, Contains("has no *.bin files") && Contains(dir / "d"));
  }
  SECTION("not a regular file") {
    msg = data_error([] { expand_data_paths({"/dev/null"}, DataFormat::Text, "data.val_path"); });
    CHECK_THAT(msg, Contains("'/dev/null' is not a regular file") && Contains("data.val_path"));
  }
  SECTION("through open()") {
    const Config cfg = data_config("tokens", {dir / "missing/*.bin"}, 8, 2);
    auto data = make_data_source(cfg);  // builds without touching the files
    msg = data_error([&] { data->open(); });
    CHECK_THAT(msg, Contains("missing/*.bin"));
  }
  CHECK_THAT(msg, StartsWith("[data] data.") && Contains("Fix:"));
  CHECK(msg.find('\n') == std::string::npos);
}

TEST_CASE("directories and globs expand in a deterministic order", "[data]") {
  TempDir dir;
  for (const char* f :
       {"t/b.txt", "t/a.txt", "t/sub/z.md", "t/sub/deeper/c", "t/.hidden", "t/.git/config"})
    write_bytes(dir / f, "text");
  SECTION("text: a directory is every regular non-hidden file under it, sorted") {
    CHECK(expand_data_paths({dir / "t"}, DataFormat::Text, "data.path") ==
          std::vector<std::string>{dir / "t/a.txt", dir / "t/b.txt", dir / "t/sub/deeper/c",
                                   dir / "t/sub/z.md"});
  }
  SECTION("text: a glob, sorted; overlapping entries keep one copy") {
    CHECK(expand_data_paths({dir / "t/b.txt", dir / "t/*.txt"}, DataFormat::Text, "data.path") ==
          std::vector<std::string>{dir / "t/b.txt", dir / "t/a.txt"});
  }
  SECTION("tokens: a directory is its *.bin files, not recursive") {
    for (const char* f :
         {"s/train_2.bin", "s/train_1.bin", "s/notes.txt", "s/.tmp.bin", "s/old/x.bin"})
      write_bytes(dir / f, shard_bytes({1, 2}));
    CHECK(expand_data_paths({dir / "s"}, DataFormat::Tokens, "data.path") ==
          std::vector<std::string>{dir / "s/train_1.bin", dir / "s/train_2.bin"});
  }
  SECTION("a text corpus opens through make_data_source") {
    const Config cfg = data_config("text", {dir / "t"}, 3, 2, "", 256);
    auto data = make_data_source(cfg);
    data->open();
    CHECK_THAT(data->describe(), StartsWith("text: 4 files, 16 B as bytes"));
  }
}

TEST_CASE("text: a directory's or a glob's empty files add no text, and a named one is an error",
          "[data]") {
  TempDir dir;
  write_bytes(dir / "t/a.txt", "text");
  write_bytes(dir / "t/empty.txt", "");
  write_bytes(dir / "e/empty.txt", "");
  CHECK(expand_data_paths({dir / "t"}, DataFormat::Text, "data.path") ==
        std::vector<std::string>{dir / "t/a.txt"});
  CHECK(expand_data_paths({dir / "t/*.txt"}, DataFormat::Text, "data.path") ==
        std::vector<std::string>{dir / "t/a.txt"});
  std::string msg =
      data_error([&] { expand_data_paths({dir / "e"}, DataFormat::Text, "data.path"); });
  CHECK_THAT(msg, Contains("has no non-empty regular files"));
  msg = data_error([&] { expand_data_paths({dir / "e/*.txt"}, DataFormat::Text, "data.path"); });
  CHECK_THAT(msg, Contains("every file matching") && Contains("is empty"));
  msg = data_error(
      [&] { TokenCorpus::open({dir / "t/empty.txt"}, DataFormat::Text, 256, "data.path"); });
  CHECK_THAT(msg, Contains("t/empty.txt: the file is empty"));
}

TEST_CASE("windows are a pure function of (seed, step, row), and targets are inputs shifted by one",
          "[data]") {
  TempDir dir;
  write_bytes(dir / "a.bin", shard_bytes(tagged_tokens(1, 300)));
  write_bytes(dir / "b.bin", shard_bytes(tagged_tokens(2, 150)));
  const int64_t T = 16, B = 4;
  for (const char* order : {"random", "sequential"}) {
    INFO(order);
    const Config cfg =
        data_config("tokens", {dir / "*.bin"}, T, B, fmt::format("order = \"{}\"", order));
    cpu::CpuBackend be(1ull << 30, 1);
    auto first = open_data(cfg);
    std::vector<int32_t> in7, tg7;
    for (int64_t step = 0; step <= 7; ++step) {
      Batch b = first->next(be, step);
      in7 = download(be, b.inputs);
      tg7 = download(be, b.targets);
    }
    auto fresh = open_data(cfg);  // has not seen steps 0..6
    Batch b = fresh->next(be, 7);
    CHECK(download(be, b.inputs) == in7);
    CHECK(download(be, b.targets) == tg7);
    for (int64_t r = 0; r < B; ++r) {
      const Window w = fresh->train_window(7, r);
      const int32_t base = w.shard->token(w.start);
      for (int64_t t = 0; t < T; ++t) {
        const size_t i = static_cast<size_t>(r * T + t);
        CHECK(in7[i] == base + t);  // tagged tokens: consecutive values within a shard
        CHECK(tg7[i] == base + t + 1);
      }
    }
  }
}

TEST_CASE("another seed draws other random windows", "[data]") {
  TempDir dir;
  write_bytes(dir / "a.bin", shard_bytes(tagged_tokens(1, 5000)));
  auto a = open_data(data_config("tokens", {dir / "a.bin"}, 8, 4));
  Config other = data_config("tokens", {dir / "a.bin"}, 8, 4);
  other.train.seed = 8;
  auto b = open_data(other);
  int same = 0;
  for (int64_t r = 0; r < 64; ++r)
    same += a->train_window(r / 4, r % 4).start == b->train_window(r / 4, r % 4).start;
  CHECK(same < 4);
}

TEST_CASE("sequential order visits every window exactly once per epoch", "[data]") {
  TempDir dir;
  const int64_t T = 10, B = 3;
  write_bytes(dir / "a.bin", shard_bytes(tagged_tokens(1, 101)));  // (101 - 1) / 10 = 10 windows
  write_bytes(dir / "b.bin", shard_bytes(tagged_tokens(2, 10)));   // shorter than T + 1: none
  write_bytes(dir / "c.bin", shard_bytes(tagged_tokens(3, 35)));   // 3 windows (0, 10, 20)
  auto data = open_data(data_config("tokens", {dir / "*.bin"}, T, B, "order = \"sequential\""));
  const int64_t n = data->train_split().windows();
  REQUIRE(n == 13);
  std::vector<std::pair<std::string, int64_t>> epoch0, epoch1;
  for (int64_t r = 0; r < 2 * n; ++r) {
    const Window w = data->train_window(r / B, r % B);
    CHECK(w.start % T == 0);
    CHECK(w.start + T + 1 <= w.shard->size());
    (r < n ? epoch0 : epoch1).emplace_back(w.shard->path(), w.start);
  }
  CHECK(std::set(epoch0.begin(), epoch0.end()).size() == static_cast<size_t>(n));
  CHECK(epoch0 == epoch1);
  CHECK(epoch0.front() == std::pair<std::string, int64_t>{dir / "a.bin", 0});
  CHECK(epoch0.back() == std::pair<std::string, int64_t>{dir / "c.bin", 20});
  const nlohmann::json cur = data->cursor(5);  // 15 rows: epoch 1, window 2
  CHECK(cur["order"] == "sequential");
  CHECK(cur["rows_drawn"] == 15);
  CHECK(cur["epoch"] == 1);
  CHECK(cur["window"] == 2);
}

TEST_CASE("random windows reach the end of each shard and never cross shards", "[data]") {
  TempDir dir;
  const int64_t T = 8, B = 4;
  write_bytes(dir / "a.bin", shard_bytes(tagged_tokens(1, 40)));  // starts 0..31
  write_bytes(dir / "b.bin", shard_bytes(tagged_tokens(2, 5)));   // too short: never drawn
  write_bytes(dir / "c.bin", shard_bytes(tagged_tokens(3, 20)));  // starts 0..11
  auto data = open_data(data_config("tokens", {dir / "*.bin"}, T, B));
  REQUIRE(data->train_split().starts() == 32 + 12);
  std::map<std::string, std::set<int64_t>> starts;
  for (int64_t step = 0; step < 1000; ++step)
    for (int64_t r = 0; r < B; ++r) {
      const Window w = data->train_window(step, r);
      REQUIRE(w.start + T + 1 <= w.shard->size());
      starts[w.shard->path()].insert(w.start);
    }
  CHECK(starts.count(dir / "b.bin") == 0);
  CHECK(starts[dir / "a.bin"].size() == 32);  // every start, the last (31) included
  CHECK(starts[dir / "c.bin"].size() == 12);
  CHECK(data->cursor(3) == nlohmann::json{{"order", "random"}, {"rows_drawn", 12}});
}

TEST_CASE("val_fraction holds out each shard's tail: fixed batches, disjoint from training",
          "[data]") {
  TempDir dir;
  const int64_t T = 8, B = 2;
  write_bytes(dir / "a.bin", shard_bytes(tagged_tokens(1, 200)));  // 50 held out: [150, 200)
  write_bytes(dir / "b.bin", shard_bytes(tagged_tokens(2, 101)));  // 25 held out: [76, 101)
  for (const char* order : {"random", "sequential"}) {
    INFO(order);
    const Config cfg = data_config("tokens", {dir / "*.bin"}, T, B,
                                   fmt::format("order = \"{}\"\nval_fraction = 0.25", order));
    auto data = open_data(cfg);
    const std::map<std::string, int64_t> split = {{dir / "a.bin", 150}, {dir / "b.bin", 76}};
    for (int64_t step = 0; step < 500; ++step)
      for (int64_t r = 0; r < B; ++r) {
        const Window w = data->train_window(step, r);
        REQUIRE(w.start + T + 1 <= split.at(w.shard->path()));
      }
    // val windows: (50 - 1) / 8 = 6 and (25 - 1) / 8 = 3: 9 windows, 4 batches of distinct ones.
    REQUIRE(data->val_split().windows() == 9);
    CHECK(data->validation_batches(0) == 4);  // 8 batches wanted, capped
    CHECK(data->validation_batches(1) == 1);
    CHECK(data->validation_batches(3 * B * T) == 3);
    cpu::CpuBackend be(1ull << 30, 1);
    for (int64_t i = 0; i < 4; ++i) {
      for (int64_t r = 0; r < B; ++r) {
        const Window w = data->val_window(i, r);
        CHECK(w.start >= split.at(w.shard->path()));
        CHECK(w.start + T + 1 <= w.shard->size());
      }
      Batch x = data->validation_batch(be, i);
      const std::vector<int32_t> in = download(be, x.inputs), tg = download(be, x.targets);
      Batch y = data->validation_batch(be, i);
      CHECK(download(be, y.inputs) == in);
      CHECK(download(be, y.targets) == tg);
    }
    CHECK_THAT(data->describe(), Contains("tokens: 2 shards, 301 tokens (train 226, val 75)"));
  }
}

TEST_CASE("a validation split with fewer than B windows wraps around", "[data]") {
  TempDir dir;
  write_bytes(dir / "train.bin", shard_bytes(tagged_tokens(1, 100)));
  write_bytes(dir / "val.bin", shard_bytes(tagged_tokens(2, 17)));  // 2 windows of 9 at stride 8
  auto data = open_data(data_config("tokens", {dir / "train.bin"}, 8, 4,
                                    fmt::format("val_path = \"{}\"", dir / "val.bin")));
  CHECK(data->validation_batches(0) == 1);
  const std::vector<int64_t> starts = {data->val_window(0, 0).start, data->val_window(0, 1).start,
                                       data->val_window(0, 2).start, data->val_window(0, 3).start};
  CHECK(starts == std::vector<int64_t>{0, 8, 0, 8});
  CHECK(data->val_window(0, 0).shard->path() == dir / "val.bin");
}

TEST_CASE("too little data for one window is a DataError naming the files", "[data]") {
  TempDir dir;
  write_bytes(dir / "a.bin", shard_bytes(tagged_tokens(1, 16)));
  write_bytes(dir / "v.bin", shard_bytes(tagged_tokens(2, 10)));
  std::string msg;
  SECTION("training data") {
    msg = data_error([&] { open_data(data_config("tokens", {dir / "a.bin"}, 16, 2)); });
    CHECK_THAT(msg, Contains("dataset shorter than one window (seq_len + 1 = 17 tokens)") &&
                        Contains(dir / "a.bin") && Contains("lower train.seq_len"));
  }
  SECTION("validation files") {
    msg = data_error([&] {
      open_data(data_config("tokens", {dir / "a.bin"}, 12, 2,
                            fmt::format("val_path = \"{}\"", dir / "v.bin")));
    });
    CHECK_THAT(msg,
               Contains("validation split shorter than one window (seq_len + 1 = 13 tokens)") &&
                   Contains(dir / "v.bin"));
  }
  SECTION("validation fraction") {
    msg = data_error(
        [&] { open_data(data_config("tokens", {dir / "a.bin"}, 4, 2, "val_fraction = 0.25")); });
    CHECK_THAT(msg, Contains("validation split shorter than one window (seq_len + 1 = 5 tokens)") &&
                        Contains(dir / "a.bin (4 tokens)") && Contains("data.val_fraction"));
  }
  SECTION("a file in both data.path and data.val_path") {
    msg = data_error([&] {
      open_data(data_config("tokens", {dir / "*.bin"}, 4, 2,
                            fmt::format("val_path = \"{}\"", dir / "v.bin")));
    });
    CHECK_THAT(msg, Contains(dir / "v.bin") && Contains("also in data.path"));
  }
  CHECK_THAT(msg, Contains("Fix:"));
}

TEST_CASE("a dry run needs no files and allocates what synthetic data does", "[data]") {
  const Config file_cfg = data_config("tokens", {"/nonexistent/remat-data/*.bin"}, 64, 3);
  Config synth_cfg = file_cfg;
  synth_cfg.data.source = "synthetic";
  auto allocated = [](const Config& cfg) {
    CountBackend be(CountTarget{}, 1ull << 40);
    auto data = make_data_source(cfg);  // never opened
    Batch b = data->next(be, 5);
    CHECK(b.inputs.tensor().shape_str() == b.targets.tensor().shape_str());
    CHECK(b.n_tokens == 64 * 3);
    return std::pair(be.pool().live_bytes(), be.pool().peak_bytes());
  };
  CHECK(allocated(file_cfg) == allocated(synth_cfg));
  CHECK(allocated(file_cfg).first == 2 * 256 * 3);  // (3, 64) i32, twice, 256-byte aligned
  auto data = make_data_source(file_cfg);
  CHECK_THAT(data->describe(), Contains("not opened"));
  CHECK(data->validation_batches(0) == 0);
  CHECK(data->cursor(2) == nlohmann::json{{"order", "random"}, {"rows_drawn", 6}});
}

TEST_CASE("synthetic data has no validation set", "[data]") {
  Config cfg = data_config("tokens", {"x.bin"}, 8, 2);
  cfg.data.source = "synthetic";
  auto data = make_data_source(cfg);
  CHECK_THAT(data->describe(), StartsWith("synthetic"));
  CHECK(data->validation_batches(0) == 0);
  cpu::CpuBackend be(1ull << 30, 1);
  CHECK_THROWS_WITH(data->validation_batch(be, 0), Contains("has no validation set"));
}

TEST_CASE("bulk normals match Box-Muller in double on the same uniforms", "[data]") {
  constexpr size_t kPairs = 1 << 18;
  std::vector<float> z(2 * kPairs);
  fill_normal(z, 7, 11, 1000);
  double worst = 0, sum = 0, sum_sq = 0, sum_4 = 0;
  for (size_t p = 0; p < kPairs; ++p) {
    float u1, u2;
    normal_pair_uniforms(7, 11, 1000 + p, u1, u2);
    const double r = std::sqrt(-2.0 * std::log(static_cast<double>(u1)));
    const double t = 6.283185307179586 * static_cast<double>(u2);
    worst = std::max(
        {worst, std::abs(z[2 * p] - r * std::cos(t)), std::abs(z[2 * p + 1] - r * std::sin(t))});
  }
  for (float v : z) {
    sum += v;
    sum_sq += static_cast<double>(v) * v;
    sum_4 += std::pow(static_cast<double>(v), 4);
    REQUIRE(std::abs(v) <= 5.9f);
  }
  const double n = static_cast<double>(z.size());
  CHECK(worst < 3e-6);
  // Moments of 2^19 draws: mean 0 +- 5 sigma/sqrt(n), variance 1 and kurtosis 3 within 1%.
  CHECK(std::abs(sum / n) < 5.0 / std::sqrt(n));
  CHECK(std::abs(sum_sq / n - 1.0) < 0.01);
  CHECK(std::abs(sum_4 / n - 3.0) < 0.03 * 3.0);
}

TEST_CASE("bulk normals are a function of the pair counter alone", "[data]") {
  // 37 numbers from pair 5 are the tail of 47 numbers from pair 0, whatever the thread count.
  std::vector<float> all(47), tail(37), many(4001), many_1thread(4001);
  fill_normal(all, 3, 4, 0);
  fill_normal(tail, 3, 4, 5);
  CHECK(std::equal(tail.begin(), tail.end(), all.begin() + 10));
  fill_normal(many, 3, 4, 9);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  fill_normal(many_1thread, 3, 4, 9);
  omp_set_num_threads(threads);
  CHECK(std::memcmp(many.data(), many_1thread.data(), many.size() * sizeof(float)) == 0);
  CHECK(many[0] != many[1]);
  // Read by number: from an odd number (a pair's sine, where a data-parallel rank's rows may
  // start) and from an even one, the same numbers as read by pair.
  std::vector<float> from_odd(28), from_even(28);
  fill_normal_from(from_odd, 3, 4, 17);
  fill_normal_from(from_even, 3, 4, 18);
  CHECK(std::equal(from_odd.begin(), from_odd.end(), all.begin() + 17));
  CHECK(std::equal(from_even.begin(), from_even.end(), all.begin() + 18));
}
