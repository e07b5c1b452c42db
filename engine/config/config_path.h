// Where `--config PATH` is read from (defined in engine/config/config.cpp, beside load_config,
// which uses it too).
#pragma once

#include <string>

namespace remat {

/// PATH when it exists or is absolute; else, when it is there, the copy under the installed data
/// folder, `<exe_dir>/../share/remat-train/PATH`: `make install` puts configs/ there, so
/// `--config configs/copy.toml` works from any folder. Else PATH as given (load_config's error
/// then names both places). `exe_dir` defaults to the running executable's folder.
std::string resolve_config_path(const std::string& path);
std::string resolve_config_path(const std::string& path, const std::string& exe_dir);

/// Where a page of the manual (`docs/configs.md`) is for the user of this binary: the installed
/// copy, `<exe_dir>/../share/doc/remat-train/PAGE`, when there is one (`make install` puts the
/// manual there); else PAGE as given, the repository's own.
std::string docs_page_path(const std::string& page);

}  // namespace remat
