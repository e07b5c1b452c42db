// The BPE model of a tokenizer.json ("model": {"type": "BPE", ...}): one pre-token (a "word") in,
// its ids out, as the `tokenizers` package computes them. The word's characters are looked up in
// the vocabulary (a character with no token becomes its UTF-8 bytes' <0xXX> tokens with
// byte_fallback, else unk_token, fused when fuse_unk, else it is dropped: `tokenizers` drops it
// silently, this counts it); then the merges apply lowest rank first, leftmost first among equal
// ranks (a priority queue over a linked list of symbols, O(n log n) in the word's length; a long
// word, a whole document as Llama 2's tokenizers have it, is first cut where no merge can join
// its sides). ignore_merges (Llama 3) takes a word that is a token as it is. Results are cached
// per word (words under 256 bytes, up to 2^18 of them). Not thread-safe (the cache).
// BPE dropout is refused by the loader: it makes encoding random, which no prompt or shard wants.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace remat {

/// Heterogeneous lookup: find a std::string key by std::string_view without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;  // before every character but a word's first
  std::string end_of_word_suffix;         // after a word's last character
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

class BpeModel {
 public:
  /// `merges` in rank order, each a pair of tokens whose concatenation (the second without its
  /// continuing_subword_prefix) is a token. Throws std::invalid_argument naming a merge whose
  /// tokens are not in `vocab`, or an unk_token that is not.
  BpeModel(TokenMap vocab, const std::vector<std::pair<std::string, std::string>>& merges,
           BpeOptions options);

  /// Appends the ids of `word` (valid UTF-8, not empty) to `out`; adds to *dropped the number of
  /// characters that have no token (see the file comment).
  void encode_word(std::string_view word, std::vector<int32_t>& out, size_t* dropped);
  /// The id of a token string, if the vocabulary has it.
  std::optional<int32_t> id_of(std::string_view token) const;
  const TokenMap& vocab() const { return vocab_; }

 private:
  void merge_word(std::string_view word, std::vector<int32_t>& out, size_t* dropped);
  void merge_long_word(std::string_view word, std::vector<int32_t>& out, size_t* dropped);
  int32_t char_id(std::string_view ch, bool first, bool last) const;
  /// The rank of the merge of the pair (a, b), or -1.
  int32_t find_merge(int32_t a, int32_t b) const;

  TokenMap vocab_;
  // The merges by pair: an open-addressing table (linear probing, at most half full) of
  // (a << 32 | b) keys and ranks; merged_id_[rank] is what the pair becomes. It made a 1 MiB
  // word (Llama 2's tokenizers keep a document whole) encode 1.4x faster than with
  // std::unordered_map (513 -> 370 ms of CPU for 1 MiB of English, remat_bench_tokenizer).
  std::vector<uint64_t> merge_keys_;
  std::vector<int32_t> merge_ranks_;
  std::vector<int32_t> merged_id_;
  uint64_t merge_mask_ = 0;
  BpeOptions options_;
  std::optional<int32_t> unk_id_;
  int32_t byte_ids_[256];  // <0x00> .. <0xFF> with byte_fallback, -1 where missing
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
  // Every (first << 32 | second) pair of code points adjacent inside a token, sorted; built for
  // the first long word (merge_long_word).
  std::vector<uint64_t> inner_pairs_;
  bool inner_pairs_built_ = false;
};

}  // namespace remat
