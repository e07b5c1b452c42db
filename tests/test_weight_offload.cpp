// remat.offload = "checkpoints+optimizer+weights" on the CPU, where the host pool is a second
// pool in the same RAM: every parameter's weights, gradients and AdamW moments live there, the
// device pool holds a use's weights and gradients only while it runs
// (engine/remat/weight_stream.h), and AdamW runs on the host's code path. Bitwise neutral for every
// model, tied or untied head; both pools predicted to the byte; the device's share and the copy
// volume follow the stream's rules exactly; the planner's escalation and time estimate; the
// refusals.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "data/synthetic.h"
#include "engine/core/cuda_workspace.h"
#include "engine/core/error.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/planner/planner.h"
#include "engine/remat/executor.h"
#include "engine/remat/weight_stream.h"
#include "engine/training/trainer.h"
#include "layers/models.h"
#include "tests/configs.h"
#include "tests/planner_util.h"
#include "tests/test_util.h"

using namespace remat;

namespace {

const char* kWeights = "remat.offload=\"checkpoints+optimizer+weights\"";

const std::string kLlama = "[model]\n" +
                           test::llama_model_table({.n_layer = 3,
                                                    .n_kv_head = 2,
                                                    .n_embd = 32,
                                                    .d_ff = 40,
                                                    .vocab_size = 29,
                                                    .tie_embeddings = false}) +
                           R"([train]
seq_len = 19
batch_size = 2
loss_chunk = 8
grad_clip = 0.5
[data]
task = "copy"
)";

const std::string kGpt =
    "[model]\n" +
    test::gpt_model_table(
        {.n_layer = 3, .n_head = 2, .n_embd = 24, .vocab_size = 31, .n_ctx = 64, .dropout = 0.1}) +
    R"([train]
seq_len = 21
batch_size = 2
grad_clip = 0.5
[data]
task = "copy"
)";

struct Record {
  std::vector<double> losses, eval_losses;
  std::vector<std::vector<float>> params, grads, moments;
  uint64_t peak = 0, host_peak = 0;
  MemorySnapshot peak_snapshot;
  uint64_t device_weights_after = 0, device_grads_after = 0;  // live once the steps are done
  OpCost copies;                                              // of the last step
};

std::vector<float> host_copy(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  be.download(v.data(), t);
  return v;
}

// `async_update`: AdamW on its host thread, overlapping the next step (as on CUDA).
Record train(const std::string& base, const std::vector<std::string>& sets, int steps = 3,
             bool async_update = false) {
  const Config cfg = parse_config(base, "weights-test", sets);
  cpu::CpuBackend be(1ull << 30, 2);
  RunParts parts = test::synthetic_run_parts(cfg, be);
  Model& model = *parts.model;
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, model), be, model, *parts.data);
  trainer.set_host_update_async(async_update);
  Record r;
  for (int s = 0; s < steps; ++s) {
    be.reset_cost();
    r.losses.push_back(trainer.step().loss);
    trainer.wait_host_update();  // forward_loss below reads the weights outside a step
    // The evaluation's pass between steps reads the weights as training does and must leave
    // the host gradients alone (they are overwritten next step anyway; the copy is dropped).
    const Batch batch = parts.data->next(be, 100 + s);
    r.eval_losses.push_back(forward_loss(be, model, batch).mean);
  }
  for (int i = 0; i < kNumPhases; ++i) {
    r.copies.to_host_bytes += be.cost(static_cast<Phase>(i)).to_host_bytes;
    r.copies.to_device_bytes += be.cost(static_cast<Phase>(i)).to_device_bytes;
  }
  for (Param& p : model.params()) {
    r.params.push_back(host_copy(be, p.value));
    r.moments.push_back(host_copy(be, p.m));
    r.moments.push_back(host_copy(be, p.v));
  }
  r.peak = be.pool().peak_bytes();
  r.host_peak = be.host_pool().peak_bytes();
  r.peak_snapshot = be.pool().peak_snapshot();
  r.device_weights_after = be.pool().live_bytes(MemCategory::Weights);
  r.device_grads_after = be.pool().live_bytes(MemCategory::Grads);
  return r;
}

// The gradients of one step (a fresh run), as the trainer leaves them before AdamW reads them.
std::vector<std::vector<float>> grads_of_one_step(const std::string& base,
                                                  const std::vector<std::string>& sets) {
  const Config cfg = parse_config(base, "weights-test", sets);
  cpu::CpuBackend be(1ull << 30, 2);
  RunParts parts = test::synthetic_run_parts(cfg, be);
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *parts.model), be, *parts.model, *parts.data);
  trainer.step();
  std::vector<std::vector<float>> grads;
  for (Param& p : parts.model->params()) grads.push_back(host_copy(be, p.grad));
  return grads;
}

void check_same_bits(const Record& a, const Record& b) {
  REQUIRE(a.losses.size() == b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) {
    CHECK(std::memcmp(&a.losses[i], &b.losses[i], sizeof(double)) == 0);
    CHECK(std::memcmp(&a.eval_losses[i], &b.eval_losses[i], sizeof(double)) == 0);
  }
  CHECK(test::bitwise_equal(a.params, b.params));
  CHECK(test::bitwise_equal(a.moments, b.moments));
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::vector<std::vector<std::string>> kSettings = {
    {"remat.policy=full"},
    {"remat.policy=full", "remat.every=2"},
    {"remat.policy=save_attn"},
    {"remat.plan=[\"full\",\"none\",\"save_dots\"]"},
    {"remat.policy=full", "remat.tile_tokens=5"},
};

uint64_t bytes_of(const std::vector<Param*>& ps) {
  uint64_t b = 0;
  for (const Param* p : ps) b += p->value.tensor().bytes();
  return b;
}

}  // namespace

TEST_CASE("weights on the host: the same bits as on the device, for every model and policy",
          "[offload][weights]") {
  struct Family {
    const char* name;
    const std::string* base;
    std::vector<std::string> sets;
  };
  const std::vector<Family> families = {
      {"llama, untied head", &kLlama, {}},
      {"llama, tied head", &kLlama, {"model.tie_embeddings=true"}},
      {"gpt (tied head, learned positions, dropout)", &kGpt, {}},
  };
  for (const Family& f : families)
    for (const auto& s : kSettings) {
      const std::vector<std::string> sets = with(f.sets, s);
      INFO(fmt::format("{} | {}", f.name, fmt::join(sets, " ")));
      const Record kept = train(*f.base, sets);
      const Record moved = train(*f.base, with(sets, {kWeights}));
      check_same_bits(moved, kept);
      CHECK(test::bitwise_equal(grads_of_one_step(*f.base, with(sets, {kWeights})),
                                grads_of_one_step(*f.base, sets)));
      // Between steps the device holds no weight and no gradient.
      CHECK(moved.device_weights_after == 0);
      CHECK(moved.device_grads_after == 0);
      CHECK(moved.peak < kept.peak);
    }
}

TEST_CASE("weights on the host: AdamW on a host thread overlapping the next step, the same bits",
          "[offload][weights]") {
  // The update of step s runs on its own thread while step s + 1 starts; each weight is fetched
  // only once its update is done. Several steps back to back (no wait between them but the
  // stream's), then the weights and moments against the synchronous run.
  for (const std::string* base : {&kLlama, &kGpt}) {
    const std::vector<std::string> sets = {"remat.policy=full", kWeights};
    const Config cfg = parse_config(*base, "weights-test", sets);
    std::vector<std::vector<float>> got, want;
    std::vector<double> got_losses, want_losses;
    for (bool async_update : {false, true}) {
      cpu::CpuBackend be(1ull << 30, 2);
      RunParts parts = test::synthetic_run_parts(cfg, be);
      Trainer trainer(cfg.train, resolve_remat_plan(cfg, *parts.model), be, *parts.model,
                      *parts.data);
      trainer.set_host_update_async(async_update);
      for (int s = 0; s < 6; ++s)
        (async_update ? got_losses : want_losses).push_back(trainer.step().loss);
      trainer.check_weights_finite();  // waits for the last update, as a checkpoint does
      for (Param& p : parts.model->params())
        for (const Buffer* b : {&p.value, &p.m, &p.v})
          (async_update ? got : want).push_back(host_copy(be, *b));
    }
    CHECK(got_losses == want_losses);
    CHECK(test::bitwise_equal(got, want));
  }
}

TEST_CASE("weights on the host: both pools predicted to the byte", "[offload][weights][planner]") {
  for (const std::string* base : {&kLlama, &kGpt})
    for (const auto& s : kSettings)
      for (const char* tie : {"model.tie_embeddings=true", "model.tie_embeddings=false"}) {
        if (base == &kGpt && std::string(tie).find("false") != std::string::npos) continue;
        const std::vector<std::string> sets =
            base == &kLlama ? with(s, {tie, kWeights}) : with(s, {kWeights});
        INFO(fmt::format("{} | {}", base == &kLlama ? "llama" : "gpt", fmt::join(sets, " ")));
        const Config cfg = parse_config(*base, "weights-test", sets);
        const DryRun plan = test::cpu_test_planner(2, 1ull << 32).dry_run(cfg);
        const Record r = train(*base, sets, 2);
        CHECK(plan.peak.total_bytes == r.peak);
        CHECK(plan.host_peak.total_bytes == r.host_peak);
        CHECK(plan.host_updated_params == plan.n_params);
      }
}

TEST_CASE("weights on the host: at most two uses' weights on the device, and the copy volume",
          "[offload][weights]") {
  // Llama, full remat every block: the stream's uses are stem, blocks 0-2, head, then per block
  // from the last its recompute and its backward (the same weights: fetched once), then the
  // stem's backward (gradients only).
  const std::vector<std::string> sets = {"remat.policy=full", kWeights};
  const Config cfg = parse_config(kLlama, "weights-test", sets);
  cpu::CpuBackend be(1ull << 30, 2);
  RunParts parts = test::synthetic_run_parts(cfg, be);
  Model& model = *parts.model;
  const RematPlan plan = resolve_remat_plan(cfg, model);
  const std::vector<ParamUse> uses = step_uses(model, plan);
  REQUIRE(uses.size() == 1 + 3 + 1 + 2 * 3 + 1);
  CHECK(uses.back().values == false);
  CHECK(uses.back().grads == true);
  // The largest device weights any two consecutive uses hold together.
  uint64_t two_uses = 0;
  for (size_t k = 0; k + 1 < uses.size(); ++k) {
    std::vector<Param*> both = uses[k].params;
    for (Param* p : uses[k + 1].params)
      if (std::find(both.begin(), both.end(), p) == both.end()) both.push_back(p);
    two_uses = std::max(two_uses, bytes_of(both));
  }
  Trainer trainer(cfg.train, plan, be, model, *parts.data);
  trainer.step();
  be.reset_cost();
  be.pool().reset_peak();
  trainer.step();
  // The peak's weights are at most those of two neighbouring uses (accounted in 256 B units).
  const uint64_t most_weights =
      be.pool().peak_snapshot().by_category[static_cast<size_t>(MemCategory::Weights)];
  CHECK(most_weights > 0);
  CHECK(most_weights <= two_uses + 256 * model.params().size());

  // Fetched: the forward reads every weight once (stem, blocks, head), the backward each
  // block's once more; every gradient goes to the host once. The checkpoints of blocks 0 and 1
  // travel too (the last segment's stays).
  uint64_t all = 0, blocks = 0;
  for (Param& p : model.params()) all += p.value.tensor().bytes();
  for (size_t i = 0; i < model.n_blocks(); ++i) blocks += bytes_of(model.block_params(i));
  const double ckpt = 2.0 * 2 * 19 * 32 * 4;  // 2 checkpoints of (B, T, C) f32
  double to_host = 0, to_device = 0;
  for (int i = 0; i < kNumPhases; ++i) {
    to_host += be.cost(static_cast<Phase>(i)).to_host_bytes;
    to_device += be.cost(static_cast<Phase>(i)).to_device_bytes;
  }
  CHECK(to_device == static_cast<double>(all + blocks) + ckpt);
  CHECK(to_host == static_cast<double>(all) + ckpt);
}

TEST_CASE("weights on the host train on one rank, and the key and --policies entries read it",
          "[offload][weights][config]") {
  CHECK_THROWS_WITH(
      parse_config(kGpt, "t",
                   {"remat.policy=full", kWeights, "parallel.data=2", "train.batch_size=2"}),
      Catch::Contains("remat.offload") && Catch::Contains("one rank") && Catch::Contains("Fix"));
  CHECK_THROWS_WITH(parse_config(kGpt, "t", {kWeights}),
                    Catch::Contains("keeps none") && Catch::Contains("Fix"));
  const Config c = parse_config(kGpt, "t", {"remat.policy=full", kWeights});
  CHECK(c.remat.offloads_weights());
  CHECK(c.remat.offloads_optimizer());
  CHECK(parse_config(config_to_toml(c), "back").remat.offload ==
        OffloadKind::CheckpointsOptimizerWeights);
  const PolicyVariant v = parse_policy_variant("full:offload=checkpoints+optimizer+weights", "fit");
  REQUIRE(v.offload);
  CHECK(*v.offload == OffloadKind::CheckpointsOptimizerWeights);
}

TEST_CASE("auto moves the weights to the host when nothing else fits a GPU target",
          "[offload][weights][auto]") {
  // A model whose weights and gradients outweigh its activations: even with the checkpoints
  // and moments on the host, the device must hold them.
  const Config cfg = parse_config(
      "", "auto-weights",
      {"model.kind=\"llama\"", "model.n_layer=4", "model.n_embd=512", "model.n_head=8",
       "model.n_kv_head=2", "model.d_ff=2048", "model.vocab_size=32000", "train.seq_len=2048",
       "train.batch_size=1", "remat.policy=\"auto\"", "data.task=\"random\""});
  const auto gpu_planner = [&](uint64_t budget) {
    return Planner(plan_target(cfg, "h200", budget), test::synthetic_run_parts);
  };
  Config moments = with_block_plan(cfg, std::vector<std::string>(4, "full"));
  moments.remat.tile_tokens = auto_tile_tokens(2048).back();
  moments.remat.offload = OffloadKind::CheckpointsOptimizer;
  const uint64_t smallest = gpu_planner(1ull << 40).dry_run(moments, false).peak.total_bytes;
  const AutoPlan chosen = choose_auto(gpu_planner(smallest - 1), cfg);
  INFO(chosen.summary());
  CHECK(chosen.fits);
  CHECK(chosen.offload == OffloadKind::CheckpointsOptimizerWeights);
  CHECK_THAT(chosen.summary(), Catch::Contains("weights and gradients in host memory"));
  // The step's estimate counts AdamW on the host: 28 bytes per parameter at the assumed rate.
  Config at = with_auto_plan(cfg, chosen);
  const Planner planner = gpu_planner(smallest - 1);
  const DryRun run = planner.dry_run(at, false);
  CHECK(run.host_updated_params == run.n_params);
  const CopyTime t = copy_time(run, planner.target());
  CHECK(t.host_update_s == Approx(static_cast<double>(run.n_params) * 28 / 100e9));
  // The device waits for the stem's and block 0's updates (fetched one use ahead) and the norm;
  // the rest overlaps the forward.
  // wte (32000 x 512) and block 0: norms 2 x 512, q|k|v (8 + 2 x 2) x 64 x 512, proj 512 x 512,
  // gate, up and down 3 x 2048 x 512.
  CHECK(run.host_first_use_params ==
        32000 * 512 + 2 * 512 + 768 * 512 + 512 * 512 + 3 * 2048 * 512);
  DryRun without = run;
  without.host_updated_params = 0;
  const double waited = t.exposed_s - copy_time(without, planner.target()).exposed_s;
  CHECK(t.host_norm_s == Approx(static_cast<double>(run.n_params) * 4 / 100e9));
  CHECK(waited >=
        static_cast<double>(run.host_first_use_params) * 28 / 100e9 + t.host_norm_s - 1e-12);
  CHECK(waited <= t.host_update_s + t.host_norm_s + 1e-12);
}

TEST_CASE("CUDA attention chunks: automatic lengths, the loop order and the workspace they save",
          "[offload][chunks][planner]") {
  // Llama-3.1-8B's qkv (W = (32 + 2 x 8) x 128) at 1,157,817 tokens: past cuDNN's span, so
  // automatic chunks of at most 64k tokens, a multiple of 64, covering the row.
  const auto qkv = [](int64_t T, int64_t W) {
    return Tensor(reinterpret_cast<void*>(256), Dims{1, T, W}, DType::BF16);
  };
  const Tensor big = qkv(1157817, 6144);
  const AttentionChunks ch = cuda::attention_chunks(big, 0);
  CHECK(ch.chunked());
  CHECK(ch.L <= cuda::kAutoAttentionChunkTokens);
  CHECK(ch.L % 64 == 0);
  CHECK(ch.count() * ch.L >= 1157817);
  CHECK((ch.count() - 1) * ch.L < 1157817);
  // Within the span: unchunked, unless the config asks; a given length is kept (only the span
  // bounds it, not the automatic cap).
  CHECK_FALSE(cuda::attention_chunks(qkv(300000, 6144), 0).chunked());
  CHECK(cuda::attention_chunks(qkv(300000, 6144), 4096).L == 4096);
  CHECK(cuda::attention_chunks(big, 100032).L == 100032);
  CHECK(cuda::attention_chunks(big, 1 << 30).L == (cuda::kCudnnMaxSpan / 6144) / 64 * 64);
  // The row-long f32 sum is the narrower of dq and dk | dv: grouped-query attention keeps dk | dv
  // (2 x 8 x 128 = 2048 per token) over the row, multi-head attention dq.
  CHECK_FALSE(cuda::chunk_key_outer(4096, 2048));
  CHECK(cuda::chunk_key_outer(768, 1536));
  // The chunked backward's workspace against one unchunked call's f32 dq accumulator (T x C x
  // 4 B): below it for GQA (its row-long sum is dk | dv, half as wide), within one pair's
  // scratch (under 2 GiB at 64k-token chunks) above it for MHA (its row-long sum is dq itself).
  for (const auto& [W, NH, KVH] :
       std::vector<std::tuple<int64_t, int, int>>{{6144, 32, 8}, {3 * 1600, 25, 25}}) {
    const Tensor t = qkv(1157817, W);
    const cuda::AttentionWorkspaceLayout w =
        cuda::attention_workspace_layout(t, NH, KVH, true, true, 0);
    const uint64_t unchunked_dq = uint64_t{1157817} * (W / (NH + 2 * KVH)) * NH * 4;
    INFO("W " << W << ": chunked workspace " << w.total() << " B");
    CHECK(w.total() < unchunked_dq + (KVH < NH ? 0 : uint64_t{2} << 30));
    CHECK(w.dq_accum < unchunked_dq / 16);  // one pair's, not the row's
  }
}

TEST_CASE("auto pairs blocks into checkpoint segments when the host is full of checkpoints",
          "[offload][auto]") {
  // GPT-2 1.5B's shape at 1.5M tokens on an H200 with its 128 GiB host: every block's
  // checkpoint (2 x 1600 B per token, bf16) would take 215 GiB of host, so no plan of
  // one-block segments fits, offloaded or not; segments of two halve them.
  const Config cfg =
      parse_config("", "auto-every",
                   {"model.n_layer=48", "model.n_embd=1600", "model.n_head=25",
                    "model.position=\"rope\"", "model.vocab_size=50304", "train.seq_len=1500000",
                    "train.batch_size=1", "remat.policy=\"auto\"", "data.task=\"random\""});
  const Planner h200(plan_target(cfg, "h200", std::nullopt), test::synthetic_run_parts);
  const AutoPlan chosen = choose_auto(h200, cfg);
  INFO(chosen.summary());
  REQUIRE(chosen.fits);
  CHECK(chosen.every == 2);
  CHECK(chosen.offload != OffloadKind::None);
  CHECK_THAT(chosen.summary(), Catch::Contains("checkpoint segments of 2 blocks"));
  const Config run = with_auto_plan(cfg, chosen);
  CHECK(run.remat.every == 2);
  CHECK(h200.fits(h200.dry_run(run, false)));
  Config single = run;
  single.remat.every = 1;
  CHECK_FALSE(h200.fits(h200.dry_run(single, false)));
  // resolve_auto writes the segments into the config that runs.
  Config resolved = cfg;
  REQUIRE(resolve_auto(h200, resolved));
  CHECK(resolved.remat.every == 2);
}
