// Token shards (llm.c .bin) and text files: open, check every token against a vocabulary taken
// from the input, and read a window. DataError is a fine answer; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "data/token_corpus.h"
#include "engine/error.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = remat::fuzz::scratch_file(data, size);
  const int64_t vocab = size > 1024 ? 1 + (data[1020] | (data[1021] << 8)) : 50304;
  for (auto format : {remat::DataFormat::Tokens, remat::DataFormat::Text}) {
    try {
      const remat::Shard shard(path, format);
      shard.check_tokens(vocab);
      const int64_t n = std::min<int64_t>(shard.size(), 64);
      std::vector<int32_t> out(static_cast<size_t>(n));
      shard.read(shard.size() - n, n, out.data(), vocab);
    } catch (const remat::DataError&) {
    }
  }
  return 0;
}
