// The real binary: exit codes, messages, outputs. Tagged [smoke] (ctest label smoke).
#include <fmt/format.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "tests/child_process.h"
#include "tests/cli_util.h"
#include "tests/temp_dir.h"

using Catch::Matchers::Contains;

namespace {

using Result = remat::test::CliResult;

Result run(const std::string& args, bool with_stderr = true) {
  return remat::test::run_binary(args, with_stderr);
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line)) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

std::string tmp_path(const std::string& name) {
  return fmt::format("/tmp/remat-test-{}-{}", getpid(), name);
}

}  // namespace

TEST_CASE("version (--version) names the backends, the BLAS and its CPU kernel", "[smoke]") {
  Result r = run("--version");
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("remat-train") && Contains("backends: cpu") &&
                        Contains("BLAS: OpenBLAS") && Contains("CPU kernel") && Contains("CUDA:"));
}

TEST_CASE("REMAT_ATTENTION_ISA picks the attention kernel, and a value the CPU cannot run exits 2",
          "[smoke]") {
  Result avx2 = remat::test::run_binary("--version", true, "REMAT_ATTENTION_ISA=avx2");
  CHECK(avx2.code == 0);
  CHECK_THAT(avx2.out,
             Contains("CPU attention: flash tiles on AVX2 (chosen by REMAT_ATTENTION_ISA)"));
  Result bad = remat::test::run_binary("--config configs/tiny.toml --steps 1", true,
                                       "REMAT_ATTENTION_ISA=sse4");
  CHECK(bad.code == 2);
  CHECK_THAT(bad.out, Contains("REMAT_ATTENTION_ISA=sse4") && Contains("Fix:"));
}

TEST_CASE("REMAT_GEMM picks the GEMM library, both train alike, and an unknown one exits 2",
          "[smoke]") {
  // By default each product runs on the library measured faster for it on this CPU (install-deps
  // installs libdnnl2); REMAT_GEMM puts every product on one library: both must train the same
  // model.
  Result version = remat::test::run_binary("--version", true, "-u REMAT_GEMM");
  CHECK_THAT(version.out,
             Contains("CPU GEMM: tiles on ") && Contains("(chosen by remat-train (default: "));
  Result onednn = remat::test::run_binary("--version", true, "REMAT_GEMM=onednn");
  CHECK_THAT(onednn.out, Contains("CPU GEMM: tiles on oneDNN") && !Contains("on OpenBLAS") &&
                             Contains("(chosen by REMAT_GEMM)"));
  Result openblas = remat::test::run_binary("--version", true, "REMAT_GEMM=openblas");
  CHECK_THAT(openblas.out, Contains("CPU GEMM: tiles on OpenBLAS (chosen by REMAT_GEMM)"));
  auto final_loss = [](const std::string& env) {
    Result r = remat::test::run_binary("--config configs/tiny.toml --steps 5", true, env);
    INFO(env << ": " << r.out);
    REQUIRE(r.code == 0);
    const auto at = r.out.find("final loss");
    REQUIRE(at != std::string::npos);
    return std::stod(r.out.substr(at + 10));
  };
  const double a = final_loss("REMAT_GEMM=openblas"), b = final_loss("REMAT_GEMM=onednn");
  CHECK(std::abs(a - b) <= 1e-3 * std::abs(a));  // the printed loss has 4 decimals
  Result bad =
      remat::test::run_binary("--config configs/tiny.toml --steps 1", true, "REMAT_GEMM=mkl");
  CHECK(bad.code == 2);
  CHECK_THAT(bad.out, Contains("REMAT_GEMM=mkl") && Contains("Fix:"));
}

TEST_CASE("help (--help) lists the train options", "[smoke]") {
  Result r = run("train --help");
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("--config") && Contains("--set") && Contains("--metrics"));
}

TEST_CASE("keys lists every config key, and keys --policies every value of remat.policy",
          "[smoke]") {
  Result keys = run("keys", false);
  CHECK(keys.code == 0);
  CHECK_THAT(keys.out, Contains("| `remat.policy` | string |") && Contains("| `model.n_layer` |"));
  Result policies = run("keys --policies", false);
  CHECK(policies.code == 0);
  for (const char* p : {"none", "full", "save_dots", "save_attn", "names", "auto"})
    CHECK_THAT(policies.out, Contains(fmt::format("| `{}` | ", p)));
  CHECK_THAT(policies.out, !Contains("remat.policy` | string"));  // not the key table
}

TEST_CASE("usage errors exit 2", "[smoke]") {
  CHECK(run("--config").code == 2);
  CHECK(run("train").code == 2);
  CHECK(run("--config configs/tiny.toml --bogus").code == 2);
}

TEST_CASE("tiny.toml trains, prints the summary and writes JSONL metrics", "[smoke]") {
  const std::string m = tmp_path("tiny.jsonl");
  Result r = run(fmt::format("--config configs/tiny.toml --set train.steps=12 --metrics {}", m));
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("remat-train") && Contains("step 12/12") && Contains("summary:") &&
                        Contains("peak memory") && Contains("checkpoints") && Contains("tokens/s"));
  auto rows = read_jsonl(m);
  REQUIRE(rows.size() == 13);
  for (int i = 0; i < 12; ++i)
    for (const char* k : {"step", "loss", "lr", "step_ms", "tokens_per_s", "peak_bytes"})
      CHECK(rows[static_cast<size_t>(i)].contains(k));
  const auto& s = rows.back()["summary"];
  for (const char* k : {"policy", "seq_len", "batch_size", "peak_bytes", "peak_by_category",
                        "median_step_ms", "tokens_per_s"})
    CHECK(s.contains(k));
  CHECK(s["policy"] == "full");
  // tokens/s is the median step's rate, printed beside it (a mean over the steps would count
  // step 1's start-up, and the two figures of one line would disagree).
  const double tokens = s["batch_size"].get<double>() * s["seq_len"].get<double>();
  CHECK(s["tokens_per_s"].get<double>() ==
        Approx(tokens * 1000.0 / s["median_step_ms"].get<double>()).epsilon(1e-9));
  std::remove(m.c_str());
}

TEST_CASE("mlp4.toml trains", "[smoke]") {
  Result r = run("--config configs/mlp4.toml --set train.steps=5");
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("mlp L=4") && Contains("summary:"));
}

TEST_CASE("none and full log the same loss at every step, and full peaks lower", "[smoke]") {
  const std::string a = tmp_path("a.jsonl"), b = tmp_path("b.jsonl");
  REQUIRE(run(fmt::format("--config configs/tiny.toml --set train.steps=5 --set remat.policy=none "
                          "--metrics {} -q",
                          a))
              .code == 0);
  REQUIRE(run(fmt::format("--config configs/tiny.toml --set train.steps=5 --set remat.policy=full "
                          "--metrics {} -q",
                          b))
              .code == 0);
  auto ra = read_jsonl(a), rb = read_jsonl(b);
  REQUIRE(ra.size() == rb.size());
  for (size_t i = 0; i + 1 < ra.size(); ++i)
    CHECK(ra[i]["loss"].get<double>() == rb[i]["loss"].get<double>());
  CHECK(rb.back()["summary"]["peak_bytes"].get<uint64_t>() <
        ra.back()["summary"]["peak_bytes"].get<uint64_t>());
  std::remove(a.c_str());
  std::remove(b.c_str());
}

TEST_CASE("config errors exit 2 with one line naming file, line and key", "[smoke]") {
  const std::string cfg = tmp_path("bad.toml");
  {
    std::ofstream f(cfg);
    f << "[model]\nkind = \"gpt\"\nn_embd = 64\nn_head = 5\n";
  }
  Result r = run("--config " + cfg);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains(cfg + ":4:") && Contains("model.n_head") && Contains("Fix:"));
  r = run("--config configs/tiny.toml --set model.position=learned --set train.seq_len=4096");
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("--set train.seq_len=4096") && Contains("n_ctx"));
  r = run("--config /nonexistent.toml");
  CHECK(r.code == 2);
  std::remove(cfg.c_str());
}

TEST_CASE("a memory budget too small exits 3 before step 1, with the breakdown and what fits",
          "[smoke]") {
  Result r = run("--config configs/tiny.toml --set device.memory=1MiB");
  CHECK(r.code == 3);
  CHECK_THAT(r.out, Contains("out of memory before step 1") && Contains("budget of 1.00 MiB") &&
                        Contains("weights") && Contains("no remat policy fits") &&
                        Contains("Fix:"));
  CHECK_THAT(r.out, !Contains("step 1/"));  // refused before training, not during it
  // copy.toml without remat needs 20.73 MiB; full (13.17) and save_attn (13.70) fit 16 MiB.
  r = run("--config configs/copy.toml --set device.memory=16MiB --set remat.policy=none");
  CHECK(r.code == 3);
  CHECK_THAT(r.out, Contains("(21737472 B)") &&
                        Contains("policies that fit: full (13.17 MiB), save_attn (13.70 MiB)"));
  CHECK_THAT(r.out, !Contains("step 1/"));
}

TEST_CASE("asking for CUDA in a build without it is a clear runtime error", "[smoke]") {
  Result v = run("--version");
  if (v.out.find("built without CUDA") == std::string::npos) return;  // this build has CUDA
  Result r = run("--config configs/tiny.toml --set device.backend=cuda");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("built without CUDA"));
}

TEST_CASE("plan predicts every policy without computing, for the CPU and a GPU preset", "[smoke]") {
  Result r = run("plan --config configs/tiny.toml");
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("none") && Contains("full") && Contains("save_dots") &&
                        Contains("save_attn") && Contains("longest T") && Contains("peak during"));
  r = run("plan --config configs/long.toml --gpu h200 --json");
  CHECK(r.code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["target"] == "h200");
  CHECK(j["activation_dtype"] == "bf16");
  CHECK(j["policies"].size() == 6);  // four built-in, auto, configured
  CHECK(j["policies"][1]["longest_seq_len"].get<int64_t>() >
        j["policies"][0]["longest_seq_len"].get<int64_t>());
  CHECK(run("plan --config configs/tiny.toml --gpu h9000").code == 2);
}

TEST_CASE("compare runs each policy and reports bitwise-identical results", "[smoke]") {
  Result r = run("compare --config configs/mlp4.toml --steps 2 --set train.batch_size=64 --json");
  REQUIRE(r.code == 0);
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('[')));
  REQUIRE(j.size() == 3);
  for (const auto& row : j) {
    CHECK(row["identical_to_none"] == true);
    CHECK(row["measured_peak_bytes"] == row["predicted_peak_bytes"]);
  }
  CHECK(j[1]["measured_peak_bytes"].get<uint64_t>() < j[0]["measured_peak_bytes"].get<uint64_t>());
}

TEST_CASE(
    "compare checks a tiled policy against none at its tile size, and refuses what train does",
    "[smoke]") {
  // Tiling sums row tiles in another order than one product: a tiled full equals none at the same
  // tile_tokens bit for bit (compare runs that none itself), not the untiled none.
  Result r = run("compare --config configs/tiny.toml --steps 2 --policies full:tile=32 --json");
  INFO(r.out);
  REQUIRE(r.code == 0);
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('[')));
  REQUIRE(j.size() == 3);
  CHECK(j[1]["policy"] == "none:tile=32");
  CHECK(j[2]["policy"] == "full:tile=32");
  CHECK(j[2]["identical_to_none"] == true);
  CHECK(j[2]["compared_with"] == "none:tile=32");
  Result offload =
      run("compare --config configs/tiny.toml --steps 2 --policies none:offload=checkpoints");
  CHECK(offload.code == 2);
  CHECK_THAT(offload.out, Contains("--policies none:offload=checkpoints: [config] remat.offload"));
  // A policy that does not fit the host's budget says so, with the host pool's predicted peak.
  Result host =
      run("compare --config configs/tiny.toml --steps 2 --policies full:offload=checkpoints --set "
          "device.host_memory=1000 --json");
  INFO(host.out);
  REQUIRE(host.code == 0);
  auto h = nlohmann::json::parse(host.out.substr(host.out.find('[')));
  REQUIRE(h.size() == 2);
  CHECK(h[1]["status"] == "oom");
  CHECK(h[1]["memory"] == "host");
  CHECK(h[1]["predicted_host_peak_bytes"].get<uint64_t>() > 1000);
  // On the CPU the host pool is the same RAM: the table says what it held beside "saved".
  Result moved =
      run("compare --config configs/tiny.toml --steps 2 --policies full:offload=checkpoints");
  INFO(moved.out);
  REQUIRE(moved.code == 0);
  CHECK_THAT(moved.out, Contains("full:offload=checkpoints: the host pool held 256.00 KiB more at "
                                 "its peak, in the same RAM on the CPU"));
  Result moved_json = run(
      "compare --config configs/tiny.toml --steps 2 --policies full:offload=checkpoints --json");
  auto mj = nlohmann::json::parse(moved_json.out.substr(moved_json.out.find('[')));
  CHECK(mj[1]["measured_host_peak_bytes"] == 256 * 1024);
  CHECK_FALSE(mj[0].contains("measured_host_peak_bytes"));
  Result twice = run("compare --config configs/tiny.toml --steps 2 --policies full,full");
  CHECK(twice.code == 2);
  CHECK_THAT(twice.out, Contains("\"full\" is listed twice"));
  // --policies replaces the config's policy: one given with --set would be dropped silently.
  for (const char* set : {"remat.policy=\\\"save_dots\\\"", "'remat.plan=[\"full\", \"none\"]'"}) {
    Result ignored = run(
        fmt::format("compare --config configs/tiny.toml --steps 2 --policies full --set {}", set));
    INFO(ignored.out);
    CHECK(ignored.code == 2);
    CHECK_THAT(ignored.out,
               Contains("[compare] runs each policy of --policies in place of remat.") &&
                   Contains("Fix: name the policies with --policies"));
  }
}

TEST_CASE("compare stopped by a signal marks the rows it did not finish and exits 128 + signal",
          "[smoke]") {
  remat::test::TempDir dir("compare-stop");
  const std::string log = dir / "compare.log";
  remat::test::Child c("compare --config configs/tiny.toml --steps 1000000", log);
  const auto text = [&] {
    std::ifstream f(log);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  // The first policy has started (its line comes after the handler is installed); its steps are
  // what the signal cuts short.
  REQUIRE(remat::test::eventually(
      [&] { return text().find("compare: none (1000000 steps)") != std::string::npos; }, 60));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(c.pid, SIGTERM);
  REQUIRE(c.wait(60));
  CHECK(c.exit_code() == 128 + SIGTERM);
  const std::string out = text();
  INFO(out);
  CHECK_THAT(out, Contains("none") && Contains("interrupted after") &&
                      Contains("of 1000000 steps: not compared"));
  CHECK_THAT(out, !Contains("compare: full") && !Contains("yes (bitwise)") && !Contains("NO"));
}

TEST_CASE("the top-level help names the program and --config, and train takes --steps", "[smoke]") {
  Result help = run("--help");
  CHECK(help.code == 0);
  CHECK_THAT(help.out, Contains("Usage: remat-train") && Contains("--config FILE") &&
                           Contains("SUBCOMMAND --help"));
  Result r = run("--config configs/tiny.toml --steps 3");
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("summary: 3 steps"));
  CHECK(run("--config configs/tiny.toml --steps 0").code == 2);
}

TEST_CASE("OpenMP threads spin briefly, then sleep, unless the user chose a wait policy",
          "[smoke]") {
  // The re-executed process reports the policy it runs with (engine/cpu/openmp_wait.h says why a
  // short spin).
  auto chosen = remat::test::run_binary("--version", true, "-u OMP_WAIT_POLICY -u GOMP_SPINCOUNT");
  CHECK_THAT(chosen.out,
             Contains("OpenMP: wait policy: spin 3000 times, then sleep (chosen by remat-train"));
  // libgomp initializes once: the re-exec happens before any library's initializer runs (from
  // main() it came after them, and libgomp printed its settings twice).
  auto shown = remat::test::run_binary(
      "--version", true, "-u OMP_WAIT_POLICY -u GOMP_SPINCOUNT OMP_DISPLAY_ENV=VERBOSE");
  const std::string begin = "OPENMP DISPLAY ENVIRONMENT BEGIN";
  const size_t first = shown.out.find(begin);
  REQUIRE(first != std::string::npos);
  CHECK(shown.out.find(begin, first + 1) == std::string::npos);
  CHECK_THAT(shown.out, Contains("GOMP_SPINCOUNT = '3000'"));
  auto user = remat::test::run_binary("--version", true,
                                      "-u REMAT_TRAIN_SET_WAIT_POLICY OMP_WAIT_POLICY=active");
  CHECK_THAT(user.out, Contains("OpenMP: wait policy active (OMP_WAIT_POLICY)"));
  auto spin = remat::test::run_binary(
      "--version", true, "-u REMAT_TRAIN_SET_WAIT_POLICY -u OMP_WAIT_POLICY GOMP_SPINCOUNT=500");
  CHECK_THAT(spin.out,
             Contains("OpenMP: wait policy: spin 500 times, then sleep (GOMP_SPINCOUNT)"));
}
