// Documents and loss masks inside rows of tokens (see data/documents.h).
#include "data/documents.h"

#include "engine/core/ops/loss.h"

namespace remat {

int64_t mark_row(const int32_t* tokens, const uint8_t* mask, int64_t T, int64_t eot,
                 int32_t* targets, int32_t* doc_start) {
  int64_t trained = 0;
  int64_t start = 0;  // the first token of the current input's document
  for (int64_t t = 0; t < T; ++t) {
    if (eot >= 0 && doc_start) doc_start[t] = static_cast<int32_t>(start);
    const bool ends_document = eot >= 0 && tokens[t] == eot;
    const bool masked = mask && mask[t + 1] == 0;
    if (ends_document || masked) {
      targets[t] = kIgnoredTarget;
    } else {
      targets[t] = tokens[t + 1];
      ++trained;
    }
    if (ends_document) start = t + 1;
  }
  return trained;
}

double document_pairs(const std::vector<int64_t>& lengths) {
  double pairs = 0;
  for (int64_t n : lengths) pairs += static_cast<double>(n) * static_cast<double>(n + 1) / 2;
  return pairs;
}

}  // namespace remat
