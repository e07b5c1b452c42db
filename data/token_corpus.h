// The files a file-backed source reads, with pread (data/data_file.h says why not mmap):
//   tokens  llm.c token shards: a header of 256 little-endian int32 (magic, version, token count,
//           the rest unused), then `count` little-endian tokens: uint16 for GPT-2's format (magic
//           20240520, version 1), uint32 for Llama 3's (magic 20240801, version 7), whose
//           vocabularies (128k-152k) do not fit 16 bits. The header decides; a corpus may mix both.
//   text    any file, one token per byte (vocabulary 256)
//   masks   a token shard X.bin's loss mask X.mask.bin (data.loss_mask = "auto"): the same header
//           with magic 20240522, version 1 and the shard's token count, then one byte per token,
//           1 = trained as a target, 0 = not. Never a shard itself: directories and globs skip
//           *.mask.bin.
// Every problem is a one-line DataError that names the file (or the data.path entry) and the fix.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/data_file.h"

namespace remat {

enum class DataFormat { Tokens, Text };

// llm.c's dev/data/data_common.py (HEADERS_INFO) writes these two pairs.
inline constexpr int32_t kShardMagic = 20240520;  // "gpt-2": uint16 tokens
inline constexpr int32_t kShardVersion = 1;
inline constexpr int32_t kShard32Magic = 20240801;  // "llama-3": uint32 tokens
inline constexpr int32_t kShard32Version = 7;
inline constexpr int64_t kShardHeaderBytes = 256 * 4;
inline constexpr int32_t kMaskMagic = 20240522;  // a shard's loss mask: one byte per token
inline constexpr int32_t kMaskVersion = 1;

/// Where a shard's loss mask lies: X.mask.bin for X.bin (X.mask.bin too for a name without .bin).
std::string mask_path_of(const std::string& shard_path);
/// Whether `path` names a loss mask (it ends in .mask.bin).
bool is_mask_path(const std::string& path);

/// A shard's loss mask (X.mask.bin beside X.bin), opened, checked, and read with pread.
class LossMask {
 public:
  /// Opens `path` and checks it against its shard `shard_path` of `tokens` tokens: the header
  /// (magic, version, count), the file's size, and that every byte is 0 or 1. Throws DataError
  /// naming both files and the fix.
  LossMask(const std::string& path, const std::string& shard_path, int64_t tokens);
  const std::string& path() const { return file_.path(); }
  int64_t size() const { return n_tokens_; }
  /// Copies the bytes of tokens [start, start + n) to `out` (one pread).
  void read(int64_t start, int64_t n, uint8_t* out) const;
  void check_unchanged() const { file_.check_unchanged(); }
  void advise(DataFile::Access access) const { file_.advise(access); }
  /// How many tokens are trained (bytes equal to 1).
  int64_t trained() const { return trained_; }

 private:
  [[noreturn]] void fail(const std::string& problem, const std::string& fix) const;
  DataFile file_;
  std::string shard_path_;
  int64_t n_tokens_ = 0, trained_ = 0;
};

/// The files named by a data.path-style list, in a deterministic order: the entries in the order
/// given, each expanded and sorted by path (byte order, independent of the locale):
///   a file      itself
///   a glob      glob(3) matches, each expanded like a path (so a matched directory expands too)
///   a directory tokens: its *.bin files (not recursive: llm.c keeps train and val shards side by
///               side, a glob picks between them); text: every regular file under it, recursively.
///               Hidden entries (".name") are skipped in both, so .git and editor files stay out.
/// A file reached twice (two entries overlap) is kept once, at its first position. `key`
/// ("data.path", "data.val_path") names the config key in messages. Throws DataError when an
/// entry matches nothing, does not exist, or is neither a regular file nor a directory.
std::vector<std::string> expand_data_paths(const std::vector<std::string>& entries,
                                           DataFormat format, const std::string& key);

/// One opened and validated file of tokens.
class Shard {
 public:
  /// Opens `path` and checks its size and header (tokens) or that it is not empty (text).
  Shard(const std::string& path, DataFormat format);
  const std::string& path() const { return file_.path(); }
  int64_t size() const { return n_tokens_; }            // tokens
  uint64_t bytes() const { return file_.size(); }       // the whole file
  int bytes_per_token() const { return token_bytes_; }  // 1 (text), 2 or 4 (the header says)
  /// Token `i` as stored (one read: for tests and messages; windows use read()). int64_t: a uint32
  /// shard can hold values no int32_t does, and a message must show them as they are.
  int64_t token(int64_t i) const;
  /// Copies tokens [start, start + n) to `out`, checking each against `vocab` (DataError naming the
  /// file, the token index and value, and the fix). One pread; DataChanged when the file shrank.
  void read(int64_t start, int64_t n, int32_t* out, int64_t vocab) const;
  /// The same check over the whole shard (one sequential pass).
  void check_tokens(int64_t vocab) const;
  /// DataChanged when the file (or its mask) is no longer the one opened, as it was
  /// (data/data_file.h).
  void check_unchanged() const {
    file_.check_unchanged();
    if (mask_) mask_->check_unchanged();
  }
  void advise(DataFile::Access access) const {
    file_.advise(access);
    if (mask_) mask_->advise(access);
  }
  /// The loss mask read beside this shard, if any (TokenCorpus::open attaches it).
  const LossMask* mask() const { return mask_ ? &*mask_ : nullptr; }
  void attach_mask(LossMask mask) { mask_.emplace(std::move(mask)); }
  /// Document ends in tokens [begin, end): the index after each end-of-text token `eot`, and `end`
  /// itself when the range does not end with one (its last document runs to the range's end).
  /// One sequential pass.
  std::vector<int64_t> document_ends(int64_t begin, int64_t end, int64_t eot) const;
  /// Whether token `token` occurs anywhere in the shard: a sequential pass that stops at the
  /// first occurrence.
  bool contains(int64_t token) const;

 private:
  [[noreturn]] void bad_token(int64_t index, int64_t vocab) const;
  uint64_t offset_of(int64_t token) const {
    return first_byte_ + static_cast<uint64_t>(token) * static_cast<uint64_t>(token_bytes_);
  }
  /// Decodes tokens [start, start + n), read into `bytes`, into `out`.
  void decode(const uint8_t* bytes, int64_t n, int32_t* out) const;
  DataFile file_;
  DataFormat format_;
  int token_bytes_ = 1;
  uint64_t first_byte_ = 0;  // of the first token in the file
  int64_t n_tokens_ = 0;
  std::optional<LossMask> mask_;
};

/// Every shard named by a data.path-style list.
class TokenCorpus {
 public:
  TokenCorpus() = default;
  /// Expands `entries`, opens and validates every file, and scans every token against `vocab`.
  /// The full scan costs one sequential pass over the data at open (seconds for the GB-scale
  /// corpora this tool trains on), and in exchange a bad token is reported before training starts
  /// instead of at whatever step first draws it; windows are still checked as they are read.
  /// With `masks` (token shards, data.loss_mask = "auto"), each shard X.bin's X.mask.bin is
  /// opened and checked beside it when it exists.
  static TokenCorpus open(const std::vector<std::string>& entries, DataFormat format, int64_t vocab,
                          const std::string& key, bool masks = false);

  DataFormat format() const { return format_; }
  const std::vector<Shard>& shards() const { return shards_; }
  int64_t total_tokens() const;
  uint64_t total_bytes() const;
  /// "a.bin (500 tokens), b.bin (12 tokens) and 3 more": for messages about the whole corpus.
  std::string list_files(size_t max_names = 3) const;
  /// How many shards have a loss mask.
  int64_t masked_shards() const;

 private:
  DataFormat format_ = DataFormat::Tokens;
  std::vector<Shard> shards_;
};

}  // namespace remat
