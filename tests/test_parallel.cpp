// Data parallel over real `mpirun -np 2` jobs of the binary (OpenMPI from Debian, oversubscribed
// on the 2-core CI machine): the same losses as one rank with the same global batch (within fp32
// reassociation: the weight gradients' GEMMs sum the rows of each rank separately), the same bits
// on every rank, the planner's per-rank peak, a failing or killed rank stopping the whole job, a
// stop signal agreed on by every rank, a data-parallel checkpoint resumed on one rank, and the
// sharded optimizer (ZeRO-1) giving the unsharded run's bits and checkpoint bytes.
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_util.h"
#include "data/synthetic.h"
#include "engine/core/count_backend.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/parallel/communicator.h"
#include "engine/parallel/gradient_sync.h"
#include "engine/training/checkpoint.h"
#include "engine/training/trainer.h"
#include "layers/models.h"
#include "temp_dir.h"
#include "tests/configs.h"
#include "tests/shard_files.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using remat::test::CliResult;
using remat::test::run_in_source;
using remat::test::TempDir;

namespace {

// Root in a container is allowed; shared-memory transport without the cross-process copy that
// ptrace-restricted containers refuse.
constexpr const char* kMpiEnv =
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
    "OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1";

// `remat-train ARGS` on `ranks` ranks started by mpirun (1 rank: no launcher at all).
CliResult run_ranks(int ranks, const std::string& args) {
  if (ranks == 1) return run_in_source(fmt::format("{} {}", REMAT_BINARY, args));
  return run_in_source(fmt::format("env {} mpirun --oversubscribe -np {} {} {}", kMpiEnv, ranks,
                                   REMAT_BINARY, args));
}

// The small GPT of every test here: 1 thread per rank, 2 ranks share the 2 cores.
std::string gpt_args(int64_t steps, const std::string& extra = "") {
  return fmt::format(
      "--config configs/copy.toml --set device.threads=1 --set train.batch_size=4 "
      "--set train.seq_len=64 --set train.steps={} --set train.warmup_steps=2 --set log.every=1 {}",
      steps, extra);
}

// The summary line of a metrics file.
nlohmann::json summary_of(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  nlohmann::json s;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("summary")) s = j["summary"];
  }
  return s;
}

// Every rank's measured peak is the byte count its own dry run predicted.
void check_rank_peaks(const fs::path& dir, const std::string& stem, int ranks) {
  for (int r = 0; r < ranks; ++r) {
    const fs::path f = dir / (r == 0 ? stem + ".jsonl" : fmt::format("{}.rank{}.jsonl", stem, r));
    const nlohmann::json s = summary_of(f.string());
    INFO(f.string() << ": " << s.dump());
    REQUIRE(s.contains("peak_bytes"));
    CHECK(s["peak_bytes"] == s["predicted_peak_bytes"]);
  }
}

// step -> `key` ("loss", "val_loss") of a metrics file's step lines.
std::map<int64_t, double> values_of(const std::string& path, const char* key) {
  std::map<int64_t, double> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains(key) && j.contains("step") && !j[key].is_null())
      out[j["step"].get<int64_t>()] = j[key];
  }
  return out;
}
std::map<int64_t, double> losses_of(const std::string& path) {
  return values_of(path, "loss");
}
std::map<int64_t, double> val_losses_of(const std::string& path) {
  return values_of(path, "val_loss");
}

void check_close(const std::map<int64_t, double>& a, const std::map<int64_t, double>& b,
                 double rel) {
  REQUIRE(!a.empty());
  REQUIRE(a.size() == b.size());
  for (const auto& [step, loss] : a) {
    INFO("step " << step << ": " << loss << " vs " << b.at(step));
    CHECK(std::abs(loss - b.at(step)) <= rel * std::abs(loss));
  }
}

}  // namespace

TEST_CASE("mpirun is installed for the data-parallel tests", "[smoke][parallel]") {
  // scripts/install-deps.sh installs openmpi-bin; without it every test below would fail late.
  const CliResult r = run_in_source("mpirun --version");
  INFO(r.out);
  REQUIRE(r.code == 0);
}

TEST_CASE("data parallel over 2 ranks trains like one rank with the same global batch",
          "[smoke][parallel]") {
  TempDir dir("dp");
  const std::string one = (dir.path / "one.jsonl").string();
  const std::string two = (dir.path / "two.jsonl").string();
  SECTION("gpt, synthetic copy task") {
    const CliResult a = run_ranks(1, gpt_args(12, "--metrics " + one));
    INFO(a.out);
    REQUIRE(a.code == 0);
    const CliResult b = run_ranks(2, gpt_args(12, "--metrics " + two));
    INFO(b.out);
    REQUIRE(b.code == 0);
    // One rank prints; the planner's per-rank peak (batch 2 and the reduction slots) holds.
    CHECK(b.out.find("2 ranks = data 2 x context 1") != std::string::npos);
    CHECK(b.out.find("equal to the measured peak") != std::string::npos);
    CHECK(b.out.find("summary:") == b.out.rfind("summary:"));
    // Two ranks on this machine: each plans against half its RAM (no device.memory given).
    auto budget_gib = [](const std::string& out) {
      const auto at = out.find("of budget ");
      REQUIRE(at != std::string::npos);
      return std::stod(out.substr(at + 10));
    };
    CHECK(std::abs(budget_gib(a.out) / budget_gib(b.out) - 2.0) < 0.01);
    // Reassociation only: measured ~1e-8 relative after 20 steps.
    check_close(losses_of(one), losses_of(two), 1e-6);
    // Every rank logs its own line with its rank, and every rank holds the same numbers.
    const auto rank1 = (dir.path / "two.rank1.jsonl").string();
    REQUIRE(fs::exists(rank1));
    CHECK(losses_of(rank1) == losses_of(two));
    std::ifstream in(rank1);
    std::string first;
    std::getline(in, first);
    CHECK(nlohmann::json::parse(first)["rank"] == 1);
  }
  SECTION("gpt on text files, each rank reading its own rows, with validation") {
    const std::string text =
        "--config configs/long.toml --set device.threads=1 --set train.seq_len=128 "
        "--set train.batch_size=4 --set train.steps=6 --set train.eval_every=3 "
        "--set train.eval_tokens=1024 --set checkpoint.dir= -q --metrics ";
    REQUIRE(run_ranks(1, text + one).code == 0);
    const CliResult b = run_ranks(2, text + two);
    INFO(b.out);
    REQUIRE(b.code == 0);
    check_close(losses_of(one), losses_of(two), 1e-6);
    check_close(val_losses_of(one), val_losses_of(two), 1e-6);
    CHECK(val_losses_of(one).size() == 2);
  }
  SECTION("mlp, regression rows that start mid-pair of the normal generator") {
    // 6 rows x 33 features: rank 1's rows start at number 99 of the step's stream.
    const std::string mlp =
        "--config configs/mlp4.toml --set device.threads=1 --set model.n_embd=33 "
        "--set train.batch_size=6 --set train.steps=8 -q --metrics ";
    REQUIRE(run_ranks(1, mlp + one).code == 0);
    const CliResult b = run_ranks(2, mlp + two);
    INFO(b.out);
    REQUIRE(b.code == 0);
    check_close(losses_of(one), losses_of(two), 1e-6);
  }
}

TEST_CASE("context parallel splits each sequence over the ranks and trains like one rank",
          "[smoke][parallel]") {
  TempDir dir("cp");
  const std::string one = (dir.path / "one.jsonl").string();
  const std::string many = (dir.path / "many.jsonl").string();
  // seq_len 101: 2C divides it for no C below; chunks of 25/26 (C = 2) and 16/17 (C = 3) tokens.
  const std::string args =
      "--config configs/copy.toml --set device.threads=1 --set train.batch_size=2 "
      "--set train.seq_len=101 --set train.steps=8 --set log.every=1 ";
  REQUIRE(run_ranks(1, args + "-q --metrics " + one).code == 0);
  SECTION("context 2") {
    const CliResult r = run_ranks(2, args + "--set parallel.context=2 --metrics " + many);
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("2 ranks = data 1 x context 2") != std::string::npos);
    CHECK(r.out.find("51 tokens of each row on each of 2 context ranks") != std::string::npos);
    CHECK(r.out.find("equal to the measured peak") != std::string::npos);
  }
  SECTION("context 3") {
    REQUIRE(run_ranks(3, args + "-q --set parallel.context=3 --metrics " + many).code == 0);
    check_rank_peaks(dir.path, "many", 3);  // 34, 34 and 33 tokens per row
    // tokens/s counts the job's tokens, 2 rows x 101, not rank 0's 2 x 34 times 3 ranks.
    const auto rate = values_of(many, "tokens_per_s"), ms = values_of(many, "step_ms");
    REQUIRE(rate.size() == 8);
    for (const auto& [step, tok_s] : rate)
      CHECK(tok_s * ms.at(step) / 1000.0 == Approx(202.0).epsilon(1e-9));
  }
  SECTION(
      "data 2 x context 2 with the optimizer sharded, and checkpoints that resume on one rank") {
    const std::string ckpt = (dir.path / "ckpt").string();
    const CliResult r = run_ranks(
        4, args + fmt::format("-q --set parallel.context=2 --set parallel.shard_optimizer=true "
                              "--stop-at 4 --set checkpoint.dir={} --metrics {}",
                              ckpt, many));
    INFO(r.out);
    REQUIRE(r.code == 0);
    check_rank_peaks(dir.path, "many", 4);
    const CliResult rest = run_ranks(
        1,
        args + fmt::format("-q --resume latest --set checkpoint.dir={} --metrics {}", ckpt, many));
    INFO(rest.out);
    REQUIRE(rest.code == 0);
  }
  // Ring attention reassociates the softmax sums: measured ~2e-9 relative.
  check_close(losses_of(one), losses_of(many), 1e-6);
  check_close(values_of(one, "copy_loss"), values_of(many, "copy_loss"), 1e-6);
}

TEST_CASE("documents, loss masks and packed rows train over data and context ranks like one rank",
          "[smoke][parallel][documents]") {
  // Packed rows of documents ending with 7, a mask hiding every third target: the loss divides
  // by the trained targets of every rank, and the ring carries the documents' starts. 2 ranks of
  // data, then 2 of context, each against one rank.
  TempDir dir("docs-ranks");
  std::vector<uint16_t> tokens;
  std::vector<uint8_t> mask;
  for (int i = 0; i < 3000; ++i) {
    const bool end = (i * 37) % 29 == 0;
    tokens.push_back(end ? 7 : static_cast<uint16_t>(8 + (i * 13) % 50));
    mask.push_back(i % 3 != 0);
  }
  remat::test::write_bytes((dir.path / "a.bin").string(), remat::test::shard_bytes(tokens));
  remat::test::write_bytes((dir.path / "a.mask.bin").string(), remat::test::mask_bytes(mask));
  remat::test::write_bytes((dir.path / "run.toml").string(),
                           fmt::format(R"([model]
kind = "gpt"
n_layer = 2
n_head = 4
n_embd = 32
vocab_size = 64
position = "rope"
[train]
seq_len = 64
batch_size = 4
steps = 6
lr = 3e-3
[data]
source = "tokens"
path = "{}"
order = "packed"
attention = "document"
eot_token = 7
[device]
threads = 1
[log]
every = 1
)",
                                       (dir.path / "a.bin").string()));
  const std::string args =
      fmt::format("--config {} -q --metrics ", (dir.path / "run.toml").string());
  const std::string one = (dir.path / "one.jsonl").string();
  const std::string many = (dir.path / "many.jsonl").string();
  const CliResult a = run_ranks(1, args + one);
  INFO(a.out);
  REQUIRE(a.code == 0);
  SECTION("data 2") {
    const CliResult r = run_ranks(2, args + many + " --set parallel.data=2");
    INFO(r.out);
    REQUIRE(r.code == 0);
  }
  SECTION("context 2") {
    const CliResult r = run_ranks(2, args + many + " --set parallel.context=2");
    INFO(r.out);
    REQUIRE(r.code == 0);
    check_rank_peaks(dir.path, "many", 2);
  }
  check_close(losses_of(one), losses_of(many), 1e-6);
}

TEST_CASE("a data-parallel checkpoint resumes on one rank where one rank would be",
          "[smoke][parallel]") {
  TempDir dir("dp-resume");
  const std::string ckpt = (dir.path / "ckpt").string();
  const std::string whole = (dir.path / "whole.jsonl").string();
  const std::string halves = (dir.path / "halves.jsonl").string();
  REQUIRE(run_ranks(1, gpt_args(8, "-q --metrics " + whole)).code == 0);
  const CliResult first = run_ranks(
      2, gpt_args(
             8, fmt::format("-q --stop-at 4 --set checkpoint.dir={} --metrics {}", ckpt, halves)));
  INFO(first.out);
  REQUIRE(first.code == 0);
  // Rank 0 alone writes: one checkpoint folder, no second writer racing it.
  int folders = 0;
  for (const auto& e : fs::directory_iterator(ckpt)) folders += e.is_directory() ? 1 : 0;
  CHECK(folders == 1);
  const CliResult second = run_ranks(
      1, gpt_args(8, fmt::format("-q --resume latest --set checkpoint.dir={} --metrics {}", ckpt,
                                 halves)));
  INFO(second.out);
  REQUIRE(second.code == 0);
  check_close(losses_of(whole), losses_of(halves), 1e-6);
}

// The bytes of a file (checkpoint tensors compared whole).
std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Where two byte strings first differ ("equal" when they do not): a short message, not a dump.
std::string first_difference(const std::string& a, const std::string& b) {
  const auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  if (ia == a.end() && ib == b.end()) return "equal";
  return fmt::format("differ from byte {} (sizes {} and {})", ia - a.begin(), a.size(), b.size());
}

TEST_CASE("a sharded optimizer (ZeRO-1) trains and checkpoints exactly like the unsharded one",
          "[smoke][parallel]") {
  TempDir dir("zero");
  // 3 ranks and 64 KiB buckets: shards of unequal length that cut through parameters.
  const std::string args =
      "--config configs/copy.toml --set device.threads=1 --set train.batch_size=6 "
      "--set train.seq_len=64 --set train.steps=8 --set train.warmup_steps=2 --set log.every=1 "
      "--set parallel.bucket_bytes=64KiB -q ";
  const fs::path plain = dir.path / "plain", sharded = dir.path / "sharded";
  auto run = [&](int ranks, const fs::path& out, const std::string& extra) {
    const CliResult r =
        run_ranks(ranks, args + fmt::format("--set checkpoint.dir={} --metrics {}.jsonl {}",
                                            (out / "ckpt").string(), out.string(), extra));
    INFO(r.out);
    REQUIRE(r.code == 0);
  };
  run(3, plain, "--stop-at 4");
  run(3, sharded, "--stop-at 4 --set parallel.shard_optimizer=true");
  // Elementwise AdamW on the same rank-order sums: the same bits, step after step.
  CHECK(losses_of(plain.string() + ".jsonl") == losses_of(sharded.string() + ".jsonl"));
  check_rank_peaks(dir.path, "sharded", 3);
  // Rank 0 gathers every rank's moments into one checkpoint, the same bytes as the unsharded one.
  const fs::path step4 = fs::path("ckpt") / "step_00000004";
  for (const char* file : {"optimizer.safetensors", "model.safetensors"}) {
    INFO(file);
    const std::string a = file_bytes(plain / step4 / file), b = file_bytes(sharded / step4 / file);
    REQUIRE(!a.empty());
    CHECK(first_difference(a, b) == "equal");
  }
  // It resumes on another number of ranks, each loading its own shard: as one rank would train.
  const fs::path whole = dir.path / "whole";
  run(1, whole, "");
  run(2, sharded, "--resume latest --set parallel.shard_optimizer=true");
  check_close(losses_of(whole.string() + ".jsonl"), losses_of(sharded.string() + ".jsonl"), 1e-6);
}

TEST_CASE("gradient accumulation over data-parallel ranks and ZeRO-1 trains like one rank",
          "[smoke][parallel][accum]") {
  // 2 micro-batches of 4 rows per step: the ranks exchange gradients once, in the last one.
  TempDir dir("dp-accum");
  const std::string base = gpt_args(6, "-q --set train.grad_accum=2 --metrics ");
  auto metrics = [&](const char* name) { return (dir.path / name).string(); };
  REQUIRE(run_ranks(1, base + metrics("one.jsonl")).code == 0);
  const CliResult two = run_ranks(2, base + metrics("two.jsonl"));
  INFO(two.out);
  REQUIRE(two.code == 0);
  const CliResult zero =
      run_ranks(2, base + metrics("zero.jsonl") + " --set parallel.shard_optimizer=true");
  INFO(zero.out);
  REQUIRE(zero.code == 0);
  // One batch of 8 rows is the same step (the rows of both micro-batches), to reassociation.
  REQUIRE(run_ranks(1, gpt_args(6, "-q --set train.batch_size=8 --metrics ") + metrics("big.jsonl"))
              .code == 0);
  check_close(losses_of(metrics("one.jsonl")), losses_of(metrics("two.jsonl")), 1e-6);
  check_close(losses_of(metrics("one.jsonl")), losses_of(metrics("zero.jsonl")), 1e-6);
  check_close(losses_of(metrics("one.jsonl")), losses_of(metrics("big.jsonl")), 1e-6);
  check_rank_peaks(dir.path, "two", 2);
  check_rank_peaks(dir.path, "zero", 2);
  // The job's tokens of an optimizer step: 2 micro-batches x 4 rows x 64 tokens.
  for (const auto& [step, tokens] : values_of(metrics("two.jsonl"), "tokens")) CHECK(tokens == 512);
}

namespace {

// `cfg` trained for its steps on one CPU rank, the optimizer sharded (over that one rank, which
// runs every piece of the sharded path: buckets, shard pieces, the weight gathers, the moments'
// gather) or not: the losses, then every weight and every first moment, in model order.
struct Trained {
  std::vector<double> losses;
  std::vector<float> weights, moments;
};
Trained train_one_rank(const remat::Config& cfg, bool shard) {
  using namespace remat;
  cpu::CpuBackend be(1ull << 32, 2);
  auto model = make_model(cfg, be);
  auto data = make_synthetic_data(cfg);
  std::unique_ptr<parallel::Communicator> one = parallel::make_single_rank();
  DataParallel dp;
  dp.shard_optimizer = shard;
  dp.comm = shard ? one.get() : nullptr;
  dp.bucket_bytes = cfg.parallel.bucket_bytes;
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data, dp);
  REQUIRE((trainer.sharded_moments() != nullptr) == shard);
  Trained out;
  for (int64_t s = 0; s < cfg.train.steps; ++s) out.losses.push_back(trainer.step().loss);
  for (Param& p : model->params()) {
    const std::vector<float> w = test::to_host(p.value.tensor());
    out.weights.insert(out.weights.end(), w.begin(), w.end());
    std::vector<float> m(static_cast<size_t>(p.value.tensor().numel()));
    if (shard)
      trainer.sharded_moments()->gather(p, 0, m.data());
    else
      m = test::to_host(p.m.tensor());
    out.moments.insert(out.moments.end(), m.begin(), m.end());
  }
  return out;
}

}  // namespace

TEST_CASE("LoRA over 2 data-parallel ranks, sharded or not, trains like one rank",
          "[smoke][parallel][lora]") {
  // The frozen base has no gradient to sum and no moments to shard: the adapters' and the
  // modules' trained whole go through the buckets alone.
  TempDir dir("dp-lora");
  const std::string base = std::string(REMAT_SOURCE_DIR) + "/tests/golden/hf/llama-lora";
  const std::string args = fmt::format(
      "--init hf:{} --set device.threads=1 --set train.seq_len=13 --set train.batch_size=4 "
      "--set train.steps=6 --set train.lr=0.01 --set lora.rank=4 --set lora.alpha=8 "
      "--set lora.dropout=0.1 --set 'lora.modules_to_save=[\"norm\"]' -q --metrics ",
      base);
  const std::string one = (dir.path / "one.jsonl").string();
  REQUIRE(run_ranks(1, "train " + args + one).code == 0);
  for (const char* shard : {"false", "true"}) {
    INFO("shard_optimizer " << shard);
    const std::string two = (dir.path / fmt::format("two-{}.jsonl", shard)).string();
    const CliResult r = run_ranks(
        2, "train " + args + two + fmt::format(" --set parallel.shard_optimizer={}", shard));
    INFO(r.out);
    REQUIRE(r.code == 0);
    check_close(losses_of(one), losses_of(two), 1e-6);
  }
}

TEST_CASE("the sharded optimizer's path over one rank gives the unsharded trainer's bits",
          "[parallel]") {
  remat::test::SmallGpt g;
  g.n_layer = 3, g.n_embd = 32, g.n_head = 4, g.vocab_size = 40, g.n_ctx = 32, g.seq_len = 24;
  g.steps = 6;
  // 4 KiB buckets: parameters cut over several buckets, buckets holding several parameters.
  const remat::Config cfg = remat::parse_config(remat::test::small_gpt_toml(g), "zero(test)",
                                                {"parallel.bucket_bytes=4096"});
  const Trained plain = train_one_rank(cfg, false), sharded = train_one_rank(cfg, true);
  CHECK(sharded.losses == plain.losses);
  CHECK(sharded.weights == plain.weights);
  CHECK(sharded.moments == plain.moments);
}

TEST_CASE("gradient buckets hold every float once, split over the ranks as each collective needs",
          "[parallel]") {
  using namespace remat;
  using parallel::ShardSplit;
  test::SmallGpt g;
  g.n_layer = 3, g.n_embd = 32, g.n_head = 4, g.vocab_size = 40, g.n_ctx = 32, g.seq_len = 24;
  const Config cfg = parse_config(test::small_gpt_toml(g), "buckets(test)", {});
  CountBackend be(CountTarget{DeviceKind::Cpu, DType::F32, 1}, UINT64_MAX);
  auto model = make_model(cfg, be);
  const size_t L = model->n_blocks();
  for (uint64_t bytes : {4096ull, 65536ull, 1ull << 30})
    for (int ranks : {1, 2, 3, 8})
      for (ShardSplit split : {ShardSplit::Balanced, ShardSplit::Equal}) {
        INFO(bytes << " B buckets, " << ranks << " ranks, "
                   << (split == ShardSplit::Equal ? "equal" : "balanced") << " shards");
        const parallel::BucketPlan plan = parallel::plan_buckets(*model, ranks, bytes, split);
        std::map<const Param*, std::vector<int>> seen;
        for (Param& p : model->params())
          seen[&p].assign(static_cast<size_t>(p.value.tensor().numel()), 0);
        // Stages in backward order (the last block first, the rest at the end), each a run of
        // buckets, each bucket's segments back to back and of that stage only.
        size_t next = 0;
        for (size_t i = 0; i <= L; ++i) {
          const size_t stage = i < L ? L - 1 - i : L;
          const auto [first, last] = plan.stage_buckets[stage];
          REQUIRE(first == next);
          next = last;
          for (size_t k = first; k < last; ++k) {
            const parallel::BucketLayout& b = plan.buckets[k];
            CHECK(b.floats >= 1);
            CHECK(static_cast<uint64_t>(b.floats) * sizeof(float) <= bytes);
            int64_t at = 0;
            for (const auto& s : b.segments) {
              CHECK(s.at == at);
              at += s.count;
              CHECK(parallel::gradient_stage(s.param->name, L) == stage);
              for (int64_t j = s.offset; j < s.offset + s.count; ++j) ++seen[s.param][j];
            }
            CHECK(at == b.floats);
            int64_t total = 0, prev_end = 0;
            for (int q = 0; q < ranks; ++q) {
              const int64_t c = b.counts[q], d = b.displs[q];
              total += c;
              if (split == ShardSplit::Balanced) {
                CHECK(d == prev_end);  // back to back
                CHECK(std::abs(c - b.counts[0]) <= 1);
              } else {  // one span for every rank, aligned starts; the last ones short or empty
                CHECK(d == q * b.span);
                CHECK(b.span % parallel::kShardAlignFloats == 0);
                CHECK(b.span < (b.floats + ranks - 1) / ranks + parallel::kShardAlignFloats);
                CHECK(c <= b.span);
                CHECK((c == b.span || d + c == b.floats || c == 0));
              }
              prev_end = d + c;
            }
            CHECK(total == b.floats);
            const int64_t padded = split == ShardSplit::Equal ? ranks * b.span : b.floats;
            CHECK(padded <= plan.largest_floats);
          }
        }
        CHECK(next == plan.buckets.size());
        for (const auto& [param, counts] : seen) {
          INFO(param->name);
          CHECK(std::count(counts.begin(), counts.end(), 1) == static_cast<int64_t>(counts.size()));
        }
      }
}

TEST_CASE("a failing rank stops every rank with its message", "[smoke][parallel]") {
  TempDir dir("dp-fail");
  // Rank 1's metrics file cannot be created (a folder has its name); rank 0 starts training and
  // would wait for rank 1 at the first gradient exchange forever.
  const std::string metrics = (dir.path / "m.jsonl").string();
  fs::create_directories(dir.path / "m.rank1.jsonl");
  // Rank 0's file from an earlier run: kept, as a refused one-rank run keeps it (every rank's
  // paths pass before any rank opens its file).
  std::ofstream(metrics) << "{\"step\":1,\"loss\":1.0}\n";
  const auto t0 = std::chrono::steady_clock::now();
  const CliResult r = run_ranks(2, gpt_args(100000, "--metrics " + metrics));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find("[rank 1] error:") != std::string::npos);
  CHECK(r.out.find("m.rank1.jsonl") != std::string::npos);
  CHECK(s < 60);
  CHECK(fs::file_size(metrics) == 22);
}

// A 2-rank job whose rank 1 (mpirun's second child) gets `signal` once it has logged a step:
// the job's exit code, the seconds from the signal to the end, and its output.
struct SignalledJob {
  int rc = -1, after = -1;
  std::string out;
};
SignalledJob signal_rank1(const std::string& name, const char* signal, const std::string& flags) {
  TempDir dir(name);
  const std::string cmd = fmt::format(
      "env {} mpirun --oversubscribe -np 2 {} {} & job=$!; "
      "for i in $(seq 300); do [ -s {} ] && break; sleep 0.1; done; "
      "sleep 1; kill -{} $(pgrep -P $job | tail -n 1); "
      "start=$(date +%s); wait $job; rc=$?; echo \"rc=$rc after=$(( $(date +%s) - start ))\"",
      kMpiEnv, REMAT_BINARY,
      gpt_args(100000, fmt::format("-q {} --metrics {}", flags, (dir.path / "m.jsonl").string())),
      (dir.path / "m.rank1.jsonl").string(), signal);
  SignalledJob job;
  job.out = run_in_source(cmd).out;
  const auto at = job.out.find("rc=");
  if (at != std::string::npos)
    (void)std::sscanf(job.out.c_str() + at, "rc=%d after=%d", &job.rc, &job.after);
  return job;
}

TEST_CASE("a rank killed mid-run ends the whole job within seconds", "[smoke][parallel]") {
  // mpirun must take rank 0 down, which would otherwise wait for rank 1 at the next exchange
  // forever.
  const SignalledJob job = signal_rank1("dp-kill", "9", "");
  INFO(job.out);
  REQUIRE(job.after >= 0);
  CHECK(job.rc != 0);
  CHECK(job.after <= 15);
}

TEST_CASE("a rank stopped mid-run ends the whole job after parallel.timeout, naming the exchange",
          "[smoke][parallel]") {
  // SIGSTOP: alive, never coming. Rank 0 waits for it at the next exchange until
  // parallel.timeout, then aborts the job, rank 1 included.
  const SignalledJob job = signal_rank1("dp-hang", "STOP", "--set parallel.timeout=3");
  INFO(job.out);
  REQUIRE(job.after >= 0);
  CHECK(job.rc == 1);
  CHECK(job.after <= 30);
  CHECK_THAT(job.out, Catch::Matchers::Contains(
                          "error: [parallel] rank 0 of 2 waited 3 s for the other ranks at") &&
                          Catch::Matchers::Contains("raise parallel.timeout"));
}

TEST_CASE("a stop signal reaching one rank stops every rank after the same step",
          "[smoke][parallel]") {
  TempDir dir("dp-term");
  const std::string metrics = (dir.path / "m.jsonl").string();
  const std::string ckpt = (dir.path / "ckpt").string();
  // SIGTERM to rank 0 only (mpirun's first child; not to mpirun, which forwards it to both).
  const std::string cmd = fmt::format(
      "env {} mpirun --oversubscribe -np 2 {} {} & job=$!; "
      "for i in $(seq 300); do [ -s {} ] && break; sleep 0.1; done; "
      "kill -TERM $(pgrep -P $job | head -n 1); wait $job; echo \"rc=$?\"",
      kMpiEnv, REMAT_BINARY,
      gpt_args(100000, fmt::format("-q --metrics {} --set checkpoint.dir={}", metrics, ckpt)),
      metrics);
  const CliResult r = run_in_source(cmd);
  INFO(r.out);
  CHECK(r.out.find("rc=143") != std::string::npos);
  const auto rank0 = losses_of(metrics);
  const auto rank1 = losses_of((dir.path / "m.rank1.jsonl").string());
  REQUIRE(!rank0.empty());
  CHECK(rank0 == rank1);  // the same steps, the same losses
  int folders = 0;
  for (const auto& e : fs::directory_iterator(ckpt)) folders += e.is_directory() ? 1 : 0;
  CHECK(folders == 1);
}

TEST_CASE("parallel settings that cannot run are refused naming the key", "[smoke][parallel]") {
  SECTION("parallel.data differs from the ranks started") {
    const CliResult r = run_ranks(2, gpt_args(2, "--set parallel.data=3 --set train.batch_size=6"));
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("parallel.data") != std::string::npos);
    CHECK(r.out.find("mpirun -np 3") != std::string::npos);
  }
  SECTION("a batch that does not split over the ranks") {
    const CliResult r = run_ranks(2, gpt_args(2, "--set train.batch_size=5"));
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("does not split evenly over 2") != std::string::npos);
  }
  SECTION("parallel.context that does not divide the ranks started") {
    const CliResult r = run_ranks(2, gpt_args(2, "--set parallel.context=3"));
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("context = 3 does not divide the 2 ranks") != std::string::npos);
  }
  SECTION("context parallel with learned positions") {
    const CliResult r =
        run_ranks(1, gpt_args(2, "--set parallel.context=2 --set model.position=learned"));
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("context parallel needs model.position") != std::string::npos);
  }
  SECTION("parallel.data in a config run without a launcher") {
    const CliResult r = run_ranks(1, gpt_args(2, "--set parallel.data=2"));
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("mpirun -np 2") != std::string::npos);
  }
  SECTION("a one-process command given a config for several ranks") {
    for (const char* cmd : {"compare --steps 1", "bench --steps 1", "fit --measure"}) {
      const CliResult r =
          run_ranks(1, fmt::format("{} --config configs/copy.toml --set parallel.context=2", cmd));
      INFO(cmd << ": " << r.out);
      CHECK(r.code == 2);
      CHECK(r.out.find("runs one process") != std::string::npos);
    }
  }
  SECTION("a sharded optimizer beside moments offloaded to the host") {
    const CliResult r = run_ranks(1, gpt_args(2,
                                              "--set parallel.shard_optimizer=true --set "
                                              "remat.offload=checkpoints+optimizer"));
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("parallel.shard_optimizer") != std::string::npos);
    CHECK(r.out.find("remat.offload = \"checkpoints\" with the sharded moments") !=
          std::string::npos);
  }
  SECTION("weights in host memory on the ranks the launcher started (none named in [parallel])") {
    const CliResult r =
        run_ranks(2, gpt_args(2, "--set remat.offload=checkpoints+optimizer+weights"));
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("trains on one rank, and mpirun started 2") != std::string::npos);
  }
  SECTION("a subcommand other than train on several ranks") {
    const CliResult r = run_ranks(2, "plan --config configs/copy.toml");
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("only `train` runs on several ranks") != std::string::npos);
  }
}

TEST_CASE("the planner predicts one rank of a context-parallel job on 8 H200s",
          "[smoke][parallel]") {
  // GPT-2 1.5B, full remat: the longest context on one card, then on 8 with the sequence split
  // over all 8 (the issue's target: at least 7x).
  auto fit = [](const std::string& extra) {
    const CliResult r = run_in_source(
        fmt::format("{} fit --config configs/gpt2-1.5b.toml --gpu h200 --policies full --json {}",
                    REMAT_BINARY, extra));
    INFO(r.out);
    REQUIRE(r.code == 0);
    return nlohmann::json::parse(r.out.substr(r.out.find('{')));
  };
  auto longest = [&](const std::string& extra) {
    return fit(extra)["policies"][0]["longest_seq_len"].get<int64_t>();
  };
  const int64_t one = longest(""), eight = longest("--ranks 8 --context 8");
  INFO(one << " tokens on one card, " << eight << " on 8");
  CHECK(eight >= 7 * one);
  // The tokens/s estimate assumes tensor-core rates, which the ring's fp32 kernels do not reach:
  // the note says so for context parallel only.
  const auto ring_caveat = [&](const std::string& extra) {
    return fit(extra)["rate_note"].get<std::string>().find("fp32 kernels on the CUDA cores") !=
           std::string::npos;
  };
  CHECK(ring_caveat("--ranks 8"));
  CHECK_FALSE(ring_caveat(""));
  CHECK_FALSE(ring_caveat("--ranks 8 --context 1 --set train.batch_size=8"));
  CHECK(longest("--ranks 8") == eight);  // fit splits each sequence over all ranks by default
  // ZeRO-1 over NCCL: each card keeps 1/8 of the AdamW moments (12 GiB less), room for tokens.
  const int64_t sharded = longest("--ranks 8 --set parallel.shard_optimizer=true");
  INFO(sharded << " tokens on 8 with the optimizer sharded");
  CHECK(sharded > eight);
  CHECK(sharded >= 7.5 * static_cast<double>(one));
  // The printout names every rank's traffic, its links and whether compute hides it.
  const CliResult plan = run_in_source(fmt::format(
      "{} plan --config configs/gpt2-1.5b.toml --gpu h200 --ranks 16 --context 8 --batch-size 2",
      REMAT_BINARY));
  INFO(plan.out);
  REQUIRE(plan.code == 0);
  CHECK(plan.out.find("16 ranks (8 per sequence)") != std::string::npos);
  CHECK(plan.out.find("ring") != std::string::npos);
  CHECK(plan.out.find("at NVLink 4") != std::string::npos);        // the ring, inside a node
  CHECK(plan.out.find("at InfiniBand NDR") != std::string::npos);  // gradients, across two
  const CliResult json = run_in_source(fmt::format(
      "{} plan --config configs/gpt2-1.5b.toml --gpu h200 --ranks 16 --context 8 --batch-size 2 "
      "--json",
      REMAT_BINARY));
  REQUIRE(json.code == 0);
  const auto rows = nlohmann::json::parse(json.out)["policies"];
  REQUIRE(!rows.empty());
  const auto& p = rows[0]["parallel"];
  CHECK(p["ranks"] == 16);
  CHECK(p["context_ranks"] == 8);
  CHECK(p["ring_bytes_per_rank"].get<double>() > 0);
  CHECK(p["gradient_bytes_per_rank"].get<double>() > 0);
  CHECK(p["exposed_seconds"].get<double>() > 0);  // the 32k plan above: not hidden
}
