// Hardening (issue 11): no hang, no lost output, no invalid input accepted. One test per fault;
// the process-level ones (signals, files, exit codes) drive the real binary and are tagged
// [smoke] too.
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "data/dataset.h"
#include "engine/config/config.h"
#include "engine/core/error.h"
#include "engine/core/memory_pool.h"
#include "engine/model_files/safetensors.h"
#include "engine/planner/planner.h"
#include "engine/training/checkpoint.h"
#include "layers/models.h"
#include "tests/child_process.h"
#include "tests/cli_util.h"
#include "tests/temp_dir.h"

using Catch::Matchers::Contains;
using remat::test::Child;
using remat::test::eventually;
using remat::test::read_text;
using remat::test::run_binary;
using remat::test::TempDir;
using remat::test::write_text;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::string config_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const remat::ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

// A tiny GPT whose steps take about a millisecond and whose checkpoint files are a few KiB.
const std::string kSmall =
    "--config configs/tiny.toml --set model.n_layer=1 --set model.n_embd=8 --set model.n_head=2 "
    "--set train.seq_len=16 --set train.batch_size=2 --set data.task=random";

size_t step_lines(const std::string& path) {
  size_t n = 0;
  for (const auto& l : lines_of(path))
    if (l.rfind("{\"step\"", 0) == 0 || l.find("\"step\":") != std::string::npos) ++n;
  return n;
}

// Every line of a metrics file is a whole JSON object.
bool all_lines_parse(const std::string& path) {
  const std::string text = read_text(path);
  if (!text.empty() && text.back() != '\n') return false;
  for (const auto& l : lines_of(path))
    if (nlohmann::json::parse(l, nullptr, false).is_discarded()) return false;
  return true;
}

// A shell command from the source folder (for ulimit and trap): exit code and stdout+stderr.
remat::test::CliResult run_shell(const std::string& cmd) {
  return remat::test::run_in_source(cmd);
}

// The children of `parent` (from /proc), for the sweep's trial.
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), {});
    const auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && state != 'Z') out.push_back(std::stoi(name));
  }
  return out;
}

std::string cmdline_of(pid_t pid) {
  std::string s = read_text(fmt::format("/proc/{}/cmdline", pid));
  std::replace(s.begin(), s.end(), '\0', ' ');
  return s;
}

}  // namespace

// ---- 1: the pool's bookkeeping is O(log n) per allocation ----

namespace {
// Fake device addresses handed out in order and never reused: the pool's bookkeeping alone.
struct BumpAllocator : remat::DeviceAllocator {
  uintptr_t next = 256;
  void* allocate(size_t bytes) override {
    void* p = reinterpret_cast<void*>(next);
    next += bytes;
    return p;
  }
  void deallocate(void*, size_t) override {}
};
}  // namespace

TEST_CASE("fault 1: a new peak costs O(log n), not a scan of every live allocation",
          "[hardening]") {
  // Allocations that each raise the peak, as a deep model's setup does: n of them, with the
  // largest-tensor tracking on. Quadratic bookkeeping makes 8x the allocations 64x slower.
  auto run = [](int n) {
    remat::MemoryPool pool(std::make_unique<BumpAllocator>(), UINT64_MAX);
    std::vector<remat::Buffer> live;
    live.reserve(static_cast<size_t>(n));
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i)
      live.push_back(pool.allocate({64 + i % 7}, remat::DType::F32, remat::MemCategory::Weights,
                                   fmt::format("w{}", i)));
    CHECK(pool.peak_snapshot().largest.size() == remat::MemoryPool::kLargestTracked);
    CHECK(pool.peak_snapshot().largest.front().bytes == 512);  // 70 floats, rounded up to 256 B
    return seconds_since(t0);
  };
  // A ratio of the two sizes' times, each the fastest of 3 runs, rather than a time limit: a
  // loaded CI machine slows both alike (linear bookkeeping: ~8x; a scan of the live set: 64x).
  const auto fastest = [&](int n) { return std::min({run(n), run(n), run(n)}); };
  const double small = fastest(5000), large = fastest(40000);
  INFO("5000 allocations " << small << " s, 40000 allocations " << large << " s");
  CHECK(large < 24 * std::max(small, 1e-3));
}

TEST_CASE("fault 1: the largest live tensors are listed in the same order as before",
          "[hardening]") {
  remat::MemoryPool pool(std::make_unique<BumpAllocator>(), UINT64_MAX);
  auto a = pool.allocate({64}, remat::DType::F32, remat::MemCategory::Weights, "a");
  auto b = pool.allocate({128}, remat::DType::F32, remat::MemCategory::Weights, "b");
  auto c = pool.allocate({64}, remat::DType::F32, remat::MemCategory::Weights, "c");
  b.reset();
  auto d = pool.allocate({1024}, remat::DType::F32, remat::MemCategory::Weights, "d");
  const auto largest = pool.live_snapshot().largest;
  REQUIRE(largest.size() == 3);
  CHECK(largest[0].name == "d");
  CHECK(largest[1].name == "a");  // ties: the older allocation first
  CHECK(largest[2].name == "c");
}

TEST_CASE(
    "fault 1: the dry run (what train plans before its banner) grows linearly with the depth, "
    "to 4096 layers",
    "[hardening][smoke]") {
  // 512 and 4096 layers, each the fastest of 2 runs: 8x the layers took 13x as long here
  // (2026-12-07; the pool's bookkeeping is O(log n) per allocation), a quadratic step (every
  // layer against every other) would take 64x. A ratio, not a time limit, so that a loaded
  // machine slows both alike.
  const auto dry_run_seconds = [](int layers) {
    const remat::Config cfg =
        remat::load_config(std::string(REMAT_SOURCE_DIR) + "/configs/tiny.toml",
                           {fmt::format("model.n_layer={}", layers)});
    const remat::Planner planner(
        remat::plan_target(cfg, "", std::nullopt), [](const remat::Config& c, remat::Backend& be) {
          return remat::RunParts{remat::make_model(c, be), remat::make_data_source(c)};
        });
    double best = 1e30;
    for (int rep = 0; rep < 2; ++rep) {
      const auto t0 = Clock::now();
      const remat::DryRun run = planner.dry_run(cfg);
      best = std::min(best, seconds_since(t0));
      CHECK(run.peak.total_bytes > 0);
      CHECK(run.peak.largest.size() == remat::MemoryPool::kLargestTracked);
    }
    return best;
  };
  const double shallow = dry_run_seconds(512), deep = dry_run_seconds(4096);
  INFO("512 layers " << shallow << " s, 4096 layers " << deep << " s");
  CHECK(deep < 32 * std::max(shallow, 1e-3));
}

// ---- 2 and 9: a config is a small regular file that names its model ----

TEST_CASE("fault 2: a device, a directory or a huge file as --config is refused at once",
          "[hardening]") {
  TempDir dir("hard-cfg");
  CHECK_THAT(config_error([] { remat::load_config("/dev/zero"); }), Contains("not a regular file"));
  CHECK_THAT(config_error([&] { remat::load_config(dir.str()); }), Contains("not a regular file"));
  write_text(dir / "big.toml", "[model]\nkind = \"gpt\"\n" + std::string(2 << 20, '#'));
  CHECK_THAT(config_error([&] { remat::load_config(dir / "big.toml"); }), Contains("larger than"));
}

TEST_CASE("fault 2: --config /dev/zero exits 2 without reading forever", "[hardening][smoke]") {
  const auto t0 = Clock::now();
  const auto r = run_binary("--config /dev/zero", true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("not a regular file"));
  CHECK(seconds_since(t0) < 5);
}

TEST_CASE("fault 9: an empty, comment-only or truncated config is not a config", "[hardening]") {
  TempDir dir("hard-empty");
  write_text(dir / "empty.toml", "");
  write_text(dir / "comments.toml", "# nothing here\n\n");
  // mlp4.toml cut before its kind: it must not train the default GPT.
  write_text(
      dir / "cut.toml",
      read_text(std::string(REMAT_SOURCE_DIR) + "/configs/mlp4.toml")
          .substr(0, read_text(std::string(REMAT_SOURCE_DIR) + "/configs/mlp4.toml").find("kind")));
  // A [model] table without its kind would train the default GPT with those sizes.
  write_text(dir / "nokind.toml", "[model]\nn_layer = 2\nn_embd = 32\n");
  for (const char* f : {"empty.toml", "comments.toml", "cut.toml", "nokind.toml"})
    CHECK_THAT(config_error([&] { remat::load_config(dir / f); }),
               Contains("model.kind: missing") && Contains("Fix:"));
  CHECK_THAT(config_error([] { remat::load_config("/dev/null"); }), Contains("not a regular file"));
  CHECK_NOTHROW(remat::load_config(std::string(REMAT_SOURCE_DIR) + "/configs/mlp4.toml"));
}

// ---- 3: sweep ranges are bounded before anything is allocated ----

TEST_CASE("fault 3: sweep --seq-lens with an absurd range exits 2 at once", "[hardening][smoke]") {
  const auto t0 = Clock::now();
  const auto r = run_binary(
      "sweep --config configs/tiny.toml --seq-lens 1..8000000000000000000 --out /tmp/remat-none",
      true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("out of range"));
  CHECK(seconds_since(t0) < 5);
  const auto many = run_binary(
      "sweep --config configs/tiny.toml --seq-lens 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,"
      "19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,"
      "49,50,51,52,53,54,55,56,57,58,59,60,61,62,63,64,65 --out /tmp/remat-none",
      true);
  CHECK(many.code == 2);
  CHECK_THAT(many.out, Contains("more than 64"));
}

// ---- 4: a failed metrics write keeps the training state and names the file ----

TEST_CASE("fault 4: a metrics write that fails exits 1 naming the file, and saves a checkpoint",
          "[hardening][smoke]") {
  TempDir dir("hard-full");
  const std::string metrics = dir / "m.jsonl", ckpt = dir / "ck";
  // RLIMIT_FSIZE stands in for a full disk: write(2) fails (EFBIG) once the metrics file reaches
  // 32 KiB, while the checkpoint's files stay smaller; SIGXFSZ is ignored, as a full disk sends
  // none. Not a device: --metrics must be a regular file (fault 6).
  const auto r = run_shell(fmt::format(
      "trap '' XFSZ; ulimit -f 64; exec {} {} --set train.steps=100000 --set checkpoint.dir={} "
      "--metrics {} -q",
      REMAT_BINARY, kSmall, ckpt, metrics));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("[metrics]") && Contains(metrics) && Contains("saved"));
  CHECK(all_lines_parse(metrics));  // cut back to its last whole line
  const std::string saved = remat::latest_checkpoint(ckpt);
  REQUIRE_FALSE(saved.empty());
  CHECK(remat::Checkpoint(saved).state().step > 50);
}

// ---- 5: the metrics file is written where the user asked, line by line ----

TEST_CASE("fault 5: SIGKILL leaves every finished step in FILE, never an older run's file",
          "[hardening][smoke]") {
  TempDir dir("hard-kill");
  const std::string metrics = dir / "m.jsonl";
  write_text(metrics, "{\"summary\": {\"stale\": \"an earlier run\"}}\n");
  Child c(fmt::format("{} --set train.steps=1000000 --metrics {} -q", kSmall, metrics),
          dir / "log");
  CHECK(eventually([&] { return step_lines(metrics) >= 5; }, 60));
  kill(c.pid, SIGKILL);
  c.wait(10);
  CHECK_THAT(read_text(metrics), !Contains("stale"));
  CHECK(step_lines(metrics) >= 5);
  CHECK(all_lines_parse(metrics));
  CHECK_FALSE(fs::exists(metrics + ".tmp"));
}

TEST_CASE("fault 5: SIGTERM and SIGHUP write the summary marked interrupted, exit 128+signal",
          "[hardening][smoke]") {
  for (int sig : {SIGTERM, SIGHUP}) {
    TempDir dir("hard-term");
    const std::string metrics = dir / "m.jsonl";
    Child c(fmt::format("{} --set train.steps=1000000 --metrics {} -q", kSmall, metrics),
            dir / "log");
    CHECK(eventually([&] { return step_lines(metrics) >= 3; }, 60));
    kill(c.pid, sig);
    REQUIRE(c.wait(30));
    CHECK(c.exit_code() == 128 + sig);
    const auto lines = lines_of(metrics);
    REQUIRE_FALSE(lines.empty());
    const auto last = nlohmann::json::parse(lines.back());
    CHECK(last["summary"]["interrupted"] == true);
  }
}

// ---- 6 and 7: output paths are checked before the first step ----

TEST_CASE("fault 6: --metrics onto a FIFO (not a regular file) exits 2 and leaves it alone",
          "[hardening][smoke]") {
  TempDir dir("hard-fifo");
  const std::string fifo = dir / "pipe";
  REQUIRE(mkfifo(fifo.c_str(), 0644) == 0);
  const auto r = run_binary(fmt::format("{} --metrics {} -q", kSmall, fifo), true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("not a regular file"));
  struct stat st {};
  REQUIRE(stat(fifo.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
}

TEST_CASE("fault 7: --metrics DIR or a missing folder exits 2 before the first step",
          "[hardening][smoke]") {
  TempDir dir("hard-dir");
  const auto t0 = Clock::now();
  const auto r = run_binary(
      fmt::format("--config configs/tiny.toml --set train.steps=100000 --metrics {}", dir.str()),
      true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("not a regular file") && !Contains("step "));
  CHECK(seconds_since(t0) < 10);
  const auto missing =
      run_binary(fmt::format("{} --metrics {}/no/such/m.jsonl -q", kSmall, dir.str()), true);
  CHECK(missing.code == 2);
  CHECK_THAT(missing.out, Contains("does not exist"));
  write_text(dir / "file", "x");
  const auto ckpt_file =
      run_binary(fmt::format("{} --set checkpoint.dir={} -q", kSmall, dir / "file"), true);
  CHECK(ckpt_file.code == 2);
  CHECK_THAT(ckpt_file.out, Contains("not a folder"));
}

// ---- 8: a signal to sweep reaches its trial, which is cleaned up ----

namespace {

// The trial process a sweep (or fit --measure) started, and its folder; with `training`, once the
// trial has begun its steps (its metrics file exists).
std::pair<pid_t, std::string> start_sweep_trial(Child& sweep, bool training = true) {
  pid_t trial = -1;
  REQUIRE(eventually(
      [&] {
        const auto kids = children_of(sweep.pid);
        if (kids.empty()) return false;
        trial = kids.front();
        return cmdline_of(trial).find("/tmp/remat-trial-") != std::string::npos;
      },
      60));
  const std::string cmd = cmdline_of(trial);
  const auto at = cmd.find("/tmp/remat-trial-");
  const std::string folder = cmd.substr(at, cmd.find('/', at + 5) - at);
  if (training) REQUIRE(eventually([&] { return fs::exists(folder + "/metrics.jsonl"); }, 60));
  return {trial, folder};
}

void check_sweep_stopped(Child& sweep, pid_t trial, const std::string& folder,
                         const std::string& out, int sig) {
  REQUIRE(sweep.wait(60));
  CHECK(sweep.exit_code() == 128 + sig);
  // The trial was the sweep's child: reaped by it, so gone; an orphan would still run.
  CHECK(eventually([&] { return kill(trial, 0) != 0; }, 10));
  CHECK_FALSE(fs::exists(folder));
  const auto j = nlohmann::json::parse(read_text(out + "/sweep.json"));
  CHECK(j["interrupted"] == true);
  kill(trial, SIGKILL);  // only matters when a check above failed: never leave an orphan
}

}  // namespace

namespace {

// A sweep of one point whose trial trains until it is stopped.
std::string endless_sweep_args(const TempDir& dir) {
  return fmt::format(
      "sweep --config configs/tiny.toml --seq-lens 64 --policies none --steps 1000000 --out {}",
      dir.str());
}

}  // namespace

TEST_CASE("fault 8: SIGTERM to sweep stops its trial, removes its folder, records interrupted",
          "[hardening][smoke]") {
  TempDir dir("hard-sweep");
  Child sweep(endless_sweep_args(dir), dir / "log");
  const auto [trial, folder] = start_sweep_trial(sweep);
  kill(sweep.pid, SIGTERM);
  check_sweep_stopped(sweep, trial, folder, dir.str(), SIGTERM);
}

TEST_CASE("fault 8: a second signal to sweep kills its trial at once, and still cleans up",
          "[hardening][smoke]") {
  TempDir dir("hard-sweep2");
  Child sweep(endless_sweep_args(dir), dir / "log");
  const auto [trial, folder] = start_sweep_trial(sweep);
  kill(trial, SIGSTOP);  // a trial stuck in a long step: only SIGKILL ends it now
  kill(sweep.pid, SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(sweep.pid, SIGINT);
  check_sweep_stopped(sweep, trial, folder, dir.str(), SIGINT);
}

TEST_CASE(
    "fault 8: SIGTERM to fit --measure stops its trial and still prints the plan, marked "
    "interrupted",
    "[hardening][smoke]") {
  // The trial at the longest length of a 512 MiB budget takes seconds: stopped as it starts.
  TempDir dir("hard-fit");
  Child fit("fit --config configs/copy.toml --policies none --memory 512MiB --measure",
            dir / "log");
  const auto [trial, folder] = start_sweep_trial(fit, false);
  kill(fit.pid, SIGTERM);
  REQUIRE(fit.wait(60));
  CHECK(fit.exit_code() == 128 + SIGTERM);
  CHECK(eventually([&] { return kill(trial, 0) != 0; }, 10));
  CHECK_FALSE(fs::exists(folder));
  CHECK_THAT(read_text(dir / "log"),
             Contains("longest: ") && Contains("interrupted: --measure stopped during none"));
  kill(trial, SIGKILL);  // only matters when a check above failed: never leave an orphan
}

// ---- 10: divergence stops the run and keeps the last finite checkpoint ----

TEST_CASE("fault 10: a non-finite loss stops training, names step and tensor, exits 1",
          "[hardening][smoke]") {
  TempDir dir("hard-nan");
  const std::string ckpt = dir / "ck", metrics = dir / "m.jsonl";
  const auto r = run_binary(
      fmt::format("--config configs/tiny.toml --set train.lr=10 --set train.weight_decay=10 --set "
                  "train.grad_clip=0 --set checkpoint.dir={} --set checkpoint.every=2 --metrics "
                  "{} -q",
                  ckpt, metrics),
      true);
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("diverged") && Contains("step") && Contains("first"));
  CHECK_THAT(r.out, !Contains("-nan |"));
  // The newest checkpoint is finite: no checkpoint of non-finite weights replaced it.
  const std::string newest = remat::latest_checkpoint(ckpt);
  if (!newest.empty()) {
    remat::safetensors::Reader model(newest + "/model.safetensors");
    for (const auto& t : model.tensors()) {
      const auto* p = reinterpret_cast<const float*>(model.data(t));
      for (uint64_t i = 0; i < t.bytes() / 4; ++i) REQUIRE(std::isfinite(p[i]));
    }
  }
  CHECK_THAT(read_text(metrics), Contains("\"diverged\""));
}

TEST_CASE("fault 10: the diverging step names the first parameter with a non-finite gradient",
          "[hardening][smoke]") {
  const auto r = run_binary(
      "--config configs/tiny.toml --set train.lr=10 --set train.weight_decay=10 --set "
      "train.grad_clip=0 -q",
      true);
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Contains("diverged at step") || Contains("diverged by step"));
  CHECK_THAT(r.out, Contains("wte") || Contains("blocks.") || Contains("ln_f"));
}

// ---- 11-13, 15, 17: invalid input is refused with a message that says what is wrong ----

TEST_CASE("fault 11: remat.save under another policy, GPT keys on the MLP: exit 2", "[hardening]") {
  const std::string gpt = "[model]\nkind = \"gpt\"\n[remat]\npolicy = \"full\"\n";
  CHECK_THAT(config_error([&] { remat::parse_config(gpt + "save = [\"nosuch\"]\n", "f.toml"); }),
             Contains("remat.save") && Contains("\"names\""));
  CHECK_NOTHROW(remat::parse_config(gpt + "save = []\n", "f.toml"));
  const std::string mlp = "[model]\nkind = \"mlp\"\n";
  for (const char* key : {"n_head = 4", "d_ff = 64", "vocab_size = 64", "n_ctx = 64"})
    CHECK_THAT(config_error([&] { remat::parse_config(mlp + key + "\n", "m.toml"); }),
               Contains("applies to model.kind = \"gpt\""));
  // The MLP's resolved config (state.json) reads back.
  const remat::Config c = remat::parse_config(mlp, "m.toml");
  CHECK_NOTHROW(remat::parse_config(remat::config_to_toml(c), "state.json"));
}

TEST_CASE("fault 12: one --set is one key", "[hardening]") {
  const std::string gpt = "[model]\nkind = \"gpt\"\n";
  CHECK_THAT(config_error([&] { remat::parse_config(gpt, "f", {"model.n_layer=3\nn_head=5"}); }),
             Contains("one --set sets one key"));
}

TEST_CASE("fault 13: a memory budget is one thing, bounded, in the config and on the command line",
          "[hardening][smoke]") {
  const std::string gpt = "[model]\nkind = \"gpt\"\n";
  CHECK_THAT(config_error([&] { remat::parse_config(gpt, "f", {"device.memory=0"}); }),
             Contains("0 bytes"));
  CHECK_THAT(config_error([&] { remat::parse_config(gpt, "f", {"device.memory=16000000TiB"}); }),
             Contains("out of range"));
  const auto zero = run_binary("plan --config configs/tiny.toml --memory 0", true);
  CHECK(zero.code == 2);
  CHECK_THAT(zero.out, Contains("0 bytes"));
  const auto huge = run_binary("plan --config configs/tiny.toml --memory 16000000TiB", true);
  CHECK(huge.code == 2);
  CHECK_THAT(huge.out, Contains("out of range"));
}

TEST_CASE("fault 15: policy names without save says the key is missing and where to add it",
          "[hardening]") {
  const std::string text = "[model]\nkind = \"gpt\"\n[remat]\npolicy = \"names\"\n";
  const std::string e = config_error([&] { remat::parse_config(text, "n.toml"); });
  CHECK_THAT(e, Contains("n.toml:4:1") && Contains("missing") && Contains("under [remat]"));
  CHECK_THAT(e, !Contains("(default)"));
}

TEST_CASE("fault 17: an integer too large for TOML is out of range, not a string", "[hardening]") {
  const std::string gpt = "[model]\nkind = \"gpt\"\n";
  CHECK_THAT(
      config_error([&] { remat::parse_config(gpt, "f", {"model.n_layer=99999999999999999999"}); }),
      Contains("out of range") && !Contains("got a string"));
  // Digits that fit are a quoted number, said as such (it once said "8 is out of range").
  for (const char* set : {"lora.rank=\"8\"", "train.steps=\"1\""})
    CHECK_THAT(
        config_error([&] { remat::parse_config(gpt, "f", {set}); }),
        Contains("got the string") && Contains("without quotes") && !Contains("out of range"));
  // A name where a list goes: the fix is the list of that name.
  CHECK_THAT(config_error([&] {
               remat::parse_config(gpt, "f", {"lora.rank=4", "lora.targets=\"c_attn\""});
             }),
             Contains("write it as a list: [\"c_attn\"]"));
  // GPT-2's tied embedding named to train whole: which module, and why not.
  CHECK_THAT(config_error([&] {
               remat::parse_config(gpt, "f", {"lora.rank=4", "lora.modules_to_save=[\"wte\"]"});
             }),
             Contains("'wte' selects transformer.wte, which is tied to the LM head"));
  // transformers' quantisation flag in [model]: unknown here, with where 4-bit bases live.
  CHECK_THAT(
      config_error([&] { remat::parse_config(gpt, "f", {"model.load_in_4bit=true"}); }),
      Contains("unknown key 'load_in_4bit' in [model]") && Contains("[lora] base = \"nf4\""));
  // [lora] keys on the MLP, which has no blocks: the fix says so rather than "set lora.rank".
  CHECK_THAT(
      config_error(
          [&] { remat::parse_config("[model]\nkind = \"mlp\"\n", "f", {"lora.base=\"nf4\""}); }),
      Contains("remove lora.base") && Contains("\"mlp\" has none") && !Contains("set lora.rank"));
  // A Hugging Face GPT-2 folder's learned positions bound the length: the one fix that applies.
  CHECK_THAT(config_error([&] {
               remat::load_config("hf:" + std::string(REMAT_SOURCE_DIR) + "/tests/golden/hf/gpt2",
                                  {"train.seq_len=100000"});
             }),
             Contains("set train.seq_len to at most 32") && !Contains("model.n_ctx,"));
}

// ---- 14, 16, 18, 19: messages and exit codes at the command line ----

TEST_CASE("fault 14: a model too wide for memory is exit 3 with the breakdown, no std:: text",
          "[hardening][smoke]") {
  const auto r = run_binary("--config configs/mlp4.toml --set model.n_embd=1M", true);
  CHECK(r.code == 3);
  CHECK_THAT(r.out, Contains("out of memory") && !Contains("std::"));
}

TEST_CASE("a flag the parser refuses is one line, exit 2, naming the subcommand's --help",
          "[hardening][smoke]") {
  const std::pair<const char*, const char*> cases[] = {
      {"export --checkpoint x --hf a --adapter b",
       "--hf excludes --adapter. Fix: see "
       "`remat-train export --help`"},
      {"train --init-adapter",
       "--init-adapter: 1 required TEXT missing. Fix: see `remat-train "
       "train --help`"},
      {"--bogus", "remat-train train has no flag --bogus. Fix: see `remat-train train --help`"},
      // A mistyped flag: the one it most likely meant, in the order typed.
      {"sample --checkpoint x --max-tokens 5",
       "remat-train sample has no flag --max-tokens (did you mean --tokens?)"},
      {"plan --config configs/tiny.toml --seqlen 7",
       "has no flag --seqlen (did you mean --seq-len?)"},
      {"sample --checkpoint x stray words",
       "unexpected arguments stray words (remat-train sample "
       "takes flags only)"},
      {"train --config configs/tiny.toml --steps 2 --steps 3",
       "--steps given 2 times: it takes one value, give it once"},
      // A flag a command turns into a key is named as typed, not as the --set it became.
      {"plan --config configs/tiny.toml --seq-len 3", "error: --seq-len 3: [config] train.seq_len"},
      {"plan --config configs/tiny.toml --batch-size 3 --ranks 2",
       "error: --ranks 2: [config] parallel.data"},
      // 2 x steps + 1 overflowed into a negative train.steps the user never set.
      {"bench --config configs/tiny.toml --steps 4611686018427387904",
       "--steps 4611686018427387904: [bench] at most 1000000 timed steps"},
      // NaN passes every range comparison; "-1" parsed as unsigned is 2^64 - 1.
      {"sample --checkpoint x --temperature nan", "--temperature: nan is not a number in [0, 100]"},
      {"sample --checkpoint x --seed -1", "--seed: -1 is not an integer in [0, "},
      {"sample --checkpoint x --tokens 99999999999999999999", "--tokens: too large"}};
  for (const auto& [cmd, want] : cases) {
    const auto r = run_binary(cmd, true);
    INFO(cmd << "\n" << r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains(want));
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  }
}

TEST_CASE("a training run whose output's reader goes away stops with its checkpoint, exit 141",
          "[hardening][smoke]") {
  // `train ... | head`: SIGPIPE killed the run between checkpoints (exit 141, the steps lost).
  // Now the failed write stops it after the step as SIGTERM would: checkpoint, metrics summary.
  TempDir dir("hard-pipe");
  const auto r = remat::test::run_in_source(
      fmt::format("({} train --config configs/tiny.toml --steps 1000000 --set log.every=50 --set "
                  "checkpoint.dir='\"{}\"' --metrics {}; echo $? > {}) | head -3 > /dev/null",
                  REMAT_BINARY, dir / "ck", dir / "m.jsonl", dir / "rc"));
  INFO(r.out);
  CHECK(read_text(dir / "rc") == "141\n");
  const std::string ckpt = remat::latest_checkpoint(dir / "ck");
  REQUIRE_FALSE(ckpt.empty());
  CHECK(remat::Checkpoint(ckpt).state().step < 1000000);
  CHECK_THAT(read_text(dir / "m.jsonl"), Contains("\"summary\""));
  CHECK_THAT(r.out, !Contains("error"));
}

TEST_CASE("an error quoting a newline or an escape sequence stays one line and inert",
          "[hardening][smoke]") {
  // A config path (or a tensor name from a file's header) is the user's or a file's text: a
  // newline in it would forge a second "error:" line, an ESC sequence clear the terminal.
  const auto r = run_binary("plan --config 'a\nerror: all good\033[2J'", true);
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  CHECK_THAT(r.out, Contains("a\\nerror: all good\\x1b[2J") && !Contains("\033"));
}

TEST_CASE("output that cannot reach stdout is an error, not exit 0 with the output cut short",
          "[hardening][smoke]") {
  if (!fs::exists("/dev/full")) {
    WARN("skipped: no /dev/full here");
    return;
  }
  // /dev/full fails every write with ENOSPC: a small output when it is flushed at the end, a
  // large one (fmt throws) while it is written.
  for (const char* cmd :
       {"plan --config configs/tiny.toml > /dev/full",
        "tokenize --tokenizer docs/examples/sft/tokenizer.json < docs/data.md "
        "> /dev/full",
        "plan --config configs/llama-3.1-8b.toml --json --gpu h200 > /dev/full"}) {
    const auto r = run_binary(cmd, true);
    INFO(cmd << "\n" << r.out);
    CHECK(r.code == 1);
    CHECK_THAT(r.out, Contains("error: [io] stdout: cannot write (No space left on device)"));
  }
}

TEST_CASE("small refusals say what is wrong with the input, not something near it",
          "[hardening][smoke]") {
  const std::tuple<const char*, int, const char*> cases[] = {
      {"sweep --config configs/tiny.toml --seq-lens 64..32", 2,
       "the range \"64..32\" ends below its start. Fix: write it from the shorter length to the "
       "longer, 32..64"},
      {"plan --config configs/tiny.toml --memory 0.5", 2, "--memory 0.5: not a size"},
      {"fit --model hf:tests/golden/hf/llama/config.json", 2,
       "config.json: [hf] a file, not a folder"},
      {"tokenize --tokenizer docs/examples/sft/tokenizer.json < docs", 2,
       "[tokenize] stdin: cannot read it (Is a directory)"},
      {"sample --checkpoint configs/tiny.toml", 2,
       "--checkpoint configs/tiny.toml: a file, not a folder"}};
  for (const auto& [cmd, code, want] : cases) {
    const auto r = run_binary(cmd, true);
    INFO(cmd << "\n" << r.out);
    CHECK(r.code == code);
    CHECK_THAT(r.out, Contains(want));
  }
}

TEST_CASE("tokenize --tokenizer bytes gives a byte-level model's ids, as sample reads them",
          "[smoke]") {
  // "bytes" is what sample and prepare_data.py call a byte-level model's tokenizer.
  auto r = remat::test::run_in_source(
      fmt::format("printf 'h\\303\\251' | {} tokenize --tokenizer bytes", REMAT_BINARY), false);
  CHECK(r.code == 0);
  CHECK(r.out == "[104, 195, 169]\n");
  r = remat::test::run_in_source(
      fmt::format("echo '[104, 195, 169]' | {} tokenize --tokenizer bytes --decode", REMAT_BINARY),
      false);
  CHECK(r.code == 0);
  CHECK(r.out == "h\xc3\xa9");
}

TEST_CASE("a flag given an empty value is refused, not taken as left out", "[hardening][smoke]") {
  // An unset shell variable (--gpu "$GPU") ran the CPU plan, and --out "" the default folder.
  for (const char* cmd :
       {"plan --config configs/tiny.toml --gpu ''", "fit --config configs/tiny.toml --memory ''",
        "eval --checkpoint x --passkey ''",
        "train --config configs/tiny.toml "
        "--set ''"}) {
    const auto r = run_binary(cmd, true);
    INFO(cmd << "\n" << r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains("[cli] ") && Contains(": an empty value. Fix: give it a value"));
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  }
}

TEST_CASE("fault 16: --steps 0 says it must be >= 1", "[hardening][smoke]") {
  for (const char* cmd : {"compare --config configs/tiny.toml --steps 0",
                          "sweep --config configs/tiny.toml --seq-lens 64 --steps 0",
                          "train --config configs/tiny.toml --stop-at 0"}) {
    const auto r = run_binary(cmd, true);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains("must be >= 1"));
    CHECK(r.out.size() < 300);
  }
}

TEST_CASE("fault 18: an unknown subcommand is named, with the list of subcommands",
          "[hardening][smoke]") {
  const auto r = run_binary("frobnicate", true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("unknown subcommand 'frobnicate'") && Contains("train, plan"));
  CHECK(run_binary("--config configs/tiny.toml --set train.steps=1 -q", true).code == 0);
}

TEST_CASE("fault 19: compare records a policy that does not fit as out of memory, and goes on",
          "[hardening][smoke]") {
  // tiny.toml's none peaks near 11.2 MiB, full near 7.4 MiB (the planner says so): 9 MiB fits full.
  const auto r = run_binary(
      "compare --config configs/tiny.toml --steps 2 --policies none,full --set device.memory=9MiB "
      "--json",
      false);
  INFO(r.out);
  CHECK(r.code == 0);
  const auto j = nlohmann::json::parse(r.out, nullptr, false);
  REQUIRE(j.is_array());
  REQUIRE(j.size() == 2);
  CHECK(j[0]["status"] == "oom");
  CHECK(j[0]["predicted_peak_bytes"].get<uint64_t>() > 9u << 20);
  CHECK(j[1]["status"] == "ok");
}
