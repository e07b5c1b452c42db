// `fit` and `sweep` on the real binary, with a tiny RoPE model (so seq_len is not capped by
// n_ctx) under a 4 MiB budget, where the longest seq_len per policy is a few hundred tokens.
// Every trial is one step in a child process. Tagged [smoke].
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli_util.h"
#include "tests/temp_dir.h"

using Catch::Matchers::Contains;

namespace {

using Result = remat::test::CliResult;

Result run(const std::string& args, bool with_stderr = false) {
  return remat::test::run_binary(args, with_stderr);
}

// tiny.toml with RoPE and batch 1: ~1.6 MiB of weights, grads and AdamW state, the rest
// activations.
const std::string kTiny =
    "--config configs/tiny.toml --set model.position=rope --set train.batch_size=1";

std::string tmp_dir(const std::string& name) {
  return fmt::format("/tmp/remat-test-{}-{}", getpid(), name);
}

std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string f;
  while (std::getline(ss, f, sep)) out.push_back(f);
  if (!line.empty() && line.back() == sep) out.emplace_back();
  return out;
}

}  // namespace

TEST_CASE("fit's predicted longest seq_len is what real steps find (--measure)", "[smoke]") {
  // Untiled, and with the MLP in chunks of 37 rows (remat.tile_tokens), whose longer reach the
  // untiled run's tiling hint announces.
  int64_t untiled_best = 0;
  for (const std::string tiling : {"", " --set remat.tile_tokens=37"}) {
    INFO("fit" << tiling);
    Result r = run("fit " + kTiny + " --memory 4MiB --measure --json" + tiling);
    REQUIRE(r.code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["pool_budget_bytes"] == 4u << 20);
    CHECK(j["rate_flops_per_s"].get<double>() > 0);
    REQUIRE(j["policies"].size() == 4);
    int64_t best = 0;
    for (const auto& p : j["policies"]) {
      INFO(p.dump());
      const int64_t longest = p["longest_seq_len"];
      best = std::max(best, longest);
      CHECK(longest > 100);
      CHECK(longest < 4000);
      CHECK_FALSE(p["capped_by_n_ctx"].get<bool>());
      CHECK(p["predicted_peak_bytes"].get<uint64_t>() <= 4u << 20);
      CHECK(p["est_tokens_per_s"].get<double>() > 0);
      const auto& m = p["measured"];
      CHECK(m["exit_at_longest"] == 0);     // a step at the predicted maximum fits ...
      CHECK(m["exit_above_longest"] == 3);  // ... and one token more does not
      CHECK(m["measured_peak_bytes"] == p["predicted_peak_bytes"]);
      CHECK(m["agrees"] == true);
    }
    CHECK_THAT(j["recommendation"].get<std::string>(),
               Contains("longest:") && Contains("at your configured 64"));
    if (tiling.empty()) {
      untiled_best = best;
      REQUIRE(j["tiling_hint"].is_object());
      CHECK(j["tiling_hint"]["longest_seq_len"].get<int64_t>() > best);
    } else {
      CHECK(j["tiling_hint"].is_null());  // tiling is on already
      CHECK(best > untiled_best);
    }
  }
}

TEST_CASE("fit prints the table and the recommendation, and --measure rejects a --gpu preset",
          "[smoke]") {
  Result r = run("fit --config configs/long.toml --gpu h200", true);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("longest T") && Contains("save_attn") && Contains("989 TFLOP/s") &&
                        Contains("longest: ") && Contains("is the fastest policy that fits") &&
                        Contains(" (a step ~") && Contains(" at the estimated rate)"));
  // The CPU's host pool is its own RAM: an offloading row says offload buys nothing there.
  r = run("fit --config configs/copy.toml --memory 64MiB --policies full,full:offload=checkpoints",
          true);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("offload buys no memory here"));
  r = run("fit --config configs/copy.toml --memory 64MiB --policies full", true);
  CHECK_THAT(r.out, !Contains("offload buys no memory here"));
  CHECK(run("fit --config configs/long.toml --gpu h200 --measure").code == 2);
  CHECK(run("fit --config configs/mlp4.toml").code == 2);
}

TEST_CASE("sweep records an out-of-memory point and goes on, and CSV and JSON follow the schema",
          "[smoke]") {
  const std::string dir = tmp_dir("sweep");
  // At 256 tokens `none` needs 3.98 MiB (> 3900 KiB) and `full` 3.04 MiB.
  Result r =
      run("sweep " + kTiny +
          " --set device.memory=3900KiB --seq-lens 128,256 --policies none,full --steps 1 --out " +
          dir);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("seq_len") && Contains("oom") && Contains("sweep.csv"));

  std::ifstream csv(dir + "/sweep.csv");
  std::string header;
  REQUIRE(std::getline(csv, header));
  CHECK(header ==
        "seq_len,policy,status,exit_code,predicted_peak_bytes,measured_peak_bytes,"
        "predicted_host_peak_bytes,measured_host_peak_bytes,median_step_ms,tokens_per_s,"
        "recompute_overhead,wall_s,message");
  std::vector<std::vector<std::string>> rows;
  for (std::string line; std::getline(csv, line);) rows.push_back(split(line, ','));
  REQUIRE(rows.size() == 4);
  CHECK(rows[0][0] == "128");
  CHECK(rows[0][1] == "none");
  CHECK(rows[0][2] == "ok");
  CHECK(rows[0][4] == rows[0][5]);  // predicted == measured peak on the CPU
  CHECK(rows[0][6] == "0");         // nothing offloaded: no host memory planned ...
  CHECK(rows[0][7] == "0");         // ... or used
  CHECK_THAT(r.out, !Contains("host pred."));
  CHECK(rows[2][0] == "256");
  CHECK(rows[2][1] == "none");
  CHECK(rows[2][2] == "oom");
  CHECK(rows[2][3] == "3");
  CHECK(rows[2][5].empty());
  CHECK(rows[2][7].empty());  // nor a measured host peak
  CHECK(rows[3][1] == "full");
  CHECK(rows[3][2] == "ok");  // the sweep went on after the out-of-memory point

  std::ifstream jf(dir + "/sweep.json");
  const auto j = nlohmann::json::parse(jf);
  for (const char* k : {"config", "target", "budget_bytes", "batch_size", "tile_tokens", "steps",
                        "seq_lens", "policies", "interrupted", "points"})
    CHECK(j.contains(k));
  CHECK(j["budget_bytes"] == 3900u << 10);
  CHECK(j["interrupted"] == false);
  REQUIRE(j["points"].size() == 4);
  for (const auto& p : j["points"]) {
    for (const char* k :
         {"seq_len", "policy", "status", "exit_code", "predicted_peak_bytes", "measured_peak_bytes",
          "predicted_host_peak_bytes", "measured_host_peak_bytes", "median_step_ms", "tokens_per_s",
          "recompute_overhead", "wall_s", "message"})
      CHECK(p.contains(k));
    if (p["status"] == "ok") {
      CHECK(p["measured_peak_bytes"] == p["predicted_peak_bytes"]);
      CHECK(p["tokens_per_s"].get<double>() > 0);
    } else {
      CHECK(p["status"] == "oom");
      CHECK(p["measured_peak_bytes"].is_null());
      CHECK(p["predicted_peak_bytes"].get<uint64_t>() > 3900u << 10);
      CHECK_THAT(p["message"].get<std::string>(), Contains("out of memory"));
    }
  }
  CHECK(j["points"][1]["recompute_overhead"].get<double>() > 0.1);  // full recomputes

  // A second sweep into the folder refuses before measuring, and the results stay.
  const auto size = std::filesystem::file_size(dir + "/sweep.csv");
  r = run("sweep " + kTiny + " --seq-lens 64 --policies none --steps 1 --out " + dir, true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("holds an earlier sweep's results (sweep.csv)") &&
                        Contains("Fix: choose another --out"));
  CHECK(std::filesystem::file_size(dir + "/sweep.csv") == size);
  r = run("sweep " + kTiny + " --seq-lens 64 --policies none --steps 1 --out " + dir + "/sweep.csv",
          true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("sweep.csv: a file, not a folder"));

  SECTION("the plot script draws sweep.png") {
    // Debian's matplotlib is in /usr/bin/python3, which a python3 on the PATH may shadow.
    std::string python;
    for (const char* py : {"python3", "/usr/bin/python3"})
      if (python.empty() &&
          std::system(fmt::format("{} -c 'import matplotlib' >/dev/null 2>&1", py).c_str()) == 0)
        python = py;
    if (python.empty()) {
      WARN("skipped: matplotlib not available (install python3-matplotlib)");
      std::filesystem::remove_all(dir);
      return;
    }
    const std::string cmd = fmt::format("{} {}/scripts/plot_sweep.py {} >/dev/null 2>&1", python,
                                        REMAT_SOURCE_DIR, dir);
    CHECK(std::system(cmd.c_str()) == 0);
    CHECK(std::filesystem::file_size(dir + "/sweep.png") > 1000);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("sweep reports the host pool of an offloading point, predicted and measured", "[smoke]") {
  const std::string dir = tmp_dir("sweep-host");
  Result r =
      run("sweep " + kTiny +
              " --seq-lens 128 --policies full,full:offload=checkpoints --steps 1 --out " + dir,
          true);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("host pred.") && Contains("host meas."));
  std::ifstream jf(dir + "/sweep.json");
  const auto j = nlohmann::json::parse(jf);
  REQUIRE(j["points"].size() == 2);
  const auto& kept = j["points"][0];
  const auto& offloaded = j["points"][1];
  REQUIRE(offloaded["status"] == "ok");
  CHECK(kept["predicted_host_peak_bytes"] == 0);
  CHECK(kept["measured_host_peak_bytes"] == 0);
  // The checkpoints moved to host memory: planned to the byte there, and gone from the device.
  CHECK(offloaded["predicted_host_peak_bytes"].get<uint64_t>() > 0);
  CHECK(offloaded["measured_host_peak_bytes"] == offloaded["predicted_host_peak_bytes"]);
  CHECK(offloaded["measured_peak_bytes"] == offloaded["predicted_peak_bytes"]);
  CHECK(offloaded["predicted_peak_bytes"].get<uint64_t>() <
        kept["predicted_peak_bytes"].get<uint64_t>());
  std::filesystem::remove_all(dir);
}

TEST_CASE("a --seq-lens range doubles from its start and always ends at its end", "[smoke]") {
  const std::string dir = tmp_dir("sweep-range");
  Result r =
      run("sweep --config configs/tiny.toml --seq-lens 100..300 --policies full --steps 1 "
          "--json --out " +
          dir);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  std::vector<int64_t> lens;
  for (const auto& p : j["points"]) lens.push_back(p["seq_len"].get<int64_t>());
  CHECK(lens == std::vector<int64_t>{100, 200, 300});
  std::filesystem::remove_all(dir);
}

TEST_CASE("sweep rejects malformed --seq-lens and seq_lens beyond a learned n_ctx", "[smoke]") {
  CHECK(run("sweep --config configs/tiny.toml --seq-lens 4k..1k").code == 2);
  CHECK(run("sweep --config configs/tiny.toml --seq-lens abc").code == 2);
  CHECK(run("sweep --config configs/tiny.toml --set model.position=learned --seq-lens 64..256")
            .code == 2);  // n_ctx = 128
}

TEST_CASE(
    "the sweep scripts: --help exits 0, a python without matplotlib gets a fix, not a "
    "traceback",
    "[smoke]") {
  auto sh = [](const std::string& cmd) { return remat::test::run_in_source(cmd); };
  auto help = sh("bash scripts/sweep.sh --help");
  CHECK(help.code == 0);
  CHECK_THAT(help.out, Contains("scripts/sweep.sh CONFIG"));
  CHECK(sh("bash scripts/sweep.sh").code == 2);
  // -S: no site-packages, so no matplotlib whichever python3 this is (the sweep.json is read
  // first: a missing or broken one is said before matplotlib is needed).
  remat::test::TempDir dir("plot-sweep");
  remat::test::write_text(dir / "sweep.json", "{}");
  auto plot = sh("python3 -S scripts/plot_sweep.py " + dir.str());
  CHECK(plot.code == 1);
  CHECK_THAT(plot.out, Contains("has no matplotlib") && Contains("Fix:") && !Contains("Traceback"));
  remat::test::write_text(dir / "sweep.json", "");
  auto broken = sh("python3 -S scripts/plot_sweep.py " + dir.str());
  CHECK(broken.code == 2);
  CHECK_THAT(broken.out, Contains("sweep.json: not JSON") && !Contains("Traceback"));
  // With matplotlib (Debian's, in /usr/bin/python3): --help is the usage, not a folder named so.
  if (sh("/usr/bin/python3 -c 'import matplotlib'").code == 0) {
    auto plot_help = sh("/usr/bin/python3 scripts/plot_sweep.py --help");
    CHECK(plot_help.code == 0);
    CHECK_THAT(plot_help.out, Contains("usage: plot_sweep.py DIR") && !Contains("cannot read"));
  }
}
