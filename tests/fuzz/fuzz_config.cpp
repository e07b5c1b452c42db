// The TOML config and --set overrides: the input is the file's text, then optional overrides,
// each after a NUL byte. Any ConfigError is a fine answer; a crash, a sanitizer report or another
// exception is a bug. A config that parses must read back from its resolved TOML (state.json).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t nul; (nul = input.find('\0', start)) != std::string::npos; start = nul + 1)
    parts.push_back(input.substr(start, nul - start));
  parts.push_back(input.substr(start));
  const std::string text = parts.front();
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());
  remat::Config c;
  try {
    c = remat::parse_config(text, "fuzz.toml", overrides);
  } catch (const remat::ConfigError&) {
    return 0;
  }
  const std::string resolved = remat::config_to_toml(c);
  try {
    remat::parse_config(resolved, "state.json");
  } catch (const remat::ConfigError& e) {
    std::fprintf(stderr, "resolved config does not read back: %s\n%s\n", e.what(),
                 resolved.c_str());
    __builtin_trap();
  }
  return 0;
}
