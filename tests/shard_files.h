// Token shards, loss masks and other data files the tests write by hand: llm.c's format (and
// bad variants of it) byte by byte, so that the readers are checked against the layout itself.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/token_corpus.h"
#include "engine/core/backend.h"
#include "engine/core/error.h"

namespace remat::test {

inline void write_bytes(const std::string& file, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(file).parent_path());
  std::ofstream out(file, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline void put_u32(std::string& s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    s[at + static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
}

/// A 1024-byte header: magic, version, count, the rest zero.
inline std::string shard_header(int32_t magic, int32_t version, int64_t count) {
  std::string s(static_cast<size_t>(kShardHeaderBytes), '\0');
  put_u32(s, 0, static_cast<uint32_t>(magic));
  put_u32(s, 4, static_cast<uint32_t>(version));
  put_u32(s, 8, static_cast<uint32_t>(count));
  return s;
}

/// An llm.c shard's bytes; the header fields can be overridden to build bad files.
inline std::string shard_bytes(const std::vector<uint16_t>& tokens, int32_t magic = kShardMagic,
                               int32_t version = kShardVersion, int64_t count = -1) {
  std::string s =
      shard_header(magic, version, count >= 0 ? count : static_cast<int64_t>(tokens.size()));
  for (uint16_t t : tokens) {
    s.push_back(static_cast<char>(t & 0xff));
    s.push_back(static_cast<char>(t >> 8));
  }
  return s;
}

/// A uint32 shard (llm.c's Llama 3 format); the header fields can be overridden as above.
inline std::string shard32_bytes(const std::vector<uint32_t>& tokens, int32_t magic = kShard32Magic,
                                 int32_t version = kShard32Version, int64_t count = -1) {
  std::string s =
      shard_header(magic, version, count >= 0 ? count : static_cast<int64_t>(tokens.size()));
  for (uint32_t t : tokens) {
    s.resize(s.size() + 4);
    put_u32(s, s.size() - 4, t);
  }
  return s;
}

/// A loss mask's bytes (X.mask.bin): one byte per token; the header fields can be overridden.
inline std::string mask_bytes(const std::vector<uint8_t>& trained, int32_t magic = kMaskMagic,
                              int32_t version = kMaskVersion, int64_t count = -1) {
  std::string s =
      shard_header(magic, version, count >= 0 ? count : static_cast<int64_t>(trained.size()));
  s.append(trained.begin(), trained.end());
  return s;
}

/// A batch's token tensor (inputs, targets, document starts) as host ids.
inline std::vector<int32_t> download(Backend& be, const Buffer& b) {
  std::vector<int32_t> out(static_cast<size_t>(b.tensor().numel()));
  be.download(out.data(), b);
  return out;
}

/// Runs `f`, which must throw DataError, and returns its message.
template <class F>
std::string data_error(F f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  FAIL("no DataError was thrown");
  return "";
}

}  // namespace remat::test
