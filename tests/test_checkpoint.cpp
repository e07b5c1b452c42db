// Checkpoints: exact round trips, files that an independent safetensors parser accepts, every
// kind of corruption becoming a CheckpointError that names the file, the atomic-write rules
// (latest ignores unfinished folders, prune and the next write clean them), and the staging
// buffer the planner counts.
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "engine/config/config.h"
#include "engine/core/count_backend.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/model_files/safetensors.h"
#include "engine/training/checkpoint.h"
#include "layers/models.h"
#include "temp_dir.h"

using namespace remat;
namespace fs = std::filesystem;
namespace st = remat::safetensors;

namespace {

using test::TempDir;

Config tiny_gpt(uint64_t seed, int64_t n_embd = 16, int64_t n_layer = 2) {
  return parse_config(fmt::format(R"(
[model]
n_layer = {}
n_head = 2
n_embd = {}
vocab_size = 11
n_ctx = 16
[train]
seq_len = 8
batch_size = 2
seed = {}
[device]
threads = 1
)",
                                  n_layer, n_embd, seed),
                      "tiny-checkpoint");
}

// Distinct, non-trivial moments, so a swapped or skipped tensor cannot pass the comparison.
void fill_moments(Model& model, float salt) {
  int k = 0;
  for (Param& p : model.params()) {
    const int64_t n = p.m.tensor().numel();
    for (int64_t i = 0; i < n; ++i) {
      p.m.f32()[i] = std::sin(static_cast<float>(i) * 0.37f + salt + static_cast<float>(k));
      p.v.f32()[i] = std::cos(static_cast<float>(i) * 0.11f - salt) + 1.5f + static_cast<float>(k);
    }
    ++k;
  }
}

bool same_bytes(const Buffer& a, const Buffer& b) {
  return a.tensor().bytes() == b.tensor().bytes() &&
         std::memcmp(a.tensor().data, b.tensor().data, a.tensor().bytes()) == 0;
}

CheckpointState state_for(const Config& cfg, int64_t step) {
  CheckpointState s;
  s.step = step;
  s.config_toml = config_to_toml(cfg);
  s.data_cursor = {{"kind", "synthetic"}, {"position", step * 16}};
  s.extra = {{"val_loss", 2.5}};
  return s;
}

// One model on its own backend, with a checkpoint writer.
struct Run {
  Config cfg;
  cpu::CpuBackend be{1ull << 28, 1};
  std::unique_ptr<Model> model;
  explicit Run(uint64_t seed, int64_t n_embd = 16, int64_t n_layer = 2)
      : cfg(tiny_gpt(seed, n_embd, n_layer)), model(make_model(cfg, be)) {
    fill_moments(*model, static_cast<float>(seed));
  }
  std::string save(const std::string& dir, int64_t step) {
    return write_checkpoint(dir, be, *model, state_for(cfg, step));
  }
};

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

uint64_t header_length(const std::string& file) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(file[static_cast<size_t>(i)]);
  return n;
}

// A safetensors file from a header text and a data section, for layouts the writer never makes.
void write_safetensors(const fs::path& p, const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>(header.size() >> (8 * i));
  write_bytes(p, out + header + std::string(data_bytes, '\x01'));
}

template <class E>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("no exception was thrown");
  return {};
}

std::string checkpoint_error(const std::function<void()>& f) {
  return error_of<CheckpointError>(f);
}

// tests/safetensors_check.py's verdict on `file`: "ok N" then the tensor names.
std::string python_check(const std::string& file) {
  const std::string cmd =
      fmt::format("python3 '{}/tests/safetensors_check.py' '{}' 2>&1", REMAT_SOURCE_DIR, file);
  FILE* pipe = ::popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int rc = ::pclose(pipe);
  INFO(out);
  CHECK(rc == 0);
  return out;
}

}  // namespace

TEST_CASE("checkpoint round trip is exact, weights and moments", "[checkpoint]") {
  TempDir tmp;
  Run a(1), b(2);
  const std::string folder = a.save(tmp.str(), 20);
  CHECK(fs::path(folder).filename() == "step_00000020");
  REQUIRE_FALSE(same_bytes(a.model->params()[0].value, b.model->params()[0].value));

  Checkpoint ck(folder);
  CHECK(ck.path() == folder);
  CHECK(ck.state().step == 20);
  CHECK(ck.state().config_toml == config_to_toml(a.cfg));
  CHECK(ck.state().data_cursor == nlohmann::json{{"kind", "synthetic"}, {"position", 320}});
  CHECK(ck.state().extra["val_loss"] == 2.5);
  ck.load_into(b.be, *b.model, true);
  auto& pa = a.model->params();
  auto& pb = b.model->params();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].name);
    CHECK(same_bytes(pa[i].value, pb[i].value));
    CHECK(same_bytes(pa[i].m, pb[i].m));
    CHECK(same_bytes(pa[i].v, pb[i].v));
  }
  // The config round-trips through TOML text too.
  CHECK(config_to_toml(parse_config(ck.state().config_toml, "state.json")) ==
        config_to_toml(a.cfg));
}

TEST_CASE("checkpoint weights only: load_into without optimizer, load_weights, weight()",
          "[checkpoint]") {
  TempDir tmp;
  Run a(1), b(2), c(3);
  const std::string folder = a.save(tmp.str(), 5);
  Checkpoint ck(folder);
  ck.load_into(b.be, *b.model, false);
  for (size_t i = 0; i < a.model->params().size(); ++i) {
    CHECK(same_bytes(a.model->params()[i].value, b.model->params()[i].value));
    CHECK_FALSE(same_bytes(a.model->params()[i].m, b.model->params()[i].m));
  }
  // weight_names in file order = parameter order; weight() returns the values and shape.
  std::vector<std::string> names;
  for (Param& p : a.model->params()) names.push_back(p.name);
  CHECK(ck.weight_names() == names);
  const Param& p0 = a.model->params()[0];
  std::vector<int64_t> shape;
  const std::vector<float> w = ck.weight(p0.name, &shape);
  CHECK(shape ==
        std::vector<int64_t>(p0.value.tensor().shape.begin(), p0.value.tensor().shape.end()));
  CHECK(std::memcmp(w.data(), p0.value.f32(), p0.value.tensor().bytes()) == 0);
  CHECK(checkpoint_error([&] { ck.weight("nope"); }).find("'nope'") != std::string::npos);

  // --init from the folder and from the file itself.
  for (const std::string& src : {folder, (fs::path(folder) / "model.safetensors").string()}) {
    Run d(4);
    load_weights(src, d.be, *d.model);
    for (size_t i = 0; i < a.model->params().size(); ++i)
      CHECK(same_bytes(a.model->params()[i].value, d.model->params()[i].value));
  }
  // A folder without state.json: its model.safetensors, validated but not checksummed.
  fs::remove(fs::path(folder) / "state.json");
  load_weights(folder, c.be, *c.model);
  CHECK(same_bytes(a.model->params()[1].value, c.model->params()[1].value));
  CHECK(checkpoint_error([&] {
          load_weights(tmp.str("missing.safetensors"), c.be, *c.model);
        }).find("missing.safetensors") != std::string::npos);
}

TEST_CASE("checkpoint files are valid safetensors for an independent parser", "[checkpoint]") {
  TempDir tmp;
  Run a(1);
  const fs::path folder = a.save(tmp.str(), 7);
  std::string want_model = fmt::format("ok {}\n", a.model->params().size());
  std::string want_opt = fmt::format("ok {}\n", 2 * a.model->params().size());
  for (Param& p : a.model->params()) {
    want_model += p.name + "\n";
    want_opt += p.name + ".exp_avg\n" + p.name + ".exp_avg_sq\n";
  }
  CHECK(python_check((folder / "model.safetensors").string()) == want_model);
  CHECK(python_check((folder / "optimizer.safetensors").string()) == want_opt);

  // Header details: data 8-byte aligned, metadata, and state.json's record of each file.
  const auto state = nlohmann::json::parse(read_bytes(folder / "state.json"));
  CHECK(state["format"] == "remat-train checkpoint");
  CHECK(state["format_version"] == 1);
  CHECK(state["remat_train_version"] == REMAT_VERSION);
  CHECK(state["rng"]["kind"] == "counter");
  for (const char* name : {"model.safetensors", "optimizer.safetensors"}) {
    const std::string bytes = read_bytes(folder / name);
    CHECK((8 + header_length(bytes)) % 8 == 0);
    CHECK(state["files"][name]["bytes"] == bytes.size());
    CHECK(state["files"][name]["xxh3_64"] == st::hex64(st::xxh3_64(bytes.data(), bytes.size())));
    const st::Reader r((folder / name).string());
    CHECK(r.metadata().at("format") == "pt");
    CHECK(r.metadata().at("step") == "7");
    CHECK(r.metadata().at("producer") == "remat-train " REMAT_VERSION);
  }
}

TEST_CASE("checkpoint corruption is a CheckpointError naming the file", "[checkpoint]") {
  TempDir tmp;
  Run a(1);
  const fs::path folder = a.save(tmp.str(), 20);
  const fs::path model_file = folder / "model.safetensors";
  const std::string original = read_bytes(model_file);
  const uint64_t n = header_length(original);
  auto open_error = [&] { return checkpoint_error([&] { Checkpoint ck(folder.string()); }); };
  auto reader_error = [&] { return checkpoint_error([&] { st::Reader r(model_file.string()); }); };
  auto has = [](const std::string& msg, const std::string& part) {
    INFO(msg);
    return msg.find(part) != std::string::npos;
  };

  SECTION("truncated") {
    fs::resize_file(model_file, original.size() - 100);
    CHECK(has(open_error(), "model.safetensors"));
    CHECK(has(open_error(), "truncated"));
    const std::string msg = reader_error();
    CHECK(has(msg, "past the end of the file"));
    CHECK(has(msg, "Fix:"));
  }
  SECTION("a flipped header byte") {
    std::string bad = original;
    bad[8 + 3] ^= 0x20;
    write_bytes(model_file, bad);
    CHECK(has(open_error(), "model.safetensors"));
    CHECK(has(open_error(), "checksum mismatch"));
  }
  SECTION("a flipped data byte") {
    std::string bad = original;
    bad.back() ^= 0x01;
    write_bytes(model_file, bad);
    CHECK(has(open_error(), "checksum mismatch"));
    st::Reader r(model_file.string());  // still well-formed: only the checksum can tell
  }
  SECTION("a dtype changed to F16") {
    std::string bad = original;
    const size_t at = bad.find("\"F32\"");
    REQUIRE(at < 8 + n);
    bad.replace(at, 5, "\"F16\"");
    write_bytes(model_file, bad);
    CHECK(has(open_error(), "checksum mismatch"));
    // Without state.json the safetensors checks catch it.
    CHECK(has(reader_error(), "F16"));
    CHECK(has(reader_error(), "bytes"));
    Run b(2);
    CHECK(has(checkpoint_error([&] { load_weights(model_file.string(), b.be, *b.model); }),
              "model.safetensors"));
  }
  SECTION("a dtype changed to I32: well-formed, but not f32") {
    std::string bad = original;
    bad.replace(bad.find("\"F32\""), 5, "\"I32\"");
    write_bytes(model_file, bad);
    Run b(2);
    const std::string msg =
        checkpoint_error([&] { load_weights(model_file.string(), b.be, *b.model); });
    CHECK(has(msg, "is I32, expected F32"));
    CHECK(has(msg, a.model->params()[0].name));
  }
  SECTION("a huge header length") {
    std::string bad = original;
    for (int i = 0; i < 8; ++i) bad[static_cast<size_t>(i)] = '\x7f';
    write_bytes(model_file, bad);
    CHECK(has(open_error(), "checksum mismatch"));
    CHECK(has(reader_error(), "header length"));
    CHECK(has(reader_error(), "100 MB"));
  }
  SECTION("a header length past the end of the file") {
    write_safetensors(model_file, "{}", 0);
    std::string bad = read_bytes(model_file);
    bad[0] = 100;
    write_bytes(model_file, bad);
    CHECK(has(reader_error(), "runs past the end of the file"));
  }
  SECTION("a file shorter than 8 bytes") {
    write_bytes(model_file, "abc");
    CHECK(has(open_error(), "model.safetensors"));
    CHECK(has(reader_error(), "too short"));
  }
  SECTION("offsets outside the file") {
    write_safetensors(model_file, R"({"w":{"dtype":"F32","shape":[100],"data_offsets":[0,400]}})",
                      40);
    CHECK(has(reader_error(), "tensor 'w' ends at byte"));
    CHECK(has(reader_error(), "truncated"));
  }
  SECTION("a gap, an overlap, trailing bytes, a shape that does not match its bytes") {
    const std::string two = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[%s]}})";
    auto with_b = [&](const std::string& offsets) {
      std::string h = two;
      h.replace(h.find("%s"), 2, offsets);
      return h;
    };
    write_safetensors(model_file, with_b("12,20"), 20);
    CHECK(has(reader_error(), "leave a gap"));
    write_safetensors(model_file, with_b("4,12"), 12);
    CHECK(has(reader_error(), "overlap"));
    write_safetensors(model_file, with_b("8,16"), 20);
    CHECK(has(reader_error(), "4 bytes follow the last tensor"));
    write_safetensors(model_file, R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
    CHECK(has(reader_error(), "needs 12 bytes"));
    write_safetensors(model_file, R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8);
    CHECK(has(reader_error(), "non-negative"));
    write_safetensors(model_file, R"({"w":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", 8);
    CHECK(has(reader_error(), "unknown dtype"));
    write_safetensors(model_file, R"([1, 2])", 0);
    CHECK(has(reader_error(), "not a JSON object"));
    write_safetensors(model_file, R"({"w": )", 0);
    CHECK(has(reader_error(), "not valid JSON"));
    write_safetensors(model_file, R"({"__metadata__":{"a":1}})", 0);
    CHECK(has(reader_error(), "__metadata__"));
  }
  SECTION("state.json missing, garbage, or of another format version") {
    const fs::path state = folder / "state.json";
    const std::string good = read_bytes(state);
    fs::remove(state);
    CHECK(has(open_error(), "state.json"));
    write_bytes(state, "{not json");
    CHECK(has(open_error(), "state.json"));
    CHECK(has(open_error(), "not valid JSON"));
    auto j = nlohmann::json::parse(good);
    j["format_version"] = 2;
    write_bytes(state, j.dump());
    CHECK(has(open_error(), "format_version"));
    j = nlohmann::json::parse(good);
    j.erase("files");
    write_bytes(state, j.dump());
    CHECK(has(open_error(), "\"files\""));
    j = nlohmann::json::parse(good);
    j["files"]["optimizer.safetensors"]["xxh3_64"] = "xyz";
    write_bytes(state, j.dump());
    CHECK(has(open_error(), "16 hex digits"));
    j = nlohmann::json::parse(good);
    j["step"] = UINT64_MAX;  // a JSON unsigned that does not fit the step's int64
    write_bytes(state, j.dump());
    CHECK(has(open_error(), "\"step\""));
  }
  SECTION("a missing tensor file or folder") {
    fs::remove(folder / "optimizer.safetensors");
    CHECK(has(open_error(), "optimizer.safetensors"));
    const std::string msg = checkpoint_error([&] { Checkpoint ck(tmp.str("step_00000099")); });
    CHECK(has(msg, "no checkpoint at"));
    CHECK(has(msg, "step_00000099"));
  }
}

TEST_CASE("checkpoint load into a model of another shape names the tensor", "[checkpoint]") {
  TempDir tmp;
  Run a(1);
  Checkpoint ck(a.save(tmp.str(), 3));

  Run wider(2, 32);
  std::vector<std::vector<float>> before;
  for (Param& p : wider.model->params())
    before.emplace_back(p.value.f32(), p.value.f32() + p.value.tensor().numel());
  const std::string msg = checkpoint_error([&] { ck.load_into(wider.be, *wider.model, true); });
  INFO(msg);
  CHECK(msg.find("another model") != std::string::npos);
  CHECK(msg.find("model.safetensors") != std::string::npos);
  CHECK(msg.find("'" + a.model->params()[0].name + "'") != std::string::npos);
  CHECK(msg.find("[11, 16]") != std::string::npos);  // both shapes
  CHECK(msg.find("[11, 32]") != std::string::npos);
  // Nothing was copied: every check runs before the first upload.
  for (size_t i = 0; i < before.size(); ++i) {
    const Param& p = wider.model->params()[i];
    CHECK(std::memcmp(before[i].data(), p.value.f32(), p.value.tensor().bytes()) == 0);
  }

  Run deeper(2, 16, 3);
  CHECK(checkpoint_error([&] {
          ck.load_into(deeper.be, *deeper.model, false);
        }).find("no tensor 'blocks.2.") != std::string::npos);
  Run shallower(2, 16, 1);
  CHECK(checkpoint_error([&] {
          ck.load_into(shallower.be, *shallower.model, false);
        }).find("'blocks.1.") != std::string::npos);
}

TEST_CASE("checkpoint latest, prune, and leftovers of a killed write", "[checkpoint]") {
  TempDir tmp;
  Run a(1);
  const std::string dir = tmp.str("ckpt");
  CHECK(latest_checkpoint(dir).empty());  // missing dir
  for (int64_t step : {10, 20, 5}) a.save(dir, step);
  CHECK(latest_checkpoint(dir) == tmp.str("ckpt/step_00000020"));

  // A killed write: a tmp folder with partial files, and a step folder without state.json.
  const fs::path killed = fs::path(dir) / ".tmp-step_00000030";
  fs::create_directories(killed);
  write_bytes(killed / "model.safetensors", "partial");
  fs::create_directories(fs::path(dir) / "step_00000040");
  fs::create_directories(fs::path(dir) / "step_4x");
  CHECK(latest_checkpoint(dir) == tmp.str("ckpt/step_00000020"));

  SECTION("the next write cleans its own tmp folder") {
    a.save(dir, 30);
    CHECK_FALSE(fs::exists(killed));
    CHECK(latest_checkpoint(dir) == tmp.str("ckpt/step_00000030"));
    Checkpoint ck(latest_checkpoint(dir));
    CHECK(ck.state().step == 30);
  }
  SECTION("prune keeps the newest N and removes tmp leftovers") {
    prune_checkpoints(dir, 2);
    CHECK_FALSE(fs::exists(killed));
    CHECK_FALSE(fs::exists(fs::path(dir) / "step_00000005"));
    CHECK(fs::exists(fs::path(dir) / "step_00000010"));
    CHECK(fs::exists(fs::path(dir) / "step_00000020"));
    prune_checkpoints(dir, 0);  // keep all
    CHECK(fs::exists(fs::path(dir) / "step_00000010"));
    prune_checkpoints(dir, 1);
    CHECK_FALSE(fs::exists(fs::path(dir) / "step_00000010"));
    CHECK(latest_checkpoint(dir) == tmp.str("ckpt/step_00000020"));
    for (const auto& e : fs::directory_iterator(dir))
      CHECK_FALSE(e.path().filename().string().starts_with(".tmp-"));
  }
}

TEST_CASE("checkpoint rewrite of an existing step replaces it whole", "[checkpoint]") {
  TempDir tmp;
  Run a(1), b(2), c(3);
  a.save(tmp.str(), 10);
  const std::string folder = b.save(tmp.str(), 10);
  Checkpoint(folder).load_into(c.be, *c.model, true);
  for (size_t i = 0; i < b.model->params().size(); ++i) {
    CHECK(same_bytes(b.model->params()[i].value, c.model->params()[i].value));
    CHECK(same_bytes(b.model->params()[i].v, c.model->params()[i].v));
  }
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(tmp.path)) ++entries;
  CHECK(entries == 1);  // no tmp or aside folder left
}

TEST_CASE("checkpoint write failure is an IoError and leaves no step folder", "[checkpoint]") {
  TempDir tmp;
  Run a(1);
  write_bytes(tmp.path / "file", "not a folder");
  const std::string msg = error_of<IoError>([&] { a.save(tmp.str("file"), 1); });
  CHECK(msg.find(tmp.str("file")) != std::string::npos);
  const std::string nested = error_of<IoError>([&] { a.save(tmp.str("file/sub"), 1); });
  CHECK(nested.find("file/sub") != std::string::npos);
  CHECK(latest_checkpoint(tmp.str()).empty());
}

TEST_CASE("checkpoint staging buffer comes from the pool on host devices only", "[checkpoint]") {
  Run a(1);
  int64_t largest = 0;
  for (Param& p : a.model->params()) largest = std::max(largest, p.value.tensor().numel());
  MemoryPool& pool = a.be.pool();
  const uint64_t before = pool.live_bytes(MemCategory::Transient);
  {
    Buffer staging = allocate_checkpoint_staging(a.be, *a.model);
    REQUIRE_FALSE(staging.empty());
    CHECK(staging.tensor().bytes() == static_cast<size_t>(largest) * sizeof(float));
    CHECK(pool.live_bytes(MemCategory::Transient) - before ==
          MemoryPool::accounted_bytes(staging.tensor().bytes()));
  }
  CHECK(pool.live_bytes(MemCategory::Transient) == before);

  // write_checkpoint stages through it: the peak is one staging buffer above what was live (it
  // ties in size with the largest parameters, so the peak's "largest" list need not show it).
  TempDir tmp;
  pool.reset_peak();
  const uint64_t live = pool.live_bytes();
  a.save(tmp.str(), 1);
  CHECK(pool.live_bytes() == live);
  CHECK(pool.peak_bytes() - live ==
        MemoryPool::accounted_bytes(static_cast<size_t>(largest) * sizeof(float)));

  // Dry runs: counted for a CPU target, not for a GPU one (host staging is outside its pool).
  CountBackend cpu_count(CountTarget{DeviceKind::Cpu, DType::F32, 1}, UINT64_MAX);
  auto m1 = make_model(a.cfg, cpu_count);
  CHECK(allocate_checkpoint_staging(cpu_count, *m1).tensor().bytes() ==
        static_cast<size_t>(largest) * sizeof(float));
  CountBackend cuda_count(CountTarget{DeviceKind::Cuda, DType::BF16, 1}, UINT64_MAX);
  auto m2 = make_model(a.cfg, cuda_count);
  CHECK(allocate_checkpoint_staging(cuda_count, *m2).empty());
}

TEST_CASE("safetensors writer and reader on their own", "[checkpoint]") {
  TempDir tmp;
  const std::string path = tmp.str("t.safetensors");
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> b = {7, -8};
  {
    st::Writer w(path, {{"a", "F32", {2, 3}}, {"empty", "F32", {0, 4}}, {"b", "I32", {2}}},
                 {{"k", "v"}});
    w.write(a.data(), a.size() * 4);
    w.write(nullptr, 0);
    w.write(b.data(), b.size() * 4);
    w.finish();
    const std::string bytes = read_bytes(path);
    CHECK(w.bytes() == bytes.size());
    CHECK(w.checksum() == st::xxh3_64(bytes.data(), bytes.size()));
  }
  CHECK(python_check(path) == "ok 3\na\nempty\nb\n");
  const st::Reader r(path);
  REQUIRE(r.tensors().size() == 3);
  CHECK(r.metadata().at("k") == "v");
  const st::TensorInfo* ta = r.find("a");
  REQUIRE(ta != nullptr);
  CHECK(ta->shape == std::vector<int64_t>{2, 3});
  CHECK(std::memcmp(r.data(*ta), a.data(), 24) == 0);
  CHECK(r.find("b")->dtype == "I32");
  CHECK(std::memcmp(r.data(*r.find("b")), b.data(), 8) == 0);
  CHECK(r.find("empty")->bytes() == 0);
  CHECK(r.find("nope") == nullptr);
  // Header-only readable dtypes.
  write_safetensors(path, R"({"h":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]}})", 6);
  CHECK(st::Reader(path).find("h")->bytes() == 6);
}
