// Files that must be regular files: the one way remat-train opens a file it reads (a config, a
// data shard, a tokenizer, a safetensors file, state.json, config.json, ...) or creates one it
// writes (checkpoint and export files, the run lock).
//
// open(2) of a FIFO blocks until the other end opens it, forever if nobody does, so every file is
// opened with O_NONBLOCK and checked with fstat before a byte moves: a FIFO, a device or a folder
// is refused at once ("not a regular file"), and the descriptor of a regular file is then switched
// back to blocking I/O. Reading follows symbolic links (a model folder of links into a download
// cache is normal); creating never does (O_NOFOLLOW: a link planted where we write is refused,
// never written through, and a dangling one never creates its target).
//
// Nothing here throws: each caller turns a problem into its own typed error (ConfigError,
// DataError, CheckpointError, IoError) with its component, the path and the fix.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace remat {

class RegularFile {
 public:
  enum class Problem : uint8_t {
    None,
    Missing,     // no such file (or folder on the way)
    NotRegular,  // a folder, a device, a FIFO or a socket
    Link,        // a symbolic link where a file is created
    Error,       // anything else: error() holds errno (EACCES, EMFILE, ...)
  };

  /// Opens `path` for reading (O_RDONLY).
  static RegularFile open_read(const std::string& path);
  /// Opens `path` with `flags` (O_RDONLY, O_WRONLY or O_RDWR, plus O_CREAT, O_TRUNC, O_EXCL, ...).
  /// O_CLOEXEC and O_NONBLOCK are always added (the latter cleared again once the file is known to
  /// be regular), and O_NOFOLLOW whenever O_CREAT is given.
  RegularFile(const std::string& path, int flags, mode_t mode = 0644);
  ~RegularFile();
  RegularFile(RegularFile&& o) noexcept;
  RegularFile& operator=(RegularFile&& o) noexcept;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  bool ok() const { return fd_ >= 0; }
  Problem problem() const { return problem_; }
  /// errno of the failed call (0 when ok()).
  int error() const { return error_; }
  /// Why the file could not be opened, for a message: "no such file", "not a regular file (a
  /// folder, device or pipe)", "a symbolic link (never followed when a file is written)", or the
  /// system's text ("Permission denied").
  std::string problem_text() const;
  int fd() const { return fd_; }
  /// Size in bytes at open.
  uint64_t size() const { return size_; }
  /// Hands the descriptor over (the caller closes it); the object is then closed.
  int release();
  void close();

  /// Reads the file from the current offset to its end into `out`. Returns 0, an errno value when
  /// a read fails, or EFBIG when there are more than `max_bytes` (then `out` is left empty).
  int read_all(std::string& out, uint64_t max_bytes = UINT64_MAX);

 private:
  std::string path_;
  int fd_ = -1;
  Problem problem_ = Problem::None;
  int error_ = 0;
  uint64_t size_ = 0;
};

}  // namespace remat
