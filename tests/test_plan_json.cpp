// `plan --json` for every shipped config, byte for byte against tests/data/plan_json/: the
// planner's figures (peaks by category, FLOPs, longest seq_len, largest batch, auto's plan) for
// the CPU at a fixed 16 GiB budget (and 16 GiB of host pool) and 2 threads, and for an H200 with
// bf16 and fp32 activations (the CUDA workspace rules). Refactors of the ops, workspaces and
// policies must change none of them; a deliberate change regenerates the files with the commands
// below (run from the repository root):
//   remat-train plan --config configs/N.toml --json --memory 16GiB --set device.threads=2
//       --set device.host_memory=16GiB
//   remat-train plan --config configs/N.toml --json --gpu h200 [--set device.precision=fp32]
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/cli_util.h"
#include "tests/temp_dir.h"

namespace remat::test {
namespace {

std::string slurp_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// "<config>.<target>.json" -> the plan flags that produced it.
std::string plan_flags(const std::string& target) {
  if (target == "cpu")
    return "--memory 16GiB --set device.threads=2 --set device.host_memory=16GiB";
  if (target == "h200-bf16") return "--gpu h200";
  if (target == "h200-fp32") return "--gpu h200 --set device.precision=fp32";
  FAIL("unknown target in a tests/data/plan_json file name: " << target);
  return "";
}

}  // namespace

TEST_CASE("plan --json of every shipped config is unchanged", "[plan-json]") {
  const std::filesystem::path dir =
      std::filesystem::path(REMAT_SOURCE_DIR) / "tests/data/plan_json";
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();  // e.g. gpt2-124m.h200-bf16.json
    const std::string stem = entry.path().stem().string();
    const size_t dot = stem.rfind('.');
    REQUIRE(dot != std::string::npos);
    const std::string config = stem.substr(0, dot), target = stem.substr(dot + 1);
    INFO(file);
    const CliResult r = run_binary(
        fmt::format("plan --config configs/{}.toml --json {}", config, plan_flags(target)), false);
    REQUIRE(r.code == 0);
    CHECK(r.out == slurp_file(entry.path()));
    ++files;
  }
  CHECK(files == 48);  // 16 configs x 3 targets
}

}  // namespace remat::test

namespace remat::test {

TEST_CASE("plan and fit say what a LoRA run trains, in text and in --json", "[plan-json][lora]") {
  // The adapters' rank, what they sit on and what trains: a user sizing QLoRA reads it beside
  // the peaks; without [lora] neither output changes (the files above).
  const std::string lora =
      "--config configs/tiny-llama.toml --set lora.rank=4 --set lora.alpha=8 "
      "--set lora.targets='[\"q_proj\",\"v_proj\"]' --set lora.base='\"nf4\"'";
  const CliResult text = run_binary("plan " + lora, false);
  INFO(text.out);
  REQUIRE(text.code == 0);
  CHECK_THAT(text.out, Catch::Contains("+ LoRA r 4 (alpha 8) on 4 linears of a frozen NF4 with "
                                       "nested absmax base, 0.002M trainable |"));
  for (const std::string& cmd : {"plan " + lora, "fit " + lora + " --gpu h100-80gb"}) {
    INFO(cmd);
    const CliResult r = run_binary(cmd + " --json", false);
    REQUIRE(r.code == 0);
    const nlohmann::json l = nlohmann::json::parse(r.out)["lora"];
    CHECK(l["rank"] == 4);
    CHECK(l["alpha"] == 8.0);
    CHECK(l["target_modules"] == nlohmann::json({"q_proj", "v_proj"}));
    CHECK(l["linears"] == 4);
    CHECK(l["base"] == "nf4");
    CHECK(l["double_quant"] == true);
    // 2 blocks of q (64 -> 64) and v (64 -> 32: 2 KV heads of 16)
    CHECK(l["trainable_params"] == 2 * ((4 * 64 + 64 * 4) + (4 * 64 + 32 * 4)));
  }
  const CliResult fit = run_binary("fit " + lora + " --gpu h100-80gb", false);
  REQUIRE(fit.code == 0);
  CHECK_THAT(fit.out, Catch::Contains("\n     LoRA r 4 (alpha 8) on 4 linears of a frozen NF4"));
  const CliResult full = run_binary("plan --config configs/tiny-llama.toml --json", false);
  REQUIRE(full.code == 0);
  CHECK_FALSE(nlohmann::json::parse(full.out).contains("lora"));
}

}  // namespace remat::test

namespace remat::test {

TEST_CASE("JSON output and metrics survive names that are not UTF-8", "[plan-json][cli]") {
  // A file or folder name may be any bytes; JSON strings are UTF-8. Such bytes print as U+FFFD
  // (was an "[internal]" error after the work, and a training run's summary lost).
  TempDir tmp("json-bytes");
  const std::string odd = std::string("t") + static_cast<char>(0xff);
  std::filesystem::copy_file(std::filesystem::path(REMAT_SOURCE_DIR) / "configs/tiny.toml",
                             tmp.path / (odd + ".toml"));
  const CliResult plan = run_binary(
      fmt::format("plan --json --config '{}'", (tmp.path / (odd + ".toml")).string()), false);
  REQUIRE(plan.code == 0);
  CHECK_THAT(nlohmann::json::parse(plan.out)["config"].get<std::string>(),
             Catch::EndsWith("t\xef\xbf\xbd.toml"));
  const CliResult train = run_command(
      fmt::format("cd {} && {} train --config {}/configs/tiny.toml --set train.steps=1 --set "
                  "'checkpoint.dir=\"{}\"' --metrics m.jsonl",
                  tmp.str(), REMAT_BINARY, REMAT_SOURCE_DIR, odd));
  INFO(train.out);
  CHECK(train.code == 0);
  std::ifstream metrics(tmp.path / "m.jsonl");
  std::string line, last;
  while (std::getline(metrics, line)) last = line;
  CHECK(nlohmann::json::parse(last).contains("summary"));
}

}  // namespace remat::test
