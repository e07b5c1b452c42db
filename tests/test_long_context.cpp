// Long context: with flash attention (O(T) statistics) and the chunked LM-head loss (no T x V
// logits), peak memory under full remat grows linearly in T, even with a 50k vocabulary.
#include <fmt/format.h>

#include <catch2/catch.hpp>

#include "data/synthetic.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/planner.h"
#include "layers/models.h"
#include "tests/planner_util.h"

using namespace remat;

namespace {

Config long_gpt(int64_t T) {
  return parse_config(
      "", "long-test",
      {"model.n_layer=2", "model.n_head=2", "model.n_embd=64", "model.vocab_size=50257",
       "model.position=\"rope\"", "train.batch_size=1", fmt::format("train.seq_len={}", T),
       "remat.policy=full", "data.task=\"random\"", "device.threads=2"});
}

uint64_t predicted(int64_t T) {
  return remat::test::cpu_test_planner(2, UINT64_MAX).dry_run(long_gpt(T), false).peak.total_bytes;
}

uint64_t measured(int64_t T) {
  const Config cfg = long_gpt(T);
  cpu::CpuBackend be(UINT64_MAX, 2);
  RunParts p = remat::test::synthetic_run_parts(cfg, be);
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *p.model), be, *p.model, *p.data);
  trainer.step();
  return be.pool().peak_bytes();
}

}  // namespace

TEST_CASE("peak memory at 2T is at most 2.05x the peak at T (50k vocabulary, full remat)",
          "[long]") {
  for (int64_t T : {4096, 32768, 262144}) {
    const uint64_t a = predicted(T), b = predicted(2 * T);
    INFO(fmt::format("predicted peak at T={}: {} B, at 2T: {} B, ratio {:.4f}", T, a, b,
                     static_cast<double>(b) / static_cast<double>(a)));
    CHECK(static_cast<double>(b) <= 2.05 * static_cast<double>(a));
  }
  const uint64_t a = measured(512), b = measured(1024);
  INFO(fmt::format("measured peak at T=512: {} B, at 1024: {} B", a, b));
  CHECK(a == predicted(512));
  CHECK(b == predicted(1024));
  CHECK(static_cast<double>(b) <= 2.05 * static_cast<double>(a));
}
