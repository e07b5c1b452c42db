// Token shards (llm.c .bin, uint16 and uint32) and text files: open, check every token against a
// vocabulary taken from the input, and read a window. DataError is a fine answer; anything else
// is a bug, and so is a window with a token the check let through outside the vocabulary.
// The same input as a loss mask (X.mask.bin) of a shard whose token count is the one its header
// claims, or one off: open, check, read its last bytes; a byte other than 0 or 1 that the check
// let through is a bug.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "data/token_corpus.h"
#include "engine/core/error.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = remat::fuzz::scratch_file(data, size);
  // Up to 2^24, model.vocab_size's bound: uint32 shards reach past 16 bits.
  const int64_t vocab =
      size > 1024 ? 1 + (data[1020] | (data[1021] << 8) | (data[1022] << 16)) : 50304;
  for (auto format : {remat::DataFormat::Tokens, remat::DataFormat::Text}) {
    try {
      const remat::Shard shard(path, format);
      shard.check_tokens(vocab);
      const int64_t n = std::min<int64_t>(shard.size(), 64);
      std::vector<int32_t> out(static_cast<size_t>(n));
      shard.read(shard.size() - n, n, out.data(), vocab);
      for (int32_t t : out)
        if (t < 0 || t >= vocab) __builtin_trap();
    } catch (const remat::DataError&) {
    }
  }
  const int64_t claimed = size >= 12
                              ? static_cast<int32_t>(data[8] | (data[9] << 8) | (data[10] << 16) |
                                                     (static_cast<uint32_t>(data[11]) << 24))
                              : 0;
  for (const int64_t tokens : {claimed, claimed + 1}) {
    if (tokens < 0) continue;
    try {
      const remat::LossMask mask(path, "shard.bin", tokens);
      const int64_t n = std::min<int64_t>(mask.size(), 64);
      std::vector<uint8_t> out(static_cast<size_t>(n));
      mask.read(mask.size() - n, n, out.data());
      for (uint8_t b : out)
        if (b > 1) __builtin_trap();
    } catch (const remat::DataError&) {
    }
  }
  return 0;
}
