// Tokenizer files, the two kinds `sample --tokenizer` reads: llm.c's gpt2_tokenizer.bin and a
// Hugging Face tokenizer.json (byte-level BPE). Each is read, then decodes its ids and refuses one
// past the end. The same bytes also go through Utf8Stream, whole and one byte at a time: the
// text must not depend on how the bytes were split into tokens.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "data/bpe_tokenizer.h"
#include "data/gpt2_tokenizer.h"
#include "engine/core/error.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

template <class Tokenizer>
void decode_all(const Tokenizer& tok, bool every_record_has_bytes) {
  size_t total = 0;
  // A tokenizer.json may declare one id near 2^24: decode the first ids and the last.
  const int64_t n = std::min<int64_t>(tok.vocab_size(), 4096);
  for (int64_t t = 0; t < n; ++t) total += tok.decode(t).size();
  if (tok.vocab_size() > 0) tok.decode(tok.vocab_size() - 1);
  if (every_record_has_bytes && total == 0 && tok.vocab_size() > 0) __builtin_trap();
  try {
    tok.decode(tok.vocab_size());
    __builtin_trap();  // outside the vocabulary must be refused
  } catch (const remat::DataError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = remat::fuzz::scratch_file(data, size);
  try {
    decode_all(remat::Gpt2Tokenizer(path), true);  // every record is >= 1 byte
  } catch (const remat::DataError&) {
  } catch (const remat::IoError&) {
  }
  try {
    decode_all(remat::BpeTokenizer(path), false);
  } catch (const remat::DataError&) {
  }
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  remat::Utf8Stream whole, split;
  std::string a = whole.push(bytes);
  a += whole.finish();
  std::string b;
  for (char c : bytes) b += split.push(std::string_view(&c, 1));
  b += split.finish();
  if (a != b) __builtin_trap();
  return 0;
}
