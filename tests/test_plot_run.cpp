// scripts/plot_run.py on real `train --metrics` files: two runs of tiny.toml with different
// policies drawn into one PNG; without matplotlib, or given a broken file, one line with the fix.
// Tagged [smoke].
#include <fmt/format.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/cli_util.h"
#include "tests/temp_dir.h"

using Catch::Matchers::Contains;

namespace {

// Debian's matplotlib is in /usr/bin/python3, which a python3 on the PATH may shadow.
std::string python_with_matplotlib() {
  for (const char* py : {"python3", "/usr/bin/python3"})
    if (std::system(fmt::format("{} -c 'import matplotlib' >/dev/null 2>&1", py).c_str()) == 0)
      return py;
  return "";
}

}  // namespace

TEST_CASE("plot_run.py overlays two training runs' metrics in one PNG", "[smoke]") {
  remat::test::TempDir dir("plot-run");
  for (const char* policy : {"none", "full"}) {
    auto r = remat::test::run_binary(
        fmt::format("--config configs/tiny.toml --steps 4 --set remat.policy={} --metrics "
                    "{}/{}.jsonl -q",
                    policy, dir.str(), policy),
        true);
    INFO(r.out);
    REQUIRE(r.code == 0);
  }
  const std::string python = python_with_matplotlib();
  if (python.empty()) {
    WARN("skipped: matplotlib not available (install python3-matplotlib)");
    return;
  }
  const std::string png = dir / "both.png";
  auto r = remat::test::run_in_source(
      fmt::format("{} scripts/plot_run.py {}/none.jsonl {}/full.jsonl --label none --label full "
                  "--out {}",
                  python, dir.str(), dir.str(), png));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("wrote " + png));
  REQUIRE(std::filesystem::exists(png));
  CHECK(std::filesystem::file_size(png) > 1000);
  // tiny.toml's synthetic task has no validation, so a written file has val_loss, beside an event
  // and a summary (neither plotted). Without --out: the first file's name with .png, beside it.
  std::ofstream val(dir / "val.jsonl");
  for (const char* line :
       {R"({"step": 1, "loss": 3.0, "tokens_per_s": 900, "peak_bytes": 4096})",
        R"({"event": "checkpoint", "step": 1, "path": "out/x", "ms": 2})",
        R"({"step": 2, "loss": 2.5, "tokens_per_s": 950, "peak_bytes": 4096, "val_loss": 2.7})",
        R"({"summary": {"policy": "full", "seq_len": 64, "interrupted": false}})"})
    val << line << '\n';
  val.close();
  r = remat::test::run_in_source(
      fmt::format("{} scripts/plot_run.py {}", python, dir / "val.jsonl"));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(std::filesystem::exists(dir / "val.png"));
}

TEST_CASE(
    "plot_run.py without matplotlib or given a missing or malformed file prints one line with the "
    "fix",
    "[smoke]") {
  auto sh = [](const std::string& cmd) { return remat::test::run_in_source(cmd); };
  // -S: no site-packages, so no matplotlib whichever python3 this is.
  auto plot = sh("python3 -S scripts/plot_run.py x.jsonl");
  CHECK(plot.code == 1);
  CHECK_THAT(plot.out, Contains("has no matplotlib") && Contains("Fix:") && !Contains("Traceback"));
  CHECK(sh("python3 -S scripts/plot_run.py").code == 2);  // usage

  const std::string python = python_with_matplotlib();
  if (python.empty()) {
    WARN("skipped: matplotlib not available (install python3-matplotlib)");
    return;
  }
  remat::test::TempDir dir("plot-run-bad");
  std::ofstream(dir / "bad.jsonl") << "{\"step\": 1, \"loss\": 2.5, \"tokens_per_s\": 9, "
                                      "\"peak_bytes\": 4}\n{\"step\": 2, \"loss\"\n";
  auto bad = sh(fmt::format("{} scripts/plot_run.py {}", python, dir / "bad.jsonl"));
  CHECK(bad.code == 2);
  CHECK_THAT(bad.out, Contains("error: [plot] " + (dir / "bad.jsonl") + ":2: not JSON") &&
                          Contains("Fix:") && !Contains("Traceback"));
  CHECK(bad.out.find('\n') == bad.out.size() - 1);  // one line
  auto missing = sh(fmt::format("{} scripts/plot_run.py {}", python, dir / "none.jsonl"));
  CHECK(missing.code == 1);
  CHECK_THAT(missing.out, Contains("error: [plot] " + (dir / "none.jsonl") + ": cannot read") &&
                              Contains("Fix:"));
  CHECK_FALSE(std::filesystem::exists(dir / "bad.png"));
  // Fields of the wrong type and a FIFO: one line each, never a traceback or a wait.
  std::ofstream(dir / "types.jsonl")
      << "{\"step\": \"x\", \"loss\": 1, \"tokens_per_s\": 9, "
         "\"peak_bytes\": 4}\n{\"event\": \"resume\", \"step\": 1}\n";
  auto types = sh(fmt::format("{} scripts/plot_run.py {}", python, dir / "types.jsonl"));
  CHECK(types.code == 2);
  CHECK_THAT(types.out, Contains("types.jsonl:1: a step line whose step is not a number") &&
                            !Contains("Traceback"));
  REQUIRE(::mkfifo((dir / "fifo.jsonl").c_str(), 0600) == 0);
  auto fifo = sh(fmt::format("timeout 20 {} scripts/plot_run.py {}", python, dir / "fifo.jsonl"));
  CHECK(fifo.code == 2);
  CHECK_THAT(fifo.out, Contains("fifo.jsonl: not a regular file"));
  // plot_eval.py: a result of the right kind whose fields are not what eval writes.
  std::ofstream(dir / "eval.json")
      << R"({"eval": "passkey", "cells": [{"length": 8, "depth": 0.5, "tasks": 2}], )"
      << R"("lengths": [8], "depths": [0.5]})";
  auto eval = sh(fmt::format("{} scripts/plot_eval.py {}", python, dir / "eval.json"));
  CHECK(eval.code == 2);
  CHECK_THAT(eval.out,
             Contains("\"cells\" is not a list of objects with numeric") && !Contains("Traceback"));
}
