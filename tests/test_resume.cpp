// Resume is bit-for-bit: N steps in one run equal N/2 steps, a checkpoint, and N/2 more from it
// (losses, weights and AdamW moments, byte for byte), also when the resumed half runs under
// another remat policy. Then the real binary: --stop-at and --resume latest, SIGTERM with
// checkpoint.on_interrupt, SIGKILL at random moments while checkpoints are written, and the
// errors a user meets (a changed model key, no checkpoint).
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cli_util.h"
#include "data/dataset.h"
#include "engine/config/config.h"
#include "engine/core/rng.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/training/checkpoint.h"
#include "engine/training/trainer.h"
#include "layers/models.h"
#include "temp_dir.h"
#include "test_util.h"

using namespace remat;
namespace fs = std::filesystem;

namespace {

using test::TempDir;

// Text with structure to learn: words from a small vocabulary in a seeded order.
void write_corpus(const std::string& file, size_t bytes) {
  static const char* kWords[] = {"the ",   "model ",    "keeps ",      "only ", "its ",
                                 "input ", "and ",      "recomputes ", "rest ", "memory ",
                                 "for ",   "compute. ", "\n"};
  std::ofstream out(file, std::ios::binary);
  size_t n = 0;
  for (uint64_t i = 0; n < bytes; ++i) {
    const char* w = kWords[rng_bits(7, 1, i) % (sizeof kWords / sizeof *kWords)];
    out << w;
    n += std::strlen(w);
  }
}

std::string config_text(const std::string& corpus, const std::string& ckpt_dir, int64_t steps) {
  return fmt::format(R"(
[model]
kind = "gpt"
n_layer = 3
n_head = 2
n_embd = 32
vocab_size = 256
position = "rope"
dropout = 0.1
[train]
seq_len = 48
batch_size = 3
steps = {}
lr = 3e-3
warmup_steps = 3
eval_every = 5
eval_tokens = 200
[data]
source = "text"
path = "{}"
val_fraction = 0.1
[remat]
policy = "full"
[device]
threads = 1
[checkpoint]
dir = "{}"
every = 5
)",
                     steps, corpus, ckpt_dir);
}

// The binary's tests: a corpus in `tmp` and, for each name, `<name>.toml` training `steps` steps
// on it with checkpoints in `<name>/`.
void write_runs(const TempDir& tmp, std::initializer_list<const char*> names, int64_t steps) {
  write_corpus(tmp / "corpus.txt", 20000);
  for (const char* name : names)
    std::ofstream(tmp / (std::string(name) + ".toml"))
        << config_text(tmp / "corpus.txt", tmp / name, steps);
}

struct Snapshot {
  std::vector<double> losses;
  std::vector<std::vector<float>> tensors;  // value, m, v of every parameter
};

void snapshot_params(Model& model, Snapshot& s) {
  for (Param& p : model.params())
    for (const Buffer* b : {&p.value, &p.m, &p.v})
      s.tensors.emplace_back(b->f32(), b->f32() + b->tensor().numel());
}

// Trains steps [from, to) of `cfg`, optionally starting from a checkpoint and ending with one.
Snapshot train_range(const Config& cfg, int64_t from, int64_t to, const std::string& resume_from,
                     const std::string& save_to) {
  cpu::CpuBackend be(1ull << 30, 2);
  auto model = make_model(cfg, be);
  auto data = make_data_source(cfg);
  data->open();
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data);
  if (!resume_from.empty()) {
    Checkpoint ckpt(resume_from);
    ckpt.load_into(be, *model, true);
    trainer.set_steps_done(ckpt.state().step);
  }
  REQUIRE(trainer.steps_done() == from);
  Snapshot s;
  while (trainer.steps_done() < to) {
    s.losses.push_back(trainer.step().loss);
    trainer.evaluate(cfg.train.eval_tokens);  // evaluation must not disturb training
  }
  if (!save_to.empty()) {
    CheckpointState st;
    st.step = trainer.steps_done();
    st.config_toml = config_to_toml(cfg);
    write_checkpoint(save_to, be, *model, st);
  }
  snapshot_params(*model, s);
  return s;
}

}  // namespace

TEST_CASE("2 x 10 steps with a checkpoint between equal 20 steps, bit for bit, with dropout",
          "[resume]") {
  TempDir tmp("bitwise");
  write_corpus(tmp / "corpus.txt", 20000);
  const Config cfg = parse_config(config_text(tmp / "corpus.txt", tmp / "ckpt", 20), "resume-test");
  const Snapshot whole = train_range(cfg, 0, 20, "", "");
  const Snapshot first = train_range(cfg, 0, 10, "", tmp / "ckpt");
  const std::string mid = tmp / "ckpt/step_00000010";
  REQUIRE(latest_checkpoint(tmp / "ckpt") == mid);

  SECTION("same policy") {
    const Snapshot second = train_range(cfg, 10, 20, mid, "");
    std::vector<double> losses = first.losses;
    losses.insert(losses.end(), second.losses.begin(), second.losses.end());
    CHECK(losses == whole.losses);
    CHECK(test::bitwise_equal(second.tensors, whole.tensors));
  }
  SECTION("resumed under another policy: remat changes nothing") {
    const Config other = parse_config(config_text(tmp / "corpus.txt", tmp / "ckpt", 20),
                                      "resume-test", {"remat.policy=save_attn", "remat.every=1"});
    const Snapshot second = train_range(other, 10, 20, mid, "");
    CHECK(std::equal(second.losses.begin(), second.losses.end(), whole.losses.begin() + 10));
    CHECK(test::bitwise_equal(second.tensors, whole.tensors));
  }
  SECTION("weights, gradients and moments on the host, before or after the checkpoint") {
    // The checkpoint of a run with the state in host memory is the same file: either half may
    // run with it, with the evaluation's forward_loss between steps.
    const std::vector<std::string> host = {"remat.offload=\"checkpoints+optimizer+weights\""};
    const Config moved =
        parse_config(config_text(tmp / "corpus.txt", tmp / "ckpt2", 20), "resume-test", host);
    const Snapshot first_moved = train_range(moved, 0, 10, "", tmp / "ckpt2");
    CHECK(first_moved.losses == first.losses);
    CHECK(test::bitwise_equal(first_moved.tensors, first.tensors));
    const Snapshot second = train_range(cfg, 10, 20, tmp / "ckpt2/step_00000010", "");
    CHECK(std::equal(second.losses.begin(), second.losses.end(), whole.losses.begin() + 10));
    CHECK(test::bitwise_equal(second.tensors, whole.tensors));
    const Snapshot second_moved = train_range(moved, 10, 20, mid, "");
    CHECK(std::equal(second_moved.losses.begin(), second_moved.losses.end(),
                     whole.losses.begin() + 10));
    CHECK(test::bitwise_equal(second_moved.tensors, whole.tensors));
  }
  SECTION("a mistake is caught: resuming without the optimizer state diverges") {
    cpu::CpuBackend be(1ull << 30, 2);
    auto model = make_model(cfg, be);
    auto data = make_data_source(cfg);
    data->open();
    Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data);
    Checkpoint(mid).load_into(be, *model, /*with_optimizer=*/false);
    trainer.set_steps_done(10);
    while (trainer.steps_done() < 20) trainer.step();
    Snapshot s;
    snapshot_params(*model, s);
    CHECK_FALSE(test::bitwise_equal(s.tensors, whole.tensors));
  }
}

// ---- the real binary ----

namespace {

struct Child {
  pid_t pid = -1;
};

// Starts remat-train with stdout/stderr to `log`, without a shell in between (signals reach it).
Child spawn_binary(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> all = {REMAT_BINARY};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  Child c;
  REQUIRE(posix_spawn(&c.pid, REMAT_BINARY, &fa, nullptr, argv.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&fa);
  return c;
}

int wait_exit(const Child& c, int* signal_out = nullptr) {
  int status = 0;
  waitpid(c.pid, &status, 0);
  if (signal_out) *signal_out = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string slurp(const std::string& file) {
  std::ifstream in(file);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<char> bytes_of(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

// Waits until `pred` holds (polling), at most `seconds`.
template <class Pred>
bool wait_for(Pred pred, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

}  // namespace

TEST_CASE(
    "the binary: --stop-at then --resume latest ends with the weights of an uninterrupted run",
    "[resume][smoke]") {
  TempDir tmp("cli");
  write_runs(tmp, {"a", "b"}, 20);
  auto run = [&](const std::string& args) { return test::run_binary(args, true); };
  REQUIRE(run(fmt::format("train -q --config {}", tmp / "a.toml")).code == 0);
  const auto half = run(
      fmt::format("train --config {} --stop-at 10 --metrics {}", tmp / "b.toml", tmp / "b.jsonl"));
  REQUIRE(half.code == 0);
  CHECK_THAT(half.out, Catch::Matchers::Contains("checkpoint"));
  const auto rest = run(fmt::format("train --config {} --resume latest --metrics {}",
                                    tmp / "b.toml", tmp / "b.jsonl"));
  INFO(rest.out);
  REQUIRE(rest.code == 0);
  CHECK_THAT(rest.out, Catch::Matchers::Contains("resumed from"));
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    CHECK(bytes_of(tmp / (std::string("a/step_00000020/") + f)) ==
          bytes_of(tmp / (std::string("b/step_00000020/") + f)));
  // The metrics of both halves are kept: 20 step lines, val_loss, a resume and checkpoint events.
  const std::string jsonl = slurp(tmp / "b.jsonl");
  CHECK_THAT(jsonl, Catch::Matchers::Contains("\"event\":\"resume\""));
  CHECK_THAT(jsonl, Catch::Matchers::Contains("\"val_loss\""));
  CHECK_THAT(jsonl, Catch::Matchers::Contains("\"step\":1,"));
  CHECK_THAT(jsonl, Catch::Matchers::Contains("\"step\":20,"));

  SECTION("a changed model key is refused, naming the key") {
    const auto bad = run(
        fmt::format("train --config {} --resume latest --set model.n_embd=64 --set model.n_head=2",
                    tmp / "b.toml"));
    CHECK(bad.code == 2);
    CHECK_THAT(bad.out, Catch::Matchers::Contains("model.n_embd"));
  }
  SECTION("a fresh run never writes over another run's checkpoints") {
    const auto fresh = run(fmt::format("train --config {}", tmp / "b.toml"));
    CHECK(fresh.code == 2);
    CHECK_THAT(fresh.out, Catch::Matchers::Contains("already holds checkpoints"));
    CHECK(fs::exists(tmp / "b/step_00000020/state.json"));
  }
  SECTION("an earlier checkpoint resumed beside later ones replaces none of them") {
    const std::string last = tmp / "b/step_00000020/model.safetensors";
    const std::vector<char> before = bytes_of(last);
    const auto back = run(fmt::format("train --resume {}", tmp / "b/step_00000010"));
    CHECK(back.code == 2);
    CHECK_THAT(back.out, Catch::Matchers::Contains(
                             "holds step_00000015, step_00000020 after the resumed step 10") &&
                             Catch::Matchers::Contains("Fix:"));
    CHECK(bytes_of(last) == before);
    // Into a folder of its own it continues, bit for bit the uninterrupted run.
    const auto elsewhere = run(fmt::format("train -q --resume {} --set checkpoint.dir='\"{}\"'",
                                           tmp / "b/step_00000010", tmp / "c"));
    INFO(elsewhere.out);
    REQUIRE(elsewhere.code == 0);
    CHECK(bytes_of(tmp / "c/step_00000020/model.safetensors") ==
          bytes_of(tmp / "a/step_00000020/model.safetensors"));
  }
  SECTION("a resume never writes into another run's checkpoint.dir") {
    const std::vector<char> before = bytes_of(tmp / "a/step_00000020/model.safetensors");
    const auto into = run(fmt::format("train --resume {} --set checkpoint.dir='\"{}\"'",
                                      tmp / "b/step_00000010", tmp / "a"));
    CHECK(into.code == 2);
    CHECK_THAT(into.out, Catch::Matchers::Contains("already holds checkpoints") &&
                             Catch::Matchers::Contains("the run continues in " + (tmp / "b")));
    CHECK(bytes_of(tmp / "a/step_00000020/model.safetensors") == before);
  }
  SECTION("a step folder typed with the shell's trailing slash, or from inside its run") {
    const auto slash =
        run(fmt::format("train -q --resume {}/ --steps 25", tmp / "b/step_00000020"));
    INFO(slash.out);
    REQUIRE(slash.code == 0);
    CHECK(fs::exists(tmp / "b/step_00000025/state.json"));
    CHECK_FALSE(fs::exists(tmp / "b/step_00000020/step_00000025"));
    const auto inside = test::run_command(fmt::format(
        "cd {} && {} train -q --resume step_00000025 --steps 30", tmp / "b", REMAT_BINARY));
    INFO(inside.out);
    REQUIRE(inside.code == 0);
    CHECK(fs::exists(tmp / "b/step_00000030/state.json"));
  }
  SECTION("a moved run continues in the folder it was moved to") {
    fs::rename(tmp / "b", tmp / "moved");
    const auto moved = run(fmt::format("train --resume {} --steps 25", tmp / "moved"));
    INFO(moved.out);
    REQUIRE(moved.code == 0);
    CHECK_THAT(moved.out, Catch::Matchers::Contains("checkpoint.dir \"" + (tmp / "b") + "\" -> \"" +
                                                    (tmp / "moved") + "\""));
    CHECK(fs::exists(tmp / "moved/step_00000025/state.json"));
    CHECK_FALSE(fs::exists(tmp / "b"));
  }
  SECTION("a corrupt checkpoint is refused, naming the file") {
    const std::string model = tmp / "b/step_00000020/model.safetensors";
    fs::resize_file(model, fs::file_size(model) - 7);
    const auto bad = run(fmt::format("train --config {} --resume latest", tmp / "b.toml"));
    CHECK(bad.code == 2);
    CHECK_THAT(bad.out, Catch::Matchers::Contains("model.safetensors"));
  }
  SECTION("no checkpoint to resume from") {
    const auto none = run(fmt::format("train --config {} --resume latest --set checkpoint.dir={}",
                                      tmp / "b.toml", tmp / "empty"));
    CHECK(none.code == 2);
    CHECK_THAT(none.out, Catch::Matchers::Contains("no complete checkpoint"));
  }
}

TEST_CASE(
    "the binary: SIGTERM stops after the step, writes a checkpoint, exits 143, and resume finishes "
    "bitwise",
    "[resume][smoke]") {
  TempDir tmp("sigterm");
  write_runs(tmp, {"a", "b"}, 400);
  Child c = spawn_binary({"train", "--config", tmp / "b.toml", "--set", "checkpoint.every=0",
                          "--metrics", tmp / "b.jsonl"},
                         tmp / "b.log");
  // Wait until it is training (the first progress line), then stop it.
  REQUIRE(wait_for([&] { return slurp(tmp / "b.log").find("step ") != std::string::npos; }, 60));
  kill(c.pid, SIGTERM);
  const int code = wait_exit(c);
  INFO(slurp(tmp / "b.log"));
  REQUIRE(code == 143);
  const std::string ckpt = latest_checkpoint(tmp / "b");
  REQUIRE_FALSE(ckpt.empty());
  const int64_t step = Checkpoint(ckpt).state().step;
  CHECK(step > 0);
  CHECK(step < 400);
  CHECK_THAT(slurp(tmp / "b.jsonl"), Catch::Matchers::Contains("\"interrupted\":true"));

  // The uninterrupted run to the same step (the schedule is that of 400 steps in both).
  auto run = [&](const std::string& args) { return test::run_binary(args, true); };
  REQUIRE(run(fmt::format("train -q --config {} --stop-at {} --set checkpoint.every=0",
                          tmp / "a.toml", step + 3))
              .code == 0);
  REQUIRE(
      run(fmt::format("train -q --config {} --resume latest --stop-at {} --set checkpoint.every=0",
                      tmp / "b.toml", step + 3))
          .code == 0);
  const std::string name = checkpoint_folder_name(step + 3);
  CHECK(bytes_of(tmp / ("a/" + name + "/model.safetensors")) ==
        bytes_of(tmp / ("b/" + name + "/model.safetensors")));
}

TEST_CASE(
    "the binary: SIGKILL at random moments while checkpoints are written never leaves a bad one",
    "[resume][smoke]") {
  TempDir tmp("sigkill");
  write_runs(tmp, {"c"}, 100000);
  const std::vector<std::string> every_step = {"--set", "checkpoint.every=1",
                                               "--set", "checkpoint.keep_last=2",
                                               "--set", "train.eval_every=0"};
  int64_t last_step = 0;
  for (int round = 0; round < 8; ++round) {
    std::vector<std::string> args = {"train", "-q", "--config", tmp / "c.toml"};
    args.insert(args.end(), every_step.begin(), every_step.end());
    if (round > 0) args.insert(args.end(), {"--resume", "latest"});
    Child c = spawn_binary(args, tmp / "c.log");
    // Kill once it has started writing checkpoints, at a moment drawn per round.
    const fs::path dir = tmp.path / "c";
    wait_for(
        [&] {
          return !latest_checkpoint(dir.string()).empty() &&
                 (round == 0 ||
                  Checkpoint(latest_checkpoint(dir.string())).state().step > last_step);
        },
        60);
    std::this_thread::sleep_for(
        std::chrono::microseconds(rng_bits(11, 2, static_cast<uint64_t>(round)) % 150000));
    kill(c.pid, SIGKILL);
    int sig = 0;
    wait_exit(c, &sig);
    INFO("round " << round << ": " << slurp(tmp / "c.log"));
    REQUIRE(sig == SIGKILL);
    const std::string latest = latest_checkpoint(dir.string());
    REQUIRE_FALSE(latest.empty());
    const Checkpoint ckpt(latest);  // verifies sizes and checksums; throws on a half-written one
    CHECK(ckpt.state().step >= last_step);
    last_step = ckpt.state().step;
  }
  // And it continues from there.
  const auto res = test::run_binary(
      fmt::format("train -q --config {} --resume latest --stop-at {} --set checkpoint.every=0 "
                  "--set train.eval_every=0",
                  tmp / "c.toml", last_step + 2),
      true);
  INFO(res.out);
  CHECK(res.code == 0);
  CHECK(Checkpoint(latest_checkpoint(tmp / "c")).state().step == last_step + 2);
}

TEST_CASE("the make run job trains at 4096 tokens in a budget that policy none does not fit",
          "[resume][smoke]") {
  TempDir tmp("long");
  const auto r =
      test::run_binary(fmt::format("train --config configs/long.toml --set train.steps=1 --set "
                                   "train.eval_every=1 --set checkpoint.dir={}",
                                   tmp / "ckpt"),
                       true);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Matchers::Contains("seq_len 4096") &&
                        Catch::Matchers::Contains("does NOT fit the budget") &&
                        Catch::Matchers::Contains("equal to the measured peak") &&
                        Catch::Matchers::Contains("val_loss"));
  CHECK_FALSE(latest_checkpoint(tmp / "ckpt").empty());
}

TEST_CASE(
    "the planner counts checkpoint staging: predicted equals measured when staging sets the peak",
    "[resume][smoke]") {
  // A 50k vocabulary at 4 tokens: the (V, C) staging buffer of a checkpoint write outweighs
  // every activation of the step, so the peak is reached while writing the checkpoint.
  TempDir tmp("staging");
  const auto r = test::run_binary(
      fmt::format(
          "train --config configs/tiny.toml --set data.task=random --set model.vocab_size=50257 "
          "--set train.seq_len=4 --set train.batch_size=1 --set train.steps=2 --set "
          "checkpoint.dir={}",
          tmp / "ckpt"),
      true);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Matchers::Contains("reached during checkpoint") &&
                        Catch::Matchers::Contains("equal to the measured peak"));
}
