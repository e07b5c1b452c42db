// Token shards (llm.c .bin, uint16 and uint32) and text files: open, check every token against a
// vocabulary taken from the input, and read a window. DataError is a fine answer; anything else
// is a bug, and so is a window with a token the check let through outside the vocabulary.
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
  return 0;
}
