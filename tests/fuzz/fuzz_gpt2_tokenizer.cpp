// Tokenizer files, the two kinds `sample --tokenizer` reads: llm.c's gpt2_tokenizer.bin and a
// Hugging Face tokenizer.json (data/hf_tokenizer.h). Each is read, then decodes its ids and
// refuses one past the end; a tokenizer.json that can encode also encodes a fixed multilingual
// text (its normalizers, pre-tokenizer regexes, added tokens and merges, as the input built them)
// and decodes the ids, whole and streamed, to UTF-8. The same bytes also go through Utf8Stream,
// whole and one byte at a time: the text must not depend on how the bytes were split into tokens.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/gpt2_tokenizer.h"
#include "data/hf_tokenizer.h"
#include "data/unicode_text.h"
#include "engine/core/error.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

constexpr int64_t kMaxDecoded = 4096;  // a tokenizer.json may declare one id near 2^24

void decode_all(const remat::Gpt2Tokenizer& tok) {
  size_t total = 0;
  for (int64_t t = 0; t < std::min<int64_t>(tok.vocab_size(), kMaxDecoded); ++t)
    total += tok.decode(t).size();
  if (tok.vocab_size() > 0) tok.decode(tok.vocab_size() - 1);
  if (total == 0 && tok.vocab_size() > 0) __builtin_trap();  // every record is >= 1 byte
  try {
    tok.decode(tok.vocab_size());
    __builtin_trap();  // outside the vocabulary must be refused
  } catch (const remat::DataError&) {
  }
}

void decode_all(remat::HfTokenizer& tok) {
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < std::min<int64_t>(tok.vocab_size(), kMaxDecoded); ++t)
    ids.push_back(static_cast<int32_t>(t));
  if (tok.vocab_size() > 0) ids.push_back(static_cast<int32_t>(tok.vocab_size() - 1));
  const std::string text = tok.decode(ids);
  if (remat::unicode::find_invalid_utf8(text) != std::string::npos) __builtin_trap();
  try {
    tok.decode(std::vector<int32_t>{static_cast<int32_t>(tok.vocab_size())});
    __builtin_trap();  // outside the vocabulary must be refused
  } catch (const remat::DataError&) {
  }
  if (!tok.can_encode()) return;
  const std::vector<int32_t> encoded = tok.encode(
      "Hello, wor<|endoftext|>ld! 123 caf\u00e9 e\u0301 \u4e2d\u6587 \U0001F44D\n\t  x", true);
  for (int32_t id : encoded)
    if (id < 0 || id >= tok.vocab_size()) __builtin_trap();
  const std::string whole = tok.decode(encoded);
  if (remat::unicode::find_invalid_utf8(whole) != std::string::npos) __builtin_trap();
  remat::DecodeStream stream(tok);  // equal to `whole` for the chains tokenizers can stream
  std::string streamed;
  for (int32_t id : encoded) streamed += stream.push(id);
  streamed += stream.finish();
  if (remat::unicode::find_invalid_utf8(streamed) != std::string::npos) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = remat::fuzz::scratch_file(data, size);
  try {
    decode_all(remat::Gpt2Tokenizer(path));
  } catch (const remat::DataError&) {
  } catch (const remat::IoError&) {
  }
  try {
    remat::HfTokenizer tok(path);
    decode_all(tok);
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
