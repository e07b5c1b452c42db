// `remat-train sample`: generation from a checkpoint on the CPU with a KV-cached decoder
// (layers/decoder.h: the GPT's or the Llama family's).
// Byte models (data.source = "text", or token ids that are bytes: --tokenizer bytes) take and
// print text. Token models take --prompt as text when --tokenizer is a Hugging Face tokenizer.json
// (encoded by data/hf_tokenizer.h, without special tokens, as scripts/prepare_data.py encodes
// training data), and as token ids otherwise (no tokenizer, or llm.c's gpt2_tokenizer.bin, which
// only decodes); --prompt-ids always takes ids. They print ids, or text through --tokenizer (the
// two kinds told apart by a ".json" name or a first byte '{'): a tokenizer.json through its
// DecodeStream (tokenizers' own streaming decode), llm.c's table through a Utf8Stream, so a
// character split across tokens prints whole and bytes that are no UTF-8 print as U+FFFD. Random
// draws come from the counter-based RNG keyed by (seed, token index), so a seed reproduces the
// output exactly.
//
// An empty prompt still needs one token to condition on: byte models start from '\n' (text files
// are lines, so a newline is the most neutral context); token models start from the tokenizer's
// end-of-text token when --tokenizer is given (documents are separated by it), else from token 0.
// That start token is not printed.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <optional>

#include "cmd/commands.h"
#include "data/gpt2_tokenizer.h"
#include "data/hf_tokenizer.h"
#include "data/unicode_text.h"
#include "engine/config/config.h"
#include "engine/core/count_backend.h"
#include "engine/core/error.h"
#include "engine/core/machine.h"
#include "engine/core/regular_file.h"
#include "engine/core/rng.h"
#include "engine/core/units.h"
#include "engine/training/checkpoint.h"
#include "engine/training/lora_checkpoint.h"
#include "layers/decoder.h"
#include "layers/models.h"

namespace remat::cli {

// --checkpoint (or train's --resume) names a step_* folder (it has a state.json) or a
// checkpoint.dir (its newest).
std::string resolve_checkpoint(const std::string& arg, const char* command, const char* flag) {
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(arg) / "state.json")) return arg;
  if (arg == "latest" && !fs::is_directory(arg))
    throw CheckpointError(
        fmt::format("[{}] {} latest: without a config there is no checkpoint.dir to take the "
                    "newest of. Fix: pass the checkpoint.dir itself (its newest checkpoint is "
                    "taken), e.g. {} out/run, or a step_* folder",
                    command, flag, flag));
  if (!fs::is_directory(arg))
    throw CheckpointError(fmt::format(
        "[{}] {} {}: {}. Fix: pass a step_* checkpoint folder, or the checkpoint.dir "
        "of a training run{}",
        command, flag, arg, fs::exists(arg) ? "a file, not a folder" : "no such folder",
        fs::path(arg).filename() == "state.json" || fs::path(arg).extension() == ".safetensors"
            ? fmt::format(" (the folder holding it: {})", fs::path(arg).parent_path().string())
            : std::string()));
  const std::string latest = latest_checkpoint(arg);
  if (latest.empty())
    throw CheckpointError(
        fmt::format("[{}] {} {}: no state.json and no complete step_* checkpoint in "
                    "it. Fix: pass a step_* folder, or train with checkpoint.dir set first",
                    command, flag, arg));
  return latest;
}

Config checkpoint_config(const Checkpoint& ckpt) {
  const Config cfg = parse_config(ckpt.state().config_toml, ckpt.path() + "/state.json");
  // The model on a count backend: its parameters' names and shapes, without memory or values.
  CountBackend count(CountTarget{}, UINT64_MAX);
  ModelShape shape = model_shape(cfg.train);
  shape.lora = cfg.lora;  // a LoRA checkpoint holds what trains: the adapters, not the base
  const std::unique_ptr<Model> model = make_model(cfg.model, shape, count);
  ckpt.check_matches(*model);
  return cfg;
}

namespace {

constexpr int32_t kByteStartToken = '\n';
constexpr int64_t kByteVocab = 256;

std::string read_prompt(const SampleOptions& opt) {
  if (opt.prompt_file.empty()) return opt.prompt;
  RegularFile file = RegularFile::open_read(opt.prompt_file);
  std::string text;
  const int err = file.ok() ? file.read_all(text) : 0;
  if (!file.ok() || err != 0)
    throw ConfigError(fmt::format("[sample] --prompt-file {}: {}. Fix: give a text file",
                                  opt.prompt_file,
                                  file.ok() ? std::strerror(err) : file.problem_text()));
  return text;
}

std::string prompt_source(const SampleOptions& opt) {
  return opt.prompt_file.empty() ? std::string("--prompt") : "--prompt-file " + opt.prompt_file;
}

}  // namespace

std::vector<int32_t> parse_token_ids(const std::string& text, int64_t vocab,
                                     const std::string& source, const std::string& fix) {
  std::vector<int32_t> ids;
  size_t i = 0;
  auto is_sep = [](char c) { return c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (i < text.size()) {
    if (is_sep(text[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && !is_sep(text[j])) ++j;
    const std::string word = text.substr(i, j - i);
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
    if (ec != std::errc() || end != word.data() + word.size() || id < 0)
      throw ConfigError(fmt::format("{}: \"{}\" is not a token id. Fix: {}", source,
                                    word.size() > 40 ? word.substr(0, 40) + "..." : word, fix));
    if (id >= vocab)
      throw ConfigError(
          fmt::format("{}: token id {} is outside the vocabulary of {}. Fix: give ids from 0 to {} "
                      "(remat-train tokenize --tokenizer tokenizer.json prints a text's ids)",
                      source, id, vocab, vocab - 1));
    ids.push_back(static_cast<int32_t>(id));
    i = j;
  }
  return ids;
}

namespace {

// Picks the next token among ids [0, n) of `logits`: argmax at temperature 0, else a draw from
// softmax(logits / T) over the top-k (all when k is 0 or >= n).
class Sampler {
 public:
  Sampler(double temperature, int64_t top_k, uint64_t seed)
      : temperature_(temperature), top_k_(top_k), seed_(seed) {}

  int32_t pick(const std::vector<float>& logits, int64_t n, uint64_t index) {
    if (temperature_ == 0)
      return static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + n) -
                                  logits.begin());
    candidates(logits, n);
    const float mx = logits[static_cast<size_t>(
        *std::max_element(ids_.begin(), ids_.end(), [&](int32_t a, int32_t b) {
          return logits[static_cast<size_t>(a)] < logits[static_cast<size_t>(b)];
        }))];
    // Subtracting the max before exp() keeps every weight in (0, 1]: stable at any temperature.
    weights_.resize(ids_.size());
    double total = 0;
    for (size_t i = 0; i < ids_.size(); ++i) {
      weights_[i] =
          std::exp(static_cast<double>(logits[static_cast<size_t>(ids_[i])] - mx) / temperature_);
      total += weights_[i];
    }
    const double u = rng_uniform(seed_, kStream, index) * total;
    double acc = 0;
    for (size_t i = 0; i < ids_.size(); ++i) {
      acc += weights_[i];
      if (u < acc) return ids_[i];
    }
    return ids_.back();  // u rounded up to the total
  }

 private:
  // ids_ = the candidate ids in increasing order (a fixed order, so a seed means one output).
  void candidates(const std::vector<float>& logits, int64_t n) {
    ids_.resize(static_cast<size_t>(n));
    std::iota(ids_.begin(), ids_.end(), 0);
    if (top_k_ > 0 && top_k_ < n) {
      auto by_logit = [&](int32_t a, int32_t b) {
        const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
        return la > lb || (la == lb && a < b);
      };
      std::nth_element(ids_.begin(), ids_.begin() + top_k_ - 1, ids_.end(), by_logit);
      ids_.resize(static_cast<size_t>(top_k_));
      std::sort(ids_.begin(), ids_.end());
    }
  }

  static constexpr uint64_t kStream = 0x73616d706c65ull;  // "sample"
  double temperature_;
  int64_t top_k_;
  uint64_t seed_;
  std::vector<int32_t> ids_;
  std::vector<double> weights_;
};

// The --tokenizer file: llm.c's binary GPT-2 table (decodes only) or a tokenizer.json.
class Detokenizer {
 public:
  explicit Detokenizer(const std::string& path) : path_(path) {
    // A model folder is the common slip: its tokenizer.json is what is meant.
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
      throw ConfigError(
          fmt::format("[sample] --tokenizer {}: a folder. Fix: pass the tokenizer file, {}", path,
                      std::filesystem::exists(std::filesystem::path(path) / "tokenizer.json", ec)
                          ? (std::filesystem::path(path) / "tokenizer.json").string() + " here"
                          : "a tokenizer.json or llm.c's gpt2_tokenizer.bin"));
    if (HfTokenizer::looks_like_json(path))
      hf_.emplace(path);
    else
      gpt2_.emplace(path);
  }
  const std::string& path() const { return path_; }
  int64_t vocab_size() const { return hf_ ? hf_->vocab_size() : gpt2_->vocab_size(); }
  int64_t eot_token() const { return hf_ ? hf_->eot_token() : gpt2_->eot_token(); }
  /// The tokenizer.json, which encodes text; null for llm.c's table.
  HfTokenizer* encoder() { return hf_ ? &*hf_ : nullptr; }
  const HfTokenizer* hf() const { return hf_ ? &*hf_ : nullptr; }
  const std::string& bytes_of(int64_t id) const { return gpt2_->decode(id); }

 private:
  std::string path_;
  std::optional<Gpt2Tokenizer> gpt2_;
  std::optional<HfTokenizer> hf_;
};

// Writes tokens to stdout as they come, flushed so a slow generation shows progress.
class Printer {
 public:
  Printer(bool bytes, const Detokenizer* tok) : bytes_(bytes), tok_(tok) {
    if (tok && tok->hf()) stream_.emplace(*tok->hf());
  }
  void prompt(const std::vector<int32_t>& ids) {
    // Generated ids print alone (they are data to pipe on); text prints as a continuation.
    if (bytes_ || tok_)
      for (int32_t id : ids) put(id);
  }
  void put(int32_t id) {
    if (bytes_) {
      std::fputc(id, stdout);
    } else if (stream_) {
      write(stream_->push(id));
    } else if (tok_) {
      write(utf8_.push(tok_->bytes_of(id)));
    } else {
      fmt::print("{}{}", first_ ? "" : " ", id);
      first_ = false;
    }
    std::fflush(stdout);
  }
  void end() {
    write(stream_ ? stream_->finish() : utf8_.finish());
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }

 private:
  static void write(const std::string& s) { std::fwrite(s.data(), 1, s.size(), stdout); }
  bool bytes_;
  const Detokenizer* tok_;
  std::optional<DecodeStream> stream_;
  Utf8Stream utf8_;
  bool first_ = true;
};

// The prompt as token ids, and whether the first one is an implied start token (not printed).
struct Prompt {
  std::vector<int32_t> ids;
  bool implied_start = false;
};

Prompt make_prompt(const SampleOptions& opt, const Config& cfg, bool bytes, Detokenizer* tok) {
  Prompt p;
  if (opt.prompt_is_ids) {
    if (bytes)
      throw ConfigError(
          "[sample] --prompt-ids is for token models; this model reads bytes (data.source = "
          "\"text\"). Fix: give the prompt as text with --prompt");
    p.ids = parse_token_ids(opt.prompt, cfg.model.vocab_size, "[sample] --prompt-ids",
                            "give ids like \"50256 464 318\"");
  } else {
    const std::string text = read_prompt(opt);
    if (bytes) {
      for (unsigned char c : text) p.ids.push_back(c);
    } else if (HfTokenizer* encoder = tok ? tok->encoder() : nullptr) {
      size_t dropped = 0;
      for (int32_t id : encoder->encode(text, false, &dropped, "[sample] " + prompt_source(opt)))
        p.ids.push_back(id);
      if (dropped > 0)
        fmt::print(stderr,
                   "warning: [sample] {} character(s) of the prompt have no token in {} (it has no "
                   "byte_fallback and no unk_token) and were left out, as tokenizers leaves them "
                   "out\n",
                   dropped, tok->path());
    } else {
      p.ids = parse_token_ids(
          text, cfg.model.vocab_size, "[sample] " + prompt_source(opt),
          tok ? "llm.c's gpt2_tokenizer.bin only decodes: give the prompt's ids (--prompt-ids "
                "\"50256 464 318\"), or --tokenizer the model's tokenizer.json to give text"
              : "this is a token model: give --tokenizer tokenizer.json to give text, or its "
                "ids (remat-train tokenize --tokenizer tokenizer.json prints a text's ids)");
    }
  }
  for (int32_t id : p.ids) {
    if (id >= cfg.model.vocab_size)
      throw ConfigError(fmt::format(
          "[sample] {}: token {} is outside the model's vocabulary of {}. Fix: use the tokenizer "
          "the training data was made with",
          opt.prompt_is_ids ? std::string("--prompt-ids") : prompt_source(opt), id,
          cfg.model.vocab_size));
    if (tok && id >= tok->vocab_size())
      throw ConfigError(fmt::format(
          "[sample] {}: token id {} is outside the vocabulary of --tokenizer {} ({} ids). Fix: "
          "give ids of that tokenizer",
          prompt_source(opt), id, tok->path(), tok->vocab_size()));
  }
  if (!p.ids.empty()) return p;
  const int64_t start = bytes ? kByteStartToken : tok ? tok->eot_token() : 0;
  if (start < 0)
    throw ConfigError(fmt::format(
        "[sample] --tokenizer {} names no end-of-text token (no eos_token in a "
        "tokenizer_config.json beside it, no <|end_of_text|> or <|endoftext|>), which an empty "
        "prompt starts from. Fix: give a --prompt of token ids",
        tok->path()));
  if (start >= cfg.model.vocab_size)
    throw ConfigError(fmt::format(
        "[sample] the empty prompt starts from end-of-text token {}, outside the model's "
        "vocabulary of {}. Fix: give a --prompt",
        start, cfg.model.vocab_size));
  p.ids.push_back(static_cast<int32_t>(start));
  p.implied_start = true;
  return p;
}

// Positions the run needs: the prompt, then every generated token but the last is fed back.
int64_t positions_needed(const Config& cfg, int64_t prompt_len, int64_t tokens) {
  const int64_t needed = prompt_len + tokens - 1;
  const int64_t n_ctx = cfg.model.n_ctx;
  if (cfg.model.position != PositionKind::Learned) return needed;
  if (prompt_len > n_ctx)
    throw ConfigError(fmt::format(
        "[sample] the prompt is {} tokens, longer than the model's {} learned positions "
        "(model.n_ctx). Fix: shorten the prompt",
        prompt_len, n_ctx));
  if (needed > n_ctx)
    throw ConfigError(fmt::format(
        "[sample] prompt ({} tokens) + --tokens {} needs {} positions; the model has {} "
        "learned positions (model.n_ctx). Fix: lower --tokens to at most {}",
        prompt_len, tokens, needed, n_ctx, n_ctx - prompt_len + 1));
  return needed;
}

// RoPE has no last position, but the decoder's key/value cache holds every one in this machine's
// memory: refused before it is allocated (naming the most --tokens that fit), and a length past
// what the run trained at is said, since the model has never seen those positions.
void check_rope_positions(const Config& cfg, int64_t prompt_len, int64_t tokens,
                          int64_t positions) {
  if (cfg.model.position == PositionKind::Learned) return;
  const double per_position = 2.0 * static_cast<double>(cfg.model.n_layer) *
                              static_cast<double>(cfg.model.kv_heads() * cfg.model.head_size()) *
                              sizeof(float);
  const double memory = static_cast<double>(host_memory_bytes());
  if (per_position * static_cast<double>(positions) > 0.8 * memory)
    throw OutOfMemory(fmt::format(
        "[sample] prompt ({} tokens) + --tokens {} needs {} positions, whose key/value cache "
        "({}) does not fit 80% of this machine's memory ({}). Fix: lower --tokens to at most {}",
        prompt_len, tokens, positions,
        format_bytes(static_cast<uint64_t>(per_position * static_cast<double>(positions))),
        format_bytes(static_cast<uint64_t>(memory)),
        std::max<int64_t>(1, static_cast<int64_t>(0.8 * memory / per_position) - prompt_len + 1)));
  const int64_t trained = cfg.model.max_position_embeddings > 0
                              ? std::max(cfg.model.max_position_embeddings, cfg.train.seq_len)
                              : cfg.train.seq_len;
  // With a RoPE scaling the reach is the scaling's to say: no warning.
  if (positions > trained && cfg.model.rope_scaling.kind == RopeScaling::None)
    fmt::print(stderr,
               "warning: [sample] prompt + --tokens reach position {}, past the {} the model "
               "trained at: RoPE continues there, but the model never learned those positions\n",
               positions, trained);
}

}  // namespace

int run_sample(const SampleOptions& opt) {
  const std::string path = resolve_checkpoint(opt.checkpoint, "sample");
  const Checkpoint ckpt(path);
  const Config cfg = checkpoint_config(ckpt);
  if (!cfg.model.has_sequence())
    throw ConfigError(fmt::format(
        "[sample] {}/state.json: model.kind = \"{}\"; only GPT and Llama models generate. Fix: "
        "sample from a checkpoint of a model.kind = \"gpt\" or \"llama\" run",
        path, cfg.model.kind));
  // `--tokenizer bytes`: a token model whose ids are bytes (shards of scripts/prepare_data.py
  // --tokenizer bytes) takes and prints text, as a model trained on text files does.
  const bool byte_ids = opt.tokenizer == "bytes";
  if (byte_ids && cfg.model.vocab_size < kByteVocab)
    throw ConfigError(fmt::format(
        "[sample] --tokenizer bytes reads ids 0-255 as bytes, and the model's vocabulary is {}. "
        "Fix: drop --tokenizer bytes, or give the tokenizer the training data was made with",
        cfg.model.vocab_size));
  const bool bytes = cfg.data.source == "text" || byte_ids;
  std::optional<Detokenizer> tok;
  if (!opt.tokenizer.empty() && !byte_ids) {
    if (bytes)
      throw ConfigError(
          "[sample] --tokenizer is for token models; this model reads bytes (data.source = "
          "\"text\") "
          "and prints text already. Fix: drop --tokenizer");
    tok.emplace(opt.tokenizer);
    if (tok->vocab_size() > cfg.model.vocab_size)
      throw ConfigError(fmt::format(
          "[sample] --tokenizer {} has {} tokens, more than the model's vocabulary of {}. "
          "Fix: use the tokenizer the training data was made with",
          opt.tokenizer, tok->vocab_size(), cfg.model.vocab_size));
  }
  const Prompt prompt = make_prompt(opt, cfg, bytes, tok ? &*tok : nullptr);
  const int64_t n_prompt = static_cast<int64_t>(prompt.ids.size());
  const int64_t capacity = positions_needed(cfg, n_prompt, opt.tokens);
  check_rope_positions(cfg, n_prompt, opt.tokens, capacity);
  const CheckpointWeights weights(ckpt, cfg);  // a LoRA run's: its adapters merged into the base
  const std::unique_ptr<Decoder> dec = make_decoder(
      cfg.model,
      [&](const std::string& name, std::vector<int64_t>* shape) {
        return weights.weight(name, shape);
      },
      capacity);
  // Only ids the output can show: bytes, or the tokenizer's table (llm.c pads the model's
  // vocabulary past it with never-seen ids).
  const int64_t n_candidates = bytes ? kByteVocab : tok ? tok->vocab_size() : cfg.model.vocab_size;

  Printer out(bytes, tok ? &*tok : nullptr);
  // The output ends with a newline however generation ends, so that an error (or the shell's
  // prompt) starts a line of its own.
  struct EndsLine {
    Printer& out;
    bool ended = false;
    ~EndsLine() {
      if (!ended) out.end();
    }
  } ends_line{out};
  if (!prompt.implied_start) out.prompt(prompt.ids);
  Sampler sampler(opt.temperature, opt.top_k, opt.seed);
  const auto t0 = std::chrono::steady_clock::now();
  // The prompt in blocks of rows (each weight read once per block), then one token at a time:
  // the same logits, bit for bit, as feeding the prompt token by token.
  std::vector<float> logits = dec->prefill(prompt.ids);
  const auto t1 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < opt.tokens; ++i) {
    const int32_t next = sampler.pick(logits, n_candidates, static_cast<uint64_t>(i));
    out.put(next);
    if (i + 1 < opt.tokens) logits = dec->forward(next);
  }
  out.end();
  ends_line.ended = true;
  auto ms = [](auto from, auto to) {
    return std::chrono::duration<double, std::milli>(to - from).count();
  };
  const double prompt_ms = ms(t0, t1), sample_ms = ms(t1, std::chrono::steady_clock::now());
  const auto tokens = [](int64_t n) { return fmt::format("{} token{}", n, n == 1 ? "" : "s"); };
  fmt::print(stderr, "prompt of {} in {:.1f} ms; sampled {} in {:.1f} ms ({:.1f} tok/s) from {}\n",
             tokens(n_prompt), prompt_ms, tokens(opt.tokens), sample_ms,
             sample_ms > 0 ? 1000.0 * static_cast<double>(opt.tokens) / sample_ms : 0.0, path);
  return 0;
}

}  // namespace remat::cli
