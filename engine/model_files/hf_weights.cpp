#include "engine/model_files/hf_weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "engine/config/lora.h"
#include "engine/core/error.h"
#include "engine/core/regular_file.h"
#include "engine/model_files/safetensors.h"

namespace remat::hf {
namespace {

namespace fs = std::filesystem;
namespace st = safetensors;

constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSingleFile = "model.safetensors";
// An index lists one line per tensor: tens of KiB for the largest models.
constexpr uint64_t kMaxIndexBytes = 256u << 20;

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Elements of one row: a matrix's columns, 1 for a vector.
int64_t row_elems(const std::vector<int64_t>& shape) {
  return shape.size() > 1 ? numel(shape) / shape[0] : 1;
}

bool is_float(const std::string& dtype) {
  return dtype == "F32" || dtype == "BF16" || dtype == "F16";
}

// The tensors of a folder: one file, or the shards its index lists, every one validated as
// safetensors (st::Reader) before a name is trusted.
class StateDict {
 public:
  struct Entry {
    const st::Reader* file = nullptr;
    const st::TensorInfo* info = nullptr;
  };

  // transformers 4.57's from_pretrained takes model.safetensors when the folder has one (a
  // regular file), and only then model.safetensors.index.json: the same order here, so that a
  // folder holding both is the same model on both sides. Anything else named model.safetensors (a
  // FIFO, a folder) is refused by the Reader rather than passed over.
  explicit StateDict(const std::string& dir) : dir_(dir) {
    const fs::path single = fs::path(dir) / kSingleFile, index = fs::path(dir) / kIndexFile;
    std::error_code ec;
    const bool has_index = fs::exists(index, ec);
    if (fs::exists(single, ec)) {
      const st::Reader& r = add_file(kSingleFile);
      for (const st::TensorInfo& t : r.tensors()) entries_[t.name] = {&r, &t};
      index_ignored_ = has_index;
    } else if (has_index) {
      open_index(index.string());
    } else {
      throw CheckpointError(fmt::format(
          "[hf] {}: neither {} nor {} is in the folder. Fix: give a folder with safetensors "
          "weights (pytorch_model.bin is not read: save the model again with "
          "safe_serialization=True)",
          dir, kSingleFile, kIndexFile));
    }
  }

  const Entry* find(const std::string& name) const {
    const auto it = entries_.find(name);
    return it == entries_.end() ? nullptr : &it->second;
  }
  const std::map<std::string, Entry>& entries() const { return entries_; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, e] : entries_) out.push_back(name);
    return out;
  }
  size_t n_files() const { return files_.size(); }
  /// Whether an index beside model.safetensors was passed over.
  bool index_ignored() const { return index_ignored_; }

 private:
  const st::Reader& add_file(const std::string& name) {
    auto it = by_name_.find(name);
    if (it != by_name_.end()) return *it->second;
    files_.push_back(std::make_unique<st::Reader>((fs::path(dir_) / name).string()));
    by_name_[name] = files_.back().get();
    return *files_.back();
  }

  void open_index(const std::string& path) {
    RegularFile index = RegularFile::open_read(path);
    std::string text;
    if (!index.ok())
      throw CheckpointError(fmt::format("[hf] {}: {}. Fix: give the folder's index file", path,
                                        index.problem_text()));
    if (const int err = index.read_all(text, kMaxIndexBytes))
      throw CheckpointError(
          fmt::format("[hf] {}: {}. Fix: save the model again", path,
                      err == EFBIG ? "larger than any index (256 MiB)" : std::strerror(err)));
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw CheckpointError(
          fmt::format("[hf] {}: not valid JSON ({}). Fix: save the model again", path, e.what()));
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw CheckpointError(
          fmt::format("[hf] {}: no \"weight_map\" object. Fix: save the model again", path));
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos ||
          file.get<std::string>().empty())
        throw CheckpointError(fmt::format(
            "[hf] {}: weight_map[\"{}\"] = {} is not a file name in the folder. Fix: save the "
            "model again",
            path, name, file.dump()));
      const st::Reader& r = add_file(file.get<std::string>());
      const st::TensorInfo* info = r.find(name);
      if (!info)
        throw CheckpointError(fmt::format(
            "[hf] {}: the index puts tensor '{}' in this file, which has no such tensor. Fix: "
            "download the shard again, or save the model again",
            r.path(), name));
      entries_[name] = {&r, info};
    }
    // A shard's tensor that the index leaves out would be loaded by transformers (it reads whole
    // shards) and ignored here: the two would not build the same model.
    for (const auto& f : files_)
      for (const st::TensorInfo& t : f->tensors())
        if (!entries_.count(t.name))
          throw CheckpointError(fmt::format(
              "[hf] {}: tensor '{}' is not in {}'s weight_map. Fix: save the model again",
              f->path(), t.name, kIndexFile));
  }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<st::Reader>> files_;
  std::map<std::string, const st::Reader*> by_name_;
  std::map<std::string, Entry> entries_;
  bool index_ignored_ = false;
};

std::vector<float> read_f32(const StateDict::Entry& e) {
  std::vector<float> out(static_cast<size_t>(numel(e.info->shape)));
  st::to_f32(e.info->dtype, e.file->data(*e.info), out.size(), out.data());
  return out;
}

// (rows, cols) -> (cols, rows), in tiles so that both sides are read and written in runs.
void transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  constexpr int64_t kTile = 64;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile)
      for (int64_t r = r0; r < std::min(rows, r0 + kTile); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + kTile); ++c)
          dst[c * rows + r] = src[r * cols + c];
}

std::vector<int64_t> shape_of(const Tensor& t) {
  return std::vector<int64_t>(t.shape.begin(), t.shape.end());
}

// Piece `pc` of our parameter `ours` (mapping `mp`) in the Hugging Face layout.
void extract(const Mapping& mp, const Piece& pc, const std::vector<float>& ours,
             std::vector<float>& piece) {
  REMAT_ASSERT(static_cast<int64_t>(ours.size()) == numel(mp.shape), "hf: {} has {} values",
               mp.ours, ours.size());
  piece.resize(static_cast<size_t>(numel(pc.shape)));
  if (mp.transposed)
    transpose(ours.data(), mp.shape[0], mp.shape[1], piece.data());
  else
    std::copy_n(ours.begin() + pc.row0 * row_elems(mp.shape), piece.size(), piece.begin());
}

const Param& param_named(Model& model, const std::string& name) {
  for (const Param& p : model.params())
    if (p.name == name) return p;
  REMAT_ASSERT(false, "hf: the model has no parameter {}", name);
  return model.params().front();
}

[[noreturn]] void refuse(const std::string& where, const std::string& problem,
                         const std::string& fix) {
  throw CheckpointError(fmt::format("[hf] {}: {}. Fix: {}", where, problem, fix));
}

// A NaN or an infinity in a file's weights: found as the tensor is converted, so that a damaged
// download is named here, not reported at step 1 as a divergence (whose first non-finite
// gradient would be some other tensor's). `v` holds the first `n` values of tensor `name`.
void check_finite(const StateDict::Entry& e, const std::string& name, const float* v, size_t n) {
  const float* bad = std::find_if(v, v + n, [](float x) { return !std::isfinite(x); });
  if (bad == v + n) return;
  const size_t count =
      static_cast<size_t>(std::count_if(bad, v + n, [](float x) { return !std::isfinite(x); }));
  refuse(e.file->path(),
         fmt::format("tensor '{}' holds {} at element {}{}", name,
                     std::isnan(*bad) ? "NaN" : (*bad > 0 ? "inf" : "-inf"), bad - v,
                     count > 1 ? fmt::format(" ({} values are not finite)", count) : ""),
         "the file is damaged or the model it was saved from had diverged: download it again, "
         "or use a checkpoint saved before that");
}

// A frozen weight stored in bf16 (lora.base = "bf16", or the embedding and head below fp32) rounds
// a finite f32 of magnitude 0x1.ffp127 (3.3962e38) or more to infinity: named here, with a
// storage that keeps it, not reported at step 1 as a divergence whose fix is the learning rate.
void check_fits_bf16(const std::string& dir, const std::string& name, const std::vector<float>& v) {
  const auto rounds_to_inf = [](float x) {
    const uint32_t mag = std::bit_cast<uint32_t>(x) & 0x7fffffffu;
    return mag >= 0x7f7f8000u && mag < 0x7f800000u;
  };
  const auto bad = std::find_if(v.begin(), v.end(), rounds_to_inf);
  if (bad == v.end()) return;
  refuse(dir,
         fmt::format("tensor '{}' holds {:g} at element {}, beyond bf16's range (its largest "
                     "value is 3.3895e+38), and lora.base stores it in bf16",
                     name, *bad, bad - v.begin()),
         "set lora.base = \"fp32\", which keeps the file's values");
}

constexpr const char* kFixAnotherModel =
    "the folder's config.json and its weights must be of one model; download the folder again";

// Our parameter `mp` from its pieces in `sd`, as f32 into `host` (its element count; vocabulary
// rows the file lacks stay 0), each piece's pages given back once read.
void assemble(const StateDict& sd, const Mapping& mp, std::vector<float>& host,
              std::vector<float>& scratch) {
  host.assign(static_cast<size_t>(numel(mp.shape)), 0.0f);  // padded vocabulary rows stay 0
  for (const Piece& pc : mp.pieces) {
    const StateDict::Entry& e = *sd.find(pc.name);
    const std::byte* src = e.file->data(*e.info);
    if (mp.transposed) {
      scratch.resize(host.size());
      st::to_f32(e.info->dtype, src, scratch.size(), scratch.data());
      check_finite(e, pc.name, scratch.data(), scratch.size());
      transpose(scratch.data(), pc.shape[0], pc.shape[1], host.data());
    } else {
      const int64_t rows = std::min(e.info->shape[0], pc.shape[0]);
      float* dst = host.data() + pc.row0 * row_elems(mp.shape);
      const size_t n = static_cast<size_t>(rows * row_elems(pc.shape));
      st::to_f32(e.info->dtype, src, n, dst);
      check_finite(e, pc.name, dst, n);
    }
    e.file->release(*e.info);
  }
}

}  // namespace

struct FolderReader::Impl {
  StateDict sd;
  std::vector<Mapping> maps;
  Impl(const std::string& dir, const ModelConfig& m)
      : sd(dir), maps(mappings(m, state_dict_prefix(m, sd.names()))) {}
};

FolderReader::FolderReader(const std::string& dir, const ModelConfig& m)
    : impl_(std::make_unique<Impl>(dir, m)) {
  for (const Mapping& mp : impl_->maps)
    for (const Piece& pc : mp.pieces) {
      const StateDict::Entry* e = impl_->sd.find(pc.name);
      if (!e || !is_float(e->info->dtype) || e->info->shape.size() != pc.shape.size() ||
          (!mp.vocab && e->info->shape != pc.shape))
        refuse(dir,
               fmt::format("no tensor '{}' of dtype F32, BF16 or F16 and shape {}", pc.name,
                           st::shape_string(pc.shape)),
               kFixAnotherModel);
    }
}
FolderReader::~FolderReader() = default;

std::vector<float> FolderReader::read(const std::string& ours) const {
  for (const Mapping& mp : impl_->maps)
    if (mp.ours == ours) {
      std::vector<float> host, scratch;
      assemble(impl_->sd, mp, host, scratch);
      return host;
    }
  REMAT_ASSERT(false, "hf: no mapping for {}", ours);
  return {};
}

bool FolderReader::has(const std::string& ours) const {
  for (const Mapping& mp : impl_->maps)
    if (mp.ours == ours) return true;
  return false;
}

std::string load_weights(const std::string& dir, const ModelConfig& m, Backend& be, Model& model) {
  StateDict sd(dir);
  const std::vector<Mapping> maps = mappings(m, state_dict_prefix(m, sd.names()));
  size_t base_params = 0;  // LoRA's adapters are no part of a Hugging Face model folder
  for (const Param& p : model.params()) base_params += !lora::is_adapter_name(p.name);
  REMAT_ASSERT(maps.size() == base_params, "hf: {} mappings for {} parameters", maps.size(),
               base_params);

  // Every name, dtype and shape first: a refused folder leaves the model untouched.
  std::set<std::string> used;
  std::set<std::string> dtypes;
  std::optional<int64_t> file_vocab;  // the embedding's rows in the file
  for (const Mapping& mp : maps) {
    REMAT_ASSERT(shape_of(param_named(model, mp.ours).value.tensor()) == mp.shape,
                 "hf: mapping of {} has another shape than the parameter", mp.ours);
    for (const Piece& pc : mp.pieces) {
      const StateDict::Entry* e = sd.find(pc.name);
      if (!e)
        refuse(dir,
               fmt::format("no tensor '{}' (the model config.json describes makes {} of it)",
                           pc.name, mp.ours),
               kFixAnotherModel);
      const std::vector<int64_t>& got = e->info->shape;
      if (!is_float(e->info->dtype))
        refuse(
            e->file->path(),
            fmt::format("tensor '{}' is {}; F32, BF16 and F16 are read", pc.name, e->info->dtype),
            "save the model in one of them (quantized weights are not imported)");
      const bool vocab_rows_differ = mp.vocab && got.size() == 2 && got[1] == pc.shape[1];
      if (got != pc.shape && !vocab_rows_differ)
        refuse(e->file->path(),
               fmt::format("tensor '{}' has shape {} but the model config.json describes needs "
                           "{} (for {})",
                           pc.name, st::shape_string(got), st::shape_string(pc.shape), mp.ours),
               kFixAnotherModel);
      if (mp.vocab) {
        if (file_vocab && got[0] != *file_vocab)
          refuse(e->file->path(),
                 fmt::format("tensor '{}' has {} rows but the embedding has {}", pc.name, got[0],
                             *file_vocab),
                 kFixAnotherModel);
        file_vocab = got[0];
      }
      dtypes.insert(e->info->dtype);
      used.insert(pc.name);
    }
  }

  // A tied LM head is the embedding; a file that carries it anyway must agree, or the folder
  // would mean two different models (which one transformers builds depends on load order).
  std::string head_note;
  const bool tied = m.kind == ModelKind::Gpt || m.tie_embeddings;
  if (const StateDict::Entry* head = sd.find("lm_head.weight"); head && tied) {
    const StateDict::Entry& emb = *sd.find(maps.front().pieces.front().name);
    const bool same = head->info->shape == emb.info->shape &&
                      (head->info->dtype == emb.info->dtype
                           ? std::memcmp(head->file->data(*head->info), emb.file->data(*emb.info),
                                         head->info->bytes()) == 0
                           : read_f32(*head) == read_f32(emb));
    if (!same)
      refuse(head->file->path(),
             fmt::format("lm_head.weight differs from {}, and config.json ties the LM head to "
                         "the embedding (tie_word_embeddings)",
                         maps.front().pieces.front().name),
             "set \"tie_word_embeddings\": false in config.json if the head is its own weight");
    head->file->release(*head->info);
    emb.file->release(*emb.info);
    used.insert("lm_head.weight");
    head_note = "; lm_head.weight equals the embedding (tied): not loaded twice";
  }
  int64_t buffers = 0;
  std::vector<std::string> left;
  for (const std::string& name : sd.names()) {
    if (used.count(name)) continue;
    if (is_buffer(m, name))
      ++buffers;
    else
      left.push_back(name);
  }
  if (!left.empty())
    refuse(sd.find(left.front())->file->path(),
           fmt::format("tensor '{}' is not part of the model config.json describes{}", left.front(),
                       left.size() > 1 ? fmt::format(" ({} such tensors)", left.size()) : ""),
           kFixAnotherModel);

  std::vector<float> host, scratch;
  std::set<std::string> stored;  // what the parameters keep: f32, or a frozen base's bf16 / nf4
  for (const Mapping& mp : maps) {
    assemble(sd, mp, host, scratch);
    const Tensor& dst = param_named(model, mp.ours).value.tensor();
    if (dst.dtype == DType::BF16) check_fits_bf16(dir, mp.pieces.front().name, host);
    stored.insert(dtype_name(dst.dtype));
    upload_weight(be, dst, host.data());
  }

  std::string vocab_note;
  if (*file_vocab > m.vocab_size)
    vocab_note = fmt::format("; vocabulary rows {}..{} of the file dropped (model.vocab_size = {})",
                             m.vocab_size, *file_vocab - 1, m.vocab_size);
  else if (*file_vocab < m.vocab_size)
    vocab_note = fmt::format("; vocabulary rows {}..{} added as zeros (model.vocab_size = {})",
                             *file_vocab, m.vocab_size - 1, m.vocab_size);
  return fmt::format("{} tensors from {} file{} ({} -> {}){}{}{}{}",
                     used.size() - !head_note.empty(), sd.n_files(), sd.n_files() == 1 ? "" : "s",
                     fmt::join(dtypes, ", "), fmt::join(stored, ", "), vocab_note, head_note,
                     buffers ? fmt::format("; {} buffers skipped (recomputed)", buffers) : "",
                     sd.index_ignored()
                         ? fmt::format("; {} beside it not read (transformers loads {} first)",
                                       kIndexFile, kSingleFile)
                         : "");
}

nlohmann::json folder_fingerprint(const std::string& dir) {
  constexpr int kSlices = 16;
  constexpr uint64_t kSlice = 64 * 1024;
  // The files a load reads: config.json, and the weights (the shards the index names, or the one).
  std::vector<std::string> names = {"config.json"};
  {
    const StateDict sd(dir);
    std::set<std::string> files;
    for (const auto& [name, e] : sd.entries())
      files.insert(fs::path(e.file->path()).filename().string());
    names.insert(names.end(), files.begin(), files.end());
    std::error_code ec;
    if (fs::is_regular_file(fs::path(dir) / kIndexFile, ec)) names.push_back(kIndexFile);
  }
  nlohmann::json files = nlohmann::json::object();
  for (const std::string& n : names) {
    const st::MappedFile f((fs::path(dir) / n).string());
    const std::byte* p = f.data();
    const uint64_t size = f.size();
    // The header of a safetensors file (8-byte length, then JSON), whole; the rest in slices.
    uint64_t head = size;
    if (n != "config.json" && n != kIndexFile && size >= 8) {
      uint64_t len = 0;
      std::memcpy(&len, p, 8);
      head = std::min(size, 8 + len);
    }
    std::string bytes(reinterpret_cast<const char*>(p), head);
    const uint64_t rest = size - head;
    if (rest > 0)
      for (int s = 0; s < kSlices; ++s) {
        const uint64_t at = head + rest / kSlices * static_cast<uint64_t>(s);
        bytes.append(reinterpret_cast<const char*>(p + at), std::min(kSlice, size - at));
      }
    files[n] = {{"bytes", size}, {"xxh3", st::hex64(st::xxh3_64(bytes.data(), bytes.size()))}};
  }
  return {{"files", files}};
}

std::string fingerprint_difference(const nlohmann::json& recorded, const nlohmann::json& now) {
  const nlohmann::json& a = recorded.at("files");
  const nlohmann::json& b = now.at("files");
  for (const auto& [name, rec] : a.items()) {
    if (!b.contains(name)) return fmt::format("{} is gone", name);
    if (b[name]["bytes"] != rec["bytes"])
      return fmt::format("{} is {} bytes, {} recorded", name, b[name]["bytes"].dump(),
                         rec["bytes"].dump());
    if (b[name]["xxh3"] != rec["xxh3"])
      return fmt::format("{} has other contents (sampled XXH3-64 {}, {} recorded)", name,
                         b[name]["xxh3"].get<std::string>(), rec["xxh3"].get<std::string>());
  }
  for (const auto& [name, rec] : b.items())
    if (!a.contains(name)) return fmt::format("{} is new", name);
  return "";
}

void for_each_tensor(const ModelConfig& m, const ParamSource& source,
                     const std::function<void(const Piece&, const std::vector<float>&)>& sink) {
  const std::string prefix = m.kind == ModelKind::Gpt ? "transformer." : "model.";
  std::vector<float> piece;
  for (const Mapping& mp : mappings(m, prefix)) {
    const std::vector<float> ours = source(mp.ours);
    for (const Piece& pc : mp.pieces) {
      extract(mp, pc, ours, piece);
      sink(pc, piece);
    }
  }
}

std::vector<std::string> write_weights(const std::string& dir, const ModelConfig& m,
                                       const ParamSource& source, const WriteOptions& opt) {
  const std::string prefix = m.kind == ModelKind::Gpt ? "transformer." : "model.";
  const std::vector<Mapping> maps = mappings(m, prefix);
  const uint64_t elem = opt.bf16 ? 2 : 4;
  // Shards hold whole parameters (q, k and v of one block stay together), in model order, each
  // up to shard_bytes unless one parameter alone is larger.
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (size_t i = 0; i < maps.size(); ++i) {
    const uint64_t bytes = static_cast<uint64_t>(numel(maps[i].shape)) * elem;
    if (!shards.back().empty() && in_shard + bytes > opt.shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += bytes;
    total += bytes;
  }
  const size_t n = shards.size();
  std::vector<std::string> files;
  nlohmann::json weight_map = nlohmann::json::object();
  std::vector<uint16_t> half;
  for (size_t s = 0; s < n; ++s) {
    const std::string name =
        n == 1 ? kSingleFile : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, n);
    std::vector<st::TensorInfo> infos;
    for (size_t i : shards[s])
      for (const Piece& pc : maps[i].pieces) {
        infos.push_back({pc.name, opt.bf16 ? "BF16" : "F32", pc.shape});
        weight_map[pc.name] = name;
      }
    // transformers refuses a safetensors file whose metadata does not say "pt".
    st::Writer w((fs::path(dir) / name).string(), infos, {{"format", "pt"}});
    std::vector<float> piece;
    for (size_t i : shards[s]) {
      const Mapping& mp = maps[i];
      const std::vector<float> ours = source(mp.ours);
      for (const Piece& pc : mp.pieces) {
        extract(mp, pc, ours, piece);
        if (opt.bf16) {
          half.resize(piece.size());
          std::transform(piece.begin(), piece.end(), half.begin(), st::f32_to_bf16);
          w.write(half.data(), half.size() * 2);
        } else {
          w.write(piece.data(), piece.size() * 4);
        }
      }
    }
    w.finish();
    files.push_back(name);
  }
  if (n > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total}}},
                                  {"weight_map", weight_map}};
    st::write_file_durably((fs::path(dir) / kIndexFile).string(), index.dump(2) + "\n");
    files.push_back(kIndexFile);
  }
  return files;
}

}  // namespace remat::hf
