// Token shards, text files and data.path expansion (see data/token_corpus.h).
#include "data/token_corpus.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>
#include <vector>

#include "engine/core/error.h"

namespace remat {
namespace fs = std::filesystem;
namespace {

const char* kTokensFix =
    "regenerate the shard with an llm.c-format tokenizer (or scripts/prepare_data.py), or set "
    "data.source = \"text\"";

[[noreturn]] void path_error(const std::string& key, const std::string& problem,
                             const std::string& fix) {
  throw DataError(fmt::format("[data] {}: {}. Fix: {}", key, problem, fix));
}

std::string cwd_note() {
  std::error_code ec;
  return fmt::format("relative paths start at the working directory, {}",
                     fs::current_path(ec).string());
}

bool is_glob(const std::string& s) {
  return s.find_first_of("*?[") != std::string::npos;
}
bool is_hidden(const fs::path& p) {
  return p.filename().string().starts_with('.');
}

// glob(3) without its locale-dependent sort: the caller sorts bytewise.
std::vector<std::string> glob_matches(const std::string& key, const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), GLOB_NOSORT, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && out.empty()))
    path_error(key, fmt::format("no file matches '{}'", pattern),
               fmt::format("correct the pattern ({})", cwd_note()));
  if (rc != 0)
    path_error(key, fmt::format("cannot expand '{}' (a directory could not be read)", pattern),
               "check the directories' permissions");
  std::sort(out.begin(), out.end());
  return out;
}

// Tokens: the *.bin files directly in `dir`; text: every non-empty regular file under it (an
// empty one adds no text; a folder of documents may well hold one). Hidden entries are skipped
// (and hidden directories not entered).
std::vector<std::string> directory_files(const std::string& key, const std::string& dir,
                                         DataFormat format) {
  std::vector<std::string> out;
  auto take = [&](const fs::directory_entry& e) {
    std::error_code ec;
    if (is_hidden(e.path()) || !e.is_regular_file(ec)) return;
    if (format == DataFormat::Text && e.file_size(ec) == 0 && !ec) return;
    if (format == DataFormat::Tokens &&
        (e.path().extension() != ".bin" || is_mask_path(e.path().string())))
      return;  // loss masks are read beside their shards, never as shards
    out.push_back(e.path().string());
  };
  std::error_code ec;
  if (format == DataFormat::Tokens) {
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) take(*it);
  } else {
    fs::recursive_directory_iterator it(dir, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      if (is_hidden(it->path()) && it->is_directory(ec)) it.disable_recursion_pending();
      take(*it);
    }
  }
  if (ec)
    path_error(key, fmt::format("cannot read directory '{}' ({})", dir, ec.message()),
               "check its permissions");
  if (out.empty())
    path_error(key,
               fmt::format("directory '{}' has no {}", dir,
                           format == DataFormat::Tokens ? "*.bin files" : "non-empty regular files"),
               format == DataFormat::Tokens
                   ? "put the token shards (*.bin) there, or name the files or a glob"
                   : "put the text files there, or name the files or a glob");
  std::sort(out.begin(), out.end());
  return out;
}

// One path (given or matched by a glob): itself if a file, its files if a directory.
void expand_one(const std::string& key, const std::string& path, DataFormat format,
                std::vector<std::string>& out, bool matched) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st))
    path_error(key, fmt::format("'{}' does not exist", path),
               fmt::format("correct the path ({})", cwd_note()));
  if (fs::is_directory(st)) {
    for (std::string& f : directory_files(key, path, format)) out.push_back(std::move(f));
  } else if (fs::is_regular_file(st)) {
    if (format == DataFormat::Tokens && is_mask_path(path)) {
      if (matched) return;  // a glob's match: the mask is read beside its shard
      path_error(
          key, fmt::format("'{}' is a loss mask, read beside its shard", path),
          fmt::format("name the shard ({}) instead", path.substr(0, path.size() - 9) + ".bin"));
    }
    // A glob's empty text file adds no text (as in a directory); one named on its own is an
    // error, reported when it is opened.
    if (format == DataFormat::Text && matched && fs::file_size(path, ec) == 0 && !ec) return;
    out.push_back(path);
  } else {
    path_error(key, fmt::format("'{}' is not a regular file or a directory", path),
               "name data files, directories of them, or a glob");
  }
}

}  // namespace

std::vector<std::string> expand_data_paths(const std::vector<std::string>& entries,
                                           DataFormat format, const std::string& key) {
  if (entries.empty()) path_error(key, "no files given", "set it to a file, a directory or a glob");
  std::vector<std::string> files;
  for (const std::string& e : entries) {
    if (is_glob(e)) {
      const size_t before = files.size();
      for (const std::string& m : glob_matches(key, e)) expand_one(key, m, format, files, true);
      if (files.size() == before && format == DataFormat::Text)
        path_error(key, fmt::format("every file matching '{}' is empty", e),
                   "fill them, or correct the pattern");
    } else {
      expand_one(key, e, format, files, false);
    }
  }
  // Overlapping entries ("a.bin" and "*.bin") would train on a file twice as often: keep one.
  std::set<fs::path> seen;
  std::vector<std::string> unique;
  for (std::string& f : files) {
    std::error_code ec;
    if (seen.insert(fs::weakly_canonical(f, ec)).second) unique.push_back(std::move(f));
  }
  return unique;
}

// ---- Shard ----

namespace {

int32_t header_word(const uint8_t* p, int i) {
  const uint8_t* w = p + 4 * i;
  return static_cast<int32_t>(static_cast<uint32_t>(w[0]) | static_cast<uint32_t>(w[1]) << 8 |
                              static_cast<uint32_t>(w[2]) << 16 |
                              static_cast<uint32_t>(w[3]) << 24);
}

[[noreturn]] void shard_error(const std::string& path, const std::string& problem,
                              const std::string& fix) {
  throw DataError(fmt::format("[data] {}: {}. Fix: {}", path, problem, fix));
}

}  // namespace

Shard::Shard(const std::string& path, DataFormat format) : file_(path), format_(format) {
  const uint64_t size = file_.size();
  if (size == 0)
    shard_error(path, "the file is empty", "remove it from the data paths, or fill it");
  if (format == DataFormat::Text) {
    n_tokens_ = static_cast<int64_t>(size);
    return;
  }
  if (size < static_cast<uint64_t>(kShardHeaderBytes))
    shard_error(path,
                fmt::format("{} bytes, shorter than the {}-byte header of a token shard", size,
                            kShardHeaderBytes),
                kTokensFix);
  uint8_t h[kShardHeaderBytes];
  file_.read(0, sizeof h, h);
  const int32_t magic = header_word(h, 0), version = header_word(h, 1);
  if (magic != kShardMagic && magic != kShard32Magic)
    shard_error(path,
                fmt::format("bad magic number {} (a token shard starts with {}, uint16 tokens, or "
                            "{}, uint32 tokens)",
                            magic, kShardMagic, kShard32Magic),
                kTokensFix);
  const bool wide = magic == kShard32Magic;
  const int32_t want = wide ? kShard32Version : kShardVersion;
  if (version != want)
    shard_error(path,
                fmt::format("unsupported version {} for magic {} (llm.c writes version {} there: "
                            "{} tokens)",
                            version, magic, want, wide ? "uint32" : "uint16"),
                fmt::format("regenerate the shard with llm.c's write_datafile or "
                            "scripts/prepare_data.py (magic {} goes with version {}, {} with {})",
                            kShardMagic, kShardVersion, kShard32Magic, kShard32Version));
  token_bytes_ = wide ? 4 : 2;
  const int64_t count = header_word(h, 2);
  if (count < 0)
    shard_error(path, fmt::format("negative token count {} in the header", count), kTokensFix);
  const uint64_t expected =
      static_cast<uint64_t>(kShardHeaderBytes) + static_cast<uint64_t>(token_bytes_ * count);
  if (size < expected)
    shard_error(
        path,
        fmt::format(
            "truncated: the header declares {} {} tokens ({} bytes with the header), the file has "
            "{} bytes ({} missing)",
            count, wide ? "uint32" : "uint16", expected, size, expected - size),
        "re-download or regenerate the shard");
  if (size > expected)
    shard_error(
        path,
        fmt::format(
            "{} trailing bytes after the {} {} tokens the header declares ({} bytes expected, {} "
            "found)",
            size - expected, count, wide ? "uint32" : "uint16", expected, size),
        "regenerate the shard, or fix the token count in its header");
  first_byte_ = kShardHeaderBytes;
  n_tokens_ = count;
}

void Shard::decode(const uint8_t* bytes, int64_t n, int32_t* out) const {
  // Little-endian on every host. A uint32 token above INT32_MAX lands negative here; read()
  // compares as unsigned, so it still fails the vocabulary check.
  if (token_bytes_ == 1) {
    for (int64_t i = 0; i < n; ++i) out[i] = bytes[i];
  } else if (token_bytes_ == 2) {
    for (int64_t i = 0; i < n; ++i) out[i] = bytes[2 * i] | (bytes[2 * i + 1] << 8);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* b = bytes + 4 * i;
      out[i] = static_cast<int32_t>(static_cast<uint32_t>(b[0]) | static_cast<uint32_t>(b[1]) << 8 |
                                    static_cast<uint32_t>(b[2]) << 16 |
                                    static_cast<uint32_t>(b[3]) << 24);
    }
  }
}

int64_t Shard::token(int64_t i) const {
  uint8_t bytes[4];
  file_.read(offset_of(i), static_cast<size_t>(token_bytes_), bytes);
  int32_t out = 0;
  decode(bytes, 1, &out);
  return token_bytes_ == 4 ? static_cast<int64_t>(static_cast<uint32_t>(out)) : out;
}

void Shard::bad_token(int64_t index, int64_t vocab) const {
  const int64_t v = token(index);
  // No model.vocab_size reaches such a value (engine/config/config.cpp caps it at 2^24): the shard
  // is corrupt or made for something else, and raising the vocabulary is no fix.
  const std::string fix =
      v >= (int64_t{1} << 24)
          ? "regenerate the shard (no vocabulary reaches that id: a corrupt or foreign file)"
          : fmt::format(
                "raise model.vocab_size to at least {}, or re-tokenize the data with a "
                "vocabulary of {}",
                v + 1, vocab);
  throw DataError(fmt::format(
      "[data] {}: token index {} (byte offset {}) is {}, outside the vocabulary (model.vocab_size "
      "= {}). Fix: {}",
      path(), index, offset_of(index), v, vocab, fix));
}

void Shard::read(int64_t start, int64_t n, int32_t* out, int64_t vocab) const {
  // One buffer per thread, reused: a window is read once per row of every step.
  thread_local std::vector<uint8_t> bytes;
  bytes.resize(static_cast<size_t>(n * token_bytes_));
  file_.read(offset_of(start), bytes.size(), bytes.data());
  decode(bytes.data(), n, out);
  // Unsigned: a uint32 token past INT32_MAX decoded negative, and must not pass as small.
  uint32_t largest = 0;
  for (int64_t i = 0; i < n; ++i) largest = std::max(largest, static_cast<uint32_t>(out[i]));
  if (largest < vocab) return;  // the common case: one compare per window, not per token
  for (int64_t i = 0; i < n; ++i)
    if (static_cast<uint32_t>(out[i]) >= vocab) bad_token(start + i, vocab);
}

void Shard::check_tokens(int64_t vocab) const {
  if (format_ == DataFormat::Text && vocab >= 256) return;  // a byte is always in range
  constexpr int64_t kChunk =
      1 << 18;  // tokens per read: 512 KiB of a uint16 shard, 1 MiB of uint32
  std::vector<int32_t> chunk(static_cast<size_t>(kChunk));
  for (int64_t begin = 0; begin < n_tokens_; begin += kChunk)
    read(begin, std::min(kChunk, n_tokens_ - begin), chunk.data(), vocab);
}

std::vector<int64_t> Shard::document_ends(int64_t begin, int64_t end, int64_t eot) const {
  std::vector<int64_t> ends;
  constexpr int64_t kChunk = 1 << 18;
  std::vector<int32_t> chunk(static_cast<size_t>(kChunk));
  for (int64_t at = begin; at < end; at += kChunk) {
    const int64_t n = std::min(kChunk, end - at);
    // The vocabulary was checked at open: any bound above every id reads the tokens as they are.
    read(at, n, chunk.data(), int64_t{1} << 32);
    for (int64_t i = 0; i < n; ++i)
      if (chunk[static_cast<size_t>(i)] == eot) ends.push_back(at + i + 1);
  }
  if (end > begin && (ends.empty() || ends.back() != end)) ends.push_back(end);
  return ends;
}

bool Shard::contains(int64_t token) const {
  constexpr int64_t kChunk = 1 << 18;
  std::vector<int32_t> chunk(static_cast<size_t>(kChunk));
  for (int64_t at = 0; at < n_tokens_; at += kChunk) {
    const int64_t n = std::min(kChunk, n_tokens_ - at);
    read(at, n, chunk.data(), int64_t{1} << 32);  // the vocabulary was checked at open
    if (std::find(chunk.begin(), chunk.begin() + n, token) != chunk.begin() + n) return true;
  }
  return false;
}

// ---- LossMask ----

std::string mask_path_of(const std::string& shard_path) {
  const std::string stem =
      shard_path.ends_with(".bin") ? shard_path.substr(0, shard_path.size() - 4) : shard_path;
  return stem + ".mask.bin";
}

bool is_mask_path(const std::string& path) {
  return path.ends_with(".mask.bin");
}

void LossMask::fail(const std::string& problem, const std::string& fix) const {
  throw DataError(fmt::format("[data] {}: {} (the loss mask of {}). Fix: {}", path(), problem,
                              shard_path_, fix));
}

LossMask::LossMask(const std::string& path, const std::string& shard_path, int64_t tokens)
    : file_(path), shard_path_(shard_path), n_tokens_(tokens) {
  const char* regenerate =
      "regenerate both with scripts/prepare_data.py, or set data.loss_mask = \"off\" to train "
      "every target";
  const uint64_t size = file_.size();
  if (size < static_cast<uint64_t>(kShardHeaderBytes))
    fail(fmt::format("{} bytes, shorter than the {}-byte header", size, kShardHeaderBytes),
         regenerate);
  uint8_t h[kShardHeaderBytes];
  file_.read(0, sizeof h, h);
  const int32_t magic = header_word(h, 0), version = header_word(h, 1), count = header_word(h, 2);
  if (magic != kMaskMagic || version != kMaskVersion)
    fail(fmt::format("header magic {} version {}, a loss mask has magic {} version {}", magic,
                     version, kMaskMagic, kMaskVersion),
         regenerate);
  if (count != tokens)
    fail(fmt::format("the header counts {} tokens, the shard has {}", count, tokens), regenerate);
  const uint64_t expected =
      static_cast<uint64_t>(kShardHeaderBytes) + static_cast<uint64_t>(tokens);
  if (size != expected)
    fail(fmt::format("{} bytes, {} expected (the header and one byte per token)", size, expected),
         regenerate);
  constexpr int64_t kChunk = 1 << 20;
  std::vector<uint8_t> chunk(
      static_cast<size_t>(std::min<int64_t>(kChunk, std::max<int64_t>(tokens, 1))));
  for (int64_t at = 0; at < tokens; at += kChunk) {
    const int64_t n = std::min(kChunk, tokens - at);
    read(at, n, chunk.data());
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t b = chunk[static_cast<size_t>(i)];
      if (b > 1)
        fail(fmt::format("byte {} for token {} (byte offset {}); a mask byte is 0 or 1", b, at + i,
                         kShardHeaderBytes + at + i),
             regenerate);
      trained_ += b;
    }
  }
}

void LossMask::read(int64_t start, int64_t n, uint8_t* out) const {
  file_.read(static_cast<uint64_t>(kShardHeaderBytes + start), static_cast<size_t>(n), out);
}

// ---- TokenCorpus ----

TokenCorpus TokenCorpus::open(const std::vector<std::string>& entries, DataFormat format,
                              int64_t vocab, const std::string& key, bool masks) {
  TokenCorpus c;
  c.format_ = format;
  for (const std::string& path : expand_data_paths(entries, format, key)) {
    Shard s(path, format);
    if (masks && format == DataFormat::Tokens) {
      const std::string mask = mask_path_of(path);
      std::error_code ec;
      // Any entry of that name is the mask, a dangling link too: opening it says what is wrong,
      // where skipping it would train every target without a word.
      if (std::filesystem::exists(std::filesystem::symlink_status(mask, ec)))
        s.attach_mask(LossMask(mask, path, s.size()));
    }
    s.advise(DataFile::Access::Sequential);
    s.check_tokens(vocab);
    s.check_unchanged();  // the pass saw one version of the file from its first byte to its last
    c.shards_.push_back(std::move(s));
  }
  // Masks on every shard and not one target trained: a run would report a loss of 0 and learn
  // nothing (a chat file without assistant turns, a mask written all zeros).
  const bool all_masked = !c.shards_.empty() && c.masked_shards() == std::ssize(c.shards_);
  int64_t trained = 0;
  for (const Shard& s : c.shards_) trained += s.mask() ? s.mask()->trained() : 0;
  if (all_masked && trained == 0)
    throw DataError(fmt::format(
        "[data] {}: the loss masks beside its {} shard{} train no target ({} of {}: all 0). Fix: "
        "train on data with trained turns (prepare_data.py --chat trains the assistant's), or set "
        "data.loss_mask = \"off\" to train every target",
        key, c.shards_.size(), c.shards_.size() == 1 ? "" : "s",
        c.shards_.front().mask()->path(), c.shards_.front().path()));
  return c;
}

int64_t TokenCorpus::total_tokens() const {
  int64_t n = 0;
  for (const Shard& s : shards_) n += s.size();
  return n;
}

int64_t TokenCorpus::masked_shards() const {
  int64_t n = 0;
  for (const Shard& s : shards_) n += s.mask() ? 1 : 0;
  return n;
}

uint64_t TokenCorpus::total_bytes() const {
  uint64_t n = 0;
  for (const Shard& s : shards_) n += s.bytes();
  return n;
}

std::string TokenCorpus::list_files(size_t max_names) const {
  std::string out;
  for (size_t i = 0; i < shards_.size() && i < max_names; ++i)
    out += fmt::format("{}{} ({} tokens)", i ? ", " : "", shards_[i].path(), shards_[i].size());
  if (shards_.size() > max_names) out += fmt::format(" and {} more", shards_.size() - max_names);
  return out;
}

}  // namespace remat
