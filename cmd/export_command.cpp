// `remat-train export`: a checkpoint as a Hugging Face model folder that transformers'
// from_pretrained loads (docs/hf.md): config.json (engine/config/hf_config) and the weights under
// transformers' names and layouts (engine/model_files/hf_weights), plus the tokenizer files of the
// folder the run started from, when that is known. A LoRA run's checkpoint exports its adapters
// merged into the base (engine/training/lora_checkpoint.h), or with --adapter the PEFT adapter
// folder itself (engine/model_files/peft.h). Nothing is overwritten: OUT must be absent or empty,
// and everything is written into OUT.tmp-<pid> beside it, fsync'd, then renamed into place, so a
// killed export leaves no OUT that looks complete.
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cmd/commands.h"
#include "cmd/report.h"
#include "engine/config/config.h"
#include "engine/config/hf_config.h"
#include "engine/core/error.h"
#include "engine/core/regular_file.h"
#include "engine/core/units.h"
#include "engine/model_files/hf_weights.h"
#include "engine/model_files/peft.h"
#include "engine/model_files/safetensors.h"
#include "engine/training/checkpoint.h"
#include "engine/training/lora_checkpoint.h"

namespace remat::cli {
namespace {

namespace fs = std::filesystem;

// What a Hugging Face folder holds besides the model: the tokenizer (its fast and slow forms,
// GPT-2's vocab.json and merges.txt) and the generation defaults.
constexpr const char* kTokenizerFiles[] = {
    "tokenizer.json",    "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "tokenizer.model",       "vocab.json",
    "merges.txt",        "generation_config.json"};

void fsync_path(const fs::path& p, int flags) {
  const int fd = ::open(p.c_str(), flags | O_CLOEXEC);
  if (fd < 0) safetensors::throw_io_error("open", p.string(), errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) safetensors::throw_io_error("fsync", p.string(), err);
}

// A file of a source folder, read whole: a regular file, never a FIFO that would block.
std::string read_source_file(const fs::path& path) {
  RegularFile file = RegularFile::open_read(path.string());
  std::string text;
  const int err = file.ok() ? file.read_all(text) : 0;
  if (!file.ok() || err != 0)
    throw IoError(fmt::format("[export] cannot read {}: {}. Fix: check the file", path.string(),
                              file.ok() ? std::strerror(err) : file.problem_text()));
  return text;
}

// OUT as a folder name without a trailing slash, so that OUT.tmp-<pid> lies beside it.
fs::path output_folder(const std::string& arg) {
  fs::path p = fs::path(arg).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  return p;
}

// The Hugging Face folder the tokenizer files and token ids come from: --tokenizer-from, else
// the folder the run was initialized from (state.json's hf_source), if it is still there.
struct TokenizerSource {
  fs::path dir;      // empty: none
  std::string note;  // why none, when one was expected
};

TokenizerSource tokenizer_source(const ExportOptions& opt, const Checkpoint& ckpt) {
  std::error_code ec;
  if (!opt.tokenizer_from.empty()) {
    if (!fs::is_directory(opt.tokenizer_from, ec))
      throw ConfigError(fmt::format(
          "[export] --tokenizer-from {}: no such folder. Fix: give the Hugging Face folder the "
          "model came from",
          opt.tokenizer_from));
    return {opt.tokenizer_from, ""};
  }
  const nlohmann::json& extra = ckpt.state().extra;
  if (!extra.contains("hf_source") || !extra["hf_source"].is_string()) return {};
  const std::string dir = extra["hf_source"].get<std::string>();
  if (!fs::is_directory(dir, ec))
    return {{},
            fmt::format("no tokenizer files: {} (the run's model.from_hf) is gone; "
                        "--tokenizer-from DIR copies them",
                        dir)};
  return {dir, ""};
}

// A folder as the user named it when it lies below the working directory (state.json keeps
// folders absolute), else as is.
std::string shown_folder(const fs::path& dir) {
  std::error_code ec;
  fs::path shown = dir.lexically_relative(fs::current_path(ec));
  if (ec || shown.empty() || *shown.begin() == "..") shown = dir;
  return shown.string();
}

// OUT (`flag` names it in errors) checked: absent or an empty folder.
fs::path checked_output(const std::string& arg, const char* flag) {
  const fs::path out = output_folder(arg);
  std::error_code ec;
  // rename(2) would not follow a link (it fails on one, dangling or not, after all the writing):
  // the folder must be named as itself.
  if (fs::is_symlink(out, ec))
    throw CheckpointError(fmt::format(
        "[export] {} {}: is a symbolic link (to {}), and export writes a new folder of its own, "
        "never through a link. Fix: give the folder's own path, or a new folder",
        flag, arg, fs::read_symlink(out, ec).string()));
  if (fs::exists(out, ec) && (!fs::is_directory(out, ec) || !fs::is_empty(out, ec)))
    throw CheckpointError(fmt::format(
        "[export] {} {}: {}, and export writes a new folder and never overwrites. Fix: choose a "
        "new folder, or remove that one",
        flag, arg,
        fs::is_directory(out, ec) ? "a folder that is not empty" : "exists and is a file"));
  // The folders on the way are made as needed: the nearest that exists must be a folder export
  // can write in (a file there, or a read-only place, is the path's fault, not the disk's).
  fs::path above = out.parent_path();
  while (!above.empty() && !fs::exists(above, ec)) above = above.parent_path();
  if (above.empty()) above = ".";
  if (!fs::is_directory(above, ec))
    throw CheckpointError(
        fmt::format("[export] {} {}: {} is a file, not a folder. Fix: give a path inside a folder",
                    flag, arg, above.string()));
  if (::access(above.c_str(), W_OK) != 0)
    throw CheckpointError(
        fmt::format("[export] {} {}: cannot write in {} ({}). Fix: give a folder you can write in",
                    flag, arg, above.string(), std::strerror(errno)));
  return out;
}

// Names the OUT.tmp-<pid> folders an export into `out` left behind when a signal stopped it
// (Ctrl-C, SIGKILL, a power cut; an error removes its own). Only named, never removed: on a
// shared file system the pid may be a live export's on another host.
void warn_about_leftovers(const fs::path& out) {
  const fs::path dir = out.has_parent_path() ? out.parent_path() : fs::path(".");
  const std::string prefix = out.filename().string() + ".tmp-";
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > prefix.size() && name.starts_with(prefix) &&
        name.find_first_not_of("0123456789", prefix.size()) == std::string::npos)
      fmt::print(stderr,
                 "warning: [export] {} is what an export into {} left when it was killed; remove "
                 "it once no export is writing it\n",
                 it->path().string(), out.string());
  }
}

// Runs `fill` on OUT.tmp-<pid>, fsyncs it and renames it to `out`; removes it on any error.
template <class Fill>
void write_folder(const fs::path& out, Fill&& fill) {
  warn_about_leftovers(out);
  std::error_code ec;
  const fs::path tmp = out.string() + fmt::format(".tmp-{}", ::getpid());
  fs::create_directories(tmp, ec);
  if (ec) safetensors::throw_io_error("create the folder", tmp.string(), ec.value());
  try {
    fill(tmp);
    fsync_path(tmp, O_RDONLY | O_DIRECTORY);
    // rename(2) replaces an empty folder, and only an empty one: a folder filled meanwhile by
    // someone else makes it fail instead of losing their files.
    if (::rename(tmp.c_str(), out.c_str()) != 0)
      safetensors::throw_io_error("rename " + tmp.string() + " to", out.string(), errno);
    fsync_path(out.has_parent_path() ? out.parent_path() : fs::path("."), O_RDONLY | O_DIRECTORY);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

// --adapter OUT: the PEFT folder of a LoRA checkpoint, its tensors as trained.
int export_adapter(const ExportOptions& opt, const std::string& path, const Checkpoint& ckpt,
                   const Config& cfg) {
  if (!cfg.lora.enabled())
    throw CheckpointError(fmt::format(
        "[export] --adapter: {} is not a LoRA run's checkpoint (its lora.rank is 0). Fix: export "
        "its weights with --hf OUT",
        path));
  const std::string base = lora_base_dir(ckpt.state(), path);
  const fs::path out = checked_output(opt.adapter, "--adapter");
  write_folder(out, [&](const fs::path& tmp) {
    peft::write_adapter(tmp.string(), cfg.model, cfg.lora, base,
                        [&](const std::string& name) { return ckpt.weight(name); });
  });
  std::error_code ec;
  fmt::print(
      "exported {} (step {}) to {}: a PEFT LoRA adapter (r = {}, lora_alpha = {}{}), {} "
      "({}) and {} on the base {}\n",
      path, ckpt.state().step, out.string(), cfg.lora.rank, cfg.lora.alpha,
      cfg.lora.rslora ? ", rslora" : "", peft::kWeightsFile,
      format_bytes(fs::file_size(out / peft::kWeightsFile, ec)), peft::kConfigFile,
      base.empty() ? "(none recorded)" : shown_folder(base));
  return 0;
}

}  // namespace

int run_export(const ExportOptions& opt) {
  const std::string path = resolve_checkpoint(opt.checkpoint, "export");
  const Checkpoint ckpt(path);
  const Config cfg = checkpoint_config(ckpt);
  if (!opt.adapter.empty()) return export_adapter(opt, path, ckpt, cfg);
  const std::string arch = hf::architecture_of(cfg.model);
  const fs::path out = checked_output(opt.out, "--hf");
  const CheckpointWeights weights(ckpt, cfg);  // a LoRA run's: merged into its base
  std::error_code ec;

  const TokenizerSource tok = tokenizer_source(opt, ckpt);
  nlohmann::json source;
  const fs::path source_config = tok.dir / "config.json";
  const bool has_source = !tok.dir.empty() && fs::is_regular_file(source_config, ec);
  if (has_source) {
    try {
      source = nlohmann::json::parse(read_source_file(source_config));
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(fmt::format("{}: [export] not valid JSON ({}). Fix: correct the file",
                                    source_config.string(), e.what()));
    }
  }

  std::vector<std::string> files, copied;
  write_folder(out, [&](const fs::path& tmp) {
    const nlohmann::ordered_json config =
        hf::config_json(cfg.model, cfg.train.seq_len, opt.bf16 ? "bfloat16" : "float32",
                        has_source && source.is_object() ? &source : nullptr);
    safetensors::write_file_durably((tmp / "config.json").string(), json_text(config, 2) + "\n");
    files = hf::write_weights(tmp.string(), cfg.model,
                              [&](const std::string& name) { return weights.weight(name); },
                              {opt.bf16, opt.shard_bytes});
    for (const char* name : kTokenizerFiles)
      if (!tok.dir.empty() && fs::is_regular_file(tok.dir / name, ec)) {
        safetensors::write_file_durably((tmp / name).string(), read_source_file(tok.dir / name));
        copied.emplace_back(name);
      }
  });

  uint64_t bytes = 0;
  for (const std::string& f : files) bytes += fs::file_size(out / f, ec);
  std::string extra = tok.note.empty() ? "" : "; " + tok.note;
  if (!copied.empty())
    extra = fmt::format("; copied {} from {}", fmt::join(copied, ", "), shown_folder(tok.dir));
  if (!weights.base_dir().empty())
    extra +=
        fmt::format("; LoRA adapters merged into the base {}", shown_folder(weights.base_dir()));
  fmt::print(
      "exported {} (step {}) to {}: {}, {} weights in {} ({}){}\n", path, ckpt.state().step,
      out.string(), arch, opt.bf16 ? "bf16" : "fp32",
      files.size() == 1 ? files.front() : fmt::format("{} shards and an index", files.size() - 1),
      format_bytes(bytes), extra);
  return 0;
}

}  // namespace remat::cli
