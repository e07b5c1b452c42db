// `remat-train tokenize`: a Hugging Face tokenizer.json on the command line (data/hf_tokenizer.h).
// Encoding reads all of stdin as text (UTF-8, every byte of it: a trailing newline is text too)
// and prints its ids as one JSON list and a newline; --decode reads ids (a JSON list, or numbers
// separated by whitespace or commas) and prints their text exactly, with no newline added, so
// that `tokenize | tokenize --decode` gives the text back. The ids are what the `tokenizers`
// package's Tokenizer.encode(text, add_special_tokens=False).ids gives (True with
// --add-special-tokens), the text what Tokenizer.decode(ids, skip_special_tokens=False) gives.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cmd/commands.h"
#include "data/hf_tokenizer.h"
#include "engine/core/error.h"

namespace remat::cli {
namespace {

std::string read_stdin() {
  std::string text;
  char buffer[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, stdin)) > 0) text.append(buffer, n);
  if (std::ferror(stdin))  // a folder redirected in (EISDIR) is the usual way here
    throw ConfigError(fmt::format(
        "[tokenize] stdin: cannot read it ({}). Fix: redirect a text file into it (< FILE), or "
        "pipe text in",
        std::strerror(errno)));
  return text;
}

// Ids as a JSON list ("[15496, 995]") or separated by whitespace or commas ("15496 995").
std::vector<int32_t> parse_ids(const std::string& text, int64_t vocab) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || text[first] != '[')
    return parse_token_ids(text, vocab, "[tokenize] stdin",
                           "give ids as a JSON list ([15496, 995]) or separated by spaces");
  nlohmann::json list;
  try {
    list = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw ConfigError(fmt::format(
        "[tokenize] stdin: not a valid JSON list (byte {}). Fix: give ids as [15496, 995]",
        e.byte));
  }
  if (!list.is_array())
    throw ConfigError("[tokenize] stdin: not a JSON list. Fix: give ids as [15496, 995]");
  std::vector<int32_t> ids;
  for (const nlohmann::json& id : list) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      throw ConfigError(fmt::format(
          "[tokenize] stdin: {} is not a token id. Fix: give ids as [15496, 995]", id.dump()));
    if (id.get<int64_t>() >= vocab)
      throw ConfigError(
          fmt::format("[tokenize] stdin: token id {} is outside the vocabulary of {}. Fix: use the "
                      "tokenizer.json the ids were made with",
                      id.get<int64_t>(), vocab));
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

}  // namespace

int run_tokenize(const TokenizeOptions& opt) {
  // "bytes", as sample and prepare_data.py take it: a byte-level model's ids are the bytes.
  if (opt.tokenizer == "bytes") {
    const std::string input = read_stdin();
    if (opt.decode) {
      std::string text;
      for (int32_t id : parse_ids(input, 256)) text.push_back(static_cast<char>(id));
      std::fwrite(text.data(), 1, text.size(), stdout);
      return 0;
    }
    std::vector<int32_t> ids(input.begin(), input.end());
    for (int32_t& id : ids) id &= 0xff;  // char may be signed
    fmt::print("[{}]\n", fmt::join(ids, ", "));
    return 0;
  }
  HfTokenizer tok(opt.tokenizer);
  const std::string input = read_stdin();
  if (opt.decode) {
    const std::string text = tok.decode(parse_ids(input, tok.vocab_size()));
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  size_t dropped = 0;
  const std::vector<int32_t> ids = tok.encode(input, opt.add_special_tokens, &dropped, "stdin");
  fmt::print("[{}]\n", fmt::join(ids, ", "));
  if (dropped > 0)
    fmt::print(stderr,
               "warning: [tokenize] {} character(s) have no token in {} (it has no byte_fallback "
               "and no unk_token) and were left out, as tokenizers leaves them out\n",
               dropped, opt.tokenizer);
  return 0;
}

}  // namespace remat::cli
