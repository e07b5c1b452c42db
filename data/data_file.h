// A data file read with pread(2) (RAII, move-only), and the identity that tells whether it changed.
//
// Data files are read, not memory-mapped: a mapped file that another process truncates kills the
// reader with SIGBUS at the next access to a page past the new end, with no message and no chance
// to save the steps done. A read instead returns short, which is an error with a message. The page
// cache still does the buffering, and a window costs one system call (docs/shared-files.md has
// the measurement).
//
// A run's windows, and their order, are functions of each file's size and bytes as they were at
// open: a file that changes afterwards (truncated, replaced by a rename, rewritten in place, or
// appended to) is a DataChanged error, found by comparing the path's identity (device, inode, size,
// modification time) with the one recorded at open.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <string>

namespace remat {

/// What names one version of a file: the inode the path leads to, its size and modification time.
struct FileIdentity {
  dev_t device = 0;
  ino_t inode = 0;
  uint64_t size = 0;
  timespec mtime{};
  bool operator==(const FileIdentity& o) const {
    return device == o.device && inode == o.inode && size == o.size &&
           mtime.tv_sec == o.mtime.tv_sec && mtime.tv_nsec == o.mtime.tv_nsec;
  }
};

class DataFile {
 public:
  /// How the file will be read next; forwarded to posix_fadvise (a hint, never an error).
  enum class Access { Normal, Sequential, Random };

  DataFile() = default;
  /// Opens `path` read-only and records its identity. Throws DataError naming the file when it
  /// cannot be opened or is not a regular file.
  explicit DataFile(const std::string& path);
  DataFile(DataFile&& o) noexcept;
  DataFile& operator=(DataFile&& o) noexcept;
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;
  ~DataFile();

  const std::string& path() const { return path_; }
  uint64_t size() const { return id_.size; }  // at open
  /// Reads bytes [offset, offset + n) into `out`. A short read (the file shrank) throws
  /// DataChanged; a failed one (EIO) throws IoError.
  void read(uint64_t offset, size_t n, void* out) const;
  /// Throws DataChanged, saying what changed, when the path no longer leads to the file as it was
  /// at open. One stat(2).
  void check_unchanged() const;
  void advise(Access access) const;

 private:
  void close();
  std::string path_;
  int fd_ = -1;
  FileIdentity id_;
};

}  // namespace remat
