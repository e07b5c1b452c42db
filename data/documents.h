// Documents and loss masks inside rows of tokens: where each token's document starts, and which
// targets are trained. What every token data source shares (file windows and packed rows,
// data/file_data.h; synthetic tokens, data/synthetic.h) and what the tests build batches with.
//
// A document is the run of tokens up to and including its end-of-text token (data.eot_token).
// With data.attention = "document" a token attends only to the earlier tokens of its own document
// and its positions restart at 0 there (engine/core/ops/attention.h reads the starts this file
// writes); the end-of-text token is trained as its document's last target, and the target after
// it, the next document's first token, is not. A row's first token starts a document, whatever
// came before it in the data. A loss mask (X.mask.bin beside a shard X.bin: data/token_corpus.h)
// says per token whether it is trained as a target.
#pragma once

#include <cstdint>
#include <vector>

namespace remat {

/// Marks one row of T inputs, tokens[0 .. T), whose targets are tokens[1 .. T]: writes `targets`
/// (T), with kIgnoredTarget (engine/core/ops/loss.h) where a target is not trained, and returns
/// how many are. `mask`: a byte per token of `tokens` (T + 1; target t is trained where
/// mask[t + 1] is 1), or null (all). `eot` >= 0: documents end at that id, so the target of an
/// end-of-text input is not trained, and `doc_start` (T, when not null) gets each input's document
/// start, an index into the row. eot < 0: no documents (doc_start is left alone).
int64_t mark_row(const int32_t* tokens, const uint8_t* mask, int64_t T, int64_t eot,
                 int32_t* targets, int32_t* doc_start);

/// The (query, key) pairs document attention computes in one row of `T` tokens split into
/// documents of the given lengths (summing to T): sum of n (n + 1) / 2. Causal attention is one
/// document of T.
double document_pairs(const std::vector<int64_t>& lengths);

}  // namespace remat
