// The fine-tuning path of a Hugging Face user (issue 59), through the real binary: a resume from
// the checkpoint alone (the folder the run started from deleted), what a config or --set beside
// it may change, a finished run resumed, the warnings of a run that would surprise, `fit` when no
// listed policy fits (and --emit-config), and the small mends: --help's offload values, the page
// an error points to, sample's last newline, the banner's first line and -v.
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "engine/config/config.h"
#include "engine/training/checkpoint.h"
#include "temp_dir.h"

using namespace remat;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

using test::CliResult;
using test::TempDir;

// tests/golden/hf/llama: a 2-block Llama with llama3-scaled RoPE (vocabulary 97), in two shards.
const fs::path kLlama = fs::path(REMAT_SOURCE_DIR) / "tests/golden/hf/llama";

CliResult run(const std::string& args) {
  return test::run_binary(args, true);
}

std::vector<char> bytes_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

// Every file under `dir`, for "nothing was written".
std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    out.push_back(
        fmt::format("{} {}", e.path().string(), e.is_regular_file() ? fs::file_size(e.path()) : 0));
  std::sort(out.begin(), out.end());
  return out;
}

// Settings small enough for seconds: the golden Llama at 16 tokens, 2 rows.
const std::string kSmall = "--set train.seq_len=16 --set train.batch_size=2 --set train.steps=6 ";

}  // namespace

TEST_CASE("resume needs the checkpoint alone: the Hugging Face folder deleted, no --config",
          "[finetune][smoke]") {
  TempDir tmp("ft-resume");
  const fs::path hf = tmp.path / "hf";
  fs::copy(kLlama, hf);
  // The uninterrupted run, and one stopped at step 3 whose folder is then deleted.
  REQUIRE(run(fmt::format("train -q --init hf:{} {} --set checkpoint.dir={}", hf.string(), kSmall,
                          tmp / "whole"))
              .code == 0);
  const CliResult half =
      run(fmt::format("train --init hf:{} {} --set checkpoint.dir={} --stop-at 3", hf.string(),
                      kSmall, tmp / "run"));
  INFO(half.out);
  REQUIRE(half.code == 0);
  fs::remove_all(hf);

  SECTION("it continues bit for bit, and keeps the folder's name for export") {
    const CliResult rest = run(fmt::format("train --resume {}", tmp / "run"));
    INFO(rest.out);
    REQUIRE(rest.code == 0);
    CHECK_THAT(rest.out, Contains("resumed from") && Contains("at step 3"));
    for (const char* f : {"model.safetensors", "optimizer.safetensors"})
      CHECK(bytes_of(tmp.path / "whole/step_00000006" / f) ==
            bytes_of(tmp.path / "run/step_00000006" / f));
    const CheckpointState st = read_checkpoint_state(tmp / "run/step_00000006");
    CHECK(st.extra["hf_source"] == hf.string());
    // The export of a run whose folder is gone still writes the model's context length.
    const CliResult ex =
        run(fmt::format("export --checkpoint {} --hf {}", tmp / "run", tmp / "out"));
    INFO(ex.out);
    REQUIRE(ex.code == 0);
    std::ifstream in(tmp / "out/config.json");
    CHECK(nlohmann::json::parse(in)["max_position_embeddings"] == 64);
  }
  SECTION("a step folder works too, and what may change mid-run is printed") {
    const CliResult r =
        run(fmt::format("train --resume {} --steps 8 --set remat.policy=full --set log.every=2",
                        tmp / "run/step_00000003"));
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Contains("changed on resume: ") &&
                          Contains("log.every 1 -> 2 (--set log.every=2)") &&
                          Contains("remat.policy \"none\" -> \"full\"") &&
                          Contains("train.steps 6 -> 8 (--set train.steps=8)"));
    CHECK(fs::exists(tmp.path / "run/step_00000008"));
  }
  SECTION("a config without [model], as after --init hf:, with --resume latest") {
    std::ofstream(tmp / "ft.toml") << fmt::format(
        "[train]\nsteps = 7\neval_every = 100\n[checkpoint]\ndir = \"{}\"\n", tmp / "run");
    const CliResult r = run(fmt::format("train --config {} --resume latest", tmp / "ft.toml"));
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Contains("train.steps 6 -> 7 (" + tmp / "ft.toml" + ":2:9)"));
    CHECK(fs::exists(tmp.path / "run/step_00000007"));
  }
  SECTION("the model, the seed, the batch and the optimizer are refused, naming the key") {
    for (const char* set : {"train.seed=5", "train.batch_size=4", "train.lr=0.5",
                            "train.grad_accum=2", "model.n_layer=3", "data.task=\"copy\""}) {
      INFO(set);
      const CliResult r = run(fmt::format("train --resume {} --set {}", tmp / "run", set));
      CHECK(r.code == 2);
      const std::string key = std::string(set).substr(0, std::string(set).find('='));
      CHECK_THAT(r.out, Contains(key + " is ") && Contains("in the checkpoint") &&
                            Contains("--init") && Contains("see docs/checkpoints.md"));
    }
    // A new RoPE scaling changes the function the model computes: a longer context under it is a
    // new run from these weights (--init), never a resume (docs/context-extension.md).
    const CliResult r = run(fmt::format(
        "train --resume {} --set 'model.rope_scaling={{ rope_type = \"yarn\", factor = 4.0, "
        "original_max_position_embeddings = 64 }}'",
        tmp / "run"));
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains("model.rope_scaling is {") && Contains("rope_type = \"yarn\"") &&
                          Contains("in the checkpoint") && Contains("--init"));
    CHECK(latest_checkpoint(tmp / "run") == tmp / "run/step_00000003");  // nothing written
  }
}

TEST_CASE("a finished run resumed trains nothing, writes nothing, exits 0", "[finetune][smoke]") {
  TempDir tmp("ft-done");
  REQUIRE(run(fmt::format("train -q --config configs/tiny.toml --steps 3 --set checkpoint.dir={}",
                          tmp / "ck"))
              .code == 0);
  const auto before = listing(tmp.path);
  const CliResult r =
      run(fmt::format("train --resume {} --metrics {}", tmp / "ck", tmp / "m.jsonl"));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out == "already at step 3 of 3: nothing to train; raise --steps\n");
  CHECK(listing(tmp.path) == before);  // no metrics, no checkpoint, no lock rewritten
  const CliResult stop = run(fmt::format("train --resume {} --steps 9 --stop-at 2", tmp / "ck"));
  CHECK(stop.code == 0);
  CHECK_THAT(stop.out, Contains("already at step 3 of 9, past --stop-at 2: nothing to train"));
  // Both ends reached: both named.
  CHECK(
      run(fmt::format("train --resume {} --stop-at 2", tmp / "ck")).out ==
      "already at step 3 of 3, past --stop-at 2: nothing to train; raise --steps and --stop-at\n");
  CHECK(listing(tmp.path) == before);
  // A damaged checkpoint is reported all the same.
  const fs::path model = tmp.path / "ck/step_00000003/model.safetensors";
  fs::resize_file(model, fs::file_size(model) - 4);
  const CliResult bad = run(fmt::format("train --resume {}", tmp / "ck"));
  CHECK(bad.code == 2);
  CHECK_THAT(bad.out, Contains("model.safetensors"));
}

TEST_CASE("warnings name the surprise and the fix, one line each", "[finetune][smoke]") {
  TempDir tmp("ft-warn");
  SECTION("a Hugging Face model on synthetic tokens") {
    const CliResult r =
        run(fmt::format("train --init hf:{} {} --steps 1", kLlama.string(), kSmall));
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Contains("warning: [data] the model of ") &&
                          Contains("trains on synthetic random tokens") &&
                          Contains("Fix: set data.source = \"tokens\""));
  }
  SECTION("a seq_len past max_position_embeddings without rope_scaling") {
    std::ifstream in(kLlama / "config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j.erase("rope_scaling");
    fs::create_directories(tmp.path / "hf");
    std::ofstream(tmp / "hf/config.json") << j.dump();
    const std::string args = fmt::format(
        "train --model hf:{} --steps 1 --set train.batch_size=1 --set train.seq_len=", tmp / "hf");
    const CliResult past = run(args + "65");
    INFO(past.out);
    REQUIRE(past.code == 0);
    CHECK_THAT(past.out, Contains("warning: [model] train.seq_len = 65 is past the 64 positions") &&
                             Contains("Fix: train at train.seq_len <= 64"));
    CHECK_THAT(run(args + "64").out, !Contains("warning: [model]"));
    // With its llama3 scaling the golden's 64 positions stretch: no warning.
    CHECK_THAT(run(fmt::format("train --model hf:{} --steps 1 --set train.batch_size=1 --set "
                               "train.seq_len=65",
                               kLlama.string()))
                   .out,
               !Contains("warning: [model]"));
  }
  SECTION("a run that ends inside its warmup") {
    const CliResult r = run("train --config configs/tiny.toml --steps 20");  // warmup_steps = 20
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Contains("warning: [train] the run ends inside its warmup: train.steps = 20 "
                               "<= train.warmup_steps = 20") &&
                          Contains("Fix: raise train.steps (--steps) above 20"));
    CHECK_THAT(run("train -q --config configs/tiny.toml --steps 21").out, !Contains("warning"));
  }
  SECTION("budgets past the machine's RAM") {
    // Planned against memory that is not there: the run would end out of memory, not refused.
    const CliResult r =
        run("train --config configs/tiny.toml --steps 21 --set device.backend=\"cpu\" --set "
            "device.memory=\"1PiB\" --set device.host_memory=\"1PiB\"");
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Contains("warning: [device] device.memory = 1024.00 TiB is more than this "
                               "machine's") &&
                          Contains("warning: [device] device.host_memory = 1024.00 TiB is more"));
    CHECK_THAT(run("train --config configs/tiny.toml --steps 21 --set device.backend=\"cpu\" "
                   "--set device.memory=\"64MiB\"")
                   .out,
               !Contains("warning"));
  }
}

TEST_CASE("fit never dead-ends: auto's search when no policy fits, its answer as a config",
          "[finetune][smoke]") {
  TempDir tmp("ft-fit");
  const CliResult r =
      run(fmt::format("fit --config configs/llama-3.1-8b.toml --gpu h100-80gb "
                      "--emit-config {}",
                      tmp / "longest.toml"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  // The rows that fit nothing leave recompute and speed blank: policy, longest, peak, host,
  // recompute, tok/s; then "NO" and the peak at the configured length.
  const size_t at = r.out.find("\nfull ");
  REQUIRE(at != std::string::npos);
  std::istringstream row(r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1));
  std::vector<std::string> cells{std::istream_iterator<std::string>(row), {}};
  CHECK(cells ==
        std::vector<std::string>{"full", "0", "-", "-", "-", "-", "NO", "172.32", "GiB", "-"});
  CHECK_THAT(r.out, Contains("longest: 134,331 tokens with "
                             "auto:tile=2048:offload=checkpoints+optimizer, batch 1 ("));
  // The file is the answer: pasted over the config's [train] and [remat], it plans that peak.
  std::ifstream in(tmp / "longest.toml");
  const std::string snippet(std::istreambuf_iterator<char>(in), {});
  CHECK_THAT(snippet, Contains("seq_len = 134331") && Contains("tile_tokens = 2048") &&
                          Contains("offload = \"checkpoints+optimizer\""));
  std::ifstream model_in(fs::path(REMAT_SOURCE_DIR) / "configs/llama-3.1-8b.toml");
  std::string model((std::istreambuf_iterator<char>(model_in)), {});
  model = model.substr(0, model.find("[train]"));  // its [model] table
  std::ofstream(tmp / "run.toml") << model << "\n" << snippet;
  const CliResult plan =
      run(fmt::format("plan --config {} --gpu h100-80gb --json", tmp / "run.toml"));
  INFO(plan.out);
  REQUIRE(plan.code == 0);
  const nlohmann::json j = nlohmann::json::parse(plan.out);
  CHECK(j["policies"].back()["fits"] == true);
  CHECK_THAT(snippet,
             Contains(fmt::format("({} B)", j["policies"].back()["peak_bytes"].get<uint64_t>())));
  // Never over a file.
  const CliResult again =
      run(fmt::format("fit --config configs/llama-3.1-8b.toml --gpu "
                      "h100-80gb --emit-config {}",
                      tmp / "longest.toml"));
  CHECK(again.code == 2);
  CHECK_THAT(again.out, Contains("fit never overwrites"));
  // Nor over a file beside it (its temporary file was FILE.tmp), into a folder, or into one that
  // does not exist: the last two refused before the search.
  std::ofstream(tmp / "new.toml.tmp") << "precious\n";
  const std::string fit = "fit --config configs/llama-3.1-8b.toml --gpu h100-80gb --emit-config ";
  REQUIRE(run(fit + (tmp / "new.toml")).code == 0);
  std::ifstream kept(tmp / "new.toml.tmp");
  CHECK(std::string(std::istreambuf_iterator<char>(kept), {}) == "precious\n");
  CHECK_THAT(run(fit + tmp.str()).out, Contains("a folder, not a file"));
  const CliResult nodir = run(fit + (tmp / "no/x.toml"));
  CHECK(nodir.code == 2);
  CHECK_THAT(nodir.out, Contains("/no does not exist"));

  SECTION("--model hf:DIR without a config plans at batch 1") {
    const CliResult hf = run(fmt::format("fit --model hf:{} --gpu h200", kLlama.string()));
    INFO(hf.out);
    REQUIRE(hf.code == 0);
    CHECK_THAT(hf.out, Contains("| batch 1 |") && Contains(", batch 1 (a step"));
  }
}

TEST_CASE("small mends: --help's offload values, error pages, sample's newline, the banner",
          "[finetune][smoke]") {
  for (const char* cmd : {"fit", "compare", "sweep"}) {
    const std::string help = run(fmt::format("{} --help", cmd)).out;
    for (OffloadKind k : offload_kinds()) CHECK_THAT(help, Contains(std::string(config_name(k))));
    CHECK_THAT(help, Contains("none|checkpoints|checkpoints+optimizer|"
                              "checkpoints+optimizer+weights"));
  }
  TempDir tmp("ft-mends");
  REQUIRE(run(fmt::format("train -q --config configs/tiny.toml --steps 2 --set checkpoint.dir={}",
                          tmp / "ck"))
              .code == 0);
  // Each error names the page that answers it.
  CHECK_THAT(run(fmt::format("sample --checkpoint {} --prompt \"not ids\"", tmp / "ck")).out,
             Contains("[sample]") && Contains("(see docs/checkpoints.md)"));
  CHECK_THAT(run(fmt::format("plan --model hf:{}", tmp / "nowhere")).out,
             Contains("[hf] no such folder") && Contains("(see docs/hf.md)"));
  CHECK_THAT(run("sample --checkpoint latest").out,
             Contains("--checkpoint latest: without a config") && Contains("checkpoints.md"));
  CHECK_THAT(run("train --config configs/tiny.toml --set train.bogus=1").out,
             Contains("(see docs/configs.md)"));
  // sample's output ends with a newline (stdout alone).
  const CliResult s = test::run_binary(
      fmt::format("sample --checkpoint {} --prompt \"1 2 3\" --tokens 5", tmp / "ck"), false);
  REQUIRE(s.code == 0);
  REQUIRE_FALSE(s.out.empty());
  CHECK(s.out.back() == '\n');
  // The banner's first line: the backend and threads; -v adds the kernels.
  const std::string plain =
      test::run_binary("train --config configs/tiny.toml --steps 1", false).out;
  const std::string verbose =
      test::run_binary("train --config configs/tiny.toml --steps 1 -v", false).out;
  const std::string first = plain.substr(0, plain.find('\n'));
  const std::string first_v = verbose.substr(0, verbose.find('\n'));
  CHECK_THAT(first, Contains("| cpu, ") && Contains(" threads (device.backend = \"cpu\")"));
  CHECK_THAT(first, !Contains("GEMM tiles") && !Contains("kernel"));
  CHECK_THAT(first_v, Contains("GEMM tiles on") && Contains("attention on"));
}
