#include "engine/training/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <utility>

#include "engine/core/error.h"
#include "engine/core/regular_file.h"
#include "engine/model_files/safetensors.h"

namespace remat {

namespace fs = std::filesystem;
namespace st = safetensors;

namespace {

constexpr const char* kModelFile = kCheckpointModelFile;
constexpr const char* kOptimizerFile = kCheckpointOptimizerFile;
constexpr const char* kStateFile = kCheckpointStateFile;
// Folders being written (or deleted) carry this prefix: readers never look at them, and the
// next write or prune removes what a killed run left behind.
constexpr std::string_view kTmpPrefix = ".tmp-";
constexpr std::string_view kStepPrefix = "step_";
// state.json holds a config and a data cursor: a few KiB (a cursor of many files, some MiB).
constexpr uint64_t kMaxStateBytes = 16u << 20;

constexpr const char* kFixEarlier = "resume from an earlier checkpoint";
constexpr const char* kAnotherModel = "the checkpoint is of another model";
constexpr const char* kFixModelKeys =
    "check [model] keys against the checkpoint's config (in its state.json)";

[[noreturn]] void fail(const std::string& path, const std::string& problem,
                       const std::string& fix = kFixEarlier) {
  throw CheckpointError(fmt::format("[checkpoint] {}: {}. Fix: {}", path, problem, fix));
}

std::vector<int64_t> shape_of(const Tensor& t) {
  return std::vector<int64_t>(t.shape.begin(), t.shape.end());
}

// Non-throwing tests: a path we cannot stat counts as absent, and the caller's own message
// (missing checkpoint, missing file) then says what is wrong.
bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}
bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

// ---- file-system steps of the atomic write; every failure is an IoError naming the path ----

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) st::throw_io_error("open", dir.string(), errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) st::throw_io_error("fsync", dir.string(), err);
}

void remove_tree(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
  if (ec) st::throw_io_error("remove", p.string(), ec.value());
}

void make_dirs(const fs::path& p) {
  std::error_code ec;
  fs::create_directories(p, ec);
  if (ec) st::throw_io_error("create folder", p.string(), ec.value());
  if (!is_dir(p)) st::throw_io_error("create folder", p.string(), ENOTDIR);
}

void rename_path(const fs::path& from, const fs::path& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    st::throw_io_error(fmt::format("rename {} to", from.string()), to.string(), errno);
}

// ---- writing ----

// Where a tensor's bytes come from on their way to the file: the pool staging buffer when the
// device is the host (so the planner's count is what the run uses), else a reused host vector.
class TensorSource {
 public:
  TensorSource(Backend& be, Buffer staging) : be_(be), staging_(std::move(staging)) {}
  const void* fetch(const Tensor& t) {
    if (!staging_.empty()) {
      const Tensor dst(staging_.tensor().data, shape_of(t), DType::F32);
      be_.copy(dst, t);
      return dst.data;
    }
    host_.resize(static_cast<size_t>(t.numel()));
    be_.download(host_.data(), t);
    return host_.data();
  }
  /// Host memory for `numel` floats that another rank's gather fills.
  float* space(int64_t numel) {
    if (!staging_.empty()) return staging_.f32();
    host_.resize(static_cast<size_t>(numel));
    return host_.data();
  }

 private:
  Backend& be_;
  Buffer staging_;
  std::vector<float> host_;
};

// One tensor of a checkpoint file: its name there and the Param field it holds (every field has
// the shape of the value).
struct FieldSpec {
  const char* suffix;
  Buffer Param::*field;
  int moment;  // DistributedMoments' index of an AdamW moment; -1 for the weights
};
const std::vector<FieldSpec> kModelFields = {{"", &Param::value, -1}};
const std::vector<FieldSpec> kOptimizerFields = {{".exp_avg", &Param::m, 0},
                                                 {".exp_avg_sq", &Param::v, 1}};

FileRecord write_tensor_file(const fs::path& path, Model& model,
                             const std::vector<FieldSpec>& fields, int64_t step,
                             TensorSource& source, DistributedMoments* moments) {
  std::vector<st::TensorInfo> infos;
  for (Param& p : model.params())
    if (p.trainable())
      for (const FieldSpec& f : fields)
        infos.push_back({p.name + f.suffix, "F32", shape_of(p.value.tensor())});
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"producer", "remat-train " REMAT_VERSION}, {"step", std::to_string(step)}};
  st::Writer w(path.string(), std::move(infos), metadata);
  for (Param& p : model.params()) {
    if (!p.trainable()) continue;  // frozen: not in a checkpoint (engine/model.h)
    for (const FieldSpec& f : fields) {
      const size_t bytes = p.value.tensor().bytes();
      if (moments && f.moment >= 0) {
        float* whole = source.space(p.value.tensor().numel());
        moments->gather(p, f.moment, whole);
        w.write(whole, bytes);
      } else {
        w.write(source.fetch((p.*f.field).tensor()), bytes);
      }
    }
  }
  w.finish();
  return {w.bytes(), w.checksum()};
}

void write_contents(const fs::path& folder, Backend& be, Model& model, const CheckpointState& state,
                    DistributedMoments* moments) {
  TensorSource source(be, allocate_checkpoint_staging(be, model));
  const FileRecord m =
      write_tensor_file(folder / kModelFile, model, kModelFields, state.step, source, nullptr);
  const FileRecord o = write_tensor_file(folder / kOptimizerFile, model, kOptimizerFields,
                                         state.step, source, moments);
  // Last: a folder with state.json has both tensor files complete.
  st::write_file_durably((folder / kStateFile).string(), checkpoint_state_json(state, m, o));
}

// Puts the complete folder `tmp` at `final_path`. An existing checkpoint of the same step (a
// resumed run writing it again) is swapped out atomically, so step_X always names a complete one.
void install(const fs::path& tmp, const fs::path& final_path) {
  if (!path_exists(final_path)) return rename_path(tmp, final_path);
  // The old checkpoint ends up under a tmp name; deleting it is best effort once the new one is
  // in place (a leftover is removed by the next write or prune).
  std::error_code ignored;
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(tmp, ignored);
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
    st::throw_io_error(fmt::format("swap {} with", tmp.string()), final_path.string(), errno);
  // No exchange on this file system: move the old one aside under a tmp name (cleaned by prune
  // if we die in between), then rename.
  const fs::path aside = final_path.parent_path() /
                         (std::string(kTmpPrefix) + "old-" + final_path.filename().string());
  remove_tree(aside);
  rename_path(final_path, aside);
  rename_path(tmp, final_path);
  fs::remove_all(aside, ignored);
}

// ---- listing ----

std::optional<int64_t> parse_step_folder(const std::string& name) {
  if (!name.starts_with(kStepPrefix) || name.size() == kStepPrefix.size()) return std::nullopt;
  const char* first = name.data() + kStepPrefix.size();
  const char* last = name.data() + name.size();
  if (!std::all_of(first, last, [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  int64_t step = 0;
  auto [ptr, ec] = std::from_chars(first, last, step);
  if (ec != std::errc() || ptr != last) return std::nullopt;
  return step;
}

// Entries of `dir` (none when it does not exist).
std::vector<fs::directory_entry> list_dir(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  std::vector<fs::directory_entry> out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    out.push_back(*it);
  if (ec) st::throw_io_error("list", dir.string(), ec.value());
  return out;
}

// Complete checkpoints (step_<digits> folders with a state.json), oldest first.
std::vector<std::pair<int64_t, fs::path>> complete_checkpoints(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  for (const fs::directory_entry& e : list_dir(dir)) {
    const auto step = parse_step_folder(e.path().filename().string());
    std::error_code ec;
    if (step && e.is_directory(ec) && fs::is_regular_file(e.path() / kStateFile, ec))
      out.emplace_back(*step, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ---- reading ----

CheckpointStateFile read_state(const fs::path& folder) {
  const fs::path p = folder / kStateFile;
  RegularFile file = RegularFile::open_read(p.string());
  if (file.problem() == RegularFile::Problem::Missing)
    fail(p.string(), "missing: the folder is not a complete checkpoint",
         "resume from an earlier checkpoint (a complete one has state.json)");
  if (!file.ok()) fail(p.string(), file.problem_text());
  std::string text;
  if (const int err = file.read_all(text, kMaxStateBytes))
    fail(p.string(), err == EFBIG ? "larger than any state.json (16 MiB)" : std::strerror(err));
  return parse_checkpoint_state(text, p.string());
}

// Size and checksum against state.json first, then the safetensors checks.
st::Reader open_verified(const fs::path& folder, const char* name, const FileRecord& rec) {
  const std::string path = (folder / name).string();
  if (!path_exists(folder / name)) fail(path, "missing: the checkpoint is incomplete");
  st::MappedFile file(path);
  if (file.size() != rec.bytes)
    fail(path, fmt::format("the file is {} bytes but state.json records {}: it is truncated or "
                           "was replaced",
                           file.size(), rec.bytes));
  const uint64_t sum = st::xxh3_64(file.data(), file.size());
  if (sum != rec.xxh3)
    fail(path, fmt::format("checksum mismatch: XXH3-64 is {}, state.json records {}: the file "
                           "was modified or corrupted",
                           st::hex64(sum), st::hex64(rec.xxh3)));
  return st::Reader(std::move(file));
}

// Destination of one tensor of a file: a field of a parameter, or its moment in `moments`.
struct Target {
  std::string name;
  const Param* param;
  const FieldSpec* field;
  DistributedMoments* moments = nullptr;
  std::vector<int64_t> shape() const { return shape_of(param->value.tensor()); }
};

std::vector<Target> targets(Model& model, const std::vector<FieldSpec>& fields,
                            DistributedMoments* moments = nullptr) {
  std::vector<Target> out;
  for (Param& p : model.params())
    if (p.trainable())
      for (const FieldSpec& f : fields)
        out.push_back({p.name + f.suffix, &p, &f, f.moment >= 0 ? moments : nullptr});
  return out;
}

// The model a file is checked against, for the messages: the run's (loading into it), or the one
// a checkpoint's own state.json describes (Checkpoint::check_matches).
struct ModelSource {
  std::string model;        // "this model", "the model ck/step_00000100/state.json describes"
  std::string consequence;  // what a mismatch means
  std::string fix;
};
const ModelSource kRunModel{"this model", kAnotherModel, kFixModelKeys};

// The file must hold exactly the targets, f32, with the model's shapes. All checked before any
// upload, so a mismatch leaves the model as it was.
void check_tensors(const st::Reader& file, const std::vector<Target>& want,
                   const ModelSource& src = kRunModel) {
  std::set<std::string> names;
  for (const Target& t : want) {
    names.insert(t.name);
    const auto model_shape = t.shape();
    const st::TensorInfo* info = file.find(t.name);
    if (info == nullptr)
      fail(file.path(),
           fmt::format("no tensor '{}' ({} has one of shape {}): {}", t.name, src.model,
                       st::shape_string(model_shape), src.consequence),
           src.fix);
    if (info->dtype != "F32")
      fail(file.path(), fmt::format("tensor '{}' is {}, expected F32", t.name, info->dtype),
           "convert the file to f32 (remat-train keeps f32 master weights)");
    if (info->shape != model_shape)
      fail(file.path(),
           fmt::format("tensor '{}' has shape {} but {} has {}: {}", t.name,
                       st::shape_string(info->shape), src.model, st::shape_string(model_shape),
                       src.consequence),
           src.fix);
  }
  for (const st::TensorInfo& info : file.tensors())
    if (!names.count(info.name))
      fail(file.path(),
           fmt::format("tensor '{}' is not a parameter of {}: {}", info.name, src.model,
                       src.consequence),
           src.fix);
}

void copy_tensors(const st::Reader& file, Backend& be, const std::vector<Target>& want) {
  check_tensors(file, want);
  for (const Target& t : want) {
    const void* data = file.data(*file.find(t.name));
    if (t.moments)
      t.moments->load(*t.param, t.field->moment, static_cast<const float*>(data));
    else
      be.upload((t.param->*t.field->field).tensor(), data);
  }
}

}  // namespace

std::string checkpoint_folder_name(int64_t step) {
  return fmt::format("step_{:08d}", step);
}

Buffer allocate_checkpoint_staging(Backend& be, Model& model) {
  if (!be.device_is_host()) return {};
  int64_t largest = 0;
  for (Param& p : model.params())
    if (p.trainable()) largest = std::max(largest, p.value.tensor().numel());
  if (largest == 0) return {};
  return be.pool().allocate({largest}, DType::F32, MemCategory::Transient, "checkpoint.staging");
}

std::string write_checkpoint(const std::string& dir, Backend& be, Model& model,
                             const CheckpointState& state, DistributedMoments* moments) {
  const fs::path root(dir);
  const std::string name = checkpoint_folder_name(state.step);
  const fs::path tmp = root / (std::string(kTmpPrefix) + name);
  const fs::path final_path = root / name;
  make_dirs(root);
  remove_tree(tmp);
  try {
    make_dirs(tmp);
    write_contents(tmp, be, model, state, moments);
    fsync_dir(tmp);
    install(tmp, final_path);
    fsync_dir(root);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // best effort: the error being thrown is the one to report
    throw;
  }
  return final_path.string();
}

void send_checkpoint_moments(Model& model, DistributedMoments& moments) {
  for (Param& p : model.params())
    if (p.trainable())
      for (const FieldSpec& f : kOptimizerFields) moments.gather(p, f.moment, nullptr);
}

void prune_checkpoints(const std::string& dir, int64_t keep_last) {
  for (const fs::directory_entry& e : list_dir(dir))
    if (e.path().filename().string().starts_with(kTmpPrefix)) remove_tree(e.path());
  if (keep_last <= 0) return;
  const auto complete = complete_checkpoints(dir);
  const size_t keep = static_cast<size_t>(keep_last);
  for (size_t i = 0; i + keep < complete.size(); ++i) {
    // Renamed first so a run killed mid-delete leaves a tmp folder, never a half step_* one.
    const fs::path& p = complete[i].second;
    const fs::path doomed =
        p.parent_path() / (std::string(kTmpPrefix) + "del-" + p.filename().string());
    rename_path(p, doomed);
    remove_tree(doomed);
  }
}

std::string latest_checkpoint(const std::string& dir) {
  const auto complete = complete_checkpoints(dir);
  return complete.empty() ? std::string() : complete.back().second.string();
}

std::vector<std::string> step_entries_after(const std::string& dir, int64_t step) {
  std::vector<std::string> out;
  for (const fs::directory_entry& e : list_dir(dir)) {
    const auto s = parse_step_folder(e.path().filename().string());
    if (s && *s > step) out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ---- Checkpoint ----

struct Checkpoint::Impl {
  std::string path;
  CheckpointStateFile state;
  st::Reader model;
  st::Reader optimizer;

  explicit Impl(const std::string& p)
      : path(p),
        state(read_state(p)),
        model(open_verified(p, kModelFile, state.files.at(kModelFile))),
        optimizer(open_verified(p, kOptimizerFile, state.files.at(kOptimizerFile))) {}
};

namespace {
const std::string& existing_folder(const std::string& path) {
  if (!is_dir(path))
    throw CheckpointError(fmt::format(
        "[checkpoint] no checkpoint at {}. Fix: give a step_* folder or run with checkpoint.dir "
        "set",
        path));
  return path;
}
}  // namespace

Checkpoint::Checkpoint(const std::string& path)
    : impl_(std::make_unique<Impl>(existing_folder(path))) {}

CheckpointState read_checkpoint_state(const std::string& path) {
  return read_state(existing_folder(path)).state;
}
Checkpoint::~Checkpoint() = default;
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;

const std::string& Checkpoint::path() const {
  return impl_->path;
}
const CheckpointState& Checkpoint::state() const {
  return impl_->state.state;
}

void Checkpoint::load_into(Backend& be, Model& model, bool with_optimizer,
                           DistributedMoments* sharded) const {
  const auto weights = targets(model, kModelFields);
  check_tensors(impl_->model, weights);
  if (with_optimizer) {
    const auto moments = targets(model, kOptimizerFields, sharded);
    check_tensors(impl_->optimizer, moments);
    copy_tensors(impl_->optimizer, be, moments);
  }
  copy_tensors(impl_->model, be, weights);
}

void Checkpoint::check_matches(Model& model) const {
  const ModelSource own{
      fmt::format("the model {}/{} describes", impl_->path, kStateFile),
      "state.json and the tensor files are not of one model",
      "restore the state.json written with them (was it edited?), or use an earlier checkpoint"};
  check_tensors(impl_->model, targets(model, kModelFields), own);
  check_tensors(impl_->optimizer, targets(model, kOptimizerFields), own);
}

std::vector<std::string> Checkpoint::weight_names() const {
  std::vector<std::string> out;
  for (const st::TensorInfo& t : impl_->model.tensors()) out.push_back(t.name);
  return out;
}

std::vector<float> Checkpoint::weight(const std::string& name, std::vector<int64_t>* shape) const {
  const st::Reader& file = impl_->model;
  const st::TensorInfo* t = file.find(name);
  if (t == nullptr)
    fail(file.path(), fmt::format("no tensor '{}'", name),
         "use one of the names in the file's header");
  if (t->dtype != "F32")
    fail(file.path(), fmt::format("tensor '{}' is {}, expected F32", name, t->dtype),
         "convert the file to f32");
  std::vector<float> out(t->bytes() / sizeof(float));
  std::memcpy(out.data(), file.data(*t), t->bytes());
  if (shape != nullptr) *shape = t->shape;
  return out;
}

void load_weights(const std::string& path, Backend& be, Model& model) {
  const fs::path p(path);
  std::optional<st::Reader> file;
  if (is_dir(p) && path_exists(p / kStateFile)) {
    // Only the weights are needed: verify model.safetensors alone, not the optimizer file.
    const CheckpointStateFile s = read_state(p);
    file.emplace(open_verified(p, kModelFile, s.files.at(kModelFile)));
  } else if (is_dir(p)) {
    file.emplace((p / kModelFile).string());
  } else {
    file.emplace(path);
  }
  copy_tensors(*file, be, targets(model, kModelFields));
}

}  // namespace remat
