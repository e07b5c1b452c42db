// The planner: a dry run on the count backend predicts the measured peak of a real CPU run to
// the byte, for every policy, granularity and several shapes; its searches agree with dry runs.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "data/synthetic.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/planner/budget_search.h"
#include "engine/planner/planner.h"
#include "layers/models.h"
#include "tests/planner_util.h"

using namespace remat;

namespace {

using remat::test::synthetic_run_parts;
Planner cpu_planner(int threads, uint64_t budget) {
  return remat::test::cpu_test_planner(threads, budget);
}

uint64_t measured_peak(const Config& cfg, int threads) {
  cpu::CpuBackend be(1ull << 32, threads);
  RunParts p = synthetic_run_parts(cfg, be);
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *p.model), be, *p.model, *p.data);
  trainer.step();
  trainer.step();
  return be.pool().peak_bytes();
}

}  // namespace

TEST_CASE("predicted peak equals the measured peak to the byte across policies and shapes",
          "[planner]") {
  const std::vector<std::string> shapes[] = {
      {"model.n_layer=3", "model.n_embd=32", "model.n_head=2", "train.seq_len=37",
       "train.batch_size=2", "model.vocab_size=50"},
      {"model.n_layer=4", "model.n_embd=48", "model.n_head=4", "train.seq_len=130",
       "train.batch_size=1", "model.position=\"rope\"", "train.loss_chunk=33"},
      {"model.kind=\"mlp\"", "model.n_layer=5", "model.n_embd=40", "train.batch_size=9"},
  };
  const std::vector<std::string> policies[] = {
      {"remat.policy=none"},
      {"remat.policy=full"},
      {"remat.policy=full", "remat.every=2"},
      {"remat.policy=save_dots"},
      {"remat.policy=save_attn", "remat.blocks=[0,2]"},
      {"remat.policy=names", "remat.save=[\"x\",\"fc\"]"},
  };
  for (const auto& shape : shapes) {
    for (const auto& policy : policies) {
      std::vector<std::string> sets = shape;
      sets.insert(sets.end(), policy.begin(), policy.end());
      sets.push_back("model.n_ctx=256");
      const Config cfg = parse_config("", "planner-test", sets);
      INFO(fmt::format("{}", fmt::join(sets, " ")));
      for (int threads : {1, 2}) {
        const DryRun plan = cpu_planner(threads, 1ull << 32).dry_run(cfg);
        CHECK(plan.peak.total_bytes == measured_peak(cfg, threads));
      }
    }
  }
}

TEST_CASE("predicted peak equals the measured peak to the byte with a tiled MLP", "[planner]") {
  // Chunks that divide nothing, one row, and more rows than the step has; with dropout (a
  // chunk-sized mask scratch) and under policies that save part of the attention half.
  const std::vector<std::string> shape = {
      "model.n_layer=3",    "model.n_embd=48", "model.n_head=4",     "train.seq_len=61",
      "train.batch_size=2", "model.n_ctx=256", "model.vocab_size=50"};
  const std::vector<std::string> settings[] = {
      {"remat.tile_tokens=17", "remat.policy=none"},
      {"remat.tile_tokens=17", "remat.policy=full"},
      {"remat.tile_tokens=1", "remat.policy=full", "remat.every=3"},
      {"remat.tile_tokens=40", "remat.policy=save_dots", "model.dropout=0.1"},
      {"remat.tile_tokens=500", "remat.policy=names", "remat.save=[\"qkv\",\"attn\"]"},
  };
  for (const auto& setting : settings) {
    std::vector<std::string> sets = shape;
    sets.insert(sets.end(), setting.begin(), setting.end());
    const Config cfg = parse_config("", "planner-test", sets);
    INFO(fmt::format("{}", fmt::join(sets, " ")));
    const DryRun plan = cpu_planner(2, 1ull << 32).dry_run(cfg);
    CHECK(plan.peak.total_bytes == measured_peak(cfg, 2));
  }
}

namespace {

// A dry run for `count`, with its replay of the tiled MLP's full tiles on or off.
DryRun dry_run_replaying(const Config& cfg, CountTarget count, bool replay_tiles) {
  PlanTarget t;
  t.count = count;
  t.count.replay_tiles = replay_tiles;
  return Planner(t, synthetic_run_parts).dry_run(cfg);
}

void check_same_snapshot(const MemorySnapshot& a, const MemorySnapshot& b) {
  CHECK(a.total_bytes == b.total_bytes);
  CHECK(a.by_category == b.by_category);
  CHECK(a.phase == b.phase);
  REQUIRE(a.largest.size() == b.largest.size());
  for (size_t i = 0; i < a.largest.size(); ++i) {
    CHECK(a.largest[i].name == b.largest[i].name);
    CHECK(a.largest[i].bytes == b.largest[i].bytes);
  }
}

}  // namespace

TEST_CASE("a dry run that replays the MLP's full tiles counts and peaks as one that runs them",
          "[planner]") {
  // The replay (Backend::for_each_row_tile) must change no bit of what the planner prints: the
  // same peak, phase and largest tensors, the same FLOP and byte counters bit for bit. Tiles
  // that divide the rows and tiles that leave a partial one; dropout (a per-tile scratch);
  // offloaded checkpoints (the host pool, copies between the tiles); a CUDA target in bf16.
  const std::vector<std::string> shape = {
      "model.n_layer=3",    "model.n_embd=48", "model.n_head=4",     "train.seq_len=96",
      "train.batch_size=2", "model.n_ctx=256", "model.vocab_size=50"};
  const std::vector<std::string> settings[] = {
      {"remat.tile_tokens=16", "remat.policy=none"},
      {"remat.tile_tokens=7", "remat.policy=full", "model.dropout=0.1"},
      {"remat.tile_tokens=1", "remat.policy=save_dots", "remat.every=2"},
      {"remat.tile_tokens=24", "remat.policy=full", "remat.offload=\"checkpoints\""},
  };
  const CountTarget targets[] = {{DeviceKind::Cpu, DType::F32, 2},
                                 {DeviceKind::Cuda, DType::BF16, 1}};
  for (const auto& setting : settings) {
    for (const CountTarget& target : targets) {
      std::vector<std::string> sets = shape;
      sets.insert(sets.end(), setting.begin(), setting.end());
      const Config cfg = parse_config("", "planner-test", sets);
      INFO(fmt::format("{} on {}", fmt::join(sets, " "), device_name(target.device)));
      const DryRun every = dry_run_replaying(cfg, target, false);
      const DryRun replayed = dry_run_replaying(cfg, target, true);
      check_same_snapshot(replayed.peak, every.peak);
      check_same_snapshot(replayed.host_peak, every.host_peak);
      for (int i = 0; i < kNumPhases; ++i) {
        INFO(fmt::format("phase {}", i));
        // Bitwise: memcmp, not ==, so that even the sign of a zero counts.
        CHECK(std::memcmp(&replayed.cost[static_cast<size_t>(i)],
                          &every.cost[static_cast<size_t>(i)], sizeof(OpCost)) == 0);
      }
      CHECK(every.cost[static_cast<size_t>(Phase::Recompute)].flops > 0);
    }
  }
}

TEST_CASE("longest seq_len and largest batch are the largest values whose dry run fits",
          "[planner]") {
  const Config cfg =
      parse_config("", "planner-test",
                   {"model.n_layer=2", "model.n_embd=32", "model.n_head=2",
                    "model.position=\"rope\"", "train.seq_len=64", "remat.policy=full"});
  const Planner planner = cpu_planner(2, 3ull << 20);
  const int64_t t = planner.longest_seq_len(cfg);
  REQUIRE(t > 64);
  Config at = cfg, above = cfg;
  at.train.seq_len = t;
  above.train.seq_len = t + 1;
  CHECK(planner.fits(at));
  CHECK_FALSE(planner.fits(above));
  const int64_t b = planner.largest_batch(cfg);
  REQUIRE(b >= 1);
  Config bb = cfg;
  bb.train.batch_size = b;
  CHECK(planner.fits(bb));
  bb.train.batch_size = b + 1;
  CHECK_FALSE(planner.fits(bb));
}

// ---- the searches themselves, on functions whose answer is known ----

namespace {

// The largest x in [1, hi] with f(x) <= budget, by looking at every x.
int64_t brute_force_largest(int64_t hi, uint64_t budget,
                            const std::function<uint64_t(int64_t)>& f) {
  int64_t best = 0;
  for (int64_t x = 1; x <= hi && f(x) <= budget; ++x) best = x;
  return best;
}

}  // namespace

TEST_CASE(
    "largest_fitting finds the exact answer of a monotone peak, in few probes when it is "
    "affine",
    "[planner]") {
  struct Shape {
    const char* name;
    std::function<uint64_t(int64_t)> peak;
    int max_probes;  // for budgets in the middle of the range
  };
  const int64_t hi = 5000;
  const std::vector<Shape> shapes = {
      {"affine", [](int64_t x) { return 1000 + 48 * static_cast<uint64_t>(x); }, 5},
      {"affine, rounded up to 256 B",
       [](int64_t x) { return (1000 + 37 * static_cast<uint64_t>(x) + 255) / 256 * 256; }, 12},
      {"saturating term (the loss chunk)",
       [](int64_t x) { return 500 * static_cast<uint64_t>(std::min<int64_t>(x, 64)) + 40 * x; }, 9},
      {"quadratic", [](int64_t x) { return static_cast<uint64_t>(x * x); }, 30},
      {"steps", [](int64_t x) { return static_cast<uint64_t>(x / 100) * 1000; }, 40},
  };
  for (const Shape& s : shapes) {
    for (uint64_t budget :
         {s.peak(1) - 1, s.peak(1), s.peak(37), s.peak(1234) + 5, s.peak(hi), s.peak(hi) * 2}) {
      int probes = 0;
      const int64_t got = largest_fitting(hi, budget, [&](int64_t x) {
        REQUIRE(x >= 1);
        REQUIRE(x <= hi);
        ++probes;
        return s.peak(x);
      });
      INFO(s.name << ", budget " << budget << ": " << probes << " probes");
      CHECK(got == brute_force_largest(hi, budget, s.peak));
      CHECK(probes <= s.max_probes);
      // A probe the caller already has (at 300) gives the same answer.
      const int64_t with_known = largest_fitting(hi, budget, s.peak, PeakProbe{300, s.peak(300)});
      CHECK(with_known == got);
    }
  }
}

TEST_CASE("a CUDA plan's --memory is the pool budget, with the runtime reserve on top",
          "[planner]") {
  const Config cfg =
      parse_config("[model]\nkind = \"gpt\"\n[device]\nbackend = \"cuda\"\n", "cuda.toml");
  const PlanTarget t = plan_target(cfg, "", 8ull << 30);
  CHECK(t.reserve_bytes == 768ull << 20);
  CHECK(t.pool_budget() == 8ull << 30);
  CHECK(t.device_bytes == (8ull << 30) + (768ull << 20));
  // A preset is the card's memory: the pool gets what the reserve leaves.
  const PlanTarget h200 = plan_target(cfg, "h200", std::nullopt);
  CHECK(h200.device_bytes == 150754820096ull);
  CHECK(h200.pool_budget() == h200.device_bytes - (768ull << 20));
  // The CPU has no reserve: --memory is the budget.
  const PlanTarget cpu =
      plan_target(parse_config("[model]\nkind = \"gpt\"\n", "c"), "", 1ull << 30);
  CHECK(cpu.reserve_bytes == 0);
  CHECK(cpu.pool_budget() == 1ull << 30);
}

TEST_CASE("attention's backward, a tiled block's peak, holds neither ln1 nor (on the CPU) O",
          "[planner]") {
  // Full remat, MLP tiled: the peak is the last block's attention backward. Its saved activations
  // there are qkv, the log-sum-exp and ln1's statistics only; ln1 comes back after it, and O is
  // replaced by D on the CPU. cuDNN reads O itself, so a CUDA plan keeps O (attn) across the
  // backward.
  const int64_t B = 1, T = 512, C = 64, NH = 4;
  const Config cfg =
      parse_config("", "peak-test",
                   {"model.n_layer=2", "model.n_embd=64", "model.n_head=4", "model.vocab_size=64",
                    "model.position=\"rope\"", "train.batch_size=1", "train.seq_len=512",
                    "remat.policy=full", "remat.tile_tokens=16", "data.task=\"random\""});
  const auto bytes = [](int64_t n, int64_t elem) {
    return MemoryPool::accounted_bytes(static_cast<size_t>(n * elem));
  };
  const uint64_t qkv = bytes(B * T * 3 * C, 4), attn = bytes(B * T * C, 4),
                 lse = bytes(B * NH * T, 4) + bytes(B * T * 2, 4);  // + ln1.stats
  const DryRun cpu = cpu_planner(2, 1ull << 32).dry_run(cfg);
  CHECK(cpu.peak.phase == "backward block 1");
  CHECK(cpu.peak.by_category[static_cast<size_t>(MemCategory::Activations)] == qkv + lse);
  PlanTarget gpu = plan_target(cfg, "h200", std::nullopt);
  gpu.count.act_dtype = DType::F32;  // the same element size as the CPU
  const DryRun cuda = Planner(gpu, synthetic_run_parts).dry_run(cfg);
  CHECK(cuda.peak.by_category[static_cast<size_t>(MemCategory::Activations)] == qkv + lse + attn);
}

TEST_CASE("with a sharded optimizer each rank's plan holds its share of the AdamW moments",
          "[planner][parallel]") {
  // 3 ranks and 4 KiB buckets: the shards differ by a float here and there, and still cover
  // every moment exactly once between them.
  std::vector<std::string> sets = {
      "model.n_layer=2",    "model.n_embd=32",     "model.n_head=2",
      "model.n_ctx=64",     "model.vocab_size=50", "train.seq_len=16",
      "train.batch_size=3", "parallel.data=3",     "parallel.bucket_bytes=4096"};
  Config whole = parse_config("", "zero-test", sets);
  sets.push_back("parallel.shard_optimizer=true");
  const DryRun unsharded = cpu_planner(1, 1ull << 32).dry_run(whole);
  const auto moments = [](const DryRun& r) {
    return r.peak.by_category[static_cast<size_t>(MemCategory::Optimizer)];
  };
  const uint64_t all = moments(unsharded);
  REQUIRE(all >= 2 * sizeof(float) * static_cast<uint64_t>(unsharded.n_params));
  uint64_t sum = 0;
  for (int rank = 0; rank < 3; ++rank) {
    Config cfg = parse_config("", "zero-test", sets);
    cfg.parallel.rank = rank;
    const DryRun r = cpu_planner(1, 1ull << 32).dry_run(cfg);
    INFO("rank " << rank << ": " << moments(r) << " of " << all << " B");
    CHECK(r.sharded_optimizer);
    whole.parallel.rank = rank;  // an all-reduce's worth of bytes either way
    CHECK(r.grad_sent_bytes == cpu_planner(1, 1ull << 32).dry_run(whole).grad_sent_bytes);
    // m and v of 1/3 of the floats, each allocation rounded up to the pool's alignment.
    const uint64_t floats = (static_cast<uint64_t>(unsharded.n_params) + 2) / 3;
    CHECK(moments(r) >= 2 * sizeof(float) * (floats - 1 - 64));
    CHECK(moments(r) <= 2 * (sizeof(float) * (floats + 64) + MemoryPool::kAlignment));
    CHECK(r.peak.total_bytes < unsharded.peak.total_bytes);
    sum += moments(r);
  }
  CHECK(sum >= 2 * sizeof(float) * static_cast<uint64_t>(unsharded.n_params));
  CHECK(sum <=
        2 * sizeof(float) * static_cast<uint64_t>(unsharded.n_params) + 6 * MemoryPool::kAlignment);
}

namespace {

// A CUDA target of `budget` pool bytes (no reserve), bf16 activations.
Planner cuda_planner(uint64_t budget) {
  PlanTarget t;
  t.name = "cuda";
  t.count = CountTarget{DeviceKind::Cuda, DType::BF16, 1};
  t.device_bytes = budget;
  return Planner(t, synthetic_run_parts);
}

uint64_t peak_with_chunk(const Planner& planner, Config cfg, int64_t rows) {
  cfg.train.loss_chunk = rows;
  return planner.dry_run(cfg, false).peak.total_bytes;
}

}  // namespace

TEST_CASE("on a GPU the LM head's chunk grows to the largest candidate the budget holds",
          "[planner][loss_chunk]") {
  // 4 x 2048 rows and a vocabulary of 8192: the default chunk is 1024 rows (32 MiB of logits),
  // the candidates 8192, 4096 and 2048 (three, so that the search between them runs).
  const Config cfg =
      parse_config("", "head.toml",
                   {"model.n_layer=2", "model.n_embd=64", "model.n_head=2",
                    "model.position=\"rope\"", "model.vocab_size=8192", "train.seq_len=2048",
                    "train.batch_size=4", "remat.policy=full", "device.backend=\"cuda\""});
  REQUIRE(default_loss_chunk_rows(8192, 8192) == 1024);
  REQUIRE(loss_chunk_candidates(8192, 8192, kGpuLossChunkRows) ==
          std::vector<int64_t>{8192, 4096, 2048});
  const Planner roomy = cuda_planner(64ull << 30);
  const uint64_t p2048 = peak_with_chunk(roomy, cfg, 2048);
  const uint64_t p4096 = peak_with_chunk(roomy, cfg, 4096);
  const uint64_t p8192 = peak_with_chunk(roomy, cfg, 8192);
  // The head is this step's peak, so each candidate costs memory: 32 MiB of logits per 1024 rows.
  REQUIRE(p2048 < p4096);
  REQUIRE(p4096 < p8192);
  const auto chosen_at = [&](uint64_t budget) {
    Config c = cfg;
    const std::optional<int64_t> rows = resolve_loss_chunk(cuda_planner(budget), c);
    CHECK(c.train.loss_chunk == rows.value_or(0));  // written into the config, or left at 0
    return rows;
  };

  SECTION("room for the largest: every row in one chunk") {
    CHECK(chosen_at(64ull << 30) == 8192);
    CHECK(chosen_at(p8192) == 8192);
  }
  SECTION("room for a middle one, found by the search between the ends") {
    CHECK(chosen_at(p8192 - 1) == 4096);
    CHECK(chosen_at(p4096) == 4096);
  }
  SECTION("room for the smallest candidate only") {
    CHECK(chosen_at(p4096 - 1) == 2048);
  }
  SECTION("no room beyond the default: the config is left as it is") {
    CHECK_FALSE(chosen_at(p2048 - 1).has_value());
  }
  SECTION("the CPU for a head that trains, and a chunk the config sets, are never changed") {
    Config c = cfg;
    CHECK_FALSE(resolve_loss_chunk(cpu_planner(1, 64ull << 30), c).has_value());
    CHECK(c.train.loss_chunk == 0);
    c.train.loss_chunk = 512;
    CHECK_FALSE(resolve_loss_chunk(roomy, c).has_value());
    CHECK(c.train.loss_chunk == 512);
  }
}

TEST_CASE("the head chunk's candidates: capped, halved down to the default, none when small",
          "[planner][loss_chunk]") {
  // GPT-2's vocabulary: a 192-row default.
  CHECK(loss_chunk_candidates(32768, 50257, kGpuLossChunkRows) ==
        std::vector<int64_t>{8192, 4096, 2048, 1024, 512, 256});
  CHECK(loss_chunk_candidates(32768, 50257, kCpuFrozenHeadChunkRows) ==
        std::vector<int64_t>{512, 256});
  // Rows round up to 64 and cap the first candidate.
  CHECK(loss_chunk_candidates(1000, 50257, kGpuLossChunkRows) ==
        std::vector<int64_t>{1024, 512, 256});
  CHECK(loss_chunk_candidates(100, 50257, kGpuLossChunkRows).empty());
  Config c = parse_config("", "r.toml", {"train.seq_len=1000", "train.batch_size=6"});
  c.parallel.data = 2;
  c.parallel.context = 3;
  CHECK(loss_rows_per_rank(c) == 3 * 334);
}

TEST_CASE("on the CPU a frozen LM head's chunk grows to 512 rows where the budget holds them",
          "[planner][loss_chunk][lora]") {
  // 2048 rows and GPT-2's vocabulary: chunks of 192 rows by default, 512 or 256 for a frozen
  // head. The head trains in full fine-tuning, and under LoRA where modules_to_save names it.
  const auto config = [](std::vector<std::string> lora) {
    std::vector<std::string> sets{"model.kind=\"llama\"",   "model.n_layer=2",
                                  "model.n_embd=64",        "model.n_head=2",
                                  "model.vocab_size=50257", "model.tie_embeddings=false",
                                  "train.seq_len=2048",     "remat.policy=\"full\""};
    sets.insert(sets.end(), lora.begin(), lora.end());
    return parse_config("", "head.toml", sets);
  };
  const Config frozen = config({"lora.rank=4"});
  REQUIRE(default_loss_chunk(frozen) == 192);
  const Planner roomy = cpu_planner(1, 64ull << 30);
  Config c = frozen;
  CHECK(resolve_loss_chunk(roomy, c) == 512);
  CHECK(c.train.loss_chunk == 512);
  // Room for 256 rows and not 512: the next candidate.
  const uint64_t p256 = peak_with_chunk(roomy, frozen, 256);
  REQUIRE(p256 < peak_with_chunk(roomy, frozen, 512));
  c = frozen;
  CHECK(resolve_loss_chunk(cpu_planner(1, p256), c) == 256);
  for (const Config& trains :
       {config({}), config({"lora.rank=4", "lora.modules_to_save=[\"lm_head\"]"})}) {
    c = trains;
    CHECK_FALSE(resolve_loss_chunk(roomy, c).has_value());
    CHECK(c.train.loss_chunk == 0);
  }
}
