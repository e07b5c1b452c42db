// remat.offload on the CPU, where the host pool is a second pool in the same RAM: the executor
// and its accounting run exactly as on a GPU, minus the second stream. Offloading moves bytes,
// never changes them: losses, gradients and weights are bitwise those of the run without it; the
// planner predicts both pools' peaks to the byte; the copy volume and the device's share of the
// checkpoints follow the executor's rules (engine/remat/executor.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "data/synthetic.h"
#include "engine/config/policy.h"
#include "engine/core/error.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/planner/planner.h"
#include "layers/models.h"
#include "tests/cli_util.h"
#include "tests/configs.h"
#include "tests/planner_util.h"
#include "tests/test_util.h"

using namespace remat;

namespace {

const std::string kBase = test::small_gpt_toml(test::remat_test_gpt());

struct Record {
  std::vector<double> losses;
  std::vector<std::vector<float>> params, grads, moments;
  uint64_t peak = 0, host_peak = 0;
  OpCost copies;  // summed over the steps' phases
};

std::vector<float> host_copy(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  be.download(v.data(), t);
  return v;
}

Record train(const std::string& text, const std::vector<std::string>& sets, int steps = 3,
             uint64_t host_budget = UINT64_MAX) {
  const Config cfg = parse_config(text, "offload-test", sets);
  cpu::CpuBackend be(1ull << 30, 2, host_budget);
  RunParts parts = test::synthetic_run_parts(cfg, be);
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *parts.model), be, *parts.model, *parts.data);
  Record r;
  for (int s = 0; s < steps; ++s) r.losses.push_back(trainer.step().loss);
  for (Param& p : parts.model->params()) {
    r.params.push_back(host_copy(be, p.value));
    r.grads.push_back(host_copy(be, p.grad));
    r.moments.push_back(host_copy(be, p.m));
    r.moments.push_back(host_copy(be, p.v));
  }
  r.peak = be.pool().peak_bytes();
  r.host_peak = be.host_pool().peak_bytes();
  for (int i = 0; i < kNumPhases; ++i) {
    r.copies.to_host_bytes += be.cost(static_cast<Phase>(i)).to_host_bytes;
    r.copies.to_device_bytes += be.cost(static_cast<Phase>(i)).to_device_bytes;
  }
  return r;
}

void check_same_bits(const Record& a, const Record& b) {
  REQUIRE(a.losses.size() == b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i)
    CHECK(std::memcmp(&a.losses[i], &b.losses[i], sizeof(double)) == 0);
  CHECK(test::bitwise_equal(a.grads, b.grads));
  CHECK(test::bitwise_equal(a.params, b.params));
  CHECK(test::bitwise_equal(a.moments, b.moments));
}

// `fit --gpu h200 --json` of a shipped config: each --policies entry's longest context.
std::map<std::string, int64_t> h200_longest(const std::string& config,
                                            const std::string& policies) {
  const test::CliResult r = test::run_binary(
      fmt::format("fit --config configs/{}.toml --gpu h200 --json --policies {}", config, policies),
      false);
  REQUIRE(r.code == 0);
  std::map<std::string, int64_t> longest;
  const auto j = nlohmann::json::parse(r.out);
  for (const auto& p : j["policies"]) longest[p["policy"]] = p["longest_seq_len"];
  return longest;
}

std::vector<std::string> with(std::vector<std::string> sets, const std::string& more) {
  sets.push_back(more);
  return sets;
}

}  // namespace

TEST_CASE("offloading gives bitwise the losses, gradients, weights and moments of keeping",
          "[offload]") {
  const std::vector<std::vector<std::string>> settings = {
      {"remat.policy=full"},
      {"remat.policy=full", "remat.every=2"},
      {"remat.policy=save_attn", "remat.blocks=[0,2]"},
      {"remat.plan=[\"full\",\"save_attn\",\"none\",\"save_dots\"]"},
      {"remat.policy=full", "remat.tile_tokens=7"},
      {"remat.policy=save_dots", "model.dropout=0.1"},
  };
  for (const auto& s : settings) {
    const Record kept = train(kBase, s);
    for (const char* offload :
         {"checkpoints", "checkpoints+optimizer", "checkpoints+optimizer+weights"}) {
      INFO(fmt::format("{} with remat.offload = {}", fmt::join(s, " "), offload));
      const Record moved = train(kBase, with(s, fmt::format("remat.offload=\"{}\"", offload)));
      check_same_bits(moved, kept);
      CHECK(moved.host_peak > 0);
      CHECK(moved.peak <= kept.peak);
    }
  }
  // The MLP model's blocks go through the same executor.
  const std::vector<std::string> mlp = {"model.kind=\"mlp\"",       "model.n_layer=5",
                                        "model.n_embd=24",          "train.batch_size=6",
                                        "data.task=\"regression\"", "remat.policy=full"};
  const Record kept = train("", mlp);
  for (const char* offload : {"checkpoints+optimizer", "checkpoints+optimizer+weights"}) {
    INFO(offload);
    check_same_bits(train("", with(mlp, fmt::format("remat.offload=\"{}\"", offload))), kept);
  }
}

TEST_CASE("the device holds at most two checkpoints and the host every offloaded one",
          "[offload]") {
  // Full remat, every = 1, L = 4: blocks 0..2 are offloaded (the last segment's stays, its
  // backward comes first). Each checkpoint is B x T x C f32.
  const test::SmallGpt g = test::remat_test_gpt();
  const uint64_t ckpt =
      MemoryPool::accounted_bytes(static_cast<size_t>(g.batch_size * g.seq_len * g.n_embd) * 4);
  const Record r = train(kBase, {"remat.policy=full", "remat.offload=\"checkpoints\""}, 2);
  CHECK(r.host_peak == 3 * ckpt);
  // Out after each forward, back before each backward: 3 checkpoints each way per step.
  CHECK(r.copies.to_host_bytes ==
        2.0 * 3 * static_cast<double>(g.batch_size * g.seq_len * g.n_embd * 4));
  CHECK(r.copies.to_device_bytes == r.copies.to_host_bytes);
  const Config cfg =
      parse_config(kBase, "t", {"remat.policy=full", "remat.offload=\"checkpoints\""});
  const DryRun plan = test::cpu_test_planner(2, 1ull << 32).dry_run(cfg);
  CHECK(plan.peak.by_category[static_cast<size_t>(MemCategory::Checkpoints)] <= 2 * ckpt);
  CHECK(plan.to_host_bytes() == r.copies.to_host_bytes / 2);  // one step
  CHECK(plan.to_device_bytes() == r.copies.to_device_bytes / 2);
  // Keeping them: all 4 on the device during the last block's backward.
  const DryRun kept = test::cpu_test_planner(2, 1ull << 32)
                          .dry_run(parse_config(kBase, "t", {"remat.policy=full"}));
  CHECK(kept.peak.by_category[static_cast<size_t>(MemCategory::Checkpoints)] == 4 * ckpt);
  CHECK(kept.host_peak.total_bytes == 0);
}

TEST_CASE("predicted device and host peaks equal the measured ones to the byte", "[offload]") {
  const std::vector<std::string> shape = {
      "model.n_layer=4",    "model.n_embd=48", "model.n_head=4",     "train.seq_len=61",
      "train.batch_size=2", "model.n_ctx=256", "model.vocab_size=50"};
  for (const char* offload :
       {"checkpoints", "checkpoints+optimizer", "checkpoints+optimizer+weights"})
    for (const char* tile : {"remat.tile_tokens=0", "remat.tile_tokens=17"})
      for (const std::vector<std::string>& policy : std::vector<std::vector<std::string>>{
               {"remat.policy=full"},
               {"remat.policy=full", "remat.every=3"},
               {"remat.policy=save_attn"},
               {"remat.plan=[\"full\",\"none\",\"full\",\"save_dots\"]"}}) {
        std::vector<std::string> sets = shape;
        sets.insert(sets.end(), policy.begin(), policy.end());
        sets.push_back(tile);
        sets.push_back(fmt::format("remat.offload=\"{}\"", offload));
        INFO(fmt::format("{}", fmt::join(sets, " ")));
        const Config cfg = parse_config("", "offload-test", sets);
        const DryRun plan = test::cpu_test_planner(2, 1ull << 32).dry_run(cfg);
        const Record r = train("", sets, 2);
        CHECK(plan.peak.total_bytes == r.peak);
        CHECK(plan.host_peak.total_bytes == r.host_peak);
        CHECK(plan.host_peak.total_bytes > 0);
      }
}

TEST_CASE("a host pool too small for the offloaded tensors is out of memory naming its key",
          "[offload]") {
  try {
    train(kBase, {"remat.policy=full", "remat.offload=\"checkpoints\""}, 1, 4096);
    FAIL("a 4 KiB host pool held three checkpoints");
  } catch (const OutOfMemory& e) {
    CHECK_THAT(e.what(), Catch::Contains("out of memory on the host") &&
                             Catch::Contains("device.host_memory") &&
                             Catch::Contains("blocks.0.x"));
  }
}

TEST_CASE("offload is a config key that refuses nonsense", "[offload][config]") {
  CHECK_THROWS_WITH(parse_config(kBase, "t", {"remat.offload=\"everything\""}),
                    Catch::Contains("remat.offload") && Catch::Contains("checkpoints+optimizer"));
  CHECK_THROWS_WITH(parse_config(kBase, "t", {"remat.offload=\"checkpoints\""}),
                    Catch::Contains("keeps none") && Catch::Contains("Fix"));
  const Config c = parse_config(kBase, "t",
                                {"remat.policy=full", "remat.offload=\"checkpoints+optimizer\"",
                                 "device.host_memory=\"2GiB\""});
  CHECK(c.remat.offloads_optimizer());
  CHECK(c.device.host_memory_bytes == (2ull << 30));
  // state.json keeps the resolved config; reading it back gives the same settings.
  const Config back = parse_config(config_to_toml(c), "back");
  CHECK(back.remat.offload == OffloadKind::CheckpointsOptimizer);
  CHECK(back.device.host_memory_bytes == (2ull << 30));
}

TEST_CASE("auto offloads on a GPU target when nothing else fits, and never on the CPU",
          "[offload][auto]") {
  const Config cfg =
      parse_config("", "auto-offload",
                   {"model.n_layer=8", "model.n_embd=64", "model.n_head=4",
                    "model.position=\"rope\"", "model.vocab_size=256", "train.seq_len=8192",
                    "train.batch_size=1", "remat.policy=\"auto\"", "data.task=\"random\""});
  // The smallest device peak without offload, tiled in the smallest chunks auto tries: one byte
  // less than it.
  Config tiled_full = with_block_plan(cfg, std::vector<std::string>(8, "full"));
  tiled_full.remat.tile_tokens = auto_tile_tokens(8192).back();
  const auto gpu_planner = [&](uint64_t budget) {
    return Planner(plan_target(cfg, "h200", budget), test::synthetic_run_parts);
  };
  const uint64_t smallest = gpu_planner(1ull << 40).dry_run(tiled_full, false).peak.total_bytes;
  const Planner tight = gpu_planner(smallest - 1);
  const AutoPlan chosen = choose_auto(tight, cfg);
  INFO(chosen.summary());
  CHECK(chosen.fits);
  CHECK(chosen.offload != OffloadKind::None);
  CHECK(chosen.host_peak_bytes > 0);
  CHECK(chosen.peak_bytes <= smallest - 1);
  // The CPU target with the same budget: offload would buy nothing there (same RAM).
  const Planner cpu = test::cpu_test_planner(2, smallest - 1);
  const AutoPlan on_cpu = choose_auto(cpu, cfg);
  CHECK(on_cpu.offload == OffloadKind::None);
}

TEST_CASE("copy time and compute time at the preset's link and peak rates", "[offload]") {
  const Config cfg =
      parse_config("", "copy-time",
                   {"model.n_layer=12", "model.n_embd=768", "model.n_head=12",
                    "model.position=\"rope\"", "model.vocab_size=50304", "train.seq_len=65536",
                    "train.batch_size=1", "remat.policy=full", "remat.offload=\"checkpoints\""});
  const PlanTarget h200 = plan_target(cfg, "h200", std::nullopt);
  CHECK(h200.host_bytes == (128ull << 30));
  const DryRun run = Planner(h200, test::synthetic_run_parts).dry_run(cfg, false);
  const CopyTime t = copy_time(run, h200);
  REQUIRE(t.modelled);
  // 11 checkpoints of T x C bf16, each way, at 50 GB/s.
  const double bytes = 11.0 * 65536 * 768 * 2;
  CHECK(run.to_host_bytes() == bytes);
  CHECK(t.copy_s == Approx(2 * bytes / 50e9));
  CHECK(t.compute_s == Approx(run.flops() / 989.4e12));
  CHECK(t.copy_s < t.compute_s);
}

TEST_CASE(
    "train refuses a host budget its offload does not fit, before step 1, and reports both "
    "peaks when it does fit",
    "[offload][smoke]") {
  const test::CliResult refused = test::run_binary(
      "train --config configs/tiny.toml --set remat.policy=full --set model.n_layer=4 "
      "--set remat.offload=checkpoints --set device.host_memory=64KiB --set train.steps=1",
      true);
  CHECK(refused.code == 3);
  CHECK_THAT(refused.out, Catch::Contains("out of host memory before step 1") &&
                              Catch::Contains("device.host_memory") && Catch::Contains("Fix:"));
  CHECK_THAT(refused.out, !Catch::Contains("step 1/"));
  const test::CliResult ran = test::run_binary(
      "train --config configs/tiny.toml --set remat.policy=full --set model.n_layer=4 "
      "--set remat.offload=checkpoints+optimizer --set train.steps=2",
      true);
  CHECK(ran.code == 0);
  CHECK_THAT(ran.out,
             Catch::Contains("checkpoints and AdamW moments in host memory") &&
                 Catch::Contains("equal to the measured peak") &&
                 Catch::Contains("in host memory (remat.offload), equal to the predicted"));
}

TEST_CASE("entries of --policies set tiling and offload beside the policy", "[offload][config]") {
  const PolicyVariant v =
      parse_policy_variant("save_attn:tile=512:offload=checkpoints+optimizer", "fit");
  CHECK(v.policy == "save_attn");
  CHECK(v.tile_tokens == 512);
  CHECK(v.offload == OffloadKind::CheckpointsOptimizer);
  CHECK_FALSE(parse_policy_variant("full", "fit").tile_tokens.has_value());
  for (const char* bad : {"full:tile=x", "full:offload=all", "full:tile=4:tile=8", "full:fast"})
    CHECK_THROWS_WITH(parse_policies({bad}, {}, "sweep"),
                      Catch::Contains("--policies") && Catch::Contains("Fix: write POLICY"));
  CHECK_THROWS_WITH(parse_policies({"fastest:tile=8"}, {}, "sweep"),
                    Catch::Contains("unknown policy \"fastest\""));
  // The planner's config and the child's overrides mean the same run.
  const Config base = parse_config(kBase, "t", {});
  const Config planned = with_policy(base, "full:tile=7:offload=checkpoints");
  const Config child =
      parse_config(kBase, "t", policy_overrides(base, "full:tile=7:offload=checkpoints"));
  for (const Config* c : {&planned, &child}) {
    CHECK(c->remat.policy == "full");
    CHECK(c->remat.tile_tokens == 7);
    CHECK(c->remat.offload == OffloadKind::Checkpoints);
  }
}

TEST_CASE("fit lists each policy variant with its longest context", "[offload][smoke]") {
  const auto longest =
      h200_longest("gpt2-124m", "full,full:tile=8192,full:tile=8192:offload=checkpoints");
  // Each addition buys context: tiling the attention-free half, then the checkpoints off the card.
  CHECK(longest.at("full") < longest.at("full:tile=8192"));
  CHECK(longest.at("full:tile=8192") < longest.at("full:tile=8192:offload=checkpoints"));
  CHECK(longest.at("full:tile=8192:offload=checkpoints") >= 6500000);  // issue 14's H200 target
}

TEST_CASE("GPT-2 1.5B on an H200 with 128 GiB of host reaches issue 14's target with offload",
          "[offload][smoke]") {
  const auto longest = h200_longest("gpt2-1.5b", "full,full:tile=8192:offload=checkpoints");
  const int64_t kept = longest.at("full"),
                offloaded = longest.at("full:tile=8192:offload=checkpoints");
  CHECK(offloaded >= 850000);
  CHECK(static_cast<double>(offloaded) >= 1.6 * static_cast<double>(kept));
}

TEST_CASE("the longest context and largest batch respect the host pool's budget", "[offload]") {
  const Config cfg =
      parse_config(kBase, "t", {"remat.policy=full", "remat.offload=\"checkpoints\""});
  // A host budget of 20 checkpoints at seq_len 45: far below what the device budget allows.
  const uint64_t host_budget = 20 * 2 * 45 * 32 * 4;
  PlanTarget t = plan_target(cfg, "", uint64_t{1} << 32);
  t.host_bytes = host_budget;
  const Planner planner(t, test::synthetic_run_parts);
  const auto run_at = [&](int64_t T) {
    Config c = cfg;
    c.train.seq_len = T;
    c.model.n_ctx = std::max<int64_t>(c.model.n_ctx, T + 1);
    return planner.dry_run(c, false);
  };
  Config roomy = cfg;
  roomy.model.n_ctx = 4096;
  const int64_t longest = planner.longest_seq_len(roomy);
  INFO("longest " << longest);
  REQUIRE(longest > 0);
  CHECK(run_at(longest).host_peak.total_bytes <= host_budget);
  CHECK(run_at(longest + 1).host_peak.total_bytes > host_budget);
  CHECK(run_at(longest + 1).peak.total_bytes < t.pool_budget());  // the host is what binds
  const int64_t batch = planner.largest_batch(cfg);
  Config b = cfg;
  b.train.batch_size = batch + 1;
  CHECK(planner.dry_run(b, false).host_peak.total_bytes > host_budget);
}

TEST_CASE("plan's auto row runs the offload auto chose", "[offload][smoke]") {
  // At 6M tokens GPT-2 124M fits an H200 only with its checkpoints on the host: the auto row must
  // be that plan (fits, with a host peak), not the same blocks with everything on the card.
  const test::CliResult r = test::run_binary(
      "plan --config configs/gpt2-124m.toml --gpu h200 --seq-len 6000000 --json", false);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["auto"]["fits"].get<bool>());
  CHECK(j["auto"]["offload"] == "checkpoints");
  int auto_rows = 0;
  for (const auto& p : j["policies"])
    if (p["policy"] == "auto") {
      ++auto_rows;
      CHECK(p["fits"].get<bool>());
      CHECK(p["peak_bytes"] == j["auto"]["peak_bytes"]);
      CHECK(p["host_peak_bytes"] == j["auto"]["host_peak_bytes"]);
    }
  CHECK(auto_rows == 1);
}
