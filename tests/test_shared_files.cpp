// Files other processes touch (issue 50): one run per checkpoint.dir, and data that changes under
// a running job. Both drive the real binary against a second process, so they are [smoke] too.
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>

#include "data/token_corpus.h"
#include "engine/core/error.h"
#include "engine/training/checkpoint.h"
#include "engine/training/run_lock.h"
#include "tests/child_process.h"
#include "tests/cli_util.h"
#include "tests/temp_dir.h"

using Catch::Matchers::Contains;
using namespace remat::test;  // Child, eventually, run_binary, TempDir, read_text, write_text
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// Replaces `path` by a new file (another inode), as `mv new path` does.
void replace_file(const std::string& path, const std::string& text) {
  write_text(path + ".new", text);
  fs::rename(path + ".new", path);
}

// A tiny GPT on bytes (tests/soak/soak.toml, smaller): a step takes about a millisecond.
std::string config_args(const TempDir& dir, bool with_val, const std::string& ck = "ck") {
  std::string args = fmt::format(
      "--config tests/soak/soak.toml --set model.n_layer=1 --set model.n_embd=16 --set "
      "train.seq_len=16 --set train.batch_size=2 --set data.path={} --set checkpoint.dir={} "
      "--set checkpoint.every=5 --set train.steps=1000000",
      dir / "train.txt", dir / ck);
  if (with_val)
    args +=
        fmt::format(" --set data.val_path={} --set train.eval_every=2 --set train.eval_tokens=32",
                    dir / "val.txt");
  return args;
}

std::string text_run(const TempDir& dir, bool with_val, const std::string& ck = "ck") {
  return config_args(dir, with_val, ck) + " -q";
}

std::string corpus(size_t n, unsigned seed) {
  std::string s(n, ' ');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (i * 7 + seed * 13 + i / 5) % 26);
  return s;
}

int64_t latest_step(const std::string& ck) {
  const std::string path = remat::latest_checkpoint(ck);
  return path.empty() ? -1 : remat::Checkpoint(path).state().step;
}

}  // namespace

// ---- one run per checkpoint.dir ----

TEST_CASE("a second run on a checkpoint.dir in use exits 2 naming the folder and the holder",
          "[shared][lock][smoke]") {
  TempDir dir("lock-second");
  write_text(dir / "train.txt", corpus(4096, 1));
  Child first(text_run(dir, false), dir / "first.log");
  REQUIRE(eventually([&] { return latest_step(dir / "ck") >= 5; }, 60));
  const auto t0 = Clock::now();
  const auto second = run_binary(text_run(dir, false) + " --resume latest", true);
  INFO(second.out);
  CHECK(second.code == 2);
  CHECK(std::chrono::duration<double>(Clock::now() - t0).count() < 5);  // at once
  CHECK_THAT(second.out, Contains("checkpoint.dir " + (dir / "ck") + " is in use by another run") &&
                             Contains(fmt::format("pid {} ", first.pid)) && Contains("Fix:"));
  // A fresh start (no --resume) is refused the same way, before it looks at the folder.
  CHECK(run_binary(text_run(dir, false), true).code == 2);
  kill(first.pid, SIGTERM);
  REQUIRE(first.wait(30));
  CHECK(first.exit_code() == 128 + SIGTERM);
}

TEST_CASE("a run refused before its first checkpoint leaves no folder of its own behind",
          "[shared][lock][smoke]") {
  TempDir dir("lock-refused");
  fs::create_directories(dir / "kept");
  // checkpoint.dir kept/new/run: the run creates new/ and run/, is refused (no data file), and
  // removes them with its lock; kept/, which it did not create, stays.
  const auto r = run_binary(config_args(dir, false, "kept/new/run") + " -q", true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("train.txt"));
  CHECK(fs::exists(dir / "kept"));
  CHECK_FALSE(fs::exists(dir / "kept/new"));
  // A folder that holds more than the lock is never removed, nor a folder it did not create.
  {
    remat::RunLock lock(dir / "a/b");
    write_text(dir / "a/b/notes.txt", "mine");
  }
  CHECK(fs::exists(dir / "a/b/notes.txt"));
  fs::create_directories(dir / "c");
  { remat::RunLock lock(dir / "c"); }
  CHECK(fs::exists(dir / "c"));
  { remat::RunLock lock(dir / "d/e"); }
  CHECK_FALSE(fs::exists(dir / "d"));
  // Named with a trailing slash, the folders it made are still each removed.
  { remat::RunLock lock(dir / "f/g/"); }
  CHECK_FALSE(fs::exists(dir / "f"));
}

TEST_CASE("a lock left by a SIGKILLed run does not block the resume", "[shared][lock][smoke]") {
  TempDir dir("lock-killed");
  write_text(dir / "train.txt", corpus(4096, 2));
  Child first(text_run(dir, false), dir / "first.log");
  REQUIRE(eventually([&] { return latest_step(dir / "ck") >= 5; }, 60));
  kill(first.pid, SIGKILL);
  REQUIRE(first.wait(30));
  CHECK_THAT(read_text(dir / "ck/.lock"), Contains(fmt::format("pid {} ", first.pid)));
  const int64_t step = latest_step(dir / "ck");
  const auto resumed = run_binary(
      text_run(dir, false) + fmt::format(" --resume latest --stop-at {}", step + 2), true);
  INFO(resumed.out);
  CHECK(resumed.code == 0);
  CHECK(latest_step(dir / "ck") == step + 2);
}

TEST_CASE("sample and plan read a checkpoint.dir in use without taking its lock",
          "[shared][lock][smoke]") {
  TempDir dir("lock-readers");
  write_text(dir / "train.txt", corpus(4096, 3));
  Child first(text_run(dir, false), dir / "first.log");
  REQUIRE(eventually([&] { return latest_step(dir / "ck") >= 5; }, 60));
  const auto sample =
      run_binary(fmt::format("sample --checkpoint {} --prompt ab --tokens 4", dir / "ck"), true);
  INFO(sample.out);
  CHECK(sample.code == 0);
  const auto plan = run_binary(fmt::format("plan {}", config_args(dir, false)), true);
  INFO(plan.out);
  CHECK(plan.code == 0);
  // The run still holds its folder.
  CHECK(run_binary(text_run(dir, false) + " --resume latest", true).code == 2);
}

// ---- data that changes under a running job ----

namespace {

struct Change {
  const char* name;
  std::function<void(const std::string&, const std::string&)> apply;  // (path, original text)
  const char* says;                                                   // what the message must show
};

const std::vector<Change> kChanges = {
    {"truncate", [](const std::string& p, const std::string&) { write_text(p, ""); }, "-> 0 bytes"},
    {"replace by rename", [](const std::string& p, const std::string& t) { replace_file(p, t); },
     "now names another"},
    {"rewrite in place",
     [](const std::string& p, const std::string& t) {
       std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);  // same inode, size
       f << std::string(t.rbegin(), t.rbegin() + 64);
     },
     "bytes, unchanged"},
    {"append",
     [](const std::string& p, const std::string&) { std::ofstream(p, std::ios::app) << "more"; },
     "appended to"},
};

}  // namespace

TEST_CASE(
    "data changed under a run: exit 2 naming the file and the change, a checkpoint that "
    "resumes bit for bit",
    "[shared][datachange][smoke]") {
  for (const bool val : {false, true}) {
    for (const Change& change : kChanges) {
      DYNAMIC_SECTION((val ? "data.val_path, " : "data.path, ") << change.name) {
        TempDir dir("data-change");
        const std::string train = corpus(4096, 4), valtext = corpus(1024, 5);
        write_text(dir / "train.txt", train);
        write_text(dir / "val.txt", valtext);
        const std::string file = val ? dir / "val.txt" : dir / "train.txt";
        Child run(text_run(dir, val), dir / "run.log");
        REQUIRE(eventually([&] { return latest_step(dir / "ck") >= 5; }, 60));
        change.apply(file, val ? valtext : train);
        REQUIRE(run.wait(60));
        const std::string log = read_text(dir / "run.log");
        INFO(log);
        CHECK(run.exit_code() == 2);
        CHECK_THAT(log, Contains("error: [data] " + file + " changed while training (size ") &&
                            Contains(change.says) && Contains("mtime") && Contains("inode") &&
                            Contains("Fix:") && Contains("Training state is in"));
        // The steps done were saved; with the data restored, the resume equals a run never stopped.
        const int64_t step = latest_step(dir / "ck");
        REQUIRE(step >= 5);
        replace_file(file, val ? valtext : train);
        const std::string stop = fmt::format(" --stop-at {}", step + 3);
        const auto resumed = run_binary(text_run(dir, val) + " --resume latest" + stop, true);
        INFO(resumed.out);
        REQUIRE(resumed.code == 0);
        REQUIRE(run_binary(text_run(dir, val, "ref") + stop, true).code == 0);
        const std::string name = remat::checkpoint_folder_name(step + 3) + "/model.safetensors";
        CHECK(read_text(dir / ("ck/" + name)) == read_text(dir / ("ref/" + name)));
      }
    }
  }
}

TEST_CASE("a shard that shrinks under a reader is a DataChanged error, not a SIGBUS",
          "[shared][datachange][data]") {
  TempDir dir("shard-shrinks");
  write_text(dir / "t.txt", corpus(8192, 6));
  const remat::Shard s(dir / "t.txt", remat::DataFormat::Text);
  std::vector<int32_t> out(64);
  s.read(8000, 64, out.data(), 256);
  write_text(dir / "t.txt", "");
  try {
    s.read(8000, 64, out.data(), 256);
    FAIL("no DataChanged");
  } catch (const remat::DataChanged& e) {
    CHECK_THAT(e.what(), Contains(dir / "t.txt") && Contains("size 8192 -> 0 bytes"));
  }
}

TEST_CASE("an appended shard fails its identity check", "[shared][datachange][data]") {
  TempDir dir("shard-appended");
  write_text(dir / "t.txt", corpus(4096, 7));
  const remat::Shard s(dir / "t.txt", remat::DataFormat::Text);
  s.check_unchanged();
  std::ofstream(dir / "t.txt", std::ios::app) << "x";
  CHECK_THROWS_AS(s.check_unchanged(), remat::DataChanged);
}
