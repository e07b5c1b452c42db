// Per-op timing (Backend::set_op_timing, what `remat-train bench` reports): every op of a step is
// recorded under its name and phase, and the FLOPs recorded per op add up to the backend's
// per-phase counts, so the breakdown accounts for the whole step; and the command itself prints
// the floor, the step and every op family of a GPT; and the CPU steal it prints beside them.
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/synthetic.h"
#include "engine/config/config.h"
#include "engine/core/machine.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/remat/executor.h"
#include "engine/training/trainer.h"
#include "layers/models.h"
#include "tests/cli_util.h"
#include "tests/configs.h"

using namespace remat;

TEST_CASE("op timing records every op by phase and its FLOPs add up to the step's", "[bench]") {
  Config cfg = load_config(std::string(REMAT_SOURCE_DIR) + "/configs/tiny.toml",
                           {"train.steps=2", "remat.policy=full"});
  cpu::CpuBackend be(1ull << 30, 2);
  auto model = make_model(cfg, be);
  auto data = make_synthetic_data(cfg);
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data);
  trainer.step();
  CHECK(be.op_times().empty());  // off by default
  be.set_op_timing(true);
  be.reset_cost();
  trainer.step();

  std::array<double, kNumPhases> flops_by_phase{};
  for (const auto& [key, t] : be.op_times()) {
    CHECK(t.calls > 0);
    CHECK(t.seconds >= 0);
    flops_by_phase[static_cast<size_t>(key.second)] += t.flops;
  }
  for (int p = 0; p < kNumPhases; ++p) {
    INFO(phase_name(static_cast<Phase>(p)));
    CHECK(flops_by_phase[static_cast<size_t>(p)] ==
          Approx(be.cost(static_cast<Phase>(p)).flops).epsilon(1e-12));
  }
  const auto& ops = be.op_times();
  const int64_t L = cfg.model.n_layer;
  // Per block: qkv, proj, fc, mlp.proj GEMMs in the forward and their backward once each; full
  // remat re-runs some of them (the executor skips what the backward does not need).
  CHECK(ops.at({"linear_forward", Phase::Forward}).calls == 4 * L);
  CHECK(ops.at({"linear_forward", Phase::Recompute}).calls > 0);
  CHECK(ops.at({"linear_forward", Phase::Recompute}).calls <= 4 * L);
  CHECK(ops.at({"linear_backward", Phase::Backward}).calls == 4 * L);
  CHECK(ops.at({"attention_backward", Phase::Backward}).calls == L);
  // The GELU runs in the fc GEMM's epilogue and its backward in mlp.proj's: no activation op
  // of its own in any phase (under full, the recompute makes fc and gelu together too).
  for (int p = 0; p < kNumPhases; ++p) {
    CHECK(!ops.contains({"activation_forward", static_cast<Phase>(p)}));
    CHECK(!ops.contains({"activation_backward", static_cast<Phase>(p)}));
  }
  CHECK(ops.at({"adamw_update", Phase::Optimizer}).calls ==
        static_cast<int64_t>(model->params().size()));
  be.reset_op_times();
  CHECK(be.op_times().empty());
}

TEST_CASE("bench prints the SGEMM floor, the step and every op family", "[smoke]") {
  const test::CliResult r = test::run_binary("bench --config configs/tiny.toml --steps 2", false);
  INFO(r.out);
  REQUIRE(r.code == 0);
  for (const char* line :
       {"floor: SGEMM 2048^3", "(median of 2, after 1 warm-up)", "% of SGEMM",
        "linear (GEMM, fused bias + activation, LoRA)", "attention", "layernorm",
        "loss (LM head / MSE)", "optimizer (AdamW, norm)",
        "data (batch: read or generated, uploaded)", "no op (allocation, copies, sync, host)",
        "of all the above: recompute phase"})
    CHECK_THAT(r.out, Catch::Matchers::Contains(line));
}

// --json is what scripts/bench_targets.py reads: one document on stdout (nothing else there),
// and its numbers the text report's: the rows add up to the median step, and each share is the
// step's rate over the floor measured beside it.
TEST_CASE("bench --json prints one document whose rows add up to the median step", "[smoke]") {
  const test::CliResult r =
      test::run_binary("bench --config configs/tiny.toml --steps 3 --json", false);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);  // throws (fails) on anything but one document
  CHECK(j.at("config") == "configs/tiny.toml");
  CHECK(j.at("policy") == "full");
  CHECK(j.at("seq_len") == 64);
  CHECK(j.at("throughput_unit") == "tokens/s");
  const auto& steps = j.at("steps");
  REQUIRE(steps.size() == 3);
  std::vector<double> ms, shares;
  for (const auto& s : steps) {
    ms.push_back(s.at("ms").get<double>());
    const double rate = s.at("gflop").get<double>() / (ms.back() / 1e3);
    CHECK(s.at("share_of_sgemm").get<double>() ==
          Approx(rate / s.at("sgemm_gflops").get<double>()).epsilon(1e-9));
    shares.push_back(s.at("share_of_sgemm").get<double>());
    // MFU: the model's FLOPs, fewer than the executed under full remat, in the same step time.
    CHECK(s.at("model_gflop") == j.at("model_gflop"));
    CHECK(s.at("model_gflop").get<double>() < s.at("gflop").get<double>());
    CHECK(s.at("model_share_of_sgemm").get<double>() ==
          Approx(s.at("model_gflop").get<double>() / (ms.back() / 1e3) /
                 s.at("sgemm_gflops").get<double>())
              .epsilon(1e-9));
  }
  std::sort(ms.begin(), ms.end());
  std::sort(shares.begin(), shares.end());
  const double step_ms = j.at("step_ms").get<double>();
  CHECK(step_ms == ms[1]);
  CHECK(j.at("share_of_sgemm").get<double>() == shares[1]);
  CHECK(j.at("throughput").get<double>() == Approx(16 * 64 / (step_ms / 1e3)).epsilon(1e-9));
  CHECK(j.at("achieved_gflops").get<double>() ==
        Approx(j.at("gflop").get<double>() / (step_ms / 1e3)).epsilon(1e-9));
  const auto& floor = j.at("sgemm_gflops");
  CHECK(floor.at("lowest").get<double>() <= floor.at("median").get<double>());
  CHECK(floor.at("median").get<double>() <= floor.at("highest").get<double>());
  double rows_ms = 0, no_op_ms = -1;
  std::vector<std::string> keys;
  for (const auto& row : j.at("op_families")) {
    keys.push_back(row.at("key"));
    rows_ms += row.at("ms").get<double>();
    CHECK(row.at("share_of_step").get<double>() ==
          Approx(row.at("ms").get<double>() / step_ms).epsilon(1e-9));
    if (row.at("key") == "no_op") no_op_ms = row.at("ms").get<double>();
  }
  CHECK(keys == std::vector<std::string>{"linear", "attention", "layernorm", "loss", "optimizer",
                                         "other", "data", "no_op"});
  // "no op" is what the ops and the batch leave of the step (never below 0).
  if (no_op_ms > 0) CHECK(rows_ms == Approx(step_ms).epsilon(1e-9));
  CHECK(j.at("recompute").at("calls").get<int64_t>() > 0);
  CHECK(j.at("data_gflop") == 0);  // token batches cost no FLOPs: the two shares are one
  CHECK(j.at("share_of_sgemm_with_data") == j.at("share_of_sgemm"));
  CHECK(j.at("warnings").is_array());
  // The CPU's ops are synchronous: no untimed steps before the timed ones (an asynchronous
  // backend, CUDA, runs as many with op timing off and reports their median here).
  CHECK(j.at("untimed_step_ms").is_null());
  CHECK(j.at("untimed_steps_ms").empty());
}

// The regression task's batch (normals and its teacher's GEMM) is not an op: the step reports its
// time apart, or bench would file it under "no op" (as it did, 8% of the tutorial MLP's step), and
// the teacher's FLOPs (2 B D^2), which bench shows apart from the training's. Token batches cost
// none.
TEST_CASE("bench counts every micro-batch of a step in its throughput", "[smoke]") {
  const test::CliResult r = test::run_binary(
      "bench --config configs/tiny.toml --steps 2 --json --set train.grad_accum=3", false);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j.at("grad_accum") == 3);
  CHECK(j.at("throughput").get<double>() ==
        Approx(3 * 16 * 64 / (j.at("step_ms").get<double>() / 1e3)).epsilon(1e-9));
}

TEST_CASE("a step reports the time its batch took, within the step's, and its FLOPs", "[bench]") {
  const Config cfg = parse_config(test::small_mlp_toml(2, 256, 2048), "mlp");
  cpu::CpuBackend be(1ull << 30, 2);
  auto model = make_model(cfg, be);
  auto data = make_synthetic_data(cfg);
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data);
  for (int s = 0; s < 2; ++s) {
    const StepMetrics m = trainer.step();
    CHECK(m.data_ms > 0);
    CHECK(m.data_ms < m.step_ms);
    CHECK(m.data_flops == 2.0 * 2048 * 256 * 256);
  }
  Config tokens = load_config(std::string(REMAT_SOURCE_DIR) + "/configs/tiny.toml", {});
  auto gpt = make_model(tokens, be);
  auto token_data = make_synthetic_data(tokens);
  Trainer gpt_trainer(tokens.train, resolve_remat_plan(tokens, *gpt), be, *gpt, *token_data);
  CHECK(gpt_trainer.step().data_flops == 0);
}

// bench's MFU counts the model's FLOPs (engine/core/backend.h): one number for every remat policy,
// 6 N D^2 for an MLP's GEMMs (with its ReLUs and loss beside them), whatever the step executes.
TEST_CASE("model FLOPs are the same under every policy, and the MLP's count is 3x its forward",
          "[bench]") {
  cpu::CpuBackend be(1ull << 30, 2);
  auto step_counts = [&be](const Config& cfg) {
    auto model = make_model(cfg, be);
    auto data = make_synthetic_data(cfg);
    Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data);
    be.reset_cost();
    trainer.step();
    double executed = 0;  // the training's: the optimizer's FLOPs are in neither count
    for (Phase p : {Phase::Forward, Phase::Recompute, Phase::Backward, Phase::Loss})
      executed += be.cost(p).flops;
    return std::pair{model_flops(be), executed};
  };
  const int64_t L = 3, D = 128, N = 256;
  const auto [mlp_none, mlp_none_executed] =
      step_counts(parse_config(test::small_mlp_toml(L, D, N), "mlp"));
  // Block 0 skips its input gradient: one GEMM of 2 N D^2 fewer executed than the model needs.
  CHECK(mlp_none == Approx(6.0 * L * N * D * D).epsilon(2.0 / D));
  CHECK(mlp_none - mlp_none_executed == Approx(2.0 * N * D * D).epsilon(2.0 / D));
  const auto [mlp_full, mlp_full_executed] =
      step_counts(parse_config(test::small_mlp_toml(L, D, N, "full"), "mlp"));
  CHECK(mlp_full == mlp_none);
  CHECK(mlp_full_executed > mlp_none_executed);  // the recompute
  const std::string tiny = std::string(REMAT_SOURCE_DIR) + "/configs/tiny.toml";
  const double gpt_none = step_counts(load_config(tiny, {"remat.policy=none"})).first;
  for (const char* policy : {"full", "save_dots", "save_attn"}) {
    INFO(policy);
    const auto [m, executed] =
        step_counts(load_config(tiny, {fmt::format("remat.policy={}", policy)}));
    CHECK(m == gpt_none);
    CHECK(executed > m);
  }
}

TEST_CASE("CPU steal is read from /proc/stat's cpu line as a share of the time between readings",
          "[bench]") {
  // user nice system idle iowait irq softirq steal guest guest_nice: guest is inside user.
  const CpuTicks before = parse_proc_stat("cpu  100 5 50 800 10 2 3 30 40 0\ncpu0 1 2 3\n");
  REQUIRE(before.ok);
  CHECK(before.total == 1000);
  CHECK(before.steal == 30);
  const CpuTicks after = parse_proc_stat("cpu  400 5 150 1100 10 2 3 330 40 0");
  REQUIRE(after.ok);
  CHECK(steal_share(before, after) == Approx(300.0 / 1000.0));
  CHECK(steal_share(before, before) < 0);  // no time passed
  // Not the aggregate line, a short line, no text: unknown, never a number.
  for (const char* bad : {"cpu0 100 5 50 800 10 2 3 30", "cpu  100 5 50", "", "intr 1 2 3"}) {
    INFO(bad);
    CHECK_FALSE(parse_proc_stat(bad).ok);
    CHECK(steal_share(parse_proc_stat(bad), after) < 0);
  }
  // This machine's own counters, where it has /proc/stat: a share in [0, 1].
  const CpuTicks now = read_cpu_ticks();
  if (now.ok) {
    volatile double spin = 0;
    for (int i = 0; i < 20000000; ++i) spin = spin + 1e-9 * i;
    const double share = steal_share(now, read_cpu_ticks());
    INFO("share " << share);
    CHECK(share <= 1.0);
  }
}

TEST_CASE("bench warns when its SGEMM floor moves by more than a quarter during the run",
          "[bench]") {
  CHECK(unsteady_floor_warning(150e9, 150e9).empty());
  CHECK(unsteady_floor_warning(150e9, 150e9 * kUnsteadyFloor).empty());  // the limit itself
  const std::string w = unsteady_floor_warning(84.5e9, 156.7e9);         // seen on the AMD VM
  CHECK_THAT(w, Catch::Matchers::StartsWith("warning: the SGEMM floor moved from 84.5 to 156.7 "
                                            "GFLOP/s") &&
                    Catch::Matchers::Contains("unreliable"));
  CHECK(w.find('\n') == std::string::npos);
  CHECK(unsteady_floor_warning(0, 1e9).empty());  // no reading: nothing to say
}
