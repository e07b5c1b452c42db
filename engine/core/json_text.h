// JSON as text, for stdout and for the files the project writes (state.json, config.json,
// adapter_config.json, sweep.json, metrics lines). A folder or file name may be any bytes and
// JSON strings are UTF-8: bytes that are not become U+FFFD instead of an exception after the work
// is done. A template, so that an ordered_json (an exported config.json) keeps its key order.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace remat {

template <class Json>
std::string json_text(const Json& j, int indent = -1) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

}  // namespace remat
