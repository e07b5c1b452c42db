// Long context: with flash attention (O(T) statistics) and the chunked LM-head loss (no T x V
// logits), peak memory under full remat grows linearly in T, even with a 50k vocabulary -- and
// so do both pools' peaks with the MLP tiled and the checkpoints in host memory.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <catch2/catch.hpp>

#include "data/synthetic.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/planner/planner.h"
#include "layers/models.h"
#include "tests/planner_util.h"

using namespace remat;

namespace {

// The modes under test: plain full remat, and full remat with the MLP tiled and the checkpoints
// (and AdamW moments) in host memory.
const std::vector<std::vector<std::string>> kModes = {
    {}, {"remat.tile_tokens=256", "remat.offload=\"checkpoints+optimizer\""}};

Config long_gpt(int64_t T, const std::vector<std::string>& mode = {}) {
  std::vector<std::string> sets = {"model.n_layer=3",
                                   "model.n_head=2",
                                   "model.n_embd=64",
                                   "model.vocab_size=50257",
                                   "model.position=\"rope\"",
                                   "train.batch_size=1",
                                   fmt::format("train.seq_len={}", T),
                                   "remat.policy=full",
                                   "data.task=\"random\"",
                                   "device.threads=2"};
  sets.insert(sets.end(), mode.begin(), mode.end());
  return parse_config("", "long-test", sets);
}

struct Peaks {
  uint64_t device = 0, host = 0;
};

Peaks predicted(int64_t T, const std::vector<std::string>& mode = {}) {
  const DryRun r = remat::test::cpu_test_planner(2, UINT64_MAX).dry_run(long_gpt(T, mode), false);
  return {r.peak.total_bytes, r.host_peak.total_bytes};
}

Peaks measured(int64_t T, const std::vector<std::string>& mode = {}) {
  const Config cfg = long_gpt(T, mode);
  cpu::CpuBackend be(UINT64_MAX, 2);
  RunParts p = remat::test::synthetic_run_parts(cfg, be);
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *p.model), be, *p.model, *p.data);
  trainer.step();
  return {be.pool().peak_bytes(), be.host_pool().peak_bytes()};
}

bool equal(const Peaks& a, const Peaks& b) {
  return a.device == b.device && a.host == b.host;
}

}  // namespace

TEST_CASE("peak memory at 2T is at most 2.05x the peak at T (50k vocabulary, full remat)",
          "[long]") {
  for (const auto& mode : kModes) {
    INFO(fmt::format("mode: {}", fmt::join(mode, " ")));
    for (int64_t T : {4096, 32768, 262144}) {
      const Peaks a = predicted(T, mode), b = predicted(2 * T, mode);
      INFO(fmt::format("predicted peak at T={}: {} B (host {} B), at 2T: {} B (host {} B)", T,
                       a.device, a.host, b.device, b.host));
      CHECK(static_cast<double>(b.device) <= 2.05 * static_cast<double>(a.device));
      CHECK(static_cast<double>(b.host) <= 2.05 * static_cast<double>(a.host));
      CHECK((a.host > 0) == !mode.empty());
    }
    const Peaks a = measured(512, mode), b = measured(1024, mode);
    INFO(fmt::format("measured peak at T=512: {} B, at 1024: {} B", a.device, b.device));
    CHECK(equal(a, predicted(512, mode)));
    CHECK(equal(b, predicted(1024, mode)));
    CHECK(static_cast<double>(b.device) <= 2.05 * static_cast<double>(a.device));
  }
}
