// PEFT LoRA adapters in and out (engine/model_files/peft, engine/training/lora_checkpoint,
// `train --init-adapter`, `export --adapter`, `export --hf` of a LoRA run; docs/lora.md), against
// peft 0.17.1 itself: the goldens tests/golden/hf/llama-lora and gpt2-lora (scripts/hf_golden.py)
// hold a base model, a PEFT adapter on it with random A and B and perturbed modules_to_save, and
// the PeftModel's loss and the gradient of every trainable tensor.
//
// Tolerances: our fp32 against peft's fp32, the loss within 1e-5 relative (the issue's bound;
// measured 3e-8 to 2e-7) and every adapter gradient within 1e-5 of its tensor's largest entry
// (measured below 1e-6), as the transformers goldens of tests/test_hf.cpp. A name, a row range,
// the scale or a transpose mapped wrong moves them by O(1).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "engine/config/config.h"
#include "engine/config/lora.h"
#include "engine/core/error.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/model_files/hf_weights.h"
#include "engine/model_files/peft.h"
#include "engine/model_files/safetensors.h"
#include "engine/remat/executor.h"
#include "layers/models.h"
#include "tests/cli_util.h"
#include "tests/shard_files.h"
#include "tests/temp_dir.h"
#include "tests/test_util.h"

namespace remat::test {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

const fs::path kGoldenDir = fs::path(REMAT_SOURCE_DIR) / "tests/golden/hf";

Json read_json(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE(in.good());
  return Json::parse(in);
}

std::string toml_strings(const Json& names) {
  std::vector<std::string> q;
  for (const Json& n : names) q.push_back(fmt::format("\"{}\"", n.get<std::string>()));
  return fmt::format("[{}]", fmt::join(q, ","));
}

// The [lora] keys of a golden's adapter, as --set overrides.
std::vector<std::string> lora_sets(const Json& meta) {
  const Json& l = meta["lora"];
  return {fmt::format("train.seq_len={}", meta["T"].get<int64_t>()),
          fmt::format("train.batch_size={}", meta["B"].get<int64_t>()),
          fmt::format("lora.rank={}", l["r"].get<int64_t>()),
          fmt::format("lora.alpha={}", l["lora_alpha"].get<double>()),
          fmt::format("lora.rslora={}", l["use_rslora"].get<bool>()),
          fmt::format("lora.targets={}", toml_strings(l["target_modules"])),
          fmt::format("lora.modules_to_save={}", toml_strings(l["modules_to_save"]))};
}

struct Golden {
  fs::path dir;
  Json meta;
  safetensors::Reader tensors;
  explicit Golden(const std::string& name)
      : dir(kGoldenDir / name),
        meta(read_json(dir / "golden.json")),
        tensors((dir / "golden.safetensors").string()) {}
  std::vector<float> tensor(const std::string& n) const {
    const safetensors::TensorInfo* t = tensors.find(n);
    REQUIRE(t != nullptr);
    std::vector<float> v(t->bytes() / 4);
    REQUIRE(safetensors::to_f32(t->dtype, tensors.data(*t), v.size(), v.data()));
    return v;
  }
  Batch batch(Backend& be) const {
    const int64_t B = meta["B"], T = meta["T"];
    Batch b;
    b.inputs = be.pool().allocate({B, T}, DType::I32, MemCategory::Transient, "inputs");
    b.targets = be.pool().allocate({B, T}, DType::I32, MemCategory::Transient, "targets");
    for (int64_t r = 0; r < B; ++r)
      for (int64_t i = 0; i < T; ++i) {
        const Json& row = meta["tokens"][static_cast<size_t>(r)];
        b.inputs.tensor().i32()[r * T + i] = row[static_cast<size_t>(i)].get<int32_t>();
        b.targets.tensor().i32()[r * T + i] = row[static_cast<size_t>(i + 1)].get<int32_t>();
      }
    b.n_tokens = B * T;
    return b;
  }
};

// A LoRA model of the golden: the base from its folder, the adapter from its adapter/ folder.
struct LoraModel {
  Config cfg;
  std::unique_ptr<cpu::CpuBackend> be;
  std::unique_ptr<Model> model;
};
LoraModel load_lora(const Golden& g, const std::vector<std::string>& extra = {}) {
  LoraModel l;
  std::vector<std::string> sets = lora_sets(g.meta);
  sets.insert(sets.end(), extra.begin(), extra.end());
  l.cfg = load_config("hf:" + g.dir.string(), sets);
  l.be = std::make_unique<cpu::CpuBackend>(1ull << 30, kTestThreads);
  l.model = make_model(l.cfg, *l.be);
  hf::load_weights(g.dir.string(), l.cfg.model, *l.be, *l.model);
  const auto values = peft::read_adapter((g.dir / "adapter").string(), l.cfg.model, l.cfg.lora);
  for (Param& p : l.model->params())
    if (const auto it = values.find(p.name); it != values.end())
      l.be->upload(p.value, it->second.data());
  return l;
}

std::vector<float> values_of(Model& m, const std::string& name, bool grad = false) {
  for (Param& p : m.params())
    if (p.name == name) return to_host(grad ? p.grad.tensor() : p.value.tensor());
  FAIL("no parameter " << name);
  return {};
}

void check_against_peft(const std::string& name) {
  const Golden g(name);
  LoraModel l = load_lora(g);
  for (Param& p : l.model->params())
    if (p.trainable()) l.be->fill(p.grad, 0.0f);
  const StepLoss loss =
      forward_backward(*l.be, *l.model, resolve_remat_plan(l.cfg, *l.model), g.batch(*l.be));
  const double want = g.meta["loss"];
  INFO(fmt::format("{}: loss {:.9g}, peft's {:.9g}", name, loss.mean, want));
  CHECK(std::abs(loss.mean - want) <= 1e-5 * std::abs(want));
  size_t compared = 0;
  for (const peft::AdapterTensor& t : peft::adapter_tensors(l.cfg.model, l.cfg.lora)) {
    const std::vector<float> ours = values_of(*l.model, t.ours, true);
    const std::vector<float> theirs = g.tensor(t.theirs);
    REQUIRE(ours.size() == theirs.size());
    double max_abs = 0, max_diff = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
      max_abs = std::max(max_abs, std::abs(static_cast<double>(theirs[i])));
      max_diff = std::max(max_diff, std::abs(static_cast<double>(ours[i]) - theirs[i]));
    }
    INFO(t.theirs << ": max |diff| " << max_diff << " of max |grad| " << max_abs);
    CHECK(max_diff <= 1e-5 * max_abs);
    ++compared;
  }
  CHECK(compared == g.meta["gradients"].size());  // every trainable tensor peft has
  // Frozen: the base has no gradient.
  for (Param& p : l.model->params())
    if (!lora::is_adapter_name(p.name) && p.frozen) CHECK(p.grad.tensor().empty());
}

}  // namespace

TEST_CASE("peft golden: our loss and adapter gradients are peft's, Llama", "[peft][golden]") {
  check_against_peft("llama-lora");
}
TEST_CASE("peft golden: our loss and adapter gradients are peft's, GPT-2 (Conv1D, rslora)",
          "[peft][golden]") {
  check_against_peft("gpt2-lora");
}

TEST_CASE("peft: an adapter written back is the one read, bit for bit, with peft's config",
          "[peft]") {
  for (const char* name : {"llama-lora", "gpt2-lora"}) {
    INFO(name);
    const Golden g(name);
    LoraModel l = load_lora(g);
    TempDir out("peft-out");
    peft::write_adapter(out.str(), l.cfg.model, l.cfg.lora, "/base/path",
                        [&](const std::string& n) { return values_of(*l.model, n); });
    const safetensors::Reader theirs((g.dir / "adapter" / peft::kWeightsFile).string());
    const safetensors::Reader ours(out / peft::kWeightsFile);
    REQUIRE(ours.tensors().size() == theirs.tensors().size());
    for (const safetensors::TensorInfo& t : theirs.tensors()) {
      const safetensors::TensorInfo* o = ours.find(t.name);
      REQUIRE(o != nullptr);
      CHECK(o->shape == t.shape);
      CHECK(std::memcmp(ours.data(*o), theirs.data(t), t.bytes()) == 0);
    }
    const Json a = read_json(g.dir / "adapter" / peft::kConfigFile);
    const Json b = read_json(out / peft::kConfigFile);
    for (const char* key : {"r", "lora_alpha", "use_rslora", "fan_in_fan_out", "peft_type",
                            "task_type", "bias", "modules_to_save"})
      CHECK(a[key] == b[key]);
    CHECK(b["base_model_name_or_path"] == "/base/path");
    // Read back by our own reader: the same run.
    CHECK(peft::read_adapter(out.str(), l.cfg.model, l.cfg.lora).size() ==
          peft::adapter_tensors(l.cfg.model, l.cfg.lora).size());
  }
}

TEST_CASE("peft: the merged weights (W + s B A) give peft's loss", "[peft][golden]") {
  for (const char* name : {"llama-lora", "gpt2-lora"}) {
    INFO(name);
    const Golden g(name);
    const std::vector<std::string> sets = lora_sets(g.meta);
    const Config with = load_config("hf:" + g.dir.string(), sets);
    const Config plain =
        load_config("hf:" + g.dir.string(), {sets[0], sets[1]});  // the same model, no LoRA
    cpu::CpuBackend be(1ull << 30, kTestThreads);
    auto model = make_model(plain, be);
    const auto adapter = peft::read_adapter((g.dir / "adapter").string(), with.model, with.lora);
    const hf::FolderReader base(g.dir.string(), with.model);
    for (Param& p : model->params()) {
      std::vector<float> w = adapter.count(p.name) ? adapter.at(p.name) : base.read(p.name);
      for (const lora::Site& s : lora::select_sites(with.model, with.lora.targets).sites)
        if (s.base == p.name)
          peft::merge(w, s, adapter.at(s.a_name), adapter.at(s.b_name), with.lora.rank,
                      lora::scaling(with.lora));
      be.upload(p.value, w.data());
    }
    const StepLoss loss = forward_loss(be, *model, g.batch(be));
    const double want = g.meta["loss"];
    INFO(fmt::format("merged loss {:.9g}, peft's {:.9g}", loss.mean, want));
    CHECK(std::abs(loss.mean - want) <= 1e-5 * std::abs(want));
  }
}

namespace {

// A copy of the llama-lora adapter folder with its config edited by `edit`.
std::string adapter_with(const TempDir& tmp, const std::function<void(Json&)>& edit) {
  const fs::path src = kGoldenDir / "llama-lora/adapter";
  const fs::path dst = tmp.path / "adapter";
  fs::create_directories(dst);
  fs::copy_file(src / peft::kWeightsFile, dst / peft::kWeightsFile);
  Json j = read_json(src / peft::kConfigFile);
  edit(j);
  std::ofstream(dst / peft::kConfigFile) << j.dump(2);
  return dst.string();
}

// A copy of the llama-lora adapter folder whose tensors `edit` changes (names, shapes, dropped).
std::string adapter_tensors_with(
    const TempDir& tmp, const std::function<void(std::vector<safetensors::TensorInfo>&)>& edit) {
  const fs::path src = kGoldenDir / "llama-lora/adapter";
  const fs::path dst = tmp.path / "adapter";
  fs::create_directories(dst);
  fs::copy_file(src / peft::kConfigFile, dst / peft::kConfigFile);
  const safetensors::Reader in((src / peft::kWeightsFile).string());
  std::vector<safetensors::TensorInfo> infos;
  for (const safetensors::TensorInfo& t : in.tensors()) infos.push_back({t.name, t.dtype, t.shape});
  edit(infos);
  std::vector<safetensors::TensorInfo> fresh;  // offsets from the (edited) shapes
  for (const safetensors::TensorInfo& t : infos) fresh.push_back({t.name, t.dtype, t.shape});
  safetensors::Writer w((dst / peft::kWeightsFile).string(), fresh, {{"format", "pt"}});
  for (const safetensors::TensorInfo& t : fresh) {
    int64_t n = 4;
    for (int64_t d : t.shape) n *= d;
    std::vector<char> zeros(static_cast<size_t>(n), 0);
    w.write(zeros.data(), zeros.size());
  }
  w.finish();
  return dst.string();
}

std::string refusal(const std::string& dir, const std::vector<std::string>& extra = {}) {
  const Golden g("llama-lora");
  std::vector<std::string> sets = lora_sets(g.meta);
  sets.insert(sets.end(), extra.begin(), extra.end());
  const Config cfg = load_config("hf:" + g.dir.string(), sets);
  try {
    peft::read_adapter(dir, cfg.model, cfg.lora);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("peft: adapters that do not fit the run, or use features not trained, are refused",
          "[peft]") {
  TempDir tmp("peft-bad");
  const std::string golden = (kGoldenDir / "llama-lora/adapter").string();
  CHECK(refusal(golden) == "accepted");
  // Rank, alpha, scaling and the adapted modules against [lora], each with the key to set.
  CHECK_THAT(refusal(golden, {"lora.rank=8"}), Contains("r = 4 but lora.rank = 8") &&
                                                   Contains("Fix: set lora.rank = 4") &&
                                                   Contains("adapter_config.json"));
  CHECK_THAT(refusal(golden, {"lora.alpha=16"}), Contains("Fix: set lora.alpha = 8"));
  CHECK_THAT(refusal(golden, {"lora.rslora=true"}), Contains("use_rslora = false"));
  CHECK_THAT(refusal(golden, {"lora.targets=[\"q_proj\",\"v_proj\"]"}),
             Contains("adapt 14 modules") && Contains("adapt 4") && Contains("lora.targets ="));
  CHECK_THAT(refusal(golden, {"lora.modules_to_save=[]"}), Contains("modules_to_save"));
  // Features, by name.
  const std::vector<std::pair<std::string, Json>> features = {{"use_dora", true},
                                                              {"lora_bias", true},
                                                              {"rank_pattern", {{"q_proj", 8}}},
                                                              {"alpha_pattern", {{"q_proj", 4}}},
                                                              {"layers_to_transform", {0}},
                                                              {"trainable_token_indices", {1, 2}},
                                                              {"use_qalora", true}};
  for (const auto& [key, value] : features) {
    INFO(key);
    TempDir t("peft-feature");
    CHECK_THAT(refusal(adapter_with(t, [&, key = key, value = value](Json& j) { j[key] = value; })),
               Contains(key) && Contains("not trained by this build"));
  }
  {
    TempDir t("peft-regex");
    CHECK_THAT(refusal(adapter_with(t, [](Json& j) { j["target_modules"] = ".*proj"; })),
               Contains("regular expression"));
  }
  {
    TempDir t("peft-bias");
    CHECK_THAT(refusal(adapter_with(t, [](Json& j) { j["bias"] = "all"; })),
               Contains("bias = \"all\""));
  }
  {
    TempDir t("peft-type");
    CHECK_THAT(refusal(adapter_with(t, [](Json& j) { j["peft_type"] = "PREFIX_TUNING"; })),
               Contains("only LoRA adapters"));
  }
  // Tensors: one missing, one of another shape, one extra (DoRA's magnitude).
  {
    TempDir t("peft-missing");
    CHECK_THAT(refusal(adapter_tensors_with(t, [](auto& infos) { infos.pop_back(); })),
               Contains("no tensor"));
  }
  {
    TempDir t("peft-shape");
    CHECK_THAT(refusal(adapter_tensors_with(t,
                                            [](auto& infos) {
                                              for (auto& i : infos)
                                                if (i.name.find("layers.1.mlp.up_proj.lora_B") !=
                                                    std::string::npos)
                                                  i.shape = {96, 3};
                                            })),
               Contains("up_proj.lora_B.weight' has shape [96, 3]"));
  }
  {
    TempDir t("peft-extra");
    CHECK_THAT(
        refusal(adapter_tensors_with(t,
                                     [](auto& infos) {
                                       infos.push_back(
                                           {"base_model.model.model.layers.0.self_attn.q_proj."
                                            "lora_magnitude_vector",
                                            "F32",
                                            {64}});
                                     })),
        Contains("(DoRA)"));
  }
  CHECK_THAT(refusal(tmp.str("nowhere")), Contains("no such folder"));
  CHECK_THAT(refusal(golden + "/adapter_config.json"), Contains("not a folder"));
}

TEST_CASE("peft: an adapter folder whose files lie is refused by file and key, never half-read",
          "[peft]") {
  // adapter_config.json as a folder (once an internal error) or a FIFO (once a hang).
  {
    TempDir t("peft-config-folder");
    const std::string dir = adapter_with(t, [](Json&) {});
    fs::remove(fs::path(dir) / peft::kConfigFile);
    fs::create_directory(fs::path(dir) / peft::kConfigFile);
    CHECK_THAT(refusal(dir), Contains("adapter_config.json: not a regular file"));
    fs::remove(fs::path(dir) / peft::kConfigFile);
    REQUIRE(::mkfifo((fs::path(dir) / peft::kConfigFile).c_str(), 0600) == 0);
    CHECK_THAT(refusal(dir), Contains("adapter_config.json: not a regular file"));
  }
  // adapter_model.safetensors truncated or a FIFO: the adapter's file, tagged [peft]
  // (docs/lora.md).
  {
    TempDir t("peft-weights-lie");
    const std::string dir = adapter_with(t, [](Json&) {});
    const fs::path weights = fs::path(dir) / peft::kWeightsFile;
    fs::resize_file(weights, fs::file_size(weights) - 5);
    CHECK_THAT(refusal(dir), StartsWith("[peft] " + weights.string()) && Contains("truncated"));
    fs::remove(weights);
    REQUIRE(::mkfifo(weights.c_str(), 0600) == 0);
    CHECK_THAT(refusal(dir), StartsWith("[peft] " + weights.string() + ": not a regular file") &&
                                 Contains("Fix: give the adapter folder a regular"));
  }
  // Booleans peft reads by truthiness, and r and lora_alpha outside what [lora] takes.
  const std::vector<std::pair<std::string, Json>> bad = {
      {"use_rslora", 1}, {"use_rslora", "yes"}, {"fan_in_fan_out", "no"}};
  for (const auto& [key, value] : bad) {
    INFO(key << " = " << value.dump());
    TempDir t("peft-bool");
    CHECK_THAT(refusal(adapter_with(t, [&, key = key, value = value](Json& j) { j[key] = value; })),
               Contains(key + " = " + value.dump() + " is not true or false"));
  }
  {
    TempDir t("peft-rank");
    CHECK_THAT(refusal(adapter_with(t, [](Json& j) { j["r"] = -8; })),
               Contains("r = -8 is not a rank this build trains") && !Contains("lora.rank = -8"));
  }
  {
    TempDir t("peft-alpha");
    CHECK_THAT(refusal(adapter_with(t, [](Json& j) { j["lora_alpha"] = 0; })),
               Contains("lora_alpha = 0 is outside") && !Contains("set lora.alpha = 0"));
  }
  // A NaN in a tensor: named with the file, not left to diverge at step 1.
  {
    TempDir t("peft-nan");
    const fs::path src = kGoldenDir / "llama-lora/adapter", dst = t.path / "adapter";
    fs::create_directories(dst);
    fs::copy_file(src / peft::kConfigFile, dst / peft::kConfigFile);
    const safetensors::Reader in((src / peft::kWeightsFile).string());
    std::vector<safetensors::TensorInfo> infos;
    for (const safetensors::TensorInfo& i : in.tensors()) infos.push_back({i.name, "F32", i.shape});
    safetensors::Writer w((dst / peft::kWeightsFile).string(), infos, {{"format", "pt"}});
    for (const safetensors::TensorInfo& i : in.tensors()) {
      std::vector<float> v(static_cast<size_t>(i.bytes() / safetensors::dtype_bytes(i.dtype)));
      REQUIRE(safetensors::to_f32(i.dtype, in.data(i), v.size(), v.data()));
      if (i.name.find("layers.0.self_attn.q_proj.lora_B") != std::string::npos)
        v[3] = std::numeric_limits<float>::quiet_NaN();
      w.write(v.data(), v.size() * sizeof(float));
    }
    w.finish();
    CHECK_THAT(refusal(dst.string()), Contains("adapter_model.safetensors") &&
                                          Contains("q_proj.lora_B.weight' holds nan at element 3"));
  }
}

TEST_CASE("peft: a base's fingerprint sees a weight changed in place, the same size", "[peft]") {
  const Golden g("llama-lora");
  TempDir tmp("peft-fingerprint");
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(g.dir / f, tmp.path / f);
  const Json before = hf::folder_fingerprint(tmp.str());
  CHECK(hf::fingerprint_difference(before, hf::folder_fingerprint(tmp.str())).empty());
  {  // a weight re-saved: the data's first byte (the first of the 16 slices starts there)
    std::fstream f(tmp / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header = 0;
    f.read(reinterpret_cast<char*>(&header), 8);
    f.seekp(static_cast<std::streamoff>(8 + header));
    const char flipped = 0x5a;
    f.write(&flipped, 1);
  }
  CHECK_THAT(hf::fingerprint_difference(before, hf::folder_fingerprint(tmp.str())),
             Contains("model.safetensors has other contents"));
}

// ---- the CLI: train --init-adapter, checkpoints, resume, export ----

namespace {

std::string lora_toml(const Golden& g, const std::string& extra) {
  const Json& l = g.meta["lora"];
  return fmt::format(R"([train]
seq_len = {}
batch_size = {}
steps = 2
lr = 0.0
[lora]
rank = {}
alpha = {}
targets = {}
modules_to_save = {}
[checkpoint]
dir = "ckpt"
[device]
threads = 2
{}
)",
                     g.meta["T"].get<int64_t>(), g.meta["B"].get<int64_t>(), l["r"].get<int64_t>(),
                     l["lora_alpha"].get<double>(), toml_strings(l["target_modules"]),
                     toml_strings(l["modules_to_save"]), extra);
}

}  // namespace

TEST_CASE("cli: a LoRA run starts from a PEFT adapter, checkpoints only it, and exports it back",
          "[peft][smoke]") {
  const Golden g("llama-lora");
  TempDir tmp("peft-cli");
  // A copy of the base, so that the test may move and change it.
  const fs::path base = tmp.path / "base";
  fs::create_directories(base);
  for (const char* f : {"config.json", "model.safetensors", "generation_config.json"})
    fs::copy_file(g.dir / f, base / f);
  std::ofstream(tmp.path / "lora.toml") << lora_toml(g, "");
  const std::string cd = fmt::format("cd {} && {} ", tmp.str(), REMAT_BINARY);
  const CliResult run = run_command(cd + fmt::format("train --config lora.toml --init hf:base "
                                                     "--init-adapter {}",
                                                     (g.dir / "adapter").string()));
  INFO(run.out);
  REQUIRE(run.code == 0);
  CHECK_THAT(run.out, Contains("+ LoRA r 4 (alpha 8) on 14 linears of a frozen fp32 base") &&
                          Contains("adapters from") && Contains("(31 tensors"));
  // The checkpoint holds the adapters and the modules trained whole, and no base weight.
  const fs::path ck = tmp.path / "ckpt/step_00000002";
  const safetensors::Reader saved((ck / "model.safetensors").string());
  for (const safetensors::TensorInfo& t : saved.tensors())
    CHECK((lora::is_adapter_name(t.name) || t.name.find("norm1") != std::string::npos ||
           t.name == "lm_head.weight"));
  CHECK(saved.tensors().size() == 14 * 2 + 2 + 1);
  const Json state = read_json(ck / "state.json");
  CHECK(state["extra"]["lora_base"]["path"] == fs::absolute(base).lexically_normal().string());

  // lr = 0: the adapter comes back out as it went in, bit for bit.
  const CliResult ex = run_command(cd + "export --checkpoint ckpt --adapter out-adapter");
  INFO(ex.out);
  REQUIRE(ex.code == 0);
  const safetensors::Reader theirs((g.dir / "adapter" / peft::kWeightsFile).string());
  const safetensors::Reader ours((tmp.path / "out-adapter" / peft::kWeightsFile).string());
  for (const safetensors::TensorInfo& t : theirs.tensors()) {
    const safetensors::TensorInfo* o = ours.find(t.name);
    REQUIRE(o != nullptr);
    CHECK(std::memcmp(ours.data(*o), theirs.data(t), t.bytes()) == 0);
  }
  // The merged export is a plain model folder; export never overwrites.
  CHECK(run_command(cd + "export --checkpoint ckpt --hf merged --dtype fp32").code == 0);
  CHECK(fs::exists(tmp.path / "merged/model.safetensors"));
  const CliResult again = run_command(cd + "export --checkpoint ckpt --adapter out-adapter");
  CHECK(again.code == 2);
  CHECK_THAT(again.out, Contains("never overwrites"));
  // --hf's options beside --adapter, and an OUT below a file: one line each, exit 2, nothing made.
  const CliResult dtype = run_command(cd + "export --checkpoint ckpt --adapter a2 --dtype fp32");
  CHECK(dtype.code == 2);
  CHECK_THAT(dtype.out, Contains("--dtype shapes a --hf model folder") && Contains("drop --dtype"));
  std::ofstream(tmp.path / "afile") << "x";
  const CliResult below = run_command(cd + "export --checkpoint ckpt --adapter afile/sub");
  CHECK(below.code == 2);
  CHECK_THAT(below.out, Contains("afile is a file, not a folder") && !Contains(".tmp-"));
  CHECK_FALSE(fs::exists(tmp.path / "a2"));

  // Resume: refused with one line when the base changed, or moved; fine once it is back.
  std::ofstream(tmp.path / "lora.toml") << lora_toml(g, "");
  const std::string resume =
      cd + "train --config lora.toml --model hf:base --resume latest --steps 3";
  {
    std::ofstream(base / "config.json", std::ios::app) << " ";  // one byte more
    const CliResult r = run_command(resume);
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains("changed since this checkpoint was written") &&
                          Contains("config.json is") && Contains("Fix:"));
    fs::copy_file(g.dir / "config.json", base / "config.json",
                  fs::copy_options::overwrite_existing);
  }
  {
    fs::rename(base, tmp.path / "moved");
    const CliResult r =
        run_command(cd + "train --config lora.toml --model hf:moved --resume latest --steps 3");
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains("is gone (moved or removed)"));
    fs::rename(tmp.path / "moved", base);
  }
  const CliResult ok = run_command(resume);
  INFO(ok.out);
  CHECK(ok.code == 0);
  CHECK_THAT(ok.out, Contains("resumed from") && Contains("LoRA base from"));
  // The resume's [lora] is the checkpoint's: another rank is another model, refused by name.
  std::ofstream(tmp.path / "other.toml") << "[checkpoint]\ndir = \"ckpt\"\n[lora]\nrank = 8\n";
  const CliResult off = run_command(cd + "train --config other.toml --resume latest");
  INFO(off.out);
  CHECK(off.code == 2);
  CHECK_THAT(off.out, Contains("lora.rank is 8 here but 4 in the checkpoint"));
  // A change that leaves the resumed config invalid (rank 0 beside the checkpoint's lora.alpha)
  // names the change, not the checkpoint's state.json line the validation stumbled on.
  const CliResult zero = run_command(cd + "train --resume ckpt --set lora.rank=0");
  INFO(zero.out);
  CHECK(zero.code == 2);
  CHECK_THAT(zero.out, Contains("--set lora.rank=0: [checkpoint] lora.rank is 0 here but 4 in the "
                                "checkpoint") &&
                           !Contains("state.json:"));
  // The same change from a config file names its line.
  std::ofstream(tmp.path / "zero.toml") << "[lora]\nrank = 0\n";
  const CliResult file = run_command(cd + "train --config zero.toml --resume ckpt");
  INFO(file.out);
  CHECK(file.code == 2);
  CHECK_THAT(file.out, Contains("zero.toml:2:") &&
                           Contains("[checkpoint] lora.rank is 0 here but 4 in the checkpoint") &&
                           !Contains("state.json:"));
  // A state.json without its base's record (edited by hand): every reader names what is missing,
  // not the first base weight it fails to find.
  const fs::path state_path = tmp.path / "ckpt/step_00000003/state.json";
  Json edited = read_json(state_path);
  edited["extra"].erase("lora_base");
  std::ofstream(state_path) << edited.dump();
  for (const char* command : {"export --checkpoint ckpt --hf merged2",
                              "sample --checkpoint ckpt --prompt-ids 1 --tokens 1",
                              "eval --checkpoint ckpt", "train --resume ckpt --steps 4"}) {
    const CliResult r = run_command(cd + command);
    INFO(command << "\n" << r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains("a LoRA checkpoint without the record of its base (lora_base)") &&
                          !Contains("no tensor"));
  }
}

TEST_CASE("cli: a QLoRA run merges its adapters into the base folder's original weights",
          "[peft][nf4][smoke]") {
  // lr = 0: the same adapters (the golden's) on an fp32 and on an NF4 base. The NF4 run trained
  // on the dequantised base, but export --hf merges into the weights the folder holds, as peft's
  // merge on an unquantised reload does: the two merged folders are the same bytes.
  const Golden g("llama-lora");
  TempDir tmp("qlora-cli");
  std::ofstream(tmp.path / "lora.toml") << lora_toml(g, "");
  const std::string cd = fmt::format("cd {} && {} ", tmp.str(), REMAT_BINARY);
  std::vector<uint16_t> tokens(200);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((7 * i) % 97);
  std::ofstream(tmp.path / "val.bin", std::ios::binary) << test::shard_bytes(tokens);
  for (const char* base : {"fp32", "nf4"}) {
    const CliResult run = run_command(
        cd + fmt::format("train --config lora.toml --init hf:{} --init-adapter {} --set "
                         "'lora.base=\"{}\"' --set 'checkpoint.dir=\"ckpt-{}\"'",
                         g.dir.string(), (g.dir / "adapter").string(), base, base));
    INFO(run.out);
    REQUIRE(run.code == 0);
    // What the base is kept as, in the load line and the model's.
    const bool nf4 = std::string(base) == "nf4";
    CHECK_THAT(run.out, Contains(nf4 ? "(F32 -> bf16, f32, nf4 (double quant))" : "(F32 -> f32)") &&
                            Contains(nf4 ? "of a frozen NF4 with nested absmax base"
                                         : "of a frozen fp32 base"));
    const CliResult ex = run_command(
        cd + fmt::format("export --checkpoint ckpt-{} --hf merged-{} --dtype fp32", base, base));
    INFO(ex.out);
    REQUIRE(ex.code == 0);
    // eval scores the checkpoint as trained, and says where that differs from the merged export.
    const CliResult ev =
        run_command(cd + fmt::format("eval --checkpoint ckpt-{} --data val.bin --windows 1", base));
    INFO(ev.out);
    REQUIRE(ev.code == 0);
    CHECK((ev.out.find("note   scored as trained: the adapters on the NF4-decoded base; "
                       "`export --hf` merges them into the base folder's original weights") !=
           std::string::npos) == nf4);
  }
  const auto bytes = [&](const char* base) {
    std::ifstream in(tmp.path / fmt::format("merged-{}", base) / "model.safetensors",
                     std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  CHECK(bytes("nf4").size() > 1000);
  CHECK(bytes("nf4") == bytes("fp32"));
}

TEST_CASE("cli: LoRA refuses a run without a base, and an adapter without LoRA", "[peft][smoke]") {
  const Golden g("llama-lora");
  TempDir tmp("peft-cli-bad");
  std::ofstream(tmp.path / "lora.toml")
      << lora_toml(g, "[model]\nkind = \"llama\"\ntie_embeddings = false");
  const std::string cd = fmt::format("cd {} && {} ", tmp.str(), REMAT_BINARY);
  CliResult r = run_command(cd + "train --config lora.toml");
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("lora.rank") && Contains("pass --init hf:DIR"));
  r = run_command(cd + fmt::format("train --model hf:{} --init-adapter {}", g.dir.string(),
                                   (g.dir / "adapter").string()));
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("--init-adapter") && Contains("lora.rank = 0"));
  std::ofstream(tmp.path / "lora2.toml") << lora_toml(g, "");
  r = run_command(cd + "train --config lora2.toml --init hf:" + g.dir.string() +
                  " --set lora.rank=8 --init-adapter " + (g.dir / "adapter").string());
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("r = 4 but lora.rank = 8"));
  CHECK_FALSE(fs::exists(tmp.path / "ckpt/step_00000001"));  // nothing written
  // An adapter on train.seed's weights: --model hf: reads only config.json.
  r = run_command(cd + fmt::format("train --config lora2.toml --model hf:{} --set checkpoint.dir= "
                                   "--init-adapter {}",
                                   g.dir.string(), (g.dir / "adapter").string()));
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Contains("an adapter starts from the base it was trained on") &&
                        Contains("Fix: pass --init hf:DIR"));
  // Out of memory whatever the length: the fix names the frozen base's storage too.
  for (const char* policy : {"auto", "full"}) {
    r = run_command(cd + fmt::format("train --config lora2.toml --init hf:{} --set checkpoint.dir= "
                                     "--set device.memory=400KiB --set remat.policy={}",
                                     g.dir.string(), policy));
    INFO(r.out);
    CHECK(r.code == 3);
    CHECK_THAT(r.out, Contains("keep the frozen base in bf16 or NF4 (lora.base = \"bf16\" or "
                               "\"nf4\")"));
  }
  // The adapter folder given as --init, with LoRA on and off.
  for (const char* rank : {"4", "0"}) {
    r = run_command(cd + fmt::format("train --config lora2.toml --set lora.rank={} --init {}", rank,
                                     (g.dir / "adapter").string()));
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Contains("a PEFT adapter folder") && Contains("pass it as --init-adapter"));
  }
  // Without a base and without checkpoints, a run to measure (fit --measure's trials): it says so.
  std::ofstream(tmp.path / "measure.toml")
      << "[model]\nkind = \"llama\"\nn_layer = 1\n[train]\nseq_len = 16\nbatch_size = 1\n"
         "steps = 1\n[lora]\nrank = 2\n";
  r = run_command(cd + "train --config measure.toml");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("LoRA base initialised from train.seed"));
}

namespace {
// Every step's loss of a metrics file, by step (full precision: JSON keeps the double).
std::map<int64_t, double> step_losses(const fs::path& metrics) {
  std::map<int64_t, double> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const Json j = Json::parse(line);
    if (j.contains("step") && j.contains("loss") && !j.contains("event"))
      out[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return out;
}
}  // namespace

TEST_CASE("cli: a LoRA run resumed from its checkpoint continues bit for bit", "[peft][smoke]") {
  const Golden g("llama-lora");
  TempDir tmp("peft-resume");
  std::ofstream(tmp.path / "lora.toml")
      << lora_toml(g, "").replace(lora_toml(g, "").find("lr = 0.0"), 8, "lr = 0.01") +
             "[data]\ntask = \"copy\"\n";
  const std::string cd = fmt::format("cd {} && {} ", tmp.str(), REMAT_BINARY);
  const std::string init =
      fmt::format("--init hf:{} --init-adapter {}", g.dir.string(), (g.dir / "adapter").string());
  REQUIRE(run_command(cd + "train --config lora.toml --steps 4 --metrics straight.jsonl " + init +
                      " --set checkpoint.dir=straight")
              .code == 0);
  REQUIRE(run_command(cd + "train --config lora.toml --steps 4 --stop-at 2 --metrics split.jsonl " +
                      init)
              .code == 0);
  const CliResult r = run_command(cd +
                                  "train --config lora.toml --steps 4 --resume latest "
                                  "--metrics split.jsonl --model hf:" +
                                  g.dir.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto a = step_losses(tmp.path / "straight.jsonl"),
             b = step_losses(tmp.path / "split.jsonl");
  REQUIRE(a.size() == 4);
  CHECK(a == b);
  // Another base named beside a resume is refused.
  const CliResult other = run_command(cd +
                                      "train --config lora.toml --steps 5 --resume latest "
                                      "--model hf:" +
                                      (kGoldenDir / "llama").string());
  INFO(other.out);
  CHECK(other.code == 2);
  CHECK_THAT(other.out, Contains("names another base") && Contains("llama-lora"));
  // The seven names written as [] select the same modules: no change. A rank changed is refused,
  // its fix a new run on the merged export (a LoRA checkpoint is no --init), and dropout too.
  const CliResult same = run_command(cd +
                                     "train --config lora.toml --steps 5 --resume latest "
                                     "--set 'lora.targets=[]'");
  INFO(same.out);
  CHECK(same.code == 0);
  for (const char* set : {"lora.rank=8", "lora.dropout=0.1"}) {
    const CliResult changed =
        run_command(cd + "train --config lora.toml --steps 6 --resume latest --set " + set);
    INFO(changed.out);
    CHECK(changed.code == 2);
    CHECK_THAT(changed.out, Contains("resume without that change") &&
                                Contains("export --checkpoint") &&
                                Contains("train --init hf:DIR") && !Contains("a fresh optimizer"));
  }
}

}  // namespace remat::test
