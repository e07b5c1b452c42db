// Synthetic training data, deterministic in (seed, step), generated on the host and uploaded:
//   random      uniform tokens (nothing to learn: the loss stays near ln V; a throughput task)
//   copy        the second half of each sequence repeats the first, so a model that attends
//               far back drives the second half's loss toward zero (task metric: that loss)
//   regression  the MLP tutorial's task: x ~ N(0, 1) (data/gaussian.h), y = relu(x A^T) for a
//               fixed random A
#pragma once

#include <memory>

#include "engine/config/config.h"
#include "engine/training/trainer.h"

namespace remat {

std::unique_ptr<DataSource> make_synthetic_data(const Config& cfg);

}  // namespace remat
