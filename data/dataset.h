// The data a run trains on, chosen by [data] source:
//   synthetic  generated tasks (data/synthetic.h)
//   tokens     llm.c token shards (.bin: 256 x int32 header, magic, version, token count; then
//              uint16 (GPT-2) or uint32 (Llama 3) tokens), read with pread (data/token_corpus.h)
//   text       any files read as bytes (vocabulary 256), read with pread
// File-backed sources touch no file until DataSource::open(), so a dry run (plan, fit) of a config
// whose files live on another machine still works.
#pragma once

#include <memory>

#include "engine/config/config.h"
#include "engine/training/trainer.h"

namespace remat {

std::unique_ptr<DataSource> make_data_source(const Config& cfg);

}  // namespace remat
