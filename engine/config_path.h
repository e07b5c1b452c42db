// Where `--config PATH` is read from (defined in engine/config.cpp, beside load_config, which
// uses it too).
#pragma once

#include <string>

namespace remat {

/// PATH when it exists or is absolute; else, when it is there, the copy under the installed data
/// folder, `<exe_dir>/../share/remat-train/PATH`: `make install` puts configs/ there, so
/// `--config configs/copy.toml` works from any folder. Else PATH as given (load_config's error
/// then names both places). `exe_dir` defaults to the running executable's folder.
std::string resolve_config_path(const std::string& path);
std::string resolve_config_path(const std::string& path, const std::string& exe_dir);

}  // namespace remat
