// BpeModel (see data/bpe_model.h).
#include "data/bpe_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "data/unicode_text.h"

namespace remat {
namespace {

// tokenizers' cache bounds: words this long are rare, and caching them would cost more than it
// saves.
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kMaxCachedWords = size_t{1} << 18;

struct Symbol {
  int32_t id;
  int32_t prev, next;  // neighbours in the word, -1 at its ends
  uint32_t bytes;      // 0 once merged into its left neighbour
};

// A merge waiting in the queue, as rank << 32 | position: the smallest first is the lowest rank,
// leftmost among equal ranks (the order tokenizers applies).
using Candidate = uint64_t;
constexpr uint64_t kEmptyKey = ~uint64_t{0};  // no pair of ids (< 2^24 each) is this

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
size_t slot_of(uint64_t key, uint64_t mask) {
  return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull >> 20) & mask);  // Fibonacci hashing
}

}  // namespace

BpeModel::BpeModel(TokenMap vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  size_t slots = 16;
  while (slots < 2 * merges.size()) slots *= 2;
  merge_keys_.assign(slots, kEmptyKey);
  merge_ranks_.assign(slots, -1);
  merge_mask_ = slots - 1;
  merged_id_.resize(merges.size());
  const size_t prefix = options_.continuing_subword_prefix.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const auto ia = vocab_.find(a), ib = vocab_.find(b);
    if (ia == vocab_.end() || ib == vocab_.end())
      throw std::invalid_argument(
          fmt::format("merge {} (\"{} {}\") names \"{}\", which is not in "
                      "model.vocab",
                      rank, a, b, ia == vocab_.end() ? a : b));
    const std::string joined = a + b.substr(std::min(prefix, b.size()));
    const auto ij = vocab_.find(joined);
    if (ij == vocab_.end())
      throw std::invalid_argument(fmt::format(
          "merge {} (\"{} {}\") makes \"{}\", which is not in model.vocab", rank, a, b, joined));
    // A pair listed twice keeps its last rank, as tokenizers' map does.
    const uint64_t key = pair_key(ia->second, ib->second);
    size_t slot = slot_of(key, merge_mask_);
    while (merge_keys_[slot] != kEmptyKey && merge_keys_[slot] != key)
      slot = (slot + 1) & merge_mask_;
    merge_keys_[slot] = key;
    merge_ranks_[slot] = static_cast<int32_t>(rank);
    merged_id_[rank] = ij->second;
  }
  if (options_.unk_token) {
    const auto it = vocab_.find(*options_.unk_token);
    if (it == vocab_.end())
      throw std::invalid_argument(
          fmt::format("model.unk_token \"{}\" is not in model.vocab", *options_.unk_token));
    unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab_.find(fmt::format("<0x{:02X}>", b));
    byte_ids_[b] = options_.byte_fallback && it != vocab_.end() ? it->second : -1;
  }
}

std::optional<int32_t> BpeModel::id_of(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

int32_t BpeModel::find_merge(int32_t a, int32_t b) const {
  const uint64_t key = pair_key(a, b);
  for (size_t slot = slot_of(key, merge_mask_);; slot = (slot + 1) & merge_mask_) {
    if (merge_keys_[slot] == key) return merge_ranks_[slot];
    if (merge_keys_[slot] == kEmptyKey) return -1;
  }
}

int32_t BpeModel::char_id(std::string_view ch, bool first, bool last) const {
  if (options_.continuing_subword_prefix.empty() && options_.end_of_word_suffix.empty()) {
    const auto it = vocab_.find(ch);
    return it == vocab_.end() ? -1 : it->second;
  }
  std::string s(first ? "" : options_.continuing_subword_prefix);
  s += ch;
  if (last) s += options_.end_of_word_suffix;
  const auto it = vocab_.find(s);
  return it == vocab_.end() ? -1 : it->second;
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out, size_t* dropped) {
  if (options_.ignore_merges)
    if (const auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  if (const auto hit = cache_.find(word); hit != cache_.end()) {
    out.insert(out.end(), hit->second.begin(), hit->second.end());
    return;
  }
  const size_t before = out.size();
  size_t lost = 0;
  if (word.size() < kMaxCachedWordBytes || !options_.continuing_subword_prefix.empty() ||
      !options_.end_of_word_suffix.empty())
    merge_word(word, out, &lost);
  else
    merge_long_word(word, out, &lost);
  if (dropped) *dropped += lost;
  // A word with a dropped character is not cached: the count must be reported each time.
  if (lost == 0 && word.size() < kMaxCachedWordBytes && cache_.size() < kMaxCachedWords)
    cache_.emplace(
        std::string(word),
        std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(before), out.end()));
}

// A long word (Llama 2's tokenizers have no pre-tokenizer: a document is one word) is cut where
// no merge can ever join its two sides, and each part merged alone. The result is the same: merges
// only ever join neighbours, so parts that can never join evolve independently. The queue and the
// symbols of a part stay in cache: 1 MiB of English through Phi-3's tokenizer took 180 ms of CPU
// instead of 370 (remat_bench_tokenizer). Two neighbouring characters can never join when both
// are tokens (no unk or byte fallback between them) and no token has the first right before the
// second.
void BpeModel::merge_long_word(std::string_view word, std::vector<int32_t>& out, size_t* dropped) {
  if (!inner_pairs_built_) {
    for (const auto& [token, id] : vocab_) {
      uint32_t prev = 0;
      for (size_t i = 0; i < token.size();) {
        const uint32_t cp = unicode::next_code_point(token, i);
        if (i > unicode::sequence_length(static_cast<unsigned char>(token[0])))
          inner_pairs_.push_back((static_cast<uint64_t>(prev) << 32) | cp);
        prev = cp;
      }
    }
    std::sort(inner_pairs_.begin(), inner_pairs_.end());
    inner_pairs_.erase(std::unique(inner_pairs_.begin(), inner_pairs_.end()), inner_pairs_.end());
    inner_pairs_built_ = true;
  }
  size_t start = 0;
  uint32_t prev = 0;
  bool prev_is_token = false;
  for (size_t i = 0; i < word.size();) {
    const size_t at = i;
    const uint32_t cp = unicode::next_code_point(word, i);
    const bool is_token = vocab_.find(word.substr(at, i - at)) != vocab_.end();
    if (at > start && prev_is_token && is_token &&
        !std::binary_search(inner_pairs_.begin(), inner_pairs_.end(),
                            (static_cast<uint64_t>(prev) << 32) | cp)) {
      merge_word(word.substr(start, at - start), out, dropped);
      start = at;
    }
    prev = cp;
    prev_is_token = is_token;
  }
  merge_word(word.substr(start), out, dropped);
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out, size_t* dropped) {
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  auto add = [&sym](int32_t id, size_t bytes) {
    sym.push_back({id, static_cast<int32_t>(sym.size()) - 1, -1, static_cast<uint32_t>(bytes)});
  };
  // The characters' ids. A character without one: its bytes' <0xXX> tokens (byte_fallback), else
  // unk_token (one per run of such characters with fuse_unk), else nothing. As in tokenizers, a
  // pending unk waits for the next character that has a token, byte fallback tokens included.
  size_t unk_bytes = 0;  // the pending unk's bytes; 0 when none is pending
  for (size_t i = 0; i < word.size();) {
    const size_t start = i;
    unicode::next_code_point(word, i);
    const std::string_view ch = word.substr(start, i - start);
    const int32_t id = char_id(ch, start == 0, i >= word.size());
    if (id >= 0) {
      if (unk_bytes > 0) add(*unk_id_, unk_bytes);
      unk_bytes = 0;
      add(id, ch.size());
      continue;
    }
    if (options_.byte_fallback && std::all_of(ch.begin(), ch.end(), [this](char c) {
          return byte_ids_[static_cast<unsigned char>(c)] >= 0;
        })) {
      for (char c : ch) add(byte_ids_[static_cast<unsigned char>(c)], 1);
      continue;
    }
    if (!unk_id_) {
      ++*dropped;
      continue;
    }
    if (unk_bytes > 0 && options_.fuse_unk) {
      unk_bytes += ch.size();
    } else {
      if (unk_bytes > 0) add(*unk_id_, unk_bytes);
      unk_bytes = ch.size();
    }
  }
  if (unk_bytes > 0) add(*unk_id_, unk_bytes);
  for (size_t k = 0; k + 1 < sym.size(); ++k) sym[k].next = static_cast<int32_t>(k + 1);

  std::vector<Candidate> queue;
  auto candidate = [&](int32_t pos) -> std::optional<Candidate> {
    const int32_t next = sym[static_cast<size_t>(pos)].next;
    if (next < 0) return std::nullopt;
    const int32_t rank =
        find_merge(sym[static_cast<size_t>(pos)].id, sym[static_cast<size_t>(next)].id);
    if (rank < 0) return std::nullopt;
    return (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(pos);
  };
  for (size_t k = 0; k + 1 < sym.size(); ++k)
    if (const auto c = candidate(static_cast<int32_t>(k))) queue.push_back(*c);
  std::make_heap(queue.begin(), queue.end(), std::greater<>{});
  auto offer = [&](int32_t pos) {
    if (const auto c = candidate(pos)) {
      queue.push_back(*c);
      std::push_heap(queue.begin(), queue.end(), std::greater<>{});
    }
  };
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), std::greater<>{});
    const Candidate top = queue.back();
    queue.pop_back();
    const auto pos = static_cast<int32_t>(top & 0xFFFFFFFFu);
    const int32_t id = merged_id_[static_cast<size_t>(top >> 32)];
    Symbol& left = sym[static_cast<size_t>(pos)];
    if (left.bytes == 0 || left.next < 0) continue;  // merged away, or at the end now
    Symbol& right = sym[static_cast<size_t>(left.next)];
    // Stale when the pair here changed since it was queued (tokenizers compares the merged id).
    const int32_t now = find_merge(left.id, right.id);
    if (now < 0 || merged_id_[static_cast<size_t>(now)] != id) continue;
    left.id = id;
    left.bytes += right.bytes;
    right.bytes = 0;
    left.next = right.next;
    if (right.next >= 0) sym[static_cast<size_t>(right.next)].prev = pos;
    if (left.prev >= 0) offer(left.prev);
    offer(pos);
  }
  for (const Symbol& s : sym)
    if (s.bytes > 0) out.push_back(s.id);
}

}  // namespace remat
