// Hardening (issue 58): files that are not what they claim. A FIFO where a safetensors file or
// state.json is expected, a checkpoint whose state.json disagrees with its tensors, a symbolic
// link where the run lock or an export goes. Each drives the real binary (tagged [smoke] too);
// commands that hung before the fix run under `timeout`, so that a regression fails instead of
// hanging the suite. The Hugging Face import's own refusals (model_type, NaN weights, a folder
// with both a single file and an index) are in tests/test_hf.cpp, prepare_data.py's full disk in
// tests/prepare_data_check.py.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/core/regular_file.h"
#include "tests/cli_util.h"
#include "tests/temp_dir.h"

using Catch::Matchers::Contains;
using remat::RegularFile;
using remat::test::CliResult;
using remat::test::read_text;
using remat::test::run_binary;
using remat::test::run_in_source;
using remat::test::TempDir;
using remat::test::write_text;
namespace fs = std::filesystem;

namespace {

// A one-block Llama (one key/value head, untied unless told) whose checkpoint is a few KiB.
const std::string kLlama =
    "--config configs/tiny.toml --set 'model.kind=\"llama\"' --set model.n_layer=1 "
    "--set model.n_embd=16 --set model.n_head=2 --set model.n_kv_head=1 --set train.seq_len=16 "
    "--set train.batch_size=2";

// Trains 2 steps of kLlama (plus `sets`) with checkpoint.dir = dir; returns the step folder.
fs::path train_checkpoint(const fs::path& dir, const std::string& sets = "") {
  const CliResult r = run_binary(
      fmt::format("train {} {} --steps 2 --set checkpoint.dir={}", kLlama, sets, dir.string()),
      true);
  INFO(r.out);
  REQUIRE(r.code == 0);
  return dir / "step_00000002";
}

// remat-train ARGS, killed after 20 s: a command that waits on a FIFO fails instead of hanging.
CliResult run_bounded(const std::string& args) {
  return run_in_source(fmt::format("timeout 20 {} {}", REMAT_BINARY, args));
}

// Replaces `path` (a file) with a FIFO that nobody ever writes.
void make_fifo(const fs::path& path) {
  fs::remove(path);
  REQUIRE(::mkfifo(path.c_str(), 0644) == 0);
}

// state.json's config with `from` replaced by `to` (the checksums cover the tensor files only).
void edit_state(const fs::path& step, const std::string& from, const std::string& to) {
  std::string text = read_text(step / "state.json");
  const size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  text.replace(at, from.size(), to);
  write_text(step / "state.json", text);
}

// `export` (to `out`) and `sample` of checkpoint `step` both exit 2, naming state.json and
// `tensor`.
void check_export_and_sample_refused(const fs::path& step, const fs::path& out,
                                     const std::string& tensor) {
  for (const std::string& cmd :
       {fmt::format("export --checkpoint {} --hf {}", step.string(), out.string()),
        fmt::format("sample --checkpoint {} --tokens 2 --temperature 0", step.string())}) {
    const CliResult r = run_bounded(cmd);
    INFO(cmd << "\n" << r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains("state.json") && Contains(tensor));
  }
}

// Entries of `dir` whose name starts with `prefix`.
std::vector<std::string> entries_starting(const fs::path& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().filename());
  return out;
}

}  // namespace

TEST_CASE("regular files: a FIFO, a folder or a device is refused at once, a link never created",
          "[hardening]") {
  TempDir tmp("regular-file");
  write_text(tmp / "file", "four");
  RegularFile f = RegularFile::open_read(tmp / "file");
  REQUIRE(f.ok());
  CHECK(f.size() == 4);
  std::string text;
  CHECK(f.read_all(text) == 0);
  CHECK(text == "four");
  RegularFile g = RegularFile::open_read(tmp / "file");
  CHECK(g.read_all(text, 3) == EFBIG);
  CHECK(text.empty());

  make_fifo(tmp.path / "fifo");
  for (const std::string& path : {tmp / "fifo", tmp.str(), std::string("/dev/zero")}) {
    INFO(path);
    const RegularFile r = RegularFile::open_read(path);  // returns: never waits for a writer
    CHECK(r.problem() == RegularFile::Problem::NotRegular);
    CHECK_THAT(r.problem_text(), Contains("not a regular file"));
  }
  CHECK(RegularFile::open_read(tmp / "missing").problem() == RegularFile::Problem::Missing);
  // Writing: not into a FIFO (no reader: refused, not blocked), never through a link.
  CHECK(RegularFile(tmp / "fifo", O_WRONLY | O_CREAT | O_TRUNC).problem() ==
        RegularFile::Problem::NotRegular);
  fs::create_symlink(tmp / "file", tmp / "link");
  fs::create_symlink(tmp / "target", tmp / "dangling");
  for (const char* name : {"link", "dangling"}) {
    INFO(name);
    const RegularFile w(tmp / name, O_WRONLY | O_CREAT | O_TRUNC);
    CHECK(w.problem() == RegularFile::Problem::Link);
    CHECK_THAT(w.problem_text(), Contains("symbolic link"));
  }
  CHECK(read_text(tmp / "file") == "four");
  CHECK_FALSE(fs::exists(tmp / "target"));
  // Reading follows links (a Hugging Face cache is a folder of them).
  CHECK(RegularFile::open_read(tmp / "link").ok());
}

TEST_CASE("issue 58.1: a FIFO where a safetensors file or state.json is expected exits 2 at once",
          "[hardening][smoke]") {
  TempDir tmp("fifo-weights");
  const fs::path step = train_checkpoint(tmp / "run");
  const fs::path hf = tmp / "hf", sharded = tmp / "sharded";
  REQUIRE(run_binary(fmt::format("export --checkpoint {} --hf {} --dtype fp32", step.string(),
                                 hf.string()),
                     true)
              .code == 0);
  REQUIRE(run_binary(fmt::format("export --checkpoint {} --hf {} --shard-size 2KB", step.string(),
                                 sharded.string()),
                     true)
              .code == 0);
  auto refused_at_once = [](const std::string& args, const std::string& file) {
    const CliResult r = run_bounded(args);
    INFO(args << "\n" << r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains("not a regular file") && Contains(file));
  };
  // --init hf:DIR takes [model] from DIR/config.json; --init CKPT is kLlama's own checkpoint.
  const std::string init_hf =
      "train --steps 1 --set train.seq_len=16 --set train.batch_size=1 "
      "--init hf:";
  const std::string init = fmt::format("train {} --steps 1 --init ", kLlama);

  make_fifo(hf / "model.safetensors");
  refused_at_once(init_hf + hf.string(), "model.safetensors");
  const std::vector<std::string> shards = entries_starting(sharded, "model-00002-of-");
  REQUIRE(shards.size() == 1);
  make_fifo(sharded / shards.front());
  refused_at_once(init_hf + sharded.string(), shards.front());

  const fs::path copy = tmp / "copy";
  fs::copy(step, copy);
  make_fifo(copy / "model.safetensors");
  refused_at_once(fmt::format("sample --checkpoint {} --tokens 2", copy.string()),
                  "model.safetensors");
  refused_at_once(fmt::format("export --checkpoint {} --hf {}", copy.string(), tmp / "out"),
                  "model.safetensors");
  CHECK(entries_starting(tmp.path, "out").empty());
  refused_at_once(init + copy.string(), "model.safetensors");
  fs::remove_all(copy);
  fs::copy(step, copy);
  make_fifo(copy / "state.json");
  refused_at_once(fmt::format("sample --checkpoint {} --tokens 2", copy.string()), "state.json");
}

TEST_CASE(
    "issue 58.2: export of a checkpoint whose state.json disagrees with its tensors exits 2 "
    "and leaves no folder",
    "[hardening][smoke]") {
  TempDir tmp("export-edited");
  const fs::path step = train_checkpoint(tmp / "run");
  struct Edit {
    std::string from, to, tensor;
  };
  // n_embd: the embedding's width; vocab_size: its rows; d_ff: the MLP's (0 = the default 4x).
  for (const Edit& e : {Edit{"n_embd = 16", "n_embd = 32", "wte"},
                        Edit{"vocab_size = 64", "vocab_size = 128", "wte"},
                        Edit{"d_ff = 0", "d_ff = 48", "blocks.0.mlp."}}) {
    INFO(e.to);
    const fs::path edited = tmp / "edited";
    fs::remove_all(edited);
    fs::copy(step, edited);
    edit_state(edited, e.from, e.to);
    check_export_and_sample_refused(edited, tmp / "out", e.tensor);
    CHECK(entries_starting(tmp.path, "out").empty());  // no out, no out.tmp-<pid>
  }
}

TEST_CASE("issue 58.3: a tie_embeddings edited in state.json is refused, naming lm_head.weight",
          "[hardening][smoke]") {
  TempDir tmp("tie-edited");
  // Untied, edited to tied: the file's own LM head would be dropped without a word.
  const fs::path untied = train_checkpoint(tmp / "untied", "--set model.tie_embeddings=false");
  edit_state(untied, "tie_embeddings = false", "tie_embeddings = true");
  // Tied, edited to untied: the head the config now asks for is missing.
  const fs::path tied = train_checkpoint(tmp / "tied", "--set model.tie_embeddings=true");
  edit_state(tied, "tie_embeddings = true", "tie_embeddings = false");
  for (const fs::path& step : {untied, tied})
    check_export_and_sample_refused(step, tmp / "out", "'lm_head.weight'");
  CHECK(entries_starting(tmp.path, "out").empty());
}

TEST_CASE("issue 58.4: checkpoint.dir/.lock as a symbolic link is refused, its target untouched",
          "[hardening][smoke]") {
  TempDir tmp("lock-link");
  write_text(tmp / "precious", "keep me\n");
  const fs::path dir = tmp / "run";
  fs::create_directories(dir);
  fs::create_symlink(tmp / "precious", dir / ".lock");
  const std::string train =
      fmt::format("train {} --steps 1 --set checkpoint.dir={}", kLlama, dir.string());
  CliResult r = run_bounded(train);
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains(".lock") && Contains("symbolic link"));
  CHECK(read_text(tmp / "precious") == "keep me\n");
  // A dangling link would have created its target.
  fs::remove(dir / ".lock");
  fs::create_symlink(tmp / "created", dir / ".lock");
  r = run_bounded(train);
  CHECK(r.code == 2);
  CHECK_FALSE(fs::exists(tmp / "created"));
  CHECK(entries_starting(dir, "step_").empty());
}

TEST_CASE("export names the folder a killed export left beside its output, and leaves it alone",
          "[hardening][smoke]") {
  // A SIGKILL'd export leaves OUT.tmp-<pid>; the next export says so, removes nothing (on a shared
  // file system the pid may be a live export's on another host) and exports as always.
  TempDir tmp("export-leftover");
  const fs::path step = train_checkpoint(tmp / "run");
  const fs::path leftover = tmp / "out.tmp-4242", unrelated = tmp / "out.tmp-old";
  fs::create_directories(leftover);
  fs::create_directories(unrelated);
  write_text(leftover / "model.safetensors", "partial");
  const CliResult r =
      run_bounded(fmt::format("export --checkpoint {} --hf {}", step.string(), tmp / "out"));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("warning: [export] " + leftover.string()) && Contains("killed"));
  CHECK(r.out.find("out.tmp-old") == std::string::npos);  // not an export's: no pid
  CHECK(read_text(leftover / "model.safetensors") == "partial");
  CHECK(fs::exists(fs::path(tmp / "out") / "config.json"));
}

TEST_CASE("issue 58.5: export --hf to a symbolic link is refused up front, the link left as is",
          "[hardening][smoke]") {
  TempDir tmp("export-link");
  const fs::path step = train_checkpoint(tmp / "run");
  fs::create_directories(tmp / "empty");
  fs::create_symlink(tmp / "empty", tmp / "to-empty");
  fs::create_symlink(tmp / "nowhere", tmp / "dangling");
  for (const char* name : {"to-empty", "dangling"}) {
    const CliResult r =
        run_bounded(fmt::format("export --checkpoint {} --hf {}", step.string(), tmp / name));
    INFO(name << "\n" << r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains("symbolic link") && Contains(name));
    CHECK(fs::is_symlink(tmp / name));
    CHECK(entries_starting(tmp.path, std::string(name) + ".tmp-").empty());
  }
  CHECK(fs::is_empty(tmp / "empty"));
  CHECK_FALSE(fs::exists(tmp / "nowhere"));
}
