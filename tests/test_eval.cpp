// `remat-train eval` (cmd/eval_command.cpp) and what it stands on: the planner's dry run of the
// forward-only pass against a real CPU pass to the byte (gpt and llama, chunked attention, tiled
// MLP, weights in host memory); through the real binary, loss by position on held-out windows
// against train's own validation loss, passkey exact match against transformers' greedy
// predictions (a golden model of tests/golden/hf), the predicted peak against the measured one,
// and the refusals (a length the budget cannot hold, nothing to score, no held-out data).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/passkey_tasks.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/model_files/safetensors.h"
#include "engine/planner/planner.h"
#include "engine/remat/executor.h"
#include "tests/cli_util.h"
#include "tests/planner_util.h"
#include "tests/temp_dir.h"

using namespace remat;
using Catch::Matchers::Contains;
using Json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// What `eval` allocates and runs, on a real CPU backend: the model, one batch of the data
// source's shape, forward_loss (with the head's predictions or not). Its pool peak.
uint64_t measured_eval_peak(const Config& cfg, int threads, bool predictions) {
  cpu::CpuBackend be(1ull << 32, threads, 1ull << 32);
  RunParts p = test::synthetic_run_parts(cfg, be);
  const Batch batch = p.data->next(be, 0);
  p.model->set_training(false);
  const StepLoss loss = forward_loss(be, *p.model, batch, predictions);
  CHECK(loss.predictions.size() == (predictions ? loss.row_losses.size() : 0));
  return be.pool().peak_bytes();
}

}  // namespace

TEST_CASE("eval's dry run predicts the forward pass's measured peak to the byte", "[eval]") {
  const std::vector<std::vector<std::string>> shapes = {
      {"model.n_layer=3", "model.n_embd=32", "model.n_head=2", "train.seq_len=37",
       "train.batch_size=2", "model.vocab_size=50"},
      {"model.kind=\"llama\"", "model.n_layer=2", "model.n_embd=32", "model.n_head=4",
       "model.n_kv_head=2", "model.vocab_size=64", "train.seq_len=130", "train.batch_size=1",
       "model.rope_scaling={ rope_type = \"yarn\", factor = 4.0, "
       "original_max_position_embeddings = 32 }",
       "remat.attention_chunk=64", "train.loss_chunk=33"},
      {"model.n_layer=2", "model.n_embd=48", "model.n_head=4", "train.seq_len=96",
       "model.position=\"rope\"", "remat.tile_tokens=40", "remat.policy=full",
       "remat.offload=\"checkpoints+optimizer+weights\""},
  };
  for (const auto& sets : shapes) {
    const Config cfg = parse_config("", "eval-test", sets);
    INFO(fmt::format("{}", fmt::join(sets, " ")));
    for (const int threads : {1, 2})
      for (const bool predictions : {false, true}) {
        CAPTURE(threads, predictions);
        PlanTarget t = test::cpu_test_planner(threads, 1ull << 32).target();
        t.host_bytes = 1ull << 32;
        const Planner planner(t, test::synthetic_run_parts);
        const DryRun plan =
            planner.dry_run(cfg, true, predictions ? StepKind::EvalPredictions : StepKind::Eval);
        CHECK(plan.peak.total_bytes == measured_eval_peak(cfg, threads, predictions));
        // No backward: never more than a training step of the same shape.
        CHECK(plan.peak.total_bytes <= planner.dry_run(cfg).peak.total_bytes);
      }
  }
}

namespace {

// A small byte-level llama trained for a few steps on generated text, with a validation split:
// its checkpoint folder, and train's last validation loss from the metrics file.
struct Trained {
  test::TempDir dir{"eval"};
  std::string checkpoint, config;
  double val_loss = 0;
};

const Trained& trained_model() {
  static Trained trained;  // its folder removed at exit
  static const Trained* t = [] {
    Trained* r = &trained;
    std::string text;
    for (int i = 0; i < 6000; ++i) text += fmt::format("{} is {} times {}. ", i * 7, i, 7);
    std::ofstream(r->dir.path / "corpus.txt") << text;
    r->config = r->dir / "run.toml";
    std::ofstream(r->config) << fmt::format(R"([model]
kind = "llama"
n_layer = 2
n_head = 4
n_embd = 32
vocab_size = 256
[train]
seq_len = 64
batch_size = 1
steps = 12
lr = 3e-3
eval_every = 12
eval_tokens = 256
[data]
source = "text"
path = "{}"
val_fraction = 0.1
[device]
backend = "cpu"
threads = 2
memory = "64MiB"
[checkpoint]
dir = "{}"
)",
                                            r->dir / "corpus.txt", r->dir / "ckpt");
    const test::CliResult run = test::run_binary(
        fmt::format("--config {} -q --metrics {}", r->config, r->dir / "metrics.jsonl"), true);
    REQUIRE(run.code == 0);
    std::ifstream metrics(r->dir / "metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) {
      const Json j = Json::parse(line);
      if (j.contains("val_loss") && !j["val_loss"].is_null()) r->val_loss = j["val_loss"];
    }
    REQUIRE(r->val_loss > 0);
    r->checkpoint = r->dir / "ckpt";
    return r;
  }();
  return *t;
}

Json eval_json(const std::string& args) {
  const test::CliResult r = test::run_binary("eval " + args + " --json", false);
  INFO(r.out);
  REQUIRE(r.code == 0);
  return Json::parse(r.out);
}

}  // namespace

TEST_CASE("eval's loss by position is train's validation loss on the same windows, binned",
          "[eval][smoke]") {
  const Trained& t = trained_model();
  // train validated on 256 / 64 = 4 sequential windows of the held-out tail: eval's first 4.
  const Json j = eval_json(fmt::format("--checkpoint {} --windows 4", t.checkpoint));
  CHECK(j["eval"] == "loss_by_position");
  CHECK(j["seq_len"] == 64);
  CHECK(j["windows"] == 4);
  CHECK(j["loss"].get<double>() == Approx(t.val_loss).epsilon(1e-9));
  // Bins 1, 2, 3-4, ..., 33-64: the tokens of context each prediction sees, up to a power of two.
  const std::vector<std::pair<int, int>> want = {{1, 1},  {2, 2},   {3, 4},  {5, 8},
                                                 {9, 16}, {17, 32}, {33, 64}};
  REQUIRE(j["bins"].size() == want.size());
  double weighted = 0;
  int64_t tokens = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const Json& b = j["bins"][i];
    CHECK(b["first"] == want[i].first);
    CHECK(b["last"] == want[i].second);
    CHECK(b["tokens"] == 4 * (want[i].second - want[i].first + 1));
    weighted += b["loss"].get<double>() * b["tokens"].get<double>();
    tokens += b["tokens"].get<int64_t>();
  }
  CHECK(tokens == 4 * 64);
  CHECK(weighted / static_cast<double>(tokens) == Approx(j["loss"].get<double>()).epsilon(1e-12));
  // The measured peak is the planner's, to the byte; and the same windows in batches of 3 (the
  // last batch short) give the same losses.
  CHECK(j["memory"]["peak_bytes"] == j["memory"]["predicted_peak_bytes"]);
  const Json b3 =
      eval_json(fmt::format("--checkpoint {} --windows 4 --batch-size 3", t.checkpoint));
  CHECK(b3["loss"].get<double>() == Approx(j["loss"].get<double>()).epsilon(1e-12));
  CHECK(b3["memory"]["peak_bytes"] == b3["memory"]["predicted_peak_bytes"]);
  // At 4x the length (RoPE past what the model saw), the table: one row per bin and the mean.
  const test::CliResult table = test::run_binary(
      fmt::format("eval --checkpoint {} --seq-len 256 --windows 2", t.checkpoint), false);
  INFO(table.out);
  CHECK(table.code == 0);
  CHECK_THAT(table.out, Contains("positions") && Contains("129-256") && Contains("all") &&
                            Contains("equal to the measured peak"));
}

namespace {

// A file of llm.c's layout: the 1024-byte header (magic, version 1, the count) and `values`: a
// token shard (magic 20240520, uint16) or its loss mask (20240522, one byte a token).
template <class T>
void write_token_file(const fs::path& path, int32_t magic, const std::vector<T>& values) {
  std::vector<int32_t> h(256, 0);
  h[0] = magic, h[1] = 1, h[2] = static_cast<int32_t>(values.size());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(h.data()), 1024);
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(sizeof(T) * values.size()));
}

// One passkey task folder, as scripts/prepare_data.py --passkey writes it, holding `tasks`:
// (tokens, indices of the scored tokens) each, at length tokens - 1.
void write_tasks(const fs::path& dir, int64_t vocab,
                 const std::vector<std::pair<std::vector<int32_t>, std::vector<size_t>>>& tasks) {
  fs::create_directories(dir);
  std::vector<uint16_t> tokens;
  std::vector<uint8_t> mask;
  Json index = {{"format", "remat-train passkey tasks"},
                {"version", 1},
                {"tokenizer", "test"},
                {"vocab_size", vocab},
                {"shard", "passkey.bin"},
                {"mask", "passkey.mask.bin"},
                {"tasks", Json::array()}};
  for (size_t i = 0; i < tasks.size(); ++i) {
    const auto& [ids, scored] = tasks[i];
    index["tasks"].push_back({{"length", ids.size() - 1},
                              {"depth", 0.5},
                              {"sample", i},
                              {"key", "x"},
                              {"offset", tokens.size()},
                              {"tokens", ids.size()}});
    const size_t base = mask.size();
    for (int32_t id : ids) tokens.push_back(static_cast<uint16_t>(id));
    mask.resize(base + ids.size(), 0);
    for (size_t s : scored) mask[base + s] = 1;
  }
  write_token_file(dir / "passkey.bin", 20240520, tokens);
  write_token_file(dir / "passkey.mask.bin", 20240522, mask);
  std::ofstream(dir / "passkey.json") << index.dump(1);
}

}  // namespace

TEST_CASE("a passkey folder that lies is refused naming the file, with the fix that helps",
          "[eval][data]") {
  test::TempDir tmp("passkey-lies");
  const fs::path dir = tmp.path / "tasks";
  auto refusal = [&] {
    try {
      PasskeyTasks tasks(dir.string(), 64);
    } catch (const DataError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  write_tasks(dir, 64, {{{1, 2, 3, 4}, {3}}, {{5, 6, 7, 8}, {2, 3}}});
  REQUIRE(refusal() == "accepted");
  {  // a label eval's table would print as is
    Json j = Json::parse(std::ifstream(dir / "passkey.json"));
    j["tasks"][1]["depth"] = 1.5;
    std::ofstream(dir / "passkey.json") << j.dump();
    CHECK_THAT(refusal(), Contains("passkey.json: task (length 3, depth 1.5, sample 1") &&
                              Contains("a depth is in [0, 1]"));
  }
  // A truncated mask: the folder is written again, not trained without masks.
  write_tasks(dir, 64, {{{1, 2, 3, 4}, {3}}, {{5, 6, 7, 8}, {2, 3}}});
  fs::resize_file(dir / "passkey.mask.bin", fs::file_size(dir / "passkey.mask.bin") - 2);
  const std::string truncated = refusal();
  CHECK_THAT(truncated, Contains("passkey.mask.bin") &&
                            Contains("Fix: write the tasks again with scripts/prepare_data.py "
                                     "--passkey") &&
                            !Contains("loss_mask"));
}

TEST_CASE("eval --passkey: exact when every scored target is transformers' greedy prediction",
          "[eval][smoke]") {
  // The yarn golden's first row (T = 40, past its original context of 16) and transformers'
  // logits of it: the token after position 39 decides task A (it is the argmax: exact) and B
  // (another token: not). C scores that right answer and a target that is not its position's
  // argmax: not exact. Changing the last token changes no logit of positions 0..39.
  const fs::path golden = fs::path(REMAT_SOURCE_DIR) / "tests/golden/hf/rope-yarn";
  const Json meta = Json::parse(std::ifstream(golden / "golden.json"));
  safetensors::Reader file((golden / "golden.safetensors").string());
  const safetensors::TensorInfo* info = file.find("logits");
  REQUIRE(info != nullptr);
  const int64_t T = meta["T"], V = meta["vocab_size"];
  std::vector<float> logits(static_cast<size_t>(2 * T * V));
  REQUIRE(safetensors::to_f32(info->dtype, file.data(*info), logits.size(), logits.data()));
  std::vector<int32_t> row;
  for (int64_t i = 0; i < T; ++i) row.push_back(meta["tokens"][0][static_cast<size_t>(i)]);
  auto argmax_at = [&](int64_t t, double* margin) {
    const float* l = logits.data() + t * V;
    const int64_t best = std::max_element(l, l + V) - l;
    float second = -INFINITY;
    for (int64_t v = 0; v < V; ++v)
      if (v != best) second = std::max(second, l[v]);
    *margin = l[best] - second;
    return static_cast<int32_t>(best);
  };
  double margin = 0;
  const int32_t answer = argmax_at(T - 1, &margin);
  REQUIRE(margin > 1e-3);  // far above the 1e-6 by which our logits differ from transformers'
  // A scored position whose target is not its argmax (the golden's random tokens mostly are not).
  size_t wrong = 0;
  for (int64_t t = T - 2; t > 0 && wrong == 0; --t) {
    double m = 0;
    if (argmax_at(t, &m) != row[static_cast<size_t>(t + 1)] && m > 1e-3)
      wrong = static_cast<size_t>(t + 1);
  }
  REQUIRE(wrong > 0);
  auto with_last = [&](int32_t last) {
    std::vector<int32_t> ids = row;
    ids.push_back(last);
    return ids;
  };
  const size_t last = static_cast<size_t>(T);
  test::TempDir tmp("eval-passkey");
  write_tasks(tmp.path / "tasks", V,
              {{with_last(answer), {last}},
               {with_last((answer + 1) % static_cast<int32_t>(V)), {last}},
               {with_last(answer), {wrong, last}}});
  const Json j = eval_json(
      fmt::format("--model hf:{} --passkey {}", golden.string(), (tmp.path / "tasks").string()));
  CHECK(j["eval"] == "passkey");
  REQUIRE(j["task_results"].size() == 3);
  CHECK(j["task_results"][0]["exact"] == true);
  CHECK(j["task_results"][1]["exact"] == false);
  CHECK(j["task_results"][2]["exact"] == false);
  CHECK(j["exact"] == 1);
  CHECK(j["cells"].size() == 1);
  CHECK(j["cells"][0]["length"] == T);
  CHECK(j["cells"][0]["tasks"] == 3);
  CHECK(j["memory"]["peak_bytes"] == j["memory"]["predicted_peak_bytes"]);
}

TEST_CASE("eval of a LoRA checkpoint: its recorded base with its adapters, peft's loss",
          "[eval][peft]") {
  // tests/golden/hf/llama-lora: a base, a PEFT adapter far from it, and the PeftModel's loss on
  // B rows of T + 1 tokens. A run from that adapter at lr 0 checkpoints it unchanged (the
  // adapters and the modules trained whole, no base weight); eval puts it back on the base that
  // state.json records and scores the same rows as its windows.
  const fs::path golden = fs::path(REMAT_SOURCE_DIR) / "tests/golden/hf/llama-lora";
  const Json meta = Json::parse(std::ifstream(golden / "golden.json"));
  const int64_t B = meta["B"], T = meta["T"];
  test::TempDir tmp("eval-lora");
  const fs::path base = tmp.path / "base";
  fs::create_directories(base);
  for (const char* f : {"config.json", "model.safetensors", "generation_config.json"})
    fs::copy_file(golden / f, base / f);
  // One shard per row: windows step by T, so each file of T + 1 tokens is one window.
  std::string files;
  for (int64_t r = 0; r < B; ++r) {
    std::vector<uint16_t> row;
    for (const Json& id : meta["tokens"][static_cast<size_t>(r)]) row.push_back(id.get<uint16_t>());
    REQUIRE(row.size() == static_cast<size_t>(T + 1));
    const fs::path file = tmp.path / fmt::format("row{}.bin", r);
    write_token_file(file, 20240520, row);
    files += " " + file.string();
  }
  auto strings = [](const Json& list) {
    std::string out;
    for (const Json& s : list)
      out += fmt::format("{}\"{}\"", out.empty() ? "" : ", ", s.get<std::string>());
    return "[" + out + "]";
  };
  const Json& l = meta["lora"];
  std::ofstream(tmp.path / "lora.toml") << fmt::format(
      "[train]\nseq_len = {}\nbatch_size = {}\nsteps = 1\nlr = 0.0\n[lora]\nrank = {}\nalpha = "
      "{}\ntargets = {}\nmodules_to_save = {}\n[checkpoint]\ndir = \"{}\"\n",
      T, B, l["r"].get<int64_t>(), l["lora_alpha"].get<double>(), strings(l["target_modules"]),
      strings(l["modules_to_save"]), tmp / "ckpt");
  const test::CliResult train =
      test::run_binary(fmt::format("train -q --config {} --init hf:{} --init-adapter {}",
                                   tmp / "lora.toml", base.string(), (golden / "adapter").string()),
                       true);
  INFO(train.out);
  REQUIRE(train.code == 0);
  const std::string data = fmt::format("--seq-len {} --windows {} --data{}", T, B, files);
  const Json lora = eval_json(fmt::format("--checkpoint {} {}", tmp / "ckpt", data));
  CHECK(lora["windows"] == B);
  CHECK(lora["loss"].get<double>() == Approx(meta["loss"].get<double>()).epsilon(1e-5));
  CHECK(lora["memory"]["peak_bytes"] == lora["memory"]["predicted_peak_bytes"]);
  // The base alone scores otherwise: the adapters were applied.
  const Json plain = eval_json(fmt::format("--model hf:{} {}", base.string(), data));
  CHECK(std::abs(plain["loss"].get<double>() - meta["loss"].get<double>()) > 1e-3);
  // A base changed since the checkpoint was written is refused, naming it.
  std::ofstream(base / "config.json", std::ios::app) << " ";
  const test::CliResult changed =
      test::run_binary(fmt::format("eval --checkpoint {} {}", tmp / "ckpt", data), true);
  CHECK(changed.code == 2);
  CHECK_THAT(changed.out,
             Contains("changed since this checkpoint was written") && Contains("config.json is"));
}

TEST_CASE("eval refuses in one line: a length the budget cannot hold, nothing or no data to score",
          "[eval][smoke]") {
  const Trained& t = trained_model();
  // 8 MiB: the eval of this model at 64k tokens does not fit; the message names the longest that
  // does, and that one runs.
  const std::string small = " --set device.memory=8MiB";
  test::CliResult r = test::run_binary(
      fmt::format("eval --checkpoint {} --seq-len 64k{}", t.checkpoint, small), true);
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("[eval] --seq-len 65536: its forward pass peaks at") &&
                        Contains("over the device budget of 8.00 MiB (device.memory)") &&
                        Contains("the longest that fits is --seq-len "));
  const size_t at = r.out.find("the longest that fits is --seq-len ");
  const int64_t longest = std::stoll(r.out.substr(at + 35));
  CHECK(longest > 64);
  CHECK(longest < 65536);
  r = test::run_binary(fmt::format("eval --checkpoint {} --seq-len {} --windows 1{}", t.checkpoint,
                                   longest + 1, small),
                       true);
  CHECK(r.code == 2);
  r = test::run_binary(fmt::format("eval --checkpoint {} --seq-len {} --windows 1 --data {}{}",
                                   t.checkpoint, longest, t.dir / "corpus.txt", small),
                       true);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("equal to the measured peak"));
  // A batch beyond the windows to score runs them, one row each: it is cut to them, never
  // planned (and refused) at its own size. One beyond the budget says so by name.
  r = test::run_binary(fmt::format("eval --checkpoint {} --seq-len {} --windows 1 --batch-size "
                                   "100000 --data {}{}",
                                   t.checkpoint, longest, t.dir / "corpus.txt", small),
                       true);
  CHECK(r.code == 0);
  r = test::run_binary(fmt::format("eval --checkpoint {} --seq-len {} --windows 8 --batch-size 8 "
                                   "--data {}{}",
                                   t.checkpoint, longest, t.dir / "corpus.txt", small),
                       true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("at --batch-size 8 (a smaller one fits more)"));
  // Nothing to score; a config without held-out data; a missing passkey folder.
  r = test::run_binary("eval --seq-len 64", true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("give --checkpoint DIR (or latest with --config) or --model hf:DIR"));
  // Another held-out split than the run's own may be text it trained on (a run without one
  // scored the tail of its training file): held-out files come with --data.
  for (const char* set :
       {"data.val_fraction=0", "data.val_fraction=0.1", "data.val_path=x.bin", "data.path=x.bin"}) {
    r = test::run_binary(fmt::format("eval --checkpoint {} --set {}", t.checkpoint, set), true);
    INFO(set << "\n" << r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains("scores what the checkpoint's run held out") &&
                          Contains("pass held-out files with --data FILES"));
  }
  // A key that changes the model scored is refused, never applied silently; a RoPE scaling is not.
  for (const char* set : {"model.n_layer=1", "lora.rank=4", "lora.alpha=1000"}) {
    r = test::run_binary(fmt::format("eval --checkpoint {} --set {}", t.checkpoint, set), true);
    INFO(set << "\n" << r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains("scores the checkpoint's own model") && Contains("export --hf"));
  }
  r = test::run_binary(
      fmt::format("eval --checkpoint {} --passkey {}", t.checkpoint, t.dir / "no-such-folder"),
      true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("no-such-folder/passkey.json: no such file"));
  // A FIFO in the index's place is refused at once, never waited on (engine/core/regular_file.h).
  fs::create_directories(t.dir / "fifo-tasks");
  REQUIRE(::mkfifo((t.dir / "fifo-tasks/passkey.json").c_str(), 0600) == 0);
  r = test::run_binary(
      fmt::format("eval --checkpoint {} --passkey {}", t.checkpoint, t.dir / "fifo-tasks"), true);
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("fifo-tasks/passkey.json: not a regular file"));
  // --checkpoint latest takes the config's checkpoint.dir.
  r = test::run_binary(fmt::format("eval --checkpoint latest --config {} --windows 1", t.config),
                       false);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("step_00000012"));
}

TEST_CASE("prepare_data.py --passkey: tasks of exactly length + 1 tokens, the answer masked",
          "[eval][smoke]") {
  test::TempDir tmp("passkey-prepare");
  test::CliResult r = test::run_in_source(fmt::format(
      "python3 scripts/prepare_data.py --passkey --tokenizer bytes --lengths 300,1k --depths "
      "0,0.5,1 --samples 2 --out {}",
      tmp / "tasks"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  const Json index = Json::parse(std::ifstream(tmp.path / "tasks/passkey.json"));
  REQUIRE(index["tasks"].size() == 12);
  std::ifstream bin(tmp.path / "tasks/passkey.bin", std::ios::binary);
  std::ifstream mask(tmp.path / "tasks/passkey.mask.bin", std::ios::binary);
  std::vector<char> b((std::istreambuf_iterator<char>(bin)), {});
  std::vector<char> m((std::istreambuf_iterator<char>(mask)), {});
  int32_t h[3];
  std::memcpy(h, m.data(), sizeof h);
  CHECK(h[0] == 20240522);
  CHECK(h[1] == 1);
  CHECK(static_cast<size_t>(h[2]) == m.size() - 1024);
  CHECK((b.size() - 1024) / 2 == m.size() - 1024);
  for (const Json& t : index["tasks"]) {
    const int64_t off = t["offset"], n = t["tokens"], len = t["length"];
    CHECK(n == len + 1);
    // The text ends with "The pass key is KEY", whose " KEY" is the only part masked.
    std::string text;
    for (int64_t i = 0; i < n; ++i)
      text += static_cast<char>(b[static_cast<size_t>(1024 + 2 * (off + i))]);
    const std::string key = t["key"];
    CHECK(text.ends_with("What is the pass key? The pass key is " + key));
    CHECK(text.find("The pass key is " + key + ". Remember it.") != std::string::npos);
    int64_t masked = 0;
    for (int64_t i = 0; i < n; ++i) masked += m[static_cast<size_t>(1024 + off + i)];
    CHECK(masked == static_cast<int64_t>(key.size()) + 1);
    CHECK(m[static_cast<size_t>(1024 + off + n - 1)] == 1);
  }
  // Filler text shorter than a length needs: one line, exit 2.
  std::ofstream(tmp.path / "filler.txt") << std::string(2000, 'a');
  r = test::run_in_source(fmt::format(
      "python3 scripts/prepare_data.py --passkey --tokenizer bytes --lengths 4k --depths 0 "
      "--out {} {}",
      tmp / "short", tmp / "filler.txt"));
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("error: [prepare] --lengths 4096: a task of 4097 tokens needs") &&
                        Contains("has 2,000. Fix: give more filler text, or shorter --lengths"));
}
