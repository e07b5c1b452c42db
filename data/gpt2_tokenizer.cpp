// Gpt2Tokenizer (see data/gpt2_tokenizer.h). The file is small (~0.5 MB for GPT-2), so it is read
// whole and parsed from memory with a bounds check before every read.
#include "data/gpt2_tokenizer.h"

#include <fmt/format.h>

#include <array>
#include <cstring>

#include "engine/core/error.h"
#include "engine/core/regular_file.h"

namespace remat {
namespace {

constexpr uint32_t kMagic = 20240328;
constexpr size_t kHeaderWords = 256;
constexpr size_t kHeaderBytes = kHeaderWords * sizeof(uint32_t);
// llm.c's version 1 files predate the EOT field; GPT-2's <|endoftext|> is this id.
constexpr int64_t kGpt2Eot = 50256;

std::string read_file_bytes(const std::string& path) {
  // A device or pipe (/dev/zero) would be read forever: only a regular file is a tokenizer.
  RegularFile file = RegularFile::open_read(path);
  if (file.problem() == RegularFile::Problem::NotRegular)
    throw DataError(
        fmt::format("[tokenizer] {}: not a regular file. Fix: pass llm.c's "
                    "gpt2_tokenizer.bin to --tokenizer",
                    path));
  if (!file.ok())
    throw IoError(fmt::format("[tokenizer] cannot open {}: {}", path, file.problem_text()));
  std::string bytes;
  if (file.read_all(bytes) != 0) throw IoError(fmt::format("[tokenizer] cannot read {}", path));
  return bytes;
}

// The header's words, little-endian as llm.c writes them (numpy "<u4" on x86).
std::array<uint32_t, kHeaderWords> read_header(const std::string& bytes) {
  std::array<uint32_t, kHeaderWords> h{};
  for (size_t i = 0; i < kHeaderWords; ++i) {
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + 4 * i;
    h[i] = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
           static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
  }
  return h;
}

}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& path) : path_(path) {
  const std::string bytes = read_file_bytes(path);
  auto fail = [&](const std::string& problem) {
    throw DataError(
        fmt::format("[tokenizer] {}: {}. Fix: pass llm.c's gpt2_tokenizer.bin (written by "
                    "its train_gpt2.py) to --tokenizer",
                    path, problem));
  };
  if (bytes.size() < kHeaderBytes)
    fail(fmt::format("{} bytes, shorter than the {}-byte header", bytes.size(), kHeaderBytes));
  const auto h = read_header(bytes);
  if (h[0] != kMagic)
    fail(fmt::format("bad magic {} (want {}): not a tokenizer file", h[0], kMagic));
  if (h[1] != 1 && h[1] != 2)
    fail(fmt::format("unsupported version {} (this reads 1 and 2)", h[1]));
  version_ = static_cast<int>(h[1]);
  const uint32_t vocab = h[2];
  if (vocab == 0) fail("vocab_size is 0");
  eot_ = version_ == 1 ? kGpt2Eot : static_cast<int64_t>(h[3]);
  if (version_ == 2 && eot_ >= vocab)
    fail(fmt::format("end-of-text token {} is outside the vocabulary of {}", eot_, vocab));
  // Each record takes at least its length byte: a header claiming more records than the file has
  // bytes is refused before the table is reserved (a corrupt count must not become a huge
  // allocation). Records are checked one by one below (a zero length is its own error).
  if (vocab > bytes.size() - kHeaderBytes)
    fail(fmt::format("truncated: the header declares {} tokens, the file holds at most {}", vocab,
                     bytes.size() - kHeaderBytes));
  table_.reserve(vocab);
  size_t off = kHeaderBytes;
  for (uint32_t i = 0; i < vocab; ++i) {
    if (off >= bytes.size())
      fail(fmt::format("truncated: the table ends after {} of {} tokens (offset {})", i, vocab,
                       off));
    const size_t len = static_cast<unsigned char>(bytes[off]);
    if (len == 0)
      fail(fmt::format("token {} has length 0 at offset {} (every token is at least one byte)", i,
                       off));
    if (off + 1 + len > bytes.size())
      fail(fmt::format("truncated: token {} needs {} bytes at offset {}, the file has {}", i, len,
                       off + 1, bytes.size()));
    table_.emplace_back(bytes, off + 1, len);
    off += 1 + len;
  }
  // Leftover bytes mean the header's vocab_size does not describe the table: a corrupt file.
  if (off != bytes.size())
    fail(fmt::format("{} bytes left after the {} tokens the header declares", bytes.size() - off,
                     vocab));
}

const std::string& Gpt2Tokenizer::decode(int64_t token) const {
  if (token < 0 || token >= vocab_size())
    throw DataError(fmt::format("[tokenizer] token {} is outside the vocabulary of {} in {}", token,
                                vocab_size(), path_));
  return table_[static_cast<size_t>(token)];
}

}  // namespace remat
