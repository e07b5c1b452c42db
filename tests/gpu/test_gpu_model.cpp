// GPU tests of whole models: a 20-step training run on both backends, remat policy equivalence on
// the GPU, cuDNN's plan workspaces against the planner's reserve, and the planner's predicted
// device peak against the measured one. The per-op rows (every CUDA op against the CPU) live with
// each op's test in tests/ops/ and are compiled into this binary too (tests/ops/backend_rows.h).
// Each test has a tag of its own besides [gpu], so that scripts/device-check.sh runs (and reports)
// them one by one. Without a CUDA device the binary prints "skipped: no CUDA device" and exits 77
// (ctest: skipped); listing (--list-tests, --list-tags, ...) works without one.
#define CATCH_CONFIG_RUNNER
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "data/synthetic.h"
#include "engine/config/config.h"
#include "engine/core/count_backend.h"
#include "engine/core/cuda_workspace.h"
#include "engine/cpu/blas_kernel.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda_api.h"
#include "engine/parallel/communicator.h"
#include "engine/parallel/context_ring.h"
#include "engine/parallel/gradient_sync.h"
#include "engine/training/checkpoint.h"
#include "engine/training/trainer.h"
#include "layers/models.h"
#include "tests/configs.h"
#include "tests/ops/backend_rows.h"
#include "tests/temp_dir.h"

namespace remat {
namespace {

using test::kCudaActivationTypes;
using test::Tolerance;

// The runs' [train], [data] and [remat] tables: 20 steps of the copy task, nothing recomputed.
const std::string kRunTables = R"([train]
seq_len = 64
batch_size = 4
steps = 20
lr = 3e-3
warmup_steps = 3
seed = 1337
[data]
task = "copy"
[remat]
policy = "none"
)";

const std::string kTinyToml =
    "[model]\n" +
    test::gpt_model_table(
        {.n_layer = 2, .n_head = 4, .n_embd = 64, .vocab_size = 64, .n_ctx = 128}) +
    kRunTables;

std::vector<double> train_losses(Backend& be, const Config& cfg) {
  auto model = make_model(cfg, be);
  auto data = make_synthetic_data(cfg);
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data);
  std::vector<double> losses;
  for (int64_t s = 0; s < cfg.train.steps; ++s) losses.push_back(trainer.step().loss);
  return losses;
}

void check_tracks(const std::string& what, const std::vector<double>& got,
                  const std::vector<double>& want, Tolerance tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(what << " step " << i + 1 << ": " << got[i] << " vs " << want[i]);
    CHECK(std::fabs(got[i] - want[i]) <= tol.atol + tol.rtol * std::fabs(want[i]));
  }
}

// bf16 training drifts from the f32 reference step by step (different roundings compound through
// AdamW); 20 steps of the tiny model stay within a few percent of the loss.
constexpr Tolerance kTrainBf16{.rtol = 0.03, .atol = 0.03};
constexpr Tolerance kTrainF32{.rtol = 0.01, .atol = 0.01};  // attention runs in bf16 in cuDNN
// Same backend, different policy: only cuDNN's non-deterministic attention backward differs.
constexpr Tolerance kPolicyRunToRun{.rtol = 2e-3, .atol = 2e-3};

/// 20 steps of `toml` with each of `variants` (and `common`) on the CPU, then on CUDA with each
/// activation type: CUDA's losses track the CPU's within kTrainBf16 / kTrainF32.
void check_cuda_tracks_cpu(const std::string& toml, const char* what,
                           const std::vector<std::vector<std::string>>& variants,
                           const std::vector<std::string>& common = {}) {
  for (const std::vector<std::string>& variant : variants) {
    std::vector<std::string> sets = common;
    sets.insert(sets.end(), variant.begin(), variant.end());
    Config cfg = parse_config(toml, "tracks(test)", sets);
    cpu::CpuBackend cpu(uint64_t{8} << 30, 0);
    const auto want = train_losses(cpu, cfg);
    for (DType act : kCudaActivationTypes) {
      cuda::CudaBackend gpu(DeviceConfig{}, act);
      check_tracks(fmt::format("{} {} {}", what, fmt::join(variant, " "), dtype_name(act)),
                   train_losses(gpu, cfg), want, act == DType::BF16 ? kTrainBf16 : kTrainF32);
    }
  }
}

}  // namespace

TEST_CASE("20 training steps on CUDA track the CPU losses (learned and rope positions)",
          "[gpu][training]") {
  check_cuda_tracks_cpu(kTinyToml, "gpt", {{"model.position=learned"}, {"model.position=rope"}});
}

namespace {

const char* kMlpToml = R"(
[model]
kind = "mlp"
n_layer = 4
n_embd = 64
[train]
batch_size = 256
steps = 8
lr = 1e-3
seed = 1337
[data]
task = "regression"
[remat]
policy = "none"
)";

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

}  // namespace

TEST_CASE("remat policies give bitwise-identical CUDA losses where every op is deterministic (MLP)",
          "[gpu][policies_bitwise]") {
  // The MLP uses cuBLASLt GEMMs and our fixed-order kernels only: recomputing a block gives the
  // same bits as the first forward, so every policy must give the same losses, bit for bit.
  for (DType act : kCudaActivationTypes) {
    INFO("activations " << dtype_name(act));
    Config none = parse_config(kMlpToml, "mlp(test)", {});
    Config full = parse_config(kMlpToml, "mlp(test)", {"remat.policy=full"});
    cuda::CudaBackend a(DeviceConfig{}, act), b(DeviceConfig{}, act);
    const auto want = train_losses(a, none), got = train_losses(b, full);
    CHECK(got == want);
  }
}

TEST_CASE("remat policies none and full give the same CUDA losses within cuDNN's run-to-run noise",
          "[gpu][policies]") {
  // Not bitwise: cuDNN's attention backward accumulates dQ with atomics (the deterministic
  // variant needs a workspace quadratic in T on Hopper), so even the same policy twice differs
  // in the last bits; kPolicyRunToRun bounds that. The observed difference is printed.
  Config none = parse_config(kTinyToml, "tiny(test)", {"train.steps=8"});
  Config full = parse_config(kTinyToml, "tiny(test)", {"train.steps=8", "remat.policy=full"});
  cuda::CudaBackend a(DeviceConfig{}, DType::BF16), b(DeviceConfig{}, DType::BF16);
  const auto want = train_losses(a, none), got = train_losses(b, full);
  std::printf("policies none vs full on CUDA (bf16): max |loss difference| over 8 steps %.3g\n",
              max_abs_diff(got, want));
  check_tracks("full vs none", got, want, kPolicyRunToRun);
}

TEST_CASE("a tiled MLP gives the untiled CUDA losses within cuDNN's run-to-run noise",
          "[gpu][tiling]") {
  // remat.tile_tokens runs LayerNorm 2 and the MLP over row chunks (views into the stream) with
  // the weight gradients summed over chunks, and dropout masks offset by the chunk's first row.
  for (const char* dropout : {"model.dropout=0", "model.dropout=0.1"}) {
    Config whole = parse_config(kTinyToml, "tiny(test)", {"train.steps=8", dropout});
    Config tiled =
        parse_config(kTinyToml, "tiny(test)", {"train.steps=8", dropout, "remat.tile_tokens=37"});
    cuda::CudaBackend a(DeviceConfig{}, DType::BF16), b(DeviceConfig{}, DType::BF16);
    const auto want = train_losses(a, whole), got = train_losses(b, tiled);
    std::printf("tile_tokens 37 vs untiled on CUDA (bf16, %s): max |loss difference| %.3g\n",
                dropout, max_abs_diff(got, want));
    check_tracks("tiled vs untiled", got, want, kPolicyRunToRun);
  }
}

TEST_CASE("offloaded checkpoints and moments give the CUDA losses of keeping them",
          "[gpu][offload]") {
  // The copies run on a second stream, ordered by events: a missing wait would show as garbage.
  // The MLP is deterministic on CUDA, so there offloading must not change a bit; the GPT (with
  // RoPE, whose bf16 backward rotates qkv in place) stays within cuDNN's run-to-run noise.
  for (DType act : kCudaActivationTypes) {
    for (const char* offload : {"checkpoints", "checkpoints+optimizer"}) {
      INFO("activations " << dtype_name(act) << ", offload " << offload);
      Config kept = parse_config(kMlpToml, "mlp(test)", {"remat.policy=full"});
      Config moved =
          parse_config(kMlpToml, "mlp(test)",
                       {"remat.policy=full", fmt::format("remat.offload=\"{}\"", offload)});
      cuda::CudaBackend a(DeviceConfig{}, act), b(DeviceConfig{}, act);
      const auto want = train_losses(a, kept), got = train_losses(b, moved);
      CHECK(got == want);
      CHECK(b.host_pool().peak_bytes() > 0);
    }
  }
  const std::vector<std::string> gpt = {"train.steps=8", "model.n_layer=4",
                                        "model.position=\"rope\"", "remat.policy=full"};
  std::vector<std::string> offloaded = gpt;
  offloaded.push_back("remat.offload=\"checkpoints+optimizer\"");
  cuda::CudaBackend a(DeviceConfig{}, DType::BF16), b(DeviceConfig{}, DType::BF16);
  const auto want = train_losses(a, parse_config(kTinyToml, "tiny(test)", gpt));
  const auto got = train_losses(b, parse_config(kTinyToml, "tiny(test)", offloaded));
  std::printf("offload vs keep on CUDA (bf16, RoPE): max |loss difference| over 8 steps %.3g\n",
              max_abs_diff(got, want));
  check_tracks("offloaded vs kept", got, want, kPolicyRunToRun);
}

namespace {

/// Every parameter's value and AdamW moments, as host floats, in model order.
std::vector<std::vector<float>> param_state(Backend& be, Model& model) {
  std::vector<std::vector<float>> out;
  for (Param& p : model.params())
    for (const Buffer* b : {&p.value, &p.m, &p.v}) out.push_back(test::fetch(be, b->tensor()));
  return out;
}

struct CudaRun {
  std::vector<double> losses;
  std::vector<std::vector<float>> state;
};

/// Steps [from, to) of `cfg` on a fresh CUDA backend, optionally resumed from checkpoint folder
/// `resume`, optionally ending with a checkpoint written under `save_dir`.
CudaRun cuda_train_range(const Config& cfg, DType act, int64_t from, int64_t to,
                         const std::string& resume, const std::string& save_dir) {
  cuda::CudaBackend be(DeviceConfig{}, act);
  auto model = make_model(cfg, be);
  auto data = make_synthetic_data(cfg);
  Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data);
  if (!resume.empty()) {
    Checkpoint ckpt(resume);
    ckpt.load_into(be, *model, /*with_optimizer=*/true);
    trainer.set_steps_done(ckpt.state().step);
  }
  REQUIRE(trainer.steps_done() == from);
  CudaRun run;
  while (trainer.steps_done() < to) run.losses.push_back(trainer.step().loss);
  if (!save_dir.empty()) {
    CheckpointState st;
    st.step = trainer.steps_done();
    st.config_toml = config_to_toml(cfg);
    write_checkpoint(save_dir, be, *model, st);
  }
  run.state = param_state(be, *model);
  return run;
}

}  // namespace

TEST_CASE("a CUDA run resumed from its checkpoint equals the run straight through, bit for bit",
          "[gpu][checkpoint]") {
  // The MLP is deterministic on CUDA, so 4 steps, a checkpoint, and 4 more on a fresh backend,
  // model and trainer must give the 8-step run's losses, weights and AdamW moments exactly: the
  // checkpoint stages device tensors through host memory, in both directions.
  const Config cfg = parse_config(kMlpToml, "mlp(test)", {});
  for (DType act : kCudaActivationTypes) {
    INFO("activations " << dtype_name(act));
    test::TempDir tmp("gpu-ckpt");
    const CudaRun whole = cuda_train_range(cfg, act, 0, 8, "", "");
    const CudaRun first = cuda_train_range(cfg, act, 0, 4, "", tmp / "ckpt");
    const std::string mid = latest_checkpoint(tmp / "ckpt");
    REQUIRE(mid == tmp / "ckpt/step_00000004");
    const CudaRun second = cuda_train_range(cfg, act, 4, 8, mid, "");
    std::vector<double> losses = first.losses;
    losses.insert(losses.end(), second.losses.begin(), second.losses.end());
    CHECK(losses == whole.losses);
    CHECK(second.state == whole.state);

    // The same checkpoint opens on either backend with the weights and moments the GPU had when
    // it wrote them (fresh models start from the seed's weights and zero moments, so a load that
    // did nothing would not match).
    cpu::CpuBackend cpu(uint64_t{1} << 30, 1);
    auto model = make_model(cfg, cpu);
    Checkpoint(mid).load_into(cpu, *model, /*with_optimizer=*/true);
    CHECK(param_state(cpu, *model) == first.state);
    cuda::CudaBackend gpu(DeviceConfig{}, act);
    auto gpu_model = make_model(cfg, gpu);
    Checkpoint(mid).load_into(gpu, *gpu_model, /*with_optimizer=*/true);
    CHECK(param_state(gpu, *gpu_model) == first.state);
  }
}

namespace {

// Builds the plan of one attention call and checks its workspace against the planner's reserve
// for that shape, printing both (scripts/device-check.sh keeps the "cuDNN plan workspace" lines:
// the figures the reserve should follow once a device has measured them).
void check_plan_workspace(cuda::CudaBackend& gpu, const char* what, const cuda::AttentionShape& s,
                          bool backward) {
  const auto reserve =
      cuda::cudnn_plan_reserve_bytes(s.B, s.NH, s.kv_heads(), s.key_rows(), s.HS, backward);
  INFO(what << (backward ? " backward" : " forward"));
  int64_t ws = -1;
  REQUIRE_NOTHROW(ws = gpu.attention_plan_workspace_bytes(s, backward));
  std::printf("cuDNN plan workspace %s %s: %lld bytes (reserve %llu)\n", what,
              backward ? "backward" : "forward", static_cast<long long>(ws),
              static_cast<unsigned long long>(reserve));
  CHECK(ws <= static_cast<int64_t>(reserve));
}

}  // namespace

TEST_CASE("cuDNN's attention plans need no more workspace than the planner reserves (GPT-2 shapes)",
          "[gpu][cudnn_workspace]") {
  cuda::CudaBackend gpu(DeviceConfig{}, DType::BF16);
  struct Shape {
    const char* model;
    int64_t NH, HS;
  };
  for (const Shape& m : {Shape{"gpt2-124m", 12, 64}, Shape{"gpt2-350m", 16, 64}}) {
    for (int64_t T : {int64_t{4096}, int64_t{32768}}) {
      for (bool bwd : {false, true}) {
        const std::string what = fmt::format("{} T={}", m.model, T);
        check_plan_workspace(gpu, what.c_str(), {1, m.NH, T, m.HS}, bwd);
      }
    }
  }
}

TEST_CASE("cuDNN's attention plans fit the planner's reserve at Llama's grouped-query shapes",
          "[gpu][cudnn_workspace]") {
  // Llama-3.1-8B's attention: 32 query heads, 8 key/value heads of 128. Its grouped backward forms
  // each query head's dK and dV before the sum over the group; if cuDNN keeps them in its
  // workspace that is 64 MiB at 4k keys and 1 GiB at 64k (cudnn_plan_reserve_bytes reserves it).
  // Then the pairs attention over chunks makes: an off-diagonal pair (no mask) of 8192 queries
  // against 65536 keys, and a last query chunk of 1000 rows against a full key chunk.
  cuda::CudaBackend gpu(DeviceConfig{}, DType::BF16);
  const int64_t NH = 32, KVH = 8, HS = 128;
  for (bool bwd : {false, true}) {
    check_plan_workspace(gpu, "llama-3.1-8b T=4096", {1, NH, 4096, HS, KVH}, bwd);
    check_plan_workspace(gpu, "llama-3.1-8b T=65536", {1, NH, 65536, HS, KVH}, bwd);
    check_plan_workspace(gpu, "llama-3.1-8b pair 8192x65536 unmasked",
                         {1, NH, 8192, HS, KVH, 65536, false}, bwd);
    check_plan_workspace(gpu, "llama-3.1-8b pair 1000x8192 unmasked",
                         {1, NH, 1000, HS, KVH, 8192, false}, bwd);
  }
}

// What a deterministic attention backward could use: cuDNN's engines for the backward graph, which
// of them its notes call deterministic, and the workspace each needs beside the reserve. The
// table is for the device run's log; the assertions tie the survey to the engine in use.
TEST_CASE("cuDNN's engine survey lists the attention backward's options, the one in use first",
          "[gpu][cudnn_engines]") {
  cuda::CudaBackend gpu(DeviceConfig{}, DType::BF16);
  const auto reserve =
      static_cast<int64_t>(cuda::cudnn_plan_reserve_bytes(1, 12, 12, 4096, 64, true));
  for (int64_t T : {int64_t{4096}, int64_t{32768}}) {
    const std::vector<cuda::EngineOption> options =
        gpu.attention_engine_survey(1, 12, T, 64, /*backward=*/true);
    REQUIRE_FALSE(options.empty());
    const cuda::EngineOption* used = nullptr;
    for (const cuda::EngineOption& o : options) {
      std::printf("cuDNN engine survey GPT-2 124M T=%lld backward: %s engine %lld, %s, %s\n",
                  static_cast<long long>(T), o.label.c_str(), static_cast<long long>(o.engine),
                  o.deterministic ? "deterministic" : "non-deterministic",
                  o.finalizes ? fmt::format("workspace {} bytes", o.workspace_bytes).c_str()
                              : ("no plan: " + o.why_not).c_str());
      if (!used && o.finalizes && o.workspace_bytes <= reserve) used = &o;
    }
    REQUIRE(used != nullptr);
    CHECK(used->workspace_bytes == gpu.attention_plan_workspace_bytes({1, 12, T, 64}, true));
  }
}

namespace {

/// One step of `toml` with each of `settings` (and `extra`) on CUDA against the planner's dry run
/// (CountBackend): the device and host pools' peaks to the byte. cuDNN's plan workspace is a
/// reserve sized from the shapes on both sides (engine/core/cuda_workspace.h), so nothing the GPU
/// decides at run time enters the peak.
void check_planner_peaks(const std::string& toml,
                         const std::vector<std::vector<std::string>>& settings,
                         const std::vector<std::string>& extra = {}) {
  for (std::vector<std::string> sets : settings) {
    const std::string policy = fmt::format("{}", fmt::join(sets, " "));
    sets.push_back("train.steps=1");
    sets.insert(sets.end(), extra.begin(), extra.end());
    Config cfg = parse_config(toml, "planner(test)", sets);
    cuda::CudaBackend gpu(DeviceConfig{}, DType::BF16);
    CountBackend count(CountTarget{DeviceKind::Cuda, DType::BF16, 1}, gpu.pool().budget_bytes());
    train_losses(gpu, cfg);
    train_losses(count, cfg);
    const uint64_t measured = gpu.pool().peak_bytes(), predicted = count.pool().peak_bytes();
    INFO(policy << ": measured " << measured << " predicted " << predicted);
    CHECK(measured == predicted);
    CHECK(gpu.host_pool().peak_bytes() == count.host_pool().peak_bytes());
  }
}

}  // namespace

TEST_CASE("the planner predicts the CUDA pool's peak to the byte", "[gpu][planner]") {
  check_planner_peaks(kTinyToml, {{"remat.policy=none"},
                                  {"remat.policy=full"},
                                  {"remat.policy=full", "remat.tile_tokens=37"},
                                  {"remat.policy=full", "model.n_layer=4",
                                   "remat.offload=\"checkpoints+optimizer\""}});
}

namespace {

// The Llama family with every option on: grouped-query attention (4 query heads on 2 key/value
// heads), head_dim apart from n_embd / n_head, q/k/v biases, the q/k norm, an untied head and
// llama3 RoPE scaling whose band edges fall among the trained positions' frequencies.
const std::string kLlamaToml =
    "[model]\n" +
    test::llama_model_table(test::every_llama_option({.head_dim = 24,
                                                      .n_embd = 64,
                                                      .d_ff = 160,
                                                      .vocab_size = 64,
                                                      .rope_theta = 500000.0,
                                                      .llama3_context = 16})) +
    kRunTables;

}  // namespace

TEST_CASE("20 llama training steps on CUDA track the CPU losses (GQA, q/k norm, biases, scaling)",
          "[gpu][llama_training]") {
  check_cuda_tracks_cpu(
      kLlamaToml, "llama",
      {{}, {"model.qk_norm=false", "model.n_kv_head=1", "model.tie_embeddings=true"}});
}

TEST_CASE(
    "llama: remat policies, tiling and offload give the CUDA losses of none within cuDNN's "
    "run-to-run noise",
    "[gpu][llama_policies]") {
  Config none = parse_config(kLlamaToml, "llama(test)", {"train.steps=8"});
  cuda::CudaBackend a(DeviceConfig{}, DType::BF16);
  const auto want = train_losses(a, none);
  for (const std::vector<std::string>& sets : std::vector<std::vector<std::string>>{
           {"remat.policy=full"},
           {"remat.policy=save_dots"},
           {"remat.policy=full", "remat.tile_tokens=37"},
           {"remat.policy=full", "remat.offload=\"checkpoints+optimizer\""}}) {
    std::vector<std::string> with = sets;
    with.push_back("train.steps=8");
    Config cfg = parse_config(kLlamaToml, "llama(test)", with);
    cuda::CudaBackend b(DeviceConfig{}, DType::BF16);
    const auto got = train_losses(b, cfg);
    std::printf("llama %s vs none on CUDA (bf16): max |loss difference| over 8 steps %.3g\n",
                fmt::format("{}", fmt::join(sets, " ")).c_str(), max_abs_diff(got, want));
    check_tracks(fmt::format("{}", fmt::join(sets, " ")), got, want, kPolicyRunToRun);
  }
}

TEST_CASE("llama: the planner predicts the CUDA pool's peak to the byte", "[gpu][llama_planner]") {
  check_planner_peaks(kLlamaToml,
                      {{"remat.policy=none"},
                       {"remat.policy=full", "remat.tile_tokens=37"},
                       {"remat.policy=save_attn", "remat.offload=\"checkpoints+optimizer\""}});
}

// LoRA (docs/lora.md) on the llama above: rank 4 on every linear, adapter dropout, the final norm
// and the LM head trained whole, every other weight frozen (a random base: the adapters' path is
// what these rows check).
const std::vector<std::string> kLora = {"lora.rank=4", "lora.alpha=8", "lora.dropout=0.1",
                                        "lora.modules_to_save=[\"norm\",\"lm_head\"]"};

TEST_CASE("lora: 20 llama training steps on CUDA track the CPU losses (adapters, frozen base)",
          "[gpu][lora_training]") {
  check_cuda_tracks_cpu(kLlamaToml, "lora", {{}, {"remat.policy=full", "remat.tile_tokens=37"}},
                        kLora);
}

TEST_CASE("lora: the planner predicts the CUDA pools' peaks to the byte", "[gpu][lora_planner]") {
  check_planner_peaks(
      kLlamaToml,
      {{"remat.policy=none"},
       {"remat.policy=full", "remat.tile_tokens=37"},
       {"remat.policy=save_attn", "remat.offload=\"checkpoints+optimizer+weights\""}},
      kLora);
}

TEST_CASE("lora: a bf16 and an NF4 base on CUDA track the CPU losses, and are planned to the byte",
          "[gpu][lora][nf4]") {
  // The base's linears stored as lora.base says: bf16 read by cuBLASLt as it is (bf16
  // activations), NF4 decoded by engine/cuda/nf4.cu into each GEMM's workspace. The CPU decodes
  // the same bytes to the same f32 values, so the runs differ by the GEMMs' rounding alone.
  for (const char* base : {"lora.base=\"bf16\"", "lora.base=\"nf4\""}) {
    std::vector<std::string> sets = kLora;
    sets.push_back(base);
    const Config cfg = parse_config(kLlamaToml, "llama(test)", sets);
    cpu::CpuBackend cpu(uint64_t{8} << 30, 0);
    const auto want = train_losses(cpu, cfg);
    for (DType act : kCudaActivationTypes) {
      cuda::CudaBackend gpu(DeviceConfig{}, act);
      check_tracks(fmt::format("lora {} {}", base, dtype_name(act)), train_losses(gpu, cfg), want,
                   act == DType::BF16 ? kTrainBf16 : kTrainF32);
    }
    check_planner_peaks(kLlamaToml, {{"remat.policy=full", "remat.tile_tokens=37"}}, sets);
  }
}

TEST_CASE("weights, gradients and moments on the host give the CUDA losses of keeping them",
          "[gpu][weights]") {
  // The weights come in on the copy stream ahead of each block and the gradients go out after
  // it: a missing wait would show as garbage. Step 1's loss comes before any update, so it is
  // bitwise the kept run's on the deterministic MLP; after that the host's AdamW (the CPU code)
  // may round an update's last bit differently from the device kernel.
  const char* weights = "remat.offload=\"checkpoints+optimizer+weights\"";
  for (DType act : kCudaActivationTypes) {
    INFO("activations " << dtype_name(act));
    Config kept = parse_config(kMlpToml, "mlp(test)", {"remat.policy=full"});
    Config moved = parse_config(kMlpToml, "mlp(test)", {"remat.policy=full", weights});
    cuda::CudaBackend a(DeviceConfig{}, act), b(DeviceConfig{}, act);
    const auto want = train_losses(a, kept), got = train_losses(b, moved);
    REQUIRE(got.size() == want.size());
    CHECK(got.front() == want.front());
    std::printf("mlp weights on the host vs kept on CUDA (%s): max |loss difference| %.3g\n",
                dtype_name(act), max_abs_diff(got, want));
    check_tracks("mlp weights on the host", got, want, kPolicyRunToRun);
    CHECK(b.pool().live_bytes(MemCategory::Weights) == 0);
  }
  for (const std::string* toml : {&kTinyToml, &kLlamaToml}) {
    const std::vector<std::string> base = {"train.steps=8", "remat.policy=full"};
    std::vector<std::string> moved = base;
    moved.push_back(weights);
    cuda::CudaBackend a(DeviceConfig{}, DType::BF16), b(DeviceConfig{}, DType::BF16);
    const auto want = train_losses(a, parse_config(*toml, "weights(test)", base));
    const auto got = train_losses(b, parse_config(*toml, "weights(test)", moved));
    std::printf("%s weights on the host vs kept on CUDA (bf16): max |loss difference| %.3g\n",
                toml == &kTinyToml ? "gpt" : "llama", max_abs_diff(got, want));
    check_tracks("weights on the host", got, want, kPolicyRunToRun);
  }
}

TEST_CASE("with the weights on the host the planner predicts both CUDA pools to the byte",
          "[gpu][weights][planner]") {
  for (const std::string* toml : {&kTinyToml, &kLlamaToml})
    check_planner_peaks(*toml,
                        {{"remat.policy=full"},
                         {"remat.policy=save_attn", "remat.tile_tokens=37"},
                         {"remat.policy=full", "remat.every=2"}},
                        {"remat.offload=\"checkpoints+optimizer+weights\""});
}

TEST_CASE("a single-rank NCCL communicator sums the gradients of one rank into themselves",
          "[gpu][nccl]") {
  // The NCCL path of data parallel on the one-GPU device: bootstrapped through a one-rank
  // communicator, every block's gradients all-reduced on NCCL's stream and ordered back before
  // the optimizer. Over one rank the sum is the gradient itself, bit for bit.
  Config cfg = parse_config(kTinyToml, "tiny(test)", {"train.steps=3"});
  cuda::CudaBackend gpu(DeviceConfig{}, DType::BF16);
  auto model = make_model(cfg, gpu);
  std::unique_ptr<parallel::Communicator> one = parallel::make_single_rank();
  std::unique_ptr<parallel::GradientSync> sync = cuda::make_nccl_sync(gpu, *model, *one);
  CHECK(std::string(sync->describe()) == "all-reduced by NCCL");
  CHECK(sync->sent_bytes_per_step() == 0);
  std::vector<std::vector<float>> before;
  uint64_t stream = 1;
  for (Param& p : model->params()) {
    // Device memory: through upload and fetch, never read or written from the host directly.
    Buffer g = test::upload(gpu, p.grad.tensor().shape, DType::F32,
                            test::host_randn(p.grad.tensor().numel(), stream++));
    gpu.copy(p.grad, g);
    before.push_back(test::fetch(gpu, p.grad));
  }
  for (size_t i = model->n_blocks(); i-- > 0;) sync->block_done(i);
  sync->finish();
  size_t k = 0;
  for (Param& p : model->params()) {
    INFO(p.name);
    CHECK(test::fetch(gpu, p.grad) == before[k++]);
  }
  INFO(cuda::nccl_version());
  CHECK(cuda::nccl_version().rfind("NCCL 2.", 0) == 0);
}

TEST_CASE("a single-rank NCCL ring channel passes a block to itself in stream order",
          "[gpu][nccl]") {
  // Context parallel's transport on the one-GPU device: over one rank the next and the previous
  // rank are the rank itself. The block is written by a compute-stream op just before the exchange
  // starts, and read by one just after wait(): the channel's events must order both.
  cuda::CudaBackend gpu(DeviceConfig{}, DType::BF16);
  std::unique_ptr<parallel::Communicator> one = parallel::make_single_rank();
  std::unique_ptr<parallel::RingChannel> ring = cuda::make_nccl_ring_channel(gpu, *one);
  CHECK(ring->size() == 1);
  CHECK(ring->rank() == 0);
  const int64_t n = int64_t{1} << 22;
  const std::vector<float> host = test::host_randn(n, 7);
  Buffer src = test::upload(gpu, {n}, DType::F32, host);
  Buffer send = test::upload(gpu, {n}, DType::F32, std::vector<float>(static_cast<size_t>(n), 0));
  Buffer recv = test::upload(gpu, {n}, DType::F32, std::vector<float>(static_cast<size_t>(n), -1));
  Buffer after = test::upload(gpu, {n}, DType::F32, std::vector<float>(static_cast<size_t>(n), -2));
  gpu.copy(send, src);
  parallel::Request r = ring->start(send.f32(), n, recv.f32(), n);
  ring->wait(r);
  gpu.copy(after, recv);
  CHECK(test::fetch(gpu, after) == host);
  CHECK(r.id == 0);
}

TEST_CASE("ZeRO-1 over NCCL on one rank trains like the unsharded trainer", "[gpu][nccl]") {
  // The sharded path on the one-GPU device: NCCL reduce-scatters of padded buckets, the update of
  // this rank's shards, all-gathers of the weights, and the moments gathered for a checkpoint
  // through host memory. Over one rank every shard is the whole bucket, so the run must track the
  // unsharded one (not bit for bit: cuDNN's attention backward accumulates with atomics). The
  // multi-rank layout is checked on the CPU ("gradient buckets hold every float once ...").
  Config cfg = parse_config(kTinyToml, "tiny(test)", {"train.steps=4"});
  cfg.parallel.bucket_bytes = 4096;  // parameters cut over buckets, buckets holding several
  std::unique_ptr<parallel::Communicator> one = parallel::make_single_rank();
  struct Run {
    std::vector<double> losses;
    std::vector<float> weights, m, v;  // every parameter's, in model order
    uint64_t peak = 0;
  };
  auto train = [&](Backend& be, bool shard, parallel::Communicator* comm) {
    auto model = make_model(cfg, be);
    auto data = make_synthetic_data(cfg);
    DataParallel dp;
    dp.shard_optimizer = shard;
    dp.comm = comm;
    dp.bucket_bytes = cfg.parallel.bucket_bytes;
    Trainer trainer(cfg.train, resolve_remat_plan(cfg, *model), be, *model, *data, dp);
    REQUIRE((trainer.sharded_moments() != nullptr) == shard);
    if (shard && comm) CHECK(trainer.gradient_sync().find("NCCL") != std::string::npos);
    Run r;
    for (int64_t s = 0; s < cfg.train.steps; ++s) r.losses.push_back(trainer.step().loss);
    r.peak = be.pool().peak_bytes();
    if (!be.computes()) return r;
    for (Param& p : model->params()) {
      const auto append = [](std::vector<float>& to, const std::vector<float>& x) {
        to.insert(to.end(), x.begin(), x.end());
      };
      append(r.weights, test::fetch(be, p.value));
      for (int moment : {0, 1}) {
        std::vector<float> whole(static_cast<size_t>(p.value.tensor().numel()));
        if (shard)
          trainer.sharded_moments()->gather(p, moment, whole.data());
        else
          whole = test::fetch(be, moment == 0 ? p.m : p.v);
        append(moment == 0 ? r.m : r.v, whole);
      }
    }
    return r;
  };
  cuda::CudaBackend a(DeviceConfig{}, DType::BF16), b(DeviceConfig{}, DType::BF16);
  const Run plain = train(a, false, nullptr), sharded = train(b, true, one.get());
  check_tracks("sharded vs unsharded", sharded.losses, plain.losses, kPolicyRunToRun);
  // Whole vectors, not elements (run-to-run noise in tiny values is large relative to them); a
  // piece updated twice, not at all or gathered to the wrong place differs by about the norm.
  auto relative_l2 = [](const std::vector<float>& got, const std::vector<float>& want) {
    REQUIRE(got.size() == want.size());
    double diff = 0, norm = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      diff += std::pow(static_cast<double>(got[i]) - want[i], 2);
      norm += std::pow(static_cast<double>(want[i]), 2);
    }
    REQUIRE(norm > 0);
    return std::sqrt(diff / norm);
  };
  CHECK(relative_l2(sharded.weights, plain.weights) <= 1e-3);
  CHECK(relative_l2(sharded.m, plain.m) <= 1e-2);
  CHECK(relative_l2(sharded.v, plain.v) <= 1e-2);
  // The planner's dry run of the sharded step (the NCCL slot, the moments' shards) to the byte.
  CountBackend count(CountTarget{DeviceKind::Cuda, DType::BF16, 1}, b.pool().budget_bytes());
  CHECK(train(count, true, nullptr).peak == sharded.peak);
}

}  // namespace remat

namespace {

bool only_lists(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--list", 6) == 0) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (remat::cuda::device_count() == 0 && !only_lists(argc, argv)) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  std::printf("%s\n", remat::cuda::version_string().c_str());
  remat::cpu::select_blas_kernel();  // the CPU reference runs the kernel a user's run would
  return Catch::Session().run(argc, argv);
}
