// Remat equivalence: losses, gradients and weights are bitwise identical under every policy and
// granularity (the CPU backend is deterministic and recompute reuses the same kernels), and the
// memory that full remat saves is exactly what the activation arithmetic says.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "data/synthetic.h"
#include "engine/config/config.h"
#include "engine/core/error.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/remat/executor.h"
#include "engine/training/trainer.h"
#include "layers/models.h"
#include "test_util.h"
#include "tests/configs.h"

using namespace remat;

namespace {

const std::string kBase = test::small_gpt_toml(test::remat_test_gpt());

struct RunRecord {
  std::vector<double> losses;
  std::vector<std::vector<float>> params, grads;
  uint64_t peak = 0;
  std::string peak_phase;
};

RunRecord train3(const std::string& text, const std::vector<std::string>& sets, int threads = 2) {
  Config cfg = parse_config(text, "remat-test", sets);
  cpu::CpuBackend be(1ull << 30, threads);
  auto model = make_model(cfg, be);
  auto data = make_synthetic_data(cfg);
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data);
  RunRecord r;
  for (int s = 0; s < 3; ++s) r.losses.push_back(trainer.step().loss);
  for (Param& p : model->params()) {
    r.params.emplace_back(p.value.f32(), p.value.f32() + p.value.tensor().numel());
    r.grads.emplace_back(p.grad.f32(), p.grad.f32() + p.grad.tensor().numel());
  }
  r.peak = be.pool().peak_bytes();
  r.peak_phase = be.pool().peak_snapshot().phase;
  return r;
}

}  // namespace

using test::bitwise_equal;

TEST_CASE("losses, gradients and weights are bitwise identical under every remat setting",
          "[remat]") {
  const RunRecord ref = train3(kBase, {"remat.policy=none"});
  const std::vector<std::vector<std::string>> settings = {
      {"remat.policy=full"},
      {"remat.policy=full", "remat.every=2"},
      {"remat.policy=full", "remat.every=3"},
      {"remat.policy=full", "remat.every=4"},
      {"remat.policy=full", "remat.blocks=[0,2,3]"},
      {"remat.policy=full", "remat.blocks=[1,2]", "remat.every=2"},
      {"remat.policy=save_dots"},
      {"remat.policy=save_attn"},
      {"remat.policy=save_attn", "remat.every=2"},
      {"remat.policy=names", "remat.save=[\"qkv\",\"gelu\"]"},
      {"remat.policy=names", "remat.save=[\"ln1\",\"ln1.stats\",\"fc\"]", "remat.every=2"},
      {"remat.plan=[\"full\",\"save_attn\",\"none\",\"save_dots\"]"},
      {"remat.plan=[\"save_dots\",\"full\",\"full\",\"none\"]", "remat.every=2"},
  };
  for (const auto& s : settings) {
    INFO(fmt::format("setting: {}", fmt::join(s, " ")));
    const RunRecord r = train3(kBase, s);
    for (size_t i = 0; i < ref.losses.size(); ++i)
      CHECK(std::memcmp(&r.losses[i], &ref.losses[i], sizeof(double)) == 0);
    CHECK(bitwise_equal(r.grads, ref.grads));
    CHECK(bitwise_equal(r.params, ref.params));
    CHECK(r.peak <= ref.peak);  // every = n_layer recomputes the whole model: same peak as none
  }
}

TEST_CASE("with dropout, recompute reproduces the masks: bitwise identical under every policy",
          "[remat]") {
  const RunRecord ref = train3(kBase, {"remat.policy=none", "model.dropout=0.2"});
  const RunRecord no_dropout = train3(kBase, {"remat.policy=none"});
  CHECK(ref.losses != no_dropout.losses);  // dropout really is on
  for (const auto& s : std::vector<std::vector<std::string>>{{"remat.policy=full"},
                                                             {"remat.policy=full", "remat.every=2"},
                                                             {"remat.policy=save_dots"},
                                                             {"remat.policy=save_attn"}}) {
    std::vector<std::string> sets = s;
    sets.push_back("model.dropout=0.2");
    INFO(fmt::format("setting: {}", fmt::join(sets, " ")));
    const RunRecord r = train3(kBase, sets);
    for (size_t i = 0; i < ref.losses.size(); ++i)
      CHECK(std::memcmp(&r.losses[i], &ref.losses[i], sizeof(double)) == 0);
    CHECK(bitwise_equal(r.grads, ref.grads));
    CHECK(bitwise_equal(r.params, ref.params));
  }
}

TEST_CASE("with documents, every policy, tiling, thread count and chunking gives the same bits",
          "[remat][documents]") {
  // Synthetic tokens equal to 5 end documents (mean length 37 in rows of 45): attention within
  // each, learned positions from 0 in each, the end-of-text targets untrained. Attention in
  // 64-token chunks over rows of 130 is a schedule of its own, the same bits under every policy.
  for (const std::vector<std::string>& base :
       {std::vector<std::string>{"data.attention=\"document\"", "data.eot_token=5"},
        std::vector<std::string>{"data.attention=\"document\"", "data.eot_token=5",
                                 "train.seq_len=130", "model.n_ctx=256",
                                 "remat.attention_chunk=64"}}) {
    auto with = [&](std::vector<std::string> sets) {
      sets.insert(sets.end(), base.begin(), base.end());
      return sets;
    };
    const RunRecord ref = train3(kBase, with({"remat.policy=none"}));
    CHECK(ref.losses != train3(kBase, {"remat.policy=none"}).losses);  // documents are on
    const std::vector<std::vector<std::string>> settings = {
        {"remat.policy=full"},
        {"remat.policy=full", "remat.every=2"},
        {"remat.policy=save_dots"},
        {"remat.policy=save_attn"},
        {"remat.policy=names", "remat.save=[\"qkv\",\"gelu\"]"},
        {"remat.plan=[\"full\",\"save_attn\",\"none\",\"save_dots\"]"},
    };
    for (const auto& s : settings) {
      INFO(fmt::format("setting: {} {}", fmt::join(s, " "), fmt::join(base, " ")));
      const RunRecord r = train3(kBase, with(s));
      CHECK(r.losses == ref.losses);
      CHECK(bitwise_equal(r.grads, ref.grads));
      CHECK(bitwise_equal(r.params, ref.params));
    }
    const RunRecord tiled = train3(kBase, with({"remat.policy=none", "remat.tile_tokens=7"}));
    for (int threads : {1, 3}) {
      INFO(threads << " threads, tiled");
      const RunRecord r =
          train3(kBase, with({"remat.policy=full", "remat.tile_tokens=7"}), threads);
      CHECK(r.losses == tiled.losses);
      CHECK(bitwise_equal(r.grads, tiled.grads));
    }
  }
}

TEST_CASE("the MLP gives bitwise identical results with and without remat", "[remat]") {
  const char* mlp = R"(
[model]
kind = "mlp"
n_layer = 4
n_embd = 24
[train]
batch_size = 7
[device]
threads = 2
)";
  const RunRecord ref = train3(mlp, {"remat.policy=none"});
  const RunRecord full = train3(mlp, {"remat.policy=full"});
  CHECK(ref.losses == full.losses);
  CHECK(bitwise_equal(full.grads, ref.grads));
  CHECK(bitwise_equal(full.params, ref.params));
}

// Memory arithmetic: under `none` every block keeps its 11 saved tensors until its backward;
// under `full` (every = 1) it keeps only x, and the block being back-propagated is recomputed to
// the same 11 tensors. Both peaks fall in the backward of the last block, so
//   peak(none) - peak(full) = (L - 1) * (saved bytes per block - bytes of x)
// exactly, with every tensor rounded up to the pool's 256-byte unit.
TEST_CASE("full remat saves exactly (L-1) blocks of activations minus their checkpoints",
          "[remat]") {
  const int64_t L = 4, B = 2, T = 45, C = 32, NH = 2, FF = 4 * C, N = B * T;
  auto bytes = [](int64_t floats) {
    return MemoryPool::accounted_bytes(static_cast<size_t>(floats) * 4);
  };
  const uint64_t x = bytes(N * C);
  const uint64_t saved = x /*x*/ + x /*ln1*/ + bytes(N * 2) + bytes(N * 3 * C) + x /*attn*/ +
                         bytes(B * NH * T) + x /*res*/ + x /*ln2*/ + bytes(N * 2) +
                         2 * bytes(N * FF);
  const RunRecord none = train3(kBase, {"remat.policy=none"});
  const RunRecord full = train3(kBase, {"remat.policy=full"});
  INFO(fmt::format("none peak {} at {}, full peak {} at {}", none.peak, none.peak_phase, full.peak,
                   full.peak_phase));
  CHECK(none.peak_phase == "backward block 3");
  CHECK(full.peak_phase == "backward block 3");
  CHECK(none.peak - full.peak == static_cast<uint64_t>(L - 1) * (saved - x));
}

TEST_CASE("policy keep-sets are the ones the README lists", "[remat]") {
  Config cfg = parse_config(kBase, "remat-test");
  cpu::CpuBackend be(1ull << 30, 1);
  auto model = make_model(cfg, be);
  auto kept = [&](const std::string& policy, std::vector<std::string> save = {}) {
    std::vector<bool> keep = policy_keep_set(policy, save, model->block(0));
    std::vector<std::string> out;
    for (size_t i = 0; i < keep.size(); ++i)
      if (keep[i]) out.push_back(model->block(0).act_names()[i]);
    return fmt::format("{}", fmt::join(out, " "));
  };
  CHECK(kept("none") == "x ln1 ln1.stats qkv attn attn.lse res ln2 ln2.stats fc gelu");
  CHECK(kept("full") == "");
  CHECK(kept("save_dots") == "qkv attn attn.lse res fc");
  CHECK(kept("save_attn") == "attn attn.lse");
  CHECK(kept("names", {"ln2", "gelu"}) == "ln2 gelu");
}

TEST_CASE("unknown activation names in remat.save are config errors listing the valid ones",
          "[remat]") {
  Config cfg = parse_config(kBase, "remat-test",
                            {"remat.policy=names", "remat.save=[\"attn\",\"softmax\"]"});
  cpu::CpuBackend be(1ull << 30, 1);
  auto model = make_model(cfg, be);
  CHECK_THROWS_AS(resolve_remat_plan(cfg, *model), ConfigError);
  CHECK_THROWS_WITH(resolve_remat_plan(cfg, *model),
                    Catch::Matchers::Contains("--set remat.save=") &&
                        Catch::Matchers::Contains("\"softmax\"") &&
                        Catch::Matchers::Contains("attn.lse"));
  CHECK_THROWS_AS(parse_config(kBase, "remat-test", {"remat.plan=[\"full\"]"}), ConfigError);
  CHECK_THROWS_AS(
      parse_config(kBase, "remat-test", {"remat.plan=[\"full\",\"full\",\"full\",\"sometimes\"]"}),
      ConfigError);
  CHECK_THROWS_AS(parse_config(kBase, "remat-test", {"remat.policy=names"}), ConfigError);
}

TEST_CASE("losses, gradients and weights are bitwise identical for 1, 2 and 3 threads",
          "[remat][threads]") {
  // Shapes that are multiples of no tile: the GEMMs (engine/cpu/gemm.cpp), attention and the
  // reductions must not depend on how the work is split. Before the GEMMs were tiled by shape,
  // OpenBLAS's own threading changed the weight gradients in the last bits.
  const std::vector<std::vector<std::string>> shapes = {
      {"model.n_ctx=512", "train.seq_len=333", "train.batch_size=3", "model.n_embd=96",
       "model.n_head=3", "train.loss_chunk=0"},
      {"model.vocab_size=5003", "train.seq_len=61", "train.batch_size=1",
       "model.position=\"rope\""},
  };
  for (const auto& shape : shapes) {
    INFO(fmt::format("shape: {}", fmt::join(shape, " ")));
    const RunRecord one = train3(kBase, shape, 1);
    for (int threads : {2, 3}) {
      INFO(threads << " threads");
      const RunRecord r = train3(kBase, shape, threads);
      for (size_t i = 0; i < one.losses.size(); ++i)
        CHECK(std::memcmp(&r.losses[i], &one.losses[i], sizeof(double)) == 0);
      CHECK(bitwise_equal(r.grads, one.grads));
      CHECK(bitwise_equal(r.params, one.params));
    }
  }
}

TEST_CASE("the MLP's data, losses and weights are bitwise identical for 1, 2 and 3 threads",
          "[remat][threads]") {
  // 1001 rows x 300 features: the synthetic regression's inputs (bulk normals) and teacher
  // product, and every GEMM tile edge, split differently across 1, 2 and 3 threads.
  const std::string mlp = test::small_mlp_toml(3, 300, 1001, "full");
  const RunRecord one = train3(mlp, {}, 1);
  for (int threads : {2, 3}) {
    INFO(threads << " threads");
    const RunRecord r = train3(mlp, {}, threads);
    for (size_t i = 0; i < one.losses.size(); ++i)
      CHECK(std::memcmp(&r.losses[i], &one.losses[i], sizeof(double)) == 0);
    CHECK(bitwise_equal(r.grads, one.grads));
    CHECK(bitwise_equal(r.params, one.params));
  }
}

// ---- remat.tile_tokens: the MLP half of each block over chunks of token rows ----

namespace {

// Largest |a - b| over a tensor, relative to the tensor's largest |b| (a gradient's scale).
double worst_scaled_diff(const std::vector<std::vector<float>>& a,
                         const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    double scale = 0, diff = 0;
    for (size_t i = 0; i < a[t].size(); ++i) {
      scale = std::max(scale, static_cast<double>(std::abs(b[t][i])));
      diff = std::max(diff, static_cast<double>(std::abs(a[t][i] - b[t][i])));
    }
    if (scale > 0) worst = std::max(worst, diff / scale);
  }
  return worst;
}

}  // namespace

TEST_CASE("a tiled MLP equals the untiled block within fp32 reassociation", "[remat]") {
  // Tiling changes only the order in which the MLP's weight and LayerNorm-2 gradients add up
  // over rows (per chunk, then over chunks). Measured on these 90 rows over 3 steps: losses
  // within 5e-9 relative, every gradient within 6.2e-6 of its tensor's largest entry; the bounds
  // are 1e-7 and 5e-5. One chunk (90 rows, or more) gives the same bits as no tiling. Weights are
  // not compared: AdamW turns the rounding noise of an exactly-zero gradient (the key bias) into
  // updates of either sign. Chunks: 1 row, 7 and 37 (dividing nothing), 90 and 1000. With
  // dropout, each chunk must draw the rows' masks of the whole tensor.
  for (const char* dropout : {"model.dropout=0", "model.dropout=0.2"}) {
    const RunRecord whole = train3(kBase, {"remat.policy=none", dropout});
    for (int64_t tile : {1, 7, 37, 90, 1000}) {
      INFO(dropout << ", tile_tokens " << tile);
      const RunRecord r =
          train3(kBase, {"remat.policy=none", dropout, fmt::format("remat.tile_tokens={}", tile)});
      for (size_t i = 0; i < whole.losses.size(); ++i)
        CHECK(std::abs(r.losses[i] - whole.losses[i]) <= 1e-7 * std::abs(whole.losses[i]));
      CHECK(worst_scaled_diff(r.grads, whole.grads) < 5e-5);
      if (tile >= 90) CHECK(bitwise_equal(r.grads, whole.grads));
    }
  }
}

TEST_CASE("with a tiled MLP every policy and thread count gives the same bits",
          "[remat][threads]") {
  const std::vector<std::string> tiled = {"remat.tile_tokens=37", "model.dropout=0.1"};
  auto with = [&](std::vector<std::string> sets) {
    sets.insert(sets.end(), tiled.begin(), tiled.end());
    return sets;
  };
  const RunRecord ref = train3(kBase, with({"remat.policy=none"}));
  const std::vector<std::vector<std::string>> settings = {
      {"remat.policy=full"},
      {"remat.policy=full", "remat.every=2"},
      {"remat.policy=save_dots"},
      {"remat.policy=save_attn"},
      {"remat.policy=names", "remat.save=[\"qkv\",\"res\"]"},
  };
  for (const auto& s : settings) {
    INFO(fmt::format("setting: {}", fmt::join(s, " ")));
    const RunRecord r = train3(kBase, with(s));
    for (size_t i = 0; i < ref.losses.size(); ++i)
      CHECK(std::memcmp(&r.losses[i], &ref.losses[i], sizeof(double)) == 0);
    CHECK(bitwise_equal(r.grads, ref.grads));
    CHECK(bitwise_equal(r.params, ref.params));
    CHECK(r.peak <= ref.peak);
  }
  for (int threads : {1, 3}) {
    INFO(threads << " threads");
    const RunRecord r = train3(kBase, with({"remat.policy=full"}), threads);
    CHECK(r.losses == ref.losses);
    CHECK(bitwise_equal(r.grads, ref.grads));
  }
}

TEST_CASE("a tiled block has no MLP slots to save, and the MLP model no token rows to tile",
          "[remat]") {
  auto resolve_fc = [] {
    const Config cfg = parse_config(
        kBase, "remat-test", {"remat.tile_tokens=16", "remat.policy=names", "remat.save=[\"fc\"]"});
    cpu::CpuBackend be(1ull << 30, 1);
    auto model = make_model(cfg, be);
    resolve_remat_plan(cfg, *model);
  };
  CHECK_THROWS_WITH(resolve_fc(),
                    Catch::Matchers::Contains("unknown activation name \"fc\"") &&
                        Catch::Matchers::Contains("x, ln1, ln1.stats, qkv, attn, attn.lse, res"));
  CHECK_THROWS_WITH(
      parse_config(test::small_mlp_toml(2, 8, 4), "remat-test", {"remat.tile_tokens=16"}),
      Catch::Matchers::Contains("remat.tile_tokens") && Catch::Matchers::Contains("Fix:"));
}
