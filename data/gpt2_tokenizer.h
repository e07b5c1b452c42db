// The GPT-2 token table of llm.c's `gpt2_tokenizer.bin`, for printing a token model's output as
// text (decoding only: a prompt is given as token ids). The file is
//   header  256 x uint32 (little-endian): magic 20240328, version (1 or 2), vocab_size, and for
//           version 2 the end-of-text token id (version 1 files imply GPT-2's 50256)
//   tokens  vocab_size records: uint8 length (>= 1), then that many bytes
// Any problem (missing file, bad magic or version, a truncated table, bytes left over) is a
// DataError naming the file and what is wrong.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace remat {

class Gpt2Tokenizer {
 public:
  /// Reads and validates `path`. Throws DataError (IoError when it cannot be opened).
  explicit Gpt2Tokenizer(const std::string& path);

  /// The bytes of `token` (not necessarily valid UTF-8 alone: GPT-2 splits characters across
  /// tokens). Throws DataError for a token outside the vocabulary.
  const std::string& decode(int64_t token) const;
  int64_t vocab_size() const { return static_cast<int64_t>(table_.size()); }
  int64_t eot_token() const { return eot_; }
  int version() const { return version_; }

 private:
  std::string path_;
  std::vector<std::string> table_;
  int64_t eot_ = 50256;
  int version_ = 0;
};

}  // namespace remat
