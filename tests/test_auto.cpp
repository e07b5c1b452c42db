// remat.policy = "auto": on small models its plan is the one with the least recompute among ALL
// 4^L per-block plans (every ordering) that fit, found by brute force over dry runs; it never
// exceeds its budget; infeasible budgets exit 3 naming the smallest achievable peak; and
// `plan --emit-config` prints a [remat] table that parses back and trains bitwise like the
// hand-written plan.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>

#include "data/synthetic.h"
#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/planner/planner.h"
#include "engine/remat/executor.h"
#include "layers/models.h"
#include "tests/cli_util.h"
#include "tests/planner_util.h"

using namespace remat;
using Catch::Matchers::Contains;

namespace {

constexpr int kThreads = 2;  // the planner's CPU target and the test configs' device.threads

using remat::test::synthetic_run_parts;
Planner cpu_planner(uint64_t budget) {
  return remat::test::cpu_test_planner(kThreads, budget);
}

// A tiny GPT: rope, so seq_len is free of n_ctx; small enough that 4^4 dry runs take no time.
std::string tiny_gpt(int n_layer) {
  return fmt::format(
      "[model]\nkind = \"gpt\"\nn_layer = {}\nn_head = 2\nn_embd = 32\nvocab_size = 64\nposition = "
      "\"rope\"\n"
      "[train]\nseq_len = 64\nbatch_size = 2\nsteps = 2\nloss_chunk = 32\n"
      "[data]\ntask = \"copy\"\n[device]\nbackend = \"cpu\"\nthreads = {}\n",
      n_layer, kThreads);
}

struct PlanCost {
  uint64_t peak = 0;
  double recompute = 0;
};

// Every per-block plan over {none, save_dots, save_attn, full}, in every order.
std::map<std::vector<std::string>, PlanCost> brute_force(const Config& cfg) {
  static const char* kChoices[] = {"none", "save_dots", "save_attn", "full"};
  const Planner planner = cpu_planner(UINT64_MAX);
  const auto L = static_cast<size_t>(cfg.model.n_layer);
  size_t n = 1;
  for (size_t i = 0; i < L; ++i) n *= 4;
  std::map<std::vector<std::string>, PlanCost> out;
  for (size_t code = 0; code < n; ++code) {
    std::vector<std::string> plan;
    for (size_t i = 0, c = code; i < L; ++i, c /= 4) plan.emplace_back(kChoices[c % 4]);
    const DryRun r = planner.dry_run(with_block_plan(cfg, plan), false);
    out[plan] = {r.peak.total_bytes, r.cost[static_cast<size_t>(Phase::Recompute)].flops};
  }
  return out;
}

std::vector<double> train_losses(const Config& cfg, int steps) {
  cpu::CpuBackend be(1ull << 32, kThreads);
  RunParts p = synthetic_run_parts(cfg, be);
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *p.model), be, *p.model, *p.data);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) losses.push_back(trainer.step().loss);
  return losses;
}

using Result = remat::test::CliResult;

Result run(const std::string& args, bool with_stderr = true) {
  return remat::test::run_binary(args, with_stderr);
}

std::string write_tmp(const std::string& name, const std::string& text) {
  const std::string path = fmt::format("/tmp/remat-test-{}-{}", getpid(), name);
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("auto chooses the least recompute of all per-block plans that fit (brute force)",
          "[planner]") {
  // The MLP has no attention, so save_attn and full tie: the tie-break must still be optimal.
  const std::string mlp = fmt::format(
      "[model]\nkind = \"mlp\"\nn_layer = 4\nn_embd = 24\n[train]\nbatch_size = 8\n"
      "[device]\nthreads = {}\n",
      kThreads);
  for (const std::string& text : {tiny_gpt(3), tiny_gpt(4), tiny_gpt(5), mlp}) {
    const Config cfg = parse_config(text, "auto-test", {"remat.policy=auto"});
    const auto all = brute_force(cfg);
    uint64_t min_peak = UINT64_MAX, max_peak = 0;
    std::set<uint64_t> peaks;
    for (const auto& [plan, c] : all) {
      min_peak = std::min(min_peak, c.peak);
      max_peak = std::max(max_peak, c.peak);
      peaks.insert(c.peak);
    }
    // The budgets where the answer changes are exactly the plans' peaks: try each and one byte
    // below it, plus the ends.
    std::vector<uint64_t> budgets;
    for (uint64_t p : peaks) {
      budgets.push_back(p);
      budgets.push_back(p - 1);
    }
    budgets.push_back(max_peak);
    budgets.push_back(max_peak + 12345);
    for (uint64_t budget : budgets) {
      INFO(fmt::format("{} n_layer {}, budget {} B (all-full peak {} B, all-none peak {} B)",
                       cfg.model.kind, cfg.model.n_layer, budget, min_peak, max_peak));
      const AutoPlan a = choose_auto_plan(cpu_planner(budget), cfg);
      CHECK(a.min_peak_bytes == min_peak);  // every block "full" is the smallest peak of any plan
      CHECK(a.budget_bytes == budget);
      REQUIRE(a.policies.size() == static_cast<size_t>(cfg.model.n_layer));
      const PlanCost& mine = all.at(a.policies);  // the predicted numbers are the plan's dry run
      CHECK(a.peak_bytes == mine.peak);
      CHECK(a.recompute_flops == mine.recompute);
      if (budget < min_peak) {
        CHECK_FALSE(a.fits);
        continue;
      }
      double best = std::numeric_limits<double>::infinity();
      for (const auto& [plan, c] : all)
        if (c.peak <= budget) best = std::min(best, c.recompute);
      INFO(fmt::format("auto chose [{}]", fmt::join(a.policies, ", ")));
      REQUIRE(a.fits);
      CHECK(a.peak_bytes <= budget);
      CHECK(a.recompute_flops == best);
    }
  }
}

TEST_CASE(
    "auto on a deep model (two-policy mixtures) stays within its budget and beats every uniform "
    "policy",
    "[planner]") {
  const Config cfg = parse_config(
      "[model]\nn_layer = 24\nn_head = 2\nn_embd = 16\nvocab_size = 32\nposition = \"rope\"\n"
      "[train]\nseq_len = 32\nbatch_size = 1\n[device]\nthreads = 2\n",
      "auto-deep", {"remat.policy=auto"});
  const Planner unlimited = cpu_planner(UINT64_MAX);
  std::map<std::string, DryRun> uniform;
  for (const char* p : {"none", "save_dots", "save_attn", "full"})
    uniform[p] = unlimited.dry_run(with_block_plan(cfg, std::vector<std::string>(24, p)), false);
  const uint64_t lo = uniform["full"].peak.total_bytes, hi = uniform["none"].peak.total_bytes;
  for (int i = 0; i <= 8; ++i) {
    const uint64_t budget = lo + (hi - lo) * static_cast<uint64_t>(i) / 8;
    INFO(fmt::format("budget {} B", budget));
    const AutoPlan a = choose_auto_plan(cpu_planner(budget), cfg);
    REQUIRE(a.fits);
    CHECK(a.peak_bytes <= budget);
    CHECK(a.n_dry_runs <= 4 + 6 * 6);  // uniform plans + six bisections over 0..24
    const DryRun check = unlimited.dry_run(with_block_plan(cfg, a.policies), false);
    CHECK(check.peak.total_bytes == a.peak_bytes);
    for (const auto& [p, r] : uniform)
      if (r.peak.total_bytes <= budget)
        CHECK(a.recompute_flops <= r.cost[static_cast<size_t>(Phase::Recompute)].flops);
  }
  CHECK_FALSE(choose_auto_plan(cpu_planner(lo - 1), cfg).fits);
}

TEST_CASE(
    "auto is a whole-model policy: every, blocks and plan beside it, or auto per block, are config "
    "errors",
    "[planner][config]") {
  const std::string base = tiny_gpt(3);
  CHECK(parse_config(base, "t", {"remat.policy=auto"}).remat.policy == "auto");
  CHECK(parse_config(base, "t", {"remat.policy=auto", "remat.plan=[]"}).remat.plan.empty());
  // The neutral values are what a file that spells out the defaults holds (configs/long.toml).
  CHECK(parse_config(base, "t", {"remat.policy=auto", "remat.every=1"}).remat.every == 1);
  CHECK(parse_config(base, "t", {"remat.policy=auto", "remat.blocks=[]"}).remat.blocks.empty());
  CHECK_THROWS_WITH(parse_config(base, "t", {"remat.policy=auto", "remat.every=2"}),
                    Contains("remat.every") && Contains("\"auto\"") && Contains("Fix:"));
  CHECK_THROWS_WITH(parse_config(base, "t", {"remat.policy=auto", "remat.blocks=[0]"}),
                    Contains("remat.blocks") && Contains("\"auto\""));
  CHECK_THROWS_WITH(
      parse_config(base, "t", {"remat.policy=auto", "remat.plan=[\"full\",\"none\",\"none\"]"}),
      Contains("remat.plan") && Contains("\"auto\""));
  CHECK_THROWS_WITH(parse_config(base, "t", {"remat.plan=[\"full\",\"auto\",\"none\"]"}),
                    Contains("remat.plan") && Contains("not a per-block policy"));
  // The executor never sees "auto": an unresolved one is a clear error, not a silent "full".
  const Config cfg = parse_config(base, "t", {"remat.policy=auto"});
  cpu::CpuBackend be(1ull << 30, kThreads);
  auto model = make_model(cfg, be);
  CHECK_THROWS_AS(resolve_remat_plan(cfg, *model), ConfigError);
}

TEST_CASE(
    "train with auto prints its plan, and an infeasible budget exits 3 naming the smallest peak",
    "[smoke]") {
  const std::string text = tiny_gpt(4);
  const std::string path = write_tmp("auto.toml", text);
  const Config cfg = parse_config(text, path, {"remat.policy=auto"});
  // The smallest achievable peak is every block "full" with the MLP tiled (auto tries that when
  // nothing fits untiled): 128 rows in chunks of 64.
  Config tiled = cfg;
  tiled.remat.tile_tokens = default_tile_tokens(2 * 64);
  REQUIRE(tiled.remat.tile_tokens == 64);
  const uint64_t min_peak = choose_auto_plan(cpu_planner(UINT64_MAX), tiled).min_peak_bytes;
  REQUIRE(min_peak < choose_auto_plan(cpu_planner(UINT64_MAX), cfg).min_peak_bytes);

  Result r = run(fmt::format("--config {} --set remat.policy=auto --set device.memory={}", path,
                             min_peak - 1));
  CHECK(r.code == 3);
  CHECK_THAT(r.out, Contains("[planner]") && Contains("\"auto\"") &&
                        Contains(fmt::format("smallest achievable peak is {} ({} B",
                                             format_bytes(min_peak), min_peak)) &&
                        Contains(fmt::format("budget of {}", format_bytes(min_peak - 1))) &&
                        Contains("the MLP in chunks of 64 tokens") && Contains("Fix:"));
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);  // one line

  const uint64_t budget = min_peak + 4096;
  const AutoPlan a = choose_auto(cpu_planner(budget), cfg);
  r = run(
      fmt::format("--config {} --set remat.policy=auto --set device.memory={} --set train.steps=2",
                  path, budget));
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("auto: chose " + a.mix()) && Contains(format_bytes(a.peak_bytes)) &&
                        Contains("summary:"));
  std::remove(path.c_str());
}

TEST_CASE(
    "plan --emit-config prints a [remat] table that parses back and trains like the hand-written "
    "plan",
    "[smoke]") {
  const std::string text = tiny_gpt(4);
  const std::string path = write_tmp("emit.toml", text);
  const Config cfg = parse_config(text, path, {"remat.policy=auto"});
  const Planner unlimited = cpu_planner(UINT64_MAX);
  const uint64_t lo =
      unlimited.dry_run(with_block_plan(cfg, std::vector<std::string>(4, "full")), false)
          .peak.total_bytes;
  const uint64_t hi =
      unlimited.dry_run(with_block_plan(cfg, std::vector<std::string>(4, "none")), false)
          .peak.total_bytes;
  const uint64_t budget = lo + (hi - lo) / 2;
  const AutoPlan a = choose_auto_plan(cpu_planner(budget), cfg);
  REQUIRE(a.fits);
  REQUIRE(std::set<std::string>(a.policies.begin(), a.policies.end()).size() >= 2);  // a real mix

  const Result r =
      run(fmt::format("plan --config {} --memory {} --emit-config", path, budget), false);
  REQUIRE(r.code == 0);
  CHECK(r.out.rfind("[remat]\n# ", 0) == 0);  // the table and nothing else
  CHECK_THAT(r.out, Contains(format_bytes(a.peak_bytes)) && Contains("recompute +"));
  const Config emitted = parse_config(text + "\n" + r.out, "emitted");
  CHECK(emitted.remat.plan == a.policies);
  CHECK(emitted.remat.policy == "none");

  const Config by_hand = parse_config(
      text, "by-hand", {fmt::format("remat.plan=[\"{}\"]", fmt::join(a.policies, "\",\""))});
  const std::vector<double> x = train_losses(emitted, 2), y = train_losses(by_hand, 2);
  REQUIRE(x.size() == 2);
  CHECK(std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0);

  // The plan table has an auto row; infeasible --emit-config exits 3.
  const Result table = run(fmt::format("plan --config {} --memory {}", path, budget));
  CHECK(table.code == 0);
  CHECK_THAT(table.out, Contains("\nauto ") && Contains("auto: chose " + a.mix()));

  // Below every untiled plan, the table tiles the MLP too, and parses back with that tiling.
  const Result tiled = run(fmt::format("plan --config {} --memory {} --emit-config", path, lo - 1));
  REQUIRE(tiled.code == 0);
  CHECK_THAT(tiled.out, Contains("\ntile_tokens = 64\n"));
  const Config emitted_tiled = parse_config(text + "\n" + tiled.out, "emitted");
  CHECK(emitted_tiled.remat.tile_tokens == 64);
  Config tiled_cfg = cfg;
  tiled_cfg.remat.tile_tokens = 64;
  const uint64_t tiled_lo =
      unlimited.dry_run(with_block_plan(tiled_cfg, std::vector<std::string>(4, "full")), false)
          .peak.total_bytes;
  CHECK(run(fmt::format("plan --config {} --memory {} --emit-config", path, tiled_lo - 1)).code ==
        3);
  std::remove(path.c_str());
}

TEST_CASE("auto's mix lists the blocks in plan order, block 0 first", "[planner]") {
  AutoPlan a;
  a.policies = {"full", "save_attn", "none", "none"};
  CHECK(a.mix() == "1 x full, 1 x save_attn, 2 x none");
}

TEST_CASE("when nothing fits untiled, auto tiles the MLP, and the run keeps to its prediction",
          "[planner]") {
  const Config cfg = parse_config(tiny_gpt(4), "t", {"remat.policy=auto"});
  const uint64_t untiled_min = choose_auto_plan(cpu_planner(UINT64_MAX), cfg).min_peak_bytes;
  // Just below what any untiled plan needs: only a tiled one fits.
  const Planner planner = cpu_planner(untiled_min - 1);
  CHECK_FALSE(choose_auto_plan(planner, cfg).fits);
  Config resolved = cfg;
  const std::optional<AutoPlan> a = resolve_auto(planner, resolved);
  REQUIRE(a);
  CHECK(a->fits);
  CHECK(a->tile_tokens == 64);
  CHECK(resolved.remat.tile_tokens == 64);
  CHECK(resolved.remat.plan == a->policies);
  CHECK_THAT(a->summary(), Contains("MLP in chunks of 64 tokens"));
  const DryRun predicted = planner.dry_run(resolved, false);
  CHECK(predicted.peak.total_bytes == a->peak_bytes);
  CHECK(predicted.peak.total_bytes < untiled_min);
  cpu::CpuBackend be(1ull << 32, kThreads);
  RunParts p = synthetic_run_parts(resolved, be);
  Trainer trainer(resolved.train, resolve_remat_plan(resolved, *p.model), be, *p.model, *p.data);
  trainer.step();
  trainer.step();
  CHECK(be.pool().peak_bytes() == predicted.peak.total_bytes);
  // With tiling configured already, auto keeps it and never tries another chunk.
  Config set = cfg;
  set.remat.tile_tokens = 100;
  CHECK(choose_auto(planner, set).tile_tokens == 100);
}

TEST_CASE("auto's MLP chunks: an eighth of the rows, then halved down to a 64th (at least 64)",
          "[planner]") {
  CHECK(auto_tile_tokens(5846) == std::vector<int64_t>{730, 365, 182, 91});
  CHECK(auto_tile_tokens(128) == std::vector<int64_t>{64});
  CHECK(auto_tile_tokens(8192) == std::vector<int64_t>{1024, 512, 256, 128});
  CHECK(auto_tile_tokens(1 << 20) == std::vector<int64_t>{4096});  // a 64th is past the largest
}

TEST_CASE("when the first MLP chunk does not fit, auto tries smaller ones before giving up",
          "[planner]") {
  // 4 blocks at 1024 token rows, chunks of 128 first, then 64; an MLP 16x wide, so that its
  // chunks set the peak.
  Config cfg =
      parse_config(tiny_gpt(4), "t", {"remat.policy=auto", "train.seq_len=512", "model.d_ff=512"});
  const std::vector<int64_t> tiles = auto_tile_tokens(2 * 512);
  REQUIRE(tiles == std::vector<int64_t>{128, 64});
  Config second = cfg;
  second.remat.tile_tokens = tiles[1];
  // The budget is what the second chunk needs at its best: the first must not fit in it.
  const uint64_t budget = choose_auto_plan(cpu_planner(UINT64_MAX), second).min_peak_bytes;
  Config first = cfg;
  first.remat.tile_tokens = tiles[0];
  REQUIRE_FALSE(choose_auto_plan(cpu_planner(budget), first).fits);
  const AutoPlan a = choose_auto(cpu_planner(budget), cfg);
  CHECK(a.fits);
  CHECK(a.tile_tokens == tiles[1]);
  CHECK(a.peak_bytes <= budget);
}

TEST_CASE("fit's tiling hint is a length auto then plans to fit", "[smoke]") {
  // fit plans the hint with the chunk of the untiled maximum, a smaller share of the rows at the
  // longer length than auto's first chunk there: auto must still find a plan at the hinted length.
  const std::string path = write_tmp("hint.toml", tiny_gpt(4));
  const std::string budget = "6MiB";
  Result r = run(fmt::format("fit --config {} --memory {} --json", path, budget), false);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["tiling_hint"].is_object());
  const int64_t hinted = j["tiling_hint"]["longest_seq_len"].get<int64_t>();
  r = run(fmt::format("plan --config {} --memory {} --seq-len {} --set remat.policy=auto --json",
                      path, budget, hinted),
          false);
  REQUIRE(r.code == 0);
  const auto plan = nlohmann::json::parse(r.out);
  INFO(r.out.substr(0, 2000));
  CHECK(plan["auto"]["fits"].get<bool>());
  std::remove(path.c_str());
}
