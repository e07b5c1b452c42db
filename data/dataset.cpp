// make_data_source: the DataSource that [data] source names (see data/dataset.h).
#include "data/dataset.h"

#include "data/file_data.h"
#include "data/synthetic.h"
#include "engine/core/error.h"

namespace remat {

// The default for sources without validation data; Trainer::evaluate asks validation_batches()
// first, so reaching this is a caller that skipped that check.
Batch DataSource::validation_batch(Backend& /*be*/, int64_t /*index*/) {
  throw Error("[data] this data source has no validation set");
}

std::unique_ptr<DataSource> make_data_source(const Config& cfg) {
  if (cfg.data.source == "synthetic") return make_synthetic_data(cfg);
  return std::make_unique<FileData>(cfg);  // "tokens" | "text": config validation allows no other
}

}  // namespace remat
