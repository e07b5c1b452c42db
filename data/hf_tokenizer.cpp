// HfTokenizer and DecodeStream (see data/hf_tokenizer.h): the file, the vocabulary and added
// tokens, and the order of the steps; the steps themselves are in data/tokenizer_pipeline.cpp and
// data/bpe_model.cpp.
#include "data/hf_tokenizer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include "data/bpe_model.h"
#include "data/regex.h"
#include "data/tokenizer_pipeline.h"
#include "data/unicode_text.h"
#include "engine/core/error.h"
#include "engine/core/regular_file.h"

namespace remat {
namespace {

using nlohmann::json;
using tokenizer::Piece;

constexpr const char* kFix =
    "pass the model's Hugging Face tokenizer.json (a BPE model: GPT-2, Llama 2 or 3, Mistral, "
    "Qwen, SmolLM, OLMo, Phi-3) to --tokenizer";
constexpr const char* kUnsupportedFix =
    "use a tokenizer.json of a family this supports (GPT-2, Llama 2 or 3, Mistral, Qwen, "
    "SmolLM, OLMo, Phi-3: docs/data.md), or encode with scripts/prepare_data.py --encode (the "
    "tokenizers package) and give the ids (sample --prompt-ids)";
// model.vocab_size's own bound (engine/config/config.cpp): a larger id belongs to no model of this
// tool.
constexpr int64_t kMaxId = int64_t{1} << 24;

[[noreturn]] void fail(const std::string& path, const std::string& problem,
                       const std::string& fix = kFix) {
  throw DataError(fmt::format("[tokenizer] {}: {}. Fix: {}", path, problem, fix));
}

json read_json(const std::string& path, const std::string& fix) {
  // A pipe or device (a FIFO, /dev/zero) would block or be read forever: refused before a byte is
  // read.
  RegularFile file = RegularFile::open_read(path);
  if (!file.ok())
    fail(path, file.problem_text(),
         file.problem() == RegularFile::Problem::Error ? "check its permissions" : fix);
  // The largest tokenizer.json files (multilingual vocabularies) are tens of MiB: a file far
  // larger is something else, refused before it is read into memory.
  constexpr uint64_t kMaxJsonBytes = uint64_t{512} << 20;
  if (file.size() > kMaxJsonBytes)
    fail(path, fmt::format("{} bytes, more than any tokenizer file holds (512 MiB)", file.size()),
         fix);
  std::string text;
  if (const int err = file.read_all(text, kMaxJsonBytes))
    fail(path, fmt::format("cannot read ({})", std::strerror(err)), "check the file");
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    fail(path, fmt::format("not valid JSON (byte {})", e.byte), fix);
  }
}

int32_t checked_id(const std::string& path, const json& id, const std::string& where) {
  if (!id.is_number_integer())
    fail(path, fmt::format("{} is {}, not an integer id", where, id.type_name()));
  const auto v = id.get<int64_t>();
  if (v < 0 || v >= kMaxId) fail(path, fmt::format("{} is {}, outside [0, {})", where, v, kMaxId));
  return static_cast<int32_t>(v);
}

bool flag(const json& node, const char* key, bool fallback) {
  const auto it = node.find(key);
  return it != node.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

// An optional string field of model (null and absent alike).
std::optional<std::string> optional_string(const json& node, const char* key,
                                           const std::string& where) {
  const auto it = node.find(key);
  if (it == node.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) throw std::invalid_argument(where + "." + key + " is not a string");
  return it->get<std::string>();
}

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
  std::string pattern;  // what is looked for: the content, normalized when `normalized`
};

// The added tokens' patterns, for the leftmost-longest search tokenizers' Aho-Corasick automaton
// does: at the first place where any pattern starts, the longest one that matches there.
class TokenTrie {
 public:
  void add(std::string_view pattern, size_t token) {
    if (pattern.empty()) return;
    int32_t node = -1;
    for (char ch : pattern) {
      const auto c = static_cast<unsigned char>(ch);
      int32_t next = node < 0 ? root_[c] : find_child(nodes_[static_cast<size_t>(node)], c);
      if (next == 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        if (node < 0)
          root_[c] = next;
        else
          nodes_[static_cast<size_t>(node)].next.emplace_back(c, next);
      }
      node = next;
    }
    // A pattern given twice keeps its first token, as the automaton does.
    if (nodes_[static_cast<size_t>(node)].token < 0)
      nodes_[static_cast<size_t>(node)].token = static_cast<int64_t>(token);
  }
  bool empty() const { return nodes_.size() == 1; }
  struct Match {
    size_t begin = std::string_view::npos, end = 0, token = 0;
  };
  Match find(std::string_view s, size_t from) const {
    for (size_t i = from; i < s.size(); ++i) {
      int32_t node = root_[static_cast<unsigned char>(s[i])];
      Match best;
      for (size_t j = i + 1; node != 0; ++j) {
        const Node& n = nodes_[static_cast<size_t>(node)];
        if (n.token >= 0) best = {i, j, static_cast<size_t>(n.token)};
        if (j >= s.size()) break;
        node = find_child(n, static_cast<unsigned char>(s[j]));
      }
      if (best.begin != std::string_view::npos) return best;
    }
    return {};
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;  // few children: a list
    int64_t token = -1;
  };
  static int32_t find_child(const Node& n, unsigned char c) {
    for (const auto& [k, v] : n.next)
      if (k == c) return v;
    return 0;
  }
  std::vector<Node> nodes_{1};  // node 0 is "none"; the root is root_
  std::array<int32_t, 256> root_{};
};

}  // namespace

struct HfTokenizer::Impl {
  std::string path;
  int64_t vocab_size = 0;
  int64_t eot = -1;
  std::unordered_map<int32_t, std::string> vocab_tokens;  // model.vocab by id
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;  // the last added token with that id
  tokenizer::Decoder decoder;

  // Encoding (encode_problem says why not, when a part is not supported).
  std::string encode_problem, special_problem;
  std::optional<BpeModel> model;
  tokenizer::Normalizer normalizer;
  tokenizer::PreTokenizer pre_tokenizer;
  tokenizer::PostProcessor post_processor;
  TokenTrie raw_tokens, normalized_tokens;  // added tokens matched before / after normalizing
  std::optional<Regex> word_char;           // single_word's \w (Rust's regex: Unicode word)

  void find_eot(const TokenMap& vocab, bool read_config);
  void load_encoding(const json& spec, TokenMap vocab);
  struct Split {
    std::optional<size_t> token;  // an added token, else text
    size_t begin, end;
  };
  std::vector<Split> find_added(std::string_view s, const TokenTrie& trie) const;
};

HfTokenizer::HfTokenizer(const std::string& path)
    : HfTokenizer(read_json(path, kFix), path, true) {}

HfTokenizer HfTokenizer::from_json(const json& spec, const std::string& name) {
  return HfTokenizer(spec, name, false);
}

HfTokenizer::HfTokenizer(const json& spec, const std::string& path, bool read_config)
    : impl_(new Impl) {
  Impl& m = *impl_;
  m.path = path;
  TokenMap vocab;
  try {
    if (!spec.is_object() || !spec.contains("model") || !spec["model"].is_object())
      fail(path, "no \"model\" object, so not a tokenizer.json");
    const json& model = spec["model"];
    const std::string type = model.value("type", std::string("BPE"));
    if (type != "BPE")
      fail(path,
           fmt::format("model.type is \"{}\"; only \"BPE\" is supported (WordPiece, Unigram and "
                       "WordLevel are not)",
                       type),
           kUnsupportedFix);
    if (!model.contains("vocab") || !model["vocab"].is_object() || model["vocab"].empty())
      fail(path, "model.vocab is missing or empty");
    vocab.reserve(model["vocab"].size());
    m.vocab_tokens.reserve(model["vocab"].size());
    for (const auto& [text, id] : model["vocab"].items()) {
      const int32_t v = checked_id(path, id, "an id of model.vocab");
      vocab.emplace(text, v);
      m.vocab_tokens[v] = text;
      m.vocab_size = std::max<int64_t>(m.vocab_size, v + 1);
    }
    // Ids as tokenizers gives them when it loads the file (the "id" fields only warn there): a
    // token already added keeps its id (its flags are replaced), one in model.vocab takes the
    // vocabulary's id, any other the next id after model.vocab's count. Published files agree
    // with their "id" fields; this keeps a file that does not encoding as transformers does.
    const json added = spec.value("added_tokens", json::array());
    if (!added.is_array()) fail(path, "added_tokens is not an array");
    std::unordered_map<std::string, size_t> added_by_content;
    auto next_id = static_cast<int64_t>(vocab.size());
    for (const json& t : added) {
      if (!t.is_object() || !t.contains("id") || !t.contains("content") ||
          !t["content"].is_string())
        fail(path, "an entry of added_tokens lacks its id or content");
      checked_id(path, t["id"], "an id of added_tokens");
      AddedToken a;
      a.content = t["content"].get<std::string>();
      if (a.content.empty()) continue;  // tokenizers ignores it
      a.single_word = flag(t, "single_word", false);
      a.lstrip = flag(t, "lstrip", false);
      a.rstrip = flag(t, "rstrip", false);
      a.normalized = flag(t, "normalized", true);
      a.special = flag(t, "special", false);
      if (const auto seen = added_by_content.find(a.content); seen != added_by_content.end()) {
        a.id = m.added[seen->second].id;
        m.added[seen->second] = std::move(a);
        continue;
      }
      if (const auto in_vocab = vocab.find(a.content); in_vocab != vocab.end())
        a.id = in_vocab->second;
      else if ((a.id = static_cast<int32_t>(next_id++)) >= kMaxId)
        fail(path, fmt::format("added token \"{}\" gets id {}, outside [0, {})", a.content, a.id,
                               kMaxId));
      added_by_content[a.content] = m.added.size();
      m.added_by_id[a.id] = m.added.size();
      m.vocab_size = std::max<int64_t>(m.vocab_size, a.id + 1);
      m.added.push_back(std::move(a));
    }
    try {
      m.decoder = tokenizer::Decoder::parse(spec.value("decoder", json()), "decoder");
    } catch (const std::invalid_argument& e) {
      fail(path, e.what(), kUnsupportedFix);
    }
  } catch (const json::exception& e) {
    // A field of an unexpected type (a number where a string was due, say).
    fail(path, fmt::format("unexpected structure ({})", e.what()));
  }
  m.find_eot(vocab, read_config);
  try {
    m.load_encoding(spec, std::move(vocab));
  } catch (const std::invalid_argument& e) {
    m.encode_problem = e.what();
  } catch (const json::exception& e) {
    m.encode_problem = fmt::format("unexpected structure ({})", e.what());
  }
}

// tokenizer_config.json's eos_token (when read_config), else <|end_of_text|> or <|endoftext|>.
void HfTokenizer::Impl::find_eot(const TokenMap& vocab, bool read_config) {
  auto id_of = [&](const std::string& text) -> int64_t {
    for (auto it = added.rbegin(); it != added.rend(); ++it)
      if (it->content == text) return it->id;  // added tokens win over the vocabulary's
    const auto v = vocab.find(text);
    return v == vocab.end() ? -1 : v->second;
  };
  const std::string config =
      (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
  std::error_code ec;
  if (read_config && std::filesystem::exists(config, ec)) {
    const json cfg = read_json(config, "repair it, or remove it (it names the end-of-text token)");
    json eos = cfg.is_object() ? cfg.value("eos_token", json()) : json();
    if (eos.is_object()) eos = eos.value("content", json());
    if (eos.is_string()) {
      eot = id_of(eos.get<std::string>());
      if (eot < 0)
        fail(config,
             fmt::format("eos_token \"{}\" is not a token of {}", eos.get<std::string>(), path),
             "keep tokenizer_config.json beside the tokenizer.json it belongs with");
      return;
    }
  }
  for (const char* name : {"<|end_of_text|>", "<|endoftext|>"})
    if ((eot = id_of(name)) >= 0) return;
}

// The parts only encoding needs; a std::invalid_argument from here leaves decoding usable.
void HfTokenizer::Impl::load_encoding(const json& spec, TokenMap vocab) {
  const json& node = spec["model"];
  if (node.contains("dropout") && !node["dropout"].is_null() &&
      !(node["dropout"].is_number() && node["dropout"].get<double>() == 0.0))
    throw std::invalid_argument(
        fmt::format("model.dropout is {}: BPE dropout (random merges) is not supported",
                    node["dropout"].dump()));
  std::vector<std::pair<std::string, std::string>> merges;
  const json list = node.value("merges", json::array());
  if (!list.is_array()) throw std::invalid_argument("model.merges is not an array");
  merges.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const json& m = list[i];
    if (m.is_string()) {
      // "a b": exactly one space (tokenizers' legacy form; tokens never hold a space here).
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        throw std::invalid_argument(
            fmt::format("model.merges[{}] is \"{}\", not two tokens separated by a space", i, s));
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      throw std::invalid_argument(fmt::format("model.merges[{}] is not a pair of tokens", i));
    }
  }
  BpeOptions options;
  options.unk_token = optional_string(node, "unk_token", "model");
  options.continuing_subword_prefix =
      optional_string(node, "continuing_subword_prefix", "model").value_or("");
  options.end_of_word_suffix = optional_string(node, "end_of_word_suffix", "model").value_or("");
  options.fuse_unk = flag(node, "fuse_unk", false);
  options.byte_fallback = flag(node, "byte_fallback", false);
  options.ignore_merges = flag(node, "ignore_merges", false);
  model.emplace(std::move(vocab), merges, std::move(options));

  normalizer = tokenizer::Normalizer::parse(spec.value("normalizer", json()), "normalizer");
  pre_tokenizer =
      tokenizer::PreTokenizer::parse(spec.value("pre_tokenizer", json()), "pre_tokenizer");
  // A normalized added token is looked for in normalized text, in its normalized form (it still
  // decodes to its content, as tokenizers 0.22 has it). Special tokens go in first: where two
  // patterns are the same, the first one's token is found.
  for (const bool special : {true, false})
    for (size_t i = 0; i < added.size(); ++i) {
      AddedToken& a = added[i];
      if (a.special != special) continue;
      a.pattern = a.content;
      if (a.normalized) {
        normalizer.apply(a.pattern);
        normalized_tokens.add(a.pattern, i);
      } else {
        raw_tokens.add(a.pattern, i);
      }
      if (a.single_word && !word_char)
        word_char.emplace(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])");
    }
  try {
    post_processor =
        tokenizer::PostProcessor::parse(spec.value("post_processor", json()), "post_processor");
  } catch (const std::invalid_argument& e) {
    special_problem = e.what();  // only add_special_tokens needs it
  }
}

// tokenizers' AddedVocabulary::find_matches: the added tokens in `s` and the text between them,
// in order, covering s (lstrip and rstrip take the whitespace around a token into it).
std::vector<HfTokenizer::Impl::Split> HfTokenizer::Impl::find_added(std::string_view s,
                                                                    const TokenTrie& trie) const {
  std::vector<Split> out;
  if (trie.empty()) {
    out.push_back({std::nullopt, 0, s.size()});
    return out;
  }
  auto is_word = [this](std::string_view ch) { return word_char->search(ch); };
  auto last_char = [](std::string_view t) {
    size_t i = t.size();
    while (i > 0 && (static_cast<unsigned char>(t[i - 1]) & 0xC0) == 0x80) --i;
    return t.substr(i > 0 ? i - 1 : 0);
  };
  auto first_char = [](std::string_view t) {
    return t.substr(0, unicode::sequence_length(static_cast<unsigned char>(t[0])));
  };
  size_t start_offset = 0;
  for (size_t from = 0;;) {
    const TokenTrie::Match match = trie.find(s, from);
    if (match.begin == std::string_view::npos) break;
    from = match.end;
    const AddedToken& token = added[match.token];
    size_t start = match.begin, stop = match.end;
    if (token.single_word) {
      const bool start_space = start == 0 || !is_word(last_char(s.substr(0, start)));
      const bool stop_space = stop == s.size() || !is_word(first_char(s.substr(stop)));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) {
      size_t ws = start;  // back over the whitespace before the token
      while (ws > 0) {
        size_t b = ws - 1;
        while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
        size_t i = b;
        if (!unicode::is_white_space(unicode::next_code_point(s, i))) break;
        ws = b;
      }
      // Whitespace an earlier token took (its rstrip) stays with it.
      start = std::max(ws, start_offset);
    }
    if (token.rstrip)
      while (stop < s.size()) {
        size_t i = stop;
        if (!unicode::is_white_space(unicode::next_code_point(s, i))) break;
        stop = i;
      }
    if (start_offset < start) out.push_back({std::nullopt, start_offset, start});
    out.push_back({match.token, start, stop});
    start_offset = stop;
  }
  if (start_offset != s.size()) out.push_back({std::nullopt, start_offset, s.size()});
  return out;
}

HfTokenizer::~HfTokenizer() = default;
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;

std::vector<int32_t> HfTokenizer::encode(std::string_view text, bool add_special_tokens,
                                         size_t* dropped, const std::string& source) {
  Impl& m = *impl_;
  if (!m.encode_problem.empty())
    fail(m.path, fmt::format("cannot encode: {}", m.encode_problem), kUnsupportedFix);
  if (add_special_tokens && !m.special_problem.empty())
    fail(m.path, fmt::format("cannot add special tokens: {}", m.special_problem),
         "encode without special tokens, or use a tokenizer.json with a TemplateProcessing");
  if (const size_t bad = unicode::find_invalid_utf8(text); bad != std::string_view::npos)
    throw DataError(
        fmt::format("[tokenizer] {} is not UTF-8 (byte {}). Fix: convert the text to UTF-8 (iconv)",
                    source, bad));
  std::vector<int32_t> ids;
  size_t lost = 0;
  std::vector<Piece> words;
  for (const Impl::Split& raw : m.find_added(text, m.raw_tokens)) {
    if (raw.token) {
      ids.push_back(m.added[*raw.token].id);
      continue;
    }
    std::string normalized(text.substr(raw.begin, raw.end - raw.begin));
    const bool head = m.normalizer.apply(normalized);
    for (const Impl::Split& piece : m.find_added(normalized, m.normalized_tokens)) {
      if (piece.token) {
        ids.push_back(m.added[*piece.token].id);
        continue;
      }
      if (piece.end == piece.begin) continue;
      words.assign(1, {normalized.substr(piece.begin, piece.end - piece.begin),
                       raw.begin == 0 && piece.begin == 0 && head});
      m.pre_tokenizer.apply(words);
      for (const Piece& w : words) m.model->encode_word(w.text, ids, &lost);
    }
  }
  if (dropped) *dropped += lost;
  return add_special_tokens ? m.post_processor.apply(std::move(ids)) : ids;
}

std::string HfTokenizer::decode(std::span<const int32_t> ids) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= m.vocab_size)
      throw DataError(fmt::format(
          "[tokenizer] {}: token {} is outside its vocabulary of {}. Fix: use the tokenizer.json "
          "the training data was made with",
          m.path, id, m.vocab_size));
    if (const auto a = m.added_by_id.find(id); a != m.added_by_id.end())
      tokens.push_back(m.added[a->second].content);
    else if (const auto v = m.vocab_tokens.find(id); v != m.vocab_tokens.end())
      tokens.push_back(v->second);
    // else: a gap in the vocabulary, which tokenizers skips
  }
  return m.decoder.decode(std::move(tokens));
}

const std::string& HfTokenizer::path() const {
  return impl_->path;
}
int64_t HfTokenizer::vocab_size() const {
  return impl_->vocab_size;
}
int64_t HfTokenizer::eot_token() const {
  return impl_->eot;
}
bool HfTokenizer::can_encode() const {
  return impl_->encode_problem.empty();
}
const std::string& HfTokenizer::encode_problem() const {
  return impl_->encode_problem;
}

bool HfTokenizer::looks_like_json(const std::string& path) {
  if (std::filesystem::path(path).extension() == ".json") return true;
  RegularFile file = RegularFile::open_read(path);
  if (!file.ok()) return false;
  char buf[4096];
  for (ssize_t n; (n = ::read(file.fd(), buf, sizeof buf)) > 0;)
    for (ssize_t i = 0; i < n; ++i)
      if (buf[i] != ' ' && buf[i] != '\t' && buf[i] != '\n' && buf[i] != '\r') return buf[i] == '{';
  return false;
}

namespace {
bool ends_with_replacement(const std::string& s) {
  return s.ends_with("\xEF\xBF\xBD");
}
}  // namespace

// tokenizers' step_decode_stream: decode the ids since the last settled place, and hand out what
// follows the text they had then, once it does not end in U+FFFD (an incomplete character). The
// ids before the settled place stay as context, so a decoder that strips the first token's
// leading space strips it once.
std::string DecodeStream::push(int32_t id) {
  if (prefix_.empty() && !ids_.empty()) {
    std::string prefix = tok_.decode(ids_);
    if (!ends_with_replacement(prefix)) {
      prefix_ = std::move(prefix);
      prefix_ids_ = ids_.size();
    }
  }
  ids_.push_back(id);
  std::string text = tok_.decode(ids_);
  if (text.size() <= prefix_.size() || ends_with_replacement(text)) return "";
  // The text goes on from the settled prefix for every decoder chain tokenizers streams (where
  // it does not, tokenizers reports an error); should one not, what follows the prefix's length
  // is taken from a character boundary, so that the output stays UTF-8.
  size_t from = prefix_.size();
  if (!text.starts_with(prefix_))
    while (from < text.size() && (static_cast<unsigned char>(text[from]) & 0xC0) == 0x80) ++from;
  std::string fresh = text.substr(from);
  const size_t kept = ids_.size() - prefix_ids_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_ids_));
  prefix_ = tok_.decode(ids_);
  prefix_ids_ = kept;
  return fresh;
}

std::string DecodeStream::finish() {
  const std::string text = tok_.decode(ids_);
  std::string rest = text.size() > prefix_.size() ? text.substr(prefix_.size()) : std::string();
  ids_.clear();
  prefix_.clear();
  prefix_ids_ = 0;
  return rest;
}

}  // namespace remat
