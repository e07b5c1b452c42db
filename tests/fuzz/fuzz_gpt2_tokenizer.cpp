// llm.c's gpt2_tokenizer.bin: read, then decode every token and one past the end.
#include <cstddef>
#include <cstdint>

#include "data/gpt2_tokenizer.h"
#include "engine/error.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = remat::fuzz::scratch_file(data, size);
  try {
    const remat::Gpt2Tokenizer tok(path);
    size_t total = 0;
    for (int64_t t = 0; t < tok.vocab_size(); ++t) total += tok.decode(t).size();
    if (total == 0 && tok.vocab_size() > 0) __builtin_trap();  // every record is >= 1 byte
    try {
      tok.decode(tok.vocab_size());
      __builtin_trap();  // outside the vocabulary must be refused
    } catch (const remat::DataError&) {
    }
  } catch (const remat::DataError&) {
  } catch (const remat::IoError&) {
  }
  return 0;
}
